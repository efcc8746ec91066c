"""Plotly figures: the fleet picture and the run view, drawn from pipeline results as they are.

Full fidelity is the rule: a trace is never randomly sampled; past ``max_points`` it is thinned with
min/max buckets (``klwatch.downsample``) so a one-step drop to zero still shows, and long traces are
drawn with WebGL. Colours carry the verdict everywhere: red reset, green ok, blue intentional,
amber inconclusive.

Every text from a run (its name, metric names, segment refs, the step axis, explanations) goes
through ``safety.plot_text``: Plotly renders a subset of HTML in titles, legends, annotations and
hover labels, and a run name is anyone's to write.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from klwatch.dashboard.safety import plot_text
from klwatch.downsample import minmax_indices
from klwatch.metrics import ENTROPY, GRAD_NORM, LOSS, LR, REWARD, MetricFamily, find_metric
from klwatch.model import LineageResult, Series
from klwatch.reference_reset import ReferenceResetConfig

VERDICT_COLORS = {"reference_reset": "#d62728", "ok": "#2ca02c", "intentional": "#1f77b4", "inconclusive": "#ff9f1c"}
STATUS_COLORS = {**VERDICT_COLORS, "error": "#7f0000", "no_kl_metric": "#8c8c8c", "kl_disabled": "#b0b0b0",
                 "insufficient_data": "#bcbd22"}
VERDICT_LABELS = {"reference_reset": "RESET", "ok": "ok", "intentional": "intentional", "inconclusive": "?"}
PIECE_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd",
                "#c44e52"]

MAX_POINTS = 4_000
"""Points drawn per trace before min/max thinning starts."""
WEBGL_ABOVE = 2_000
"""Total points in a figure above which traces are drawn with WebGL (Scattergl)."""

LINKED_FAMILIES: tuple[MetricFamily, ...] = (LOSS, REWARD, LR, GRAD_NORM, ENTROPY)
"""Other series worth seeing under the KL, in panel order."""


def pick_linked_metrics(names: Sequence[str], *, exclude: Sequence[str] = ()) -> list[str]:
    """One series per family (loss, reward, learning rate, grad norm, entropy) when the run logs it.

    Found through the naming module, as every detector finds its series: the family's best-ranked
    name (``train/loss`` over ``val/loss``; ``actor/pg_loss``, ``optim/lr``, ``critic/score/mean``).
    KL series and bookkeeping series (``_runtime``) are never picked.
    """
    chosen: list[str] = []
    for family in LINKED_FAMILIES:
        name = find_metric([n for n in names if n not in exclude and n not in chosen], family=family)
        if name is not None:
            chosen.append(name)
    return chosen


def _wall_strings(wall_times: np.ndarray | None, n: int) -> np.ndarray:
    if wall_times is None:
        return np.full(n, "-", dtype=object)
    stamps = pd.to_datetime(pd.Series(wall_times), unit="s", utc=True, errors="coerce")
    return stamps.dt.strftime("%Y-%m-%d %H:%M:%S UTC").fillna("-").to_numpy(dtype=object)


def _thin(series: Series, max_points: int) -> Series:
    if len(series) <= max_points:
        return series
    return series.take(minmax_indices(series.values, max_points=max_points))


def _trace(series: Series, *, name: str, color: str, segment: str, metric: str, webgl: bool,
           showlegend: bool, legendgroup: str, axis: int) -> dict:
    # The wall time differs per point; the segment is the trace's own, so it lives in the template
    # (not repeated per point: the figure's JSON is what every click ships to the browser).
    custom = _wall_strings(series.wall_times, len(series)) if len(series) else None
    suffix = "" if axis == 1 else str(axis)
    return {
        "type": "scattergl" if webgl else "scatter",
        "x": series.steps, "y": series.values, "xaxis": f"x{suffix}", "yaxis": f"y{suffix}",
        "mode": "lines+markers" if len(series) <= 300 else "lines",
        "name": plot_text(name), "legendgroup": legendgroup, "showlegend": showlegend,
        "line": {"color": color, "width": 1.6}, "marker": {"color": color, "size": 4},
        "customdata": custom,
        "hovertemplate": (f"<b>{plot_text(metric)}</b><br>step %{{x}}<br>value %{{y:.4g}}<br>%{{customdata}}"
                          f"<br>segment {plot_text(segment)}<extra></extra>"),
    }


def run_figure(result: LineageResult, *, linked: Sequence[str] = (), max_points: int = MAX_POINTS,
               webgl_above: int = WEBGL_ABOVE) -> go.Figure:
    """The KL over the whole training run, one colour per piece, every resume boundary marked.

    Each boundary is a vertical line through all panels, coloured and labelled with its verdict and
    score; the windows the detector compared are shaded on the KL panel (before in grey, after in
    the verdict's colour). Panels below share the x axis (step) and show ``linked`` series. The
    figure is assembled as one plain spec and validated once (plotly's incremental API costs
    hundreds of milliseconds for a few panels, paid on every click).
    """
    lin = result.lineage
    metric = result.metric or lin.kl_metric
    panels = ([metric] if metric else []) + [m for m in linked if m != metric]
    rows = max(1, len(panels))
    layout, domains = _panel_axes(rows, x_title=plot_text(lin.step_axis or "step"))
    traces, thinned = _piece_traces(result, panels, max_points=max_points, webgl_above=webgl_above)
    titles = [plot_text(f"−{p} (logged negated)" if i == 0 and p == lin.kl_metric and lin.kl_negated else p)
              for i, p in enumerate(panels)]
    annotations: list[dict] = [
        {"text": t, "x": 0.0, "xref": "paper", "xanchor": "left", "y": domains[r][1], "yref": "paper",
         "yanchor": "bottom", "showarrow": False, "font": {"size": 12, "color": "#444"}}
        for r, t in enumerate(titles)]
    shapes = _boundary_marks(result, annotations, on_panel=bool(panels), shade=metric is not None)
    title = f"{plot_text(lin.name)}: {result.status}"
    if thinned:
        title += f"  (long series: min/max of each bucket drawn, ≤{max_points:,} points per piece)"
    layout.update(
        title={"text": title, "font": {"size": 15}}, height=430 + 170 * (rows - 1), hovermode="closest",
        margin={"l": 60, "r": 20, "t": 90, "b": 95},
        legend={"orientation": "h", "x": 0.0, "y": 0.0, "yanchor": "bottom", "yref": "container", "font": {"size": 11}},
        uirevision=lin.id, shapes=shapes, annotations=annotations,
    )
    return go.Figure({"data": traces, "layout": layout})


def _panel_axes(rows: int, *, x_title: str) -> tuple[dict, list[tuple[float, float]]]:
    """One x/y axis pair per panel, top to bottom, the x axes matched (zoom one, zoom all) and the KL's
    panel the tallest: the layout's axes and each panel's vertical domain."""
    gap = 0.045 if rows > 1 else 0.0
    weights = [2.2] + [1.0] * (rows - 1)
    usable = 1.0 - gap * (rows - 1)
    domains, top = [], 1.0
    for w in weights:
        h = usable * w / sum(weights)
        domains.append((max(0.0, top - h), top))
        top = top - h - gap
    layout: dict = {}
    for r in range(1, rows + 1):
        sfx = "" if r == 1 else str(r)
        layout[f"xaxis{sfx}"] = {"anchor": f"y{sfx}", "domain": [0.0, 1.0], "showticklabels": r == rows,
                                 "showspikes": True, "spikemode": "across", "spikesnap": "cursor", "spikethickness": 1,
                                 **({} if r == 1 else {"matches": "x"}),
                                 **({"title": {"text": x_title}} if r == rows else {})}
        layout[f"yaxis{sfx}"] = {"anchor": f"x{sfx}", "domain": list(domains[r - 1])}
    return layout, domains


def _piece_traces(result: LineageResult, panels: Sequence[str], *, max_points: int,
                  webgl_above: int) -> tuple[list[dict], bool]:
    """One trace per piece in every panel (the legend names each piece's segment once); whether
    any trace was thinned."""
    lin = result.lineage
    traces: list[dict] = []
    total = sum(len(p[m]) for p in lin.pieces for m in panels if m in p)
    webgl = total > webgl_above
    thinned = False
    for row, m in enumerate(panels, start=1):
        # the KL as a distance (a KL logged negated flipped back), every other series as logged
        series = lin.kl_pieces() if m == lin.kl_metric else [p.get(m) for p in lin.pieces]
        for i, s in enumerate(series):
            if s is None or not len(s):
                continue
            drawn = _thin(s, max_points)
            thinned |= len(drawn) < len(s)
            seg_i = lin.piece_segments[i] if i < len(lin.piece_segments) else 0
            seg_ref = lin.segments[seg_i].ref if seg_i < len(lin.segments) else "?"
            traces.append(_trace(drawn, name=f"piece {i + 1}: {seg_ref.rstrip('/').rsplit('/', 1)[-1]}",
                                 color=PIECE_COLORS[i % len(PIECE_COLORS)], segment=seg_ref, metric=m, webgl=webgl,
                                 showlegend=row == 1, legendgroup=f"piece{i}", axis=row))
    return traces, thinned


def _boundary_marks(result: LineageResult, annotations: list[dict], *, on_panel: bool, shade: bool) -> list[dict]:
    """Every boundary's line and verdict label (added to ``annotations``; labels alternate in height
    so neighbours do not overlap) and, with ``shade``, the KL windows its verdict compared."""
    shapes: list[dict] = []
    for k, v in enumerate(sorted(result.verdicts, key=lambda v: v.boundary.step)):
        step = int(v.boundary.step)
        color = VERDICT_COLORS.get(v.verdict, "#555")
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": step, "x1": step, "y0": 0, "y1": 1,
                       "line": {"color": color, "width": 2, "dash": "dash"}, "layer": "above"})
        label = f"{VERDICT_LABELS.get(v.verdict, v.verdict)} {v.score:.2f}"
        annotations.append({"x": step, "xref": "x", "y": 1.0 + (0.07 if k % 2 else 0.0),
                            "yref": "y domain" if on_panel else "paper", "text": f"<b>{label}</b>", "showarrow": False,
                            "yanchor": "bottom", "font": {"color": "white", "size": 11}, "bgcolor": color,
                            "borderpad": 2, "hovertext": f"step {step}: {plot_text(v.explanation)}"})
        if not shade:
            continue
        for window, fill in ((v.window_before, "rgba(120,120,120,0.14)"), (v.window_after, _rgba(color, 0.16))):
            if window:
                lo, hi = window
                if lo == hi:
                    lo, hi = lo - 0.5, hi + 0.5
                shapes.append({"type": "rect", "xref": "x", "yref": "y domain", "x0": lo, "x1": hi, "y0": 0,
                               "y1": 1, "fillcolor": fill, "line": {"width": 0}, "layer": "below"})
    return shapes


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def fleet_figure(points: pd.DataFrame, *, thresholds: ReferenceResetConfig) -> go.Figure:
    """Every boundary of every run: KL after/before (log) against the detector's score.

    Resets gather at the bottom right (KL collapsed, high score), healthy resumes near ratio 1 on the
    left; the dotted lines are the current thresholds, so moving a slider moves the picture's cut.
    A boundary without a ratio (no KL level before it) is drawn on the 'no change' line.
    """
    floor = 1e-4
    traces = []
    for verdict, color in VERDICT_COLORS.items():
        sub = points[points["verdict"] == verdict]
        if sub.empty:
            continue
        ratio = sub["ratio"].astype("float64").fillna(1.0).clip(lower=floor)
        traces.append({
            "type": "scatter", "x": sub["score"].to_numpy(), "y": ratio.to_numpy(), "mode": "markers",
            "name": f"{verdict} ({len(sub)})",
            "marker": {"color": color, "size": 10, "opacity": 0.8, "line": {"width": 1, "color": "white"}},
            "customdata": np.stack([sub["key"], sub["run"].map(plot_text), sub["step"].astype(str),
                                    sub["kl_before"].map(fmt_kl), sub["kl_after"].map(fmt_kl)], axis=-1),
            "hovertemplate": ("<b>%{customdata[1]}</b><br>resume at step %{customdata[2]}<br>"
                              "KL %{customdata[3]} → %{customdata[4]}<br>after/before %{y:.3g}<br>"
                              "score %{x:.2f}<extra></extra>"),
        })
    dotted = {"dash": "dot", "color": "#888", "width": 1}
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": thresholds.low_fraction,
               "y1": thresholds.low_fraction, "line": dotted}]
    annotations = [{"text": "low", "xref": "paper", "x": 0, "xanchor": "left", "yref": "y",
                    "y": float(np.log10(thresholds.low_fraction)), "yanchor": "top", "showarrow": False,
                    "font": {"size": 10, "color": "#888"}}]
    for x, label in ((thresholds.ok_score, "ok ≤"), (thresholds.reset_score, "reset ≥")):
        shapes.append({"type": "line", "xref": "x", "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1, "line": dotted})
        annotations.append({"text": label, "xref": "x", "x": x, "yref": "paper", "y": 1, "yanchor": "bottom",
                            "showarrow": False, "font": {"size": 10, "color": "#888"}})
    layout = {
        "height": 280, "margin": {"l": 60, "r": 20, "t": 30, "b": 40}, "hovermode": "closest",
        "xaxis": {"title": {"text": "reset score"}, "range": [-0.03, 1.03]},
        "yaxis": {"title": {"text": "KL after / before"}, "type": "log",
                  "tickvals": [1e-4, 1e-3, 1e-2, 0.1, 0.5, 1, 10],
                  "ticktext": ["≤1e-4", "0.001", "0.01", "0.1", "0.5", "1", "10"]},
        "legend": {"orientation": "h", "y": 1.12, "yanchor": "bottom"}, "clickmode": "event+select",
        "shapes": shapes, "annotations": annotations,
    }
    return go.Figure({"data": traces, "layout": layout})


def fmt_kl(x: float | None) -> str:
    """A KL level as the page shows it: three significant digits, '-' for none (or not finite)."""
    return "-" if x is None or not np.isfinite(x) else f"{x:.3g}"


def plot_config(filename: str) -> dict:
    """The chart toolbar: PNG export at twice the screen resolution, named after the run."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", filename).strip("_") or "klwatch-run"
    return {"displaylogo": False,
            "toImageButtonOptions": {"format": "png", "filename": safe, "scale": 2}}


def figure_html(fig: go.Figure, *, filename: str) -> str:
    """A self-contained HTML page of the chart (plotly.js inlined: opens offline)."""
    return fig.to_html(include_plotlyjs=True, full_html=True, config=plot_config(filename))
