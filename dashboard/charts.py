"""Plotly figures: the fleet picture and the run view, drawn from pipeline results as they are.

Full fidelity is the rule: a trace is never randomly sampled; past ``max_points`` points in one
panel (every piece of the run together, raw and smoothed together) the panel is thinned with min/max
buckets (``klwatch.downsample``) so a one-step drop to zero still shows; a run of dozens of pieces is
drawn as one line per panel. The cost of a run view is therefore bounded by its panels, never by the
run's length or its number of pieces, and the capped lines are drawn as SVG: a WebGL context costs a
browser without a GPU more than drawing them (``WEBGL_ABOVE``). Colours carry
the verdict everywhere: red reset, green ok, blue intentional, amber inconclusive, violet a finding.

Every text from a run (its name, metric names, segment refs, the step axis, explanations) goes
through ``safety.plot_text``: Plotly renders a subset of HTML in titles, legends, annotations and
hover labels, and a run name is anyone's to write.
"""

from __future__ import annotations

import re
import os
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from klwatch.dashboard.safety import plot_text
from klwatch.downsample import minmax_indices
from klwatch.metrics import ENTROPY, GRAD_NORM, LOSS, LR, REWARD, MetricFamily, find_metric
from klwatch.comparison import Comparison
from klwatch.model import Finding, LineageResult, Series
from klwatch.reference_reset import ReferenceResetConfig

VERDICT_COLORS = {"reference_reset": "#d62728", "ok": "#2ca02c", "intentional": "#1f77b4", "inconclusive": "#ff9f1c"}
FINDING_COLOR = "#9467bd"
STATUS_COLORS = {**VERDICT_COLORS, "error": "#7f0000", "no_kl_metric": "#7a7a7a", "kl_disabled": "#8c8c8c",
                 "insufficient_data": "#8f9015", "ok, with findings": FINDING_COLOR}
DARK_STATUS_COLORS = {**STATUS_COLORS, "reference_reset": "#ff6b6b", "error": "#ff8a80", "intentional": "#64b5f6",
                      "ok": "#5cd65c", "ok, with findings": "#c3a3ef", "no_kl_metric": "#b0b0b0", "kl_disabled": "#9e9e9e",
                      "insufficient_data": "#d4d52a", "inconclusive": "#ffb347"}
"""Status text on a dark page: the same hues, light enough to read (dark red on near-black is not)."""
PART_COLOR = "#e377c2"
THEMES = {
    "light": {"before": "rgba(110,110,110,0.18)", "control": "#555555", "after_alpha": 0.18, "raw_alpha": 0.22},
    "dark": {"before": "rgba(215,215,215,0.22)", "control": "#d0d0d0", "after_alpha": 0.28, "raw_alpha": 0.3},
}
"""What differs between a light and a dark page (text colours are left to Streamlit's chart theme)."""
VERDICT_LABELS = {"reference_reset": "RESET", "ok": "ok", "intentional": "intentional", "inconclusive": "?"}
PIECE_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd",
                "#c44e52"]

def status_color(status: str, theme: str = "light") -> str:
    """The colour a status is written in, for the page's theme."""
    return (DARK_STATUS_COLORS if theme == "dark" else STATUS_COLORS).get(status, "#888")


def env_count(name: str, default: int, *, least: int) -> int:
    """A count the environment may set (``default`` when unset or not a number; never below ``least``)."""
    try:
        return max(least, int(os.environ.get(name, default)))
    except ValueError:
        return default


PANEL_POINTS = env_count("KLWATCH_DASHBOARD_PANEL_POINTS", 6_000, least=8)
"""Points drawn per panel (all pieces, raw and smoothed together) before min/max thinning starts."""
MAX_POINTS = PANEL_POINTS
WEBGL_ABOVE = 40_000
"""Total points in a figure above which traces are drawn with WebGL (Scattergl): more than six full
panels hold at the default cap, so WebGL only comes in when ``KLWATCH_DASHBOARD_PANEL_POINTS`` is
raised. Below it SVG lines are cheaper: a browser without a GPU (a VM, a remote desktop, headless
Chromium) spent 1.5-2 s creating each chart's WebGL context on a busy 2-core machine, more than
drawing the capped lines; opening a run of the 1,000-run fleet took 5-8 s with WebGL, about 4 s
without, at a load average of 10 (``bench_dashboard.py --browser``)."""
MAX_PIECE_TRACES = 24
"""Pieces drawn as their own trace (own colour, own legend entry); past this a panel is one line."""
MIN_WINDOW_FRACTION = 0.01
"""A shaded compared window is at least this share of the x axis wide (a few pixels on a long run)."""
X_AXES = ("step", "relative", "wall")
"""The run view's x axis: the step, hours since the run's first point, or the wall clock."""

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


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased exponential moving average (the first points are not
    pulled towards zero); non-finite points are skipped and keep their place. Applied per piece, so a
    drop at a resume is never smeared back into the run before it."""
    out = np.array(values, dtype=np.float64, copy=True)
    if weight <= 0 or not len(out):
        return out
    finite = np.isfinite(out)
    x = out[finite]
    if not len(x):
        return out
    from scipy.signal import lfilter  # scipy is a klwatch dependency; imported when smoothing is asked

    last = lfilter([1.0 - weight], [1.0, -weight], x)
    out[finite] = last / (1.0 - weight ** np.arange(1, len(x) + 1))
    return out


def thin_panel(parts: Sequence[Series], max_points: int) -> list[Series]:
    """The pieces of one panel thinned together to at most ``max_points`` points: min/max buckets over
    all of them in logged order (``minmax_indices``), each piece keeping its first and last point while
    that leaves most of the budget to the buckets."""
    total = sum(len(p) for p in parts)
    if total <= max_points:
        return list(parts)
    ends = 2 * len(parts) if 4 * len(parts) <= max_points else 0
    values = np.concatenate([p.values for p in parts])
    keep = minmax_indices(values, max_points=max(4, max_points - ends))
    out, offset = [], 0
    for p in parts:
        sel = keep[(keep >= offset) & (keep < offset + len(p))] - offset
        if ends and len(p):
            sel = np.union1d(sel, [0, len(p) - 1])
        out.append(p.take(np.asarray(sel, dtype=np.int64)))
        offset += len(p)
    return out


class XAxis:
    """Steps to x coordinates for the axis chosen: the step itself, hours since the run's first wall
    time, or the wall time (milliseconds since the epoch, on a date axis). Marks (boundaries, windows,
    findings) sit at steps; on a clock axis they go where the piece that logged that step was then."""

    def __init__(self, kind: str, pieces: Sequence[dict[str, Series]]) -> None:
        self.pieces = pieces
        walls = [s.wall_times for p in pieces for s in p.values() if s.wall_times is not None and len(s)]
        self.has_clock = bool(walls) and all(s.wall_times is not None for p in pieces for s in p.values() if len(s))
        self.kind = kind if kind in X_AXES and (kind == "step" or self.has_clock) else "step"
        self.t0 = float(min(float(np.nanmin(w)) for w in walls)) if walls else 0.0

    def of_series(self, s: Series) -> np.ndarray:
        if self.kind == "step" or s.wall_times is None:
            return s.steps
        return self._clock(s.wall_times)

    def _clock(self, wall: np.ndarray | float) -> np.ndarray:
        w = np.asarray(wall, dtype=np.float64)
        return (w - self.t0) / 3600.0 if self.kind == "relative" else w * 1000.0

    def at(self, step: float, piece: int | None = None) -> float | None:
        """The x of ``step``, looked up in piece ``piece`` first, then in the latest piece holding it."""
        if self.kind == "step":
            return float(step)
        order = ([piece] if piece is not None and 0 <= piece < len(self.pieces) else []) + \
            list(range(len(self.pieces) - 1, -1, -1))
        for k in order:
            longest = max((s for s in self.pieces[k].values() if s.wall_times is not None and len(s)), key=len, default=None)
            if longest is None or not longest.steps.min() <= step <= longest.steps.max():
                continue
            o = np.argsort(longest.steps, kind="stable")
            return float(self._clock(np.interp(step, longest.steps[o], longest.wall_times[o])))  # type: ignore[index]
        return None

    @property
    def title(self) -> str | None:
        return {"relative": "hours since the run's first point", "wall": "wall time (UTC)"}.get(self.kind)


def _trace(series: Series, *, x: np.ndarray, name: str, color: str, segment: str, metric: str, webgl: bool,
           showlegend: bool, legendgroup: str, axis: int, opacity: float = 1.0, hover: bool = True,
           dash: str | None = None) -> dict:
    # The wall time differs per point; the segment is the trace's own, so it lives in the template
    # (not repeated per point: the figure's JSON is what every click ships to the browser).
    suffix = "" if axis == 1 else str(axis)
    trace = {
        "type": "scattergl" if webgl else "scatter",
        "x": x, "y": series.values, "xaxis": "x", "yaxis": f"y{suffix}",
        "mode": "lines+markers" if len(series) <= 300 and opacity == 1.0 else "lines",
        "name": plot_text(name), "legendgroup": legendgroup, "showlegend": showlegend,
        "line": {"color": color, "width": 1.6, **({"dash": dash} if dash else {})}, "marker": {"color": color, "size": 4},
        "opacity": opacity, "connectgaps": False,
    }
    if not hover:
        trace["hoverinfo"] = "skip"
        return trace
    trace["customdata"] = _wall_strings(series.wall_times, len(series)) if len(series) else None
    trace["text"] = series.steps  # the step, whatever the x axis is (not drawn: the mode has no text)
    # one line per trace: the unified hover lists every panel's trace at that step
    trace["hovertemplate"] = (f"<b>{plot_text(metric)}</b> %{{y:.4g}} · step %{{text}} · %{{customdata}}"
                              f" · {plot_text(segment)}<extra></extra>")
    return trace


def run_figure(result: LineageResult, *, linked: Sequence[str] = (), max_points: int = PANEL_POINTS,
               webgl_above: int = WEBGL_ABOVE, findings: Sequence[Finding] | None = None, smoothing: float = 0.0,
               log_y: bool = False, x_axis: str = "step", x_range: tuple[float, float] | None = None,
               theme: str = "light", control: LineageResult | None = None,
               comparison: Comparison | None = None, status: str | None = None) -> go.Figure:
    """The KL over the whole training run, one colour per piece, every resume boundary marked.

    Each boundary is a vertical line through all panels, coloured and labelled with its verdict and
    score; the windows the detector compared are shaded on the KL panel (before in grey, after in
    the verdict's colour; never narrower than a sliver of the axis, widened away from the boundary,
    and named in the legend). Each
    finding is marked at its step on the panel of the series it cites. Panels below share one x
    axis (so one hover reads every panel at that step) and show ``linked`` series. With ``control``
    (and the ``comparison`` the core made of the two), the control run's KL is drawn over the KL
    panel and the step where they part is marked. The figure is assembled as one plain spec and
    validated once (plotly's incremental API costs hundreds of milliseconds for a few panels).
    """
    lin = result.lineage
    findings = result.findings if findings is None else findings
    metric = result.metric or lin.kl_metric
    panels = ([metric] if metric else []) + [m for m in dict.fromkeys(linked) if m != metric]
    rows = max(1, len(panels))
    xs = XAxis(x_axis, lin.pieces)
    layout, domains = _panel_axes(rows, x_title=plot_text(xs.title or lin.step_axis or "step"), x_kind=xs.kind,
                                  log_y=log_y)
    colors = THEMES.get(theme, THEMES["light"])
    traces, thinned = _piece_traces(result, panels, xs=xs, max_points=max_points, webgl_above=webgl_above,
                                    smoothing=smoothing, raw_alpha=colors["raw_alpha"],
                                    control=control if metric else None, control_color=colors["control"])
    annotations = _panel_titles(result, panels, domains)
    span = _x_span(traces, x_range)
    shapes = _boundary_marks(result, annotations, xs=xs, on_panel=bool(panels), shade=metric is not None,
                             min_width=span * MIN_WINDOW_FRACTION, colors=colors)
    if metric and any(s["type"] == "rect" for s in shapes):
        traces += _window_legend(colors)
    shapes += _finding_marks(findings, result, panels, annotations, xs=xs, log_y=log_y)
    if comparison is not None and control is not None:
        shapes += _parting_marks(comparison, annotations, xs=xs, on_panel=bool(panels))
    title = f"{plot_text(lin.name)}: {status or result.status}"
    if thinned:
        title += f"  (long series: min/max of each bucket drawn, ≤{max_points:,} points per panel)"
    if xs.kind != x_axis:
        title += "  (no wall clock in this run: x is the step)"
    _frame(layout, title=title, rows=rows, x_range=x_range, uirevision=f"{lin.id}:{xs.kind}:{log_y}:{x_range}")
    layout.update(shapes=shapes, annotations=annotations)
    return go.Figure({"data": traces, "layout": layout})


def _panel_titles(result: LineageResult, panels: Sequence[str], domains: Sequence[tuple[float, float]]) -> list[dict]:
    """Each panel's series named above it (a KL logged negated says so: the panel draws it flipped)."""
    lin = result.lineage
    titles = [plot_text(f"−{p} (logged negated)" if i == 0 and p == lin.kl_metric and lin.kl_negated else p)
              for i, p in enumerate(panels)]
    return [{"text": t, "x": 0.0, "xref": "paper", "xanchor": "left", "y": domains[r][1], "yref": "paper",
             "yanchor": "bottom", "showarrow": False, "font": {"size": 12}} for r, t in enumerate(titles)]


def _frame(layout: dict, *, title: str, rows: int, x_range: tuple[float, float] | None, uirevision: str) -> None:
    """The figure's title, height (the KL panel and 170 px per panel below), one hover across panels,
    the legend under the chart, and the x range when zoomed to a resume."""
    if x_range is not None:
        layout["xaxis"]["range"] = list(x_range)
        layout["xaxis"]["autorange"] = False
    layout.update(
        title={"text": title, "font": {"size": 15}}, height=430 + 170 * (rows - 1),
        hovermode="x unified", hoversubplots="axis",
        margin={"l": 60, "r": 20, "t": 90, "b": 95},
        legend={"orientation": "h", "x": 0.0, "y": 0.0, "yanchor": "bottom", "yref": "container", "font": {"size": 11}},
        uirevision=uirevision,
    )


def _x_span(traces: list[dict], x_range: tuple[float, float] | None) -> float:
    if x_range is not None:
        return float(abs(x_range[1] - x_range[0]))
    lo, hi = np.inf, -np.inf
    for t in traces:
        x = np.asarray(t.get("x") if t.get("x") is not None else [], dtype=np.float64)
        x = x[np.isfinite(x)]
        if len(x):
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    return hi - lo if hi > lo else 0.0


def _panel_axes(rows: int, *, x_title: str, x_kind: str = "step", log_y: bool = False) -> tuple[dict, list[tuple[float, float]]]:
    """One y axis per panel, top to bottom, all on one x axis (zoom one, zoom all; one hover across
    them) drawn under the bottom panel, the KL's panel the tallest: the layout's axes and each panel's
    vertical domain."""
    gap = 0.045 if rows > 1 else 0.0
    weights = [2.2] + [1.0] * (rows - 1)
    usable = 1.0 - gap * (rows - 1)
    domains, top = [], 1.0
    for w in weights:
        h = usable * w / sum(weights)
        domains.append((max(0.0, top - h), top))
        top = top - h - gap
    bottom = "" if rows == 1 else str(rows)
    layout: dict = {"xaxis": {"anchor": f"y{bottom}", "domain": [0.0, 1.0], "title": {"text": x_title},
                              "showspikes": True, "spikemode": "across", "spikesnap": "cursor", "spikethickness": 1,
                              **({"type": "date"} if x_kind == "wall" else {})}}
    for r in range(1, rows + 1):
        sfx = "" if r == 1 else str(r)
        layout[f"yaxis{sfx}"] = {"anchor": "x", "domain": list(domains[r - 1]), **({"type": "log"} if log_y else {})}
    return layout, domains


def _segment_ref(lin, i: int) -> str:
    seg_i = lin.piece_segments[i] if i < len(lin.piece_segments) else 0
    return lin.segments[seg_i].ref if seg_i < len(lin.segments) else "?"


def _panel_series(result: LineageResult, m: str) -> list[Series | None]:
    """The metric in every piece: the KL as a distance (a KL logged negated flipped back), every
    other series as logged."""
    lin = result.lineage
    return lin.kl_pieces() if m == lin.kl_metric else [p.get(m) for p in lin.pieces]


def _piece_traces(result: LineageResult, panels: Sequence[str], *, xs: XAxis, max_points: int, webgl_above: int,
                  smoothing: float = 0.0, raw_alpha: float = 0.25, control: LineageResult | None = None,
                  control_color: str = "#555") -> tuple[list[dict], bool]:
    """One trace per piece in every panel (the legend names each piece's segment once), or one line
    per panel when the run has more pieces than a legend can hold; with ``smoothing`` the raw series
    stays, faint, behind the smoothed one; with ``control``, its KL over the KL panel. Every panel
    within ``max_points`` together. Whether any panel was thinned."""
    lin = result.lineage
    traces: list[dict] = []
    webgl = _drawn_points(result, panels, max_points=max_points, layers=2 if smoothing > 0 else 1) > webgl_above
    thinned = False
    many = len(lin.pieces) > MAX_PIECE_TRACES
    for row, m in enumerate(panels, start=1):
        present = [(i, s) for i, s in enumerate(_panel_series(result, m)) if s is not None and len(s)]
        ctl = [s for s in control.lineage.kl_pieces() if s is not None and len(s)] if control and row == 1 else []
        layers = ([("raw", raw_alpha), ("smoothed", 1.0)] if smoothing > 0 else [("raw", 1.0)])
        budget = max(8, max_points // (len(layers) + (1 if ctl else 0)))
        for layer, opacity in layers:
            parts = [Series(s.steps, ema(s.values, smoothing), s.wall_times) if layer == "smoothed" else s
                     for _, s in present]
            drawn = thin_panel(parts, budget)
            thinned |= sum(len(d) for d in drawn) < sum(len(p) for p in parts)
            main = opacity == 1.0
            if many:
                traces.append(_joined_trace(drawn, xs=xs, name=f"{len(present)} pieces (one line)", metric=m,
                                            webgl=webgl, showlegend=row == 1 and main, axis=row, opacity=opacity,
                                            hover=main))
                continue
            for (i, _), d in zip(present, drawn):
                seg_ref = _segment_ref(lin, i)
                traces.append(_trace(d, x=xs.of_series(d), name=f"piece {i + 1}: {seg_ref.rstrip('/').rsplit('/', 1)[-1]}",
                                     color=PIECE_COLORS[i % len(PIECE_COLORS)], segment=f"segment {seg_ref}", metric=m,
                                     webgl=webgl, showlegend=row == 1 and main, legendgroup=f"piece{i}", axis=row,
                                     opacity=opacity, hover=main))
        if ctl:
            drawn = thin_panel(ctl, budget)
            thinned |= sum(len(d) for d in drawn) < sum(len(p) for p in ctl)
            cx = XAxis(xs.kind, control.lineage.pieces) if control is not None else xs
            cx.t0 = xs.t0 if xs.kind == "relative" else cx.t0
            joined = _join(drawn, cx)
            traces.append(_trace(joined[0], x=joined[1], name=f"control: {control.lineage.name}",  # type: ignore[union-attr]
                                 color=control_color, segment="control run", metric=m, webgl=webgl, showlegend=True,
                                 legendgroup="control", axis=1, dash="dash"))
    return traces, thinned


def _drawn_points(result: LineageResult, panels: Sequence[str], *, max_points: int, layers: int) -> int:
    """The points the figure draws, each panel's up to its cap: what a browser pays for (the run's
    length is thinned away, so it does not decide WebGL)."""
    pieces = result.lineage.pieces
    return sum(min(max_points, layers * sum(len(p[m]) for p in pieces if m in p)) for m in panels)


def _join(parts: Sequence[Series], xs: XAxis) -> tuple[Series, np.ndarray]:
    """Pieces as one series with a gap (NaN) between pieces, and its x coordinates."""
    steps, values, walls, xv = [], [], [], []
    for k, p in enumerate(parts):
        if k:
            steps.append(np.array([p.steps[0] if len(p) else 0]))
            values.append(np.array([np.nan]))
            walls.append(np.array([np.nan]))
            xv.append(np.array([np.nan]))
        steps.append(p.steps)
        values.append(p.values)
        walls.append(p.wall_times if p.wall_times is not None else np.full(len(p), np.nan))
        xv.append(np.asarray(xs.of_series(p), dtype=np.float64))
    if not steps:
        return Series(np.empty(0, np.int64), np.empty(0)), np.empty(0)
    wall = np.concatenate(walls)
    joined = Series(np.concatenate(steps), np.concatenate(values), None if np.isnan(wall).all() else wall)
    return joined, np.concatenate(xv)


def _joined_trace(parts: Sequence[Series], *, xs: XAxis, name: str, metric: str, webgl: bool, showlegend: bool,
                  axis: int, opacity: float, hover: bool) -> dict:
    joined, x = _join(parts, xs)
    return _trace(joined, x=x, name=name, color=PIECE_COLORS[0], segment="pieces joined (boundaries are marked)",
                  metric=metric, webgl=webgl, showlegend=showlegend, legendgroup="pieces", axis=axis,
                  opacity=opacity, hover=hover)


def _boundary_marks(result: LineageResult, annotations: list[dict], *, on_panel: bool, shade: bool,
                    xs: XAxis | None = None, min_width: float = 0.0, colors: dict | None = None) -> list[dict]:
    """Every boundary's line and verdict label (added to ``annotations``; labels alternate in height
    so neighbours do not overlap) and, with ``shade``, the KL windows its verdict compared, each at
    least ``min_width`` wide (widened away from the boundary) so it shows on a long run."""
    xs = xs or XAxis("step", result.lineage.pieces)
    colors = colors or THEMES["light"]
    shapes: list[dict] = []
    for k, v in enumerate(sorted(result.verdicts, key=lambda v: v.boundary.step)):
        step = int(v.boundary.step)
        x = xs.at(step, v.boundary.piece_index)
        if x is None:
            continue
        color = VERDICT_COLORS.get(v.verdict, "#555")
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": color, "width": 2, "dash": "dash"}, "layer": "above"})
        label = f"{VERDICT_LABELS.get(v.verdict, v.verdict)} {v.score:.2f}"
        annotations.append({"x": x, "xref": "x", "y": 1.0 + (0.07 if k % 2 else 0.0),
                            "yref": "y domain" if on_panel else "paper", "text": f"<b>{label}</b>", "showarrow": False,
                            "yanchor": "bottom", "font": {"color": "white", "size": 11}, "bgcolor": color,
                            "borderpad": 2, "hovertext": f"step {step}: {plot_text(v.explanation)}"})
        if not shade:
            continue
        for window, fill, piece, before in ((v.window_before, colors["before"], v.boundary.piece_index - 1, True),
                                            (v.window_after, _rgba(color, colors["after_alpha"]), v.boundary.piece_index,
                                             False)):
            if not window:
                continue
            lo, hi = xs.at(window[0], piece), xs.at(window[1], piece)
            if lo is None or hi is None:
                continue
            if xs.kind == "step" and lo == hi:
                lo, hi = lo - 0.5, hi + 0.5
            if hi - lo < min_width:  # widened away from the boundary: the two windows never cover each other
                lo, hi = (hi - min_width, hi) if before else (lo, lo + min_width)
            shapes.append({"type": "rect", "xref": "x", "yref": "y domain", "x0": lo, "x1": hi, "y0": 0,
                           "y1": 1, "fillcolor": fill, "line": {"width": 0}, "layer": "below"})
    return shapes


def _window_legend(colors: dict) -> list[dict]:
    """Legend entries naming the shaded windows (a shape has no legend entry of its own)."""
    return [{"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name, "showlegend": True,
             "hoverinfo": "skip", "legendgroup": "windows",
             "marker": {"symbol": "square", "size": 13, "color": color}}
            for name, color in (("KL compared before the resume", colors["before"]),
                                ("KL compared after (verdict colour)", _rgba(VERDICT_COLORS["ok"], colors["after_alpha"] + 0.2)))]


def _finding_marks(findings: Sequence[Finding], result: LineageResult, panels: Sequence[str], annotations: list[dict],
                   *, xs: XAxis, log_y: bool) -> list[dict]:
    """Each finding with a step: a violet label pointing at the cited series' value there (on the
    panel of the first series it cites that is drawn, else on the KL's), and a dotted line through
    that panel only."""
    from klwatch.dashboard.data import finding_metrics

    shapes: list[dict] = []
    if not panels:
        return shapes
    for k, f in enumerate(f for f in findings if f.step is not None):
        cited = [m for m in finding_metrics(f, result.lineage) if m in panels]
        row = panels.index(cited[0]) + 1 if cited else 1
        sfx = "" if row == 1 else str(row)
        x = xs.at(int(f.step))  # type: ignore[arg-type]
        if x is None:
            continue
        y = _value_at(_panel_series(result, panels[row - 1]), int(f.step))  # type: ignore[arg-type]
        shapes.append({"type": "line", "xref": "x", "yref": f"y{sfx} domain", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": FINDING_COLOR, "width": 2, "dash": "dot"}, "layer": "above"})
        mark = {"x": x, "xref": "x", "text": f"◆ {plot_text(f.detector)}", "showarrow": True, "arrowhead": 2,
                "arrowcolor": FINDING_COLOR, "ax": 30 + 12 * (k % 3), "ay": -28 - 16 * (k % 3),
                "font": {"color": "white", "size": 11}, "bgcolor": FINDING_COLOR, "borderpad": 2,
                "hovertext": plot_text(f"step {f.step}, {f.severity}: {f.message}")}
        if y is not None and (not log_y or y > 0):
            mark.update(y=float(np.log10(y)) if log_y else y, yref=f"y{sfx}")
        else:
            mark.update(y=0.9, yref=f"y{sfx} domain")
        annotations.append(mark)
    return shapes


def _value_at(parts: Sequence[Series | None], step: int) -> float | None:
    """The value logged at ``step`` (the latest piece holding it), else None."""
    for s in reversed(parts):
        if s is None or not len(s):
            continue
        hit = np.flatnonzero(s.steps == step)
        if len(hit) and np.isfinite(s.values[hit[-1]]):
            return float(s.values[hit[-1]])
    return None


def _parting_marks(cmp: Comparison, annotations: list[dict], *, xs: XAxis, on_panel: bool) -> list[dict]:
    """Where the resumed run parts from the control (the comparison's step), or where it was compared
    from when they agree."""
    step = cmp.part_step if cmp.part_step is not None else cmp.resume_step
    x = xs.at(step)
    if x is None:
        return []
    text = f"parted at step {step}" if cmp.part_step is not None else f"compared from step {step}: {cmp.verdict}"
    annotations.append({"x": x, "xref": "x", "y": 0.0, "yref": "y domain" if on_panel else "paper", "yanchor": "top",
                        "text": f"<b>{plot_text(text)}</b>", "showarrow": False, "font": {"color": "white", "size": 11},
                        "bgcolor": PART_COLOR, "borderpad": 2, "hovertext": plot_text(cmp.explanation)})
    return [{"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
             "line": {"color": PART_COLOR, "width": 3, "dash": "solid" if cmp.part_step is not None else "dot"},
             "layer": "above"}]


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
