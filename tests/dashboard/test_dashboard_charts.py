"""The run view's figure: every boundary marked with its verdict, windows shaded, drops never thinned away."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from klwatch.dashboard import charts, data
from klwatch.model import Lineage, LineageResult, Segment, Series
from klwatch.pipeline import ScanConfig
from klwatch.reference_reset import ReferenceResetConfig

from dashboard_runs import write_fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> data.Fleet:
    return data.load_fleet([str(write_fleet(tmp_path_factory.mktemp("fleet")))], config=ScanConfig())


def _by_name(fleet: data.Fleet, name: str) -> LineageResult:
    return next(r for r in fleet.scan.results if r.lineage.name == name)


def test_every_boundary_is_a_line_through_all_panels_labelled_with_its_verdict(fleet: data.Fleet) -> None:
    result = _by_name(fleet, "grpo-resume-buggy")
    fig = charts.run_figure(result, linked=["train/loss", "train/reward"])
    lines = [s for s in fig.layout.shapes if s.type == "line" and s.yref == "paper"]
    assert sorted(s.x0 for s in lines) == [v.boundary.step for v in result.verdicts] == [41, 81]
    assert all(s.yref == "paper" and s.y0 == 0 and s.y1 == 1 for s in lines)
    assert {s.line.color for s in lines} == {charts.VERDICT_COLORS["reference_reset"]}
    labels = [a.text for a in fig.layout.annotations if "RESET" in (a.text or "")]
    assert labels == [f"<b>RESET {v.score:.2f}</b>" for v in result.verdicts]
    # three panels on one step axis (zoom one, zoom all; one hover reads them all), one trace per piece in each
    drawn = [t for t in fig.data if t.legendgroup != "windows"]
    assert {t.xaxis for t in drawn} == {"x"} and {t.yaxis for t in drawn} == {"y", "y2", "y3"}
    assert fig.layout.hovermode == "x unified" and fig.layout.hoversubplots == "axis"
    assert len(drawn) == 3 * 3


def test_the_windows_the_detector_compared_are_shaded(fleet: data.Fleet) -> None:
    result = _by_name(fleet, "grpo-resume-fixed")
    fig = charts.run_figure(result)
    rects = sorted(((s.x0, s.x1) for s in fig.layout.shapes if s.type == "rect"))
    expected = sorted(w for v in result.verdicts for w in (v.window_before, v.window_after))
    assert rects == [tuple(w) for w in expected]
    assert len(rects) == 4


def test_hover_gives_step_value_wall_time_and_segment(fleet: data.Fleet) -> None:
    result = _by_name(fleet, "grpo-resume-buggy")
    fig = charts.run_figure(result)
    trace = fig.data[1]  # the second piece: the first process after the first resume
    assert trace.x[0] == 41
    wall = trace.customdata[0]
    assert wall.startswith("2025-") and wall.endswith("UTC")
    segment = result.lineage.segments[result.lineage.piece_segments[1]].ref
    assert f"segment {segment}" in trace.hovertemplate
    assert list(trace.text[:2]) == [41, 42]  # the step, whatever the x axis shows
    assert "step %{text}" in trace.hovertemplate and "%{y" in trace.hovertemplate and "%{customdata}" in trace.hovertemplate


def _one_long_piece(n: int, drop_at: int) -> LineageResult:
    """A run logged every step for ``n`` steps whose KL is zero at exactly one step."""
    steps = np.arange(1, n + 1)
    values = 0.05 + 0.001 * np.sin(steps / 7.0)
    values[drop_at] = 0.0
    series = Series(steps, values, 1.7e9 + steps * 2.0)
    seg = Segment(kind="table", ref="big.csv", source="x", series={"kl": series})
    lin = Lineage(id="big", name="big", segments=[seg], pieces=[{"kl": series}], piece_segments=[0], kl_metric="kl")
    return LineageResult(lin, "kl", "ok")


def test_a_kl_logged_negated_is_drawn_as_the_distance_it_is() -> None:
    steps = np.arange(1, 61)
    kl = Series(steps, -0.05 * (1 - np.exp(-steps / 10.0)), 1.7e9 + steps * 2.0)
    reward = Series(steps, -0.5 + steps / 100.0, 1.7e9 + steps * 2.0)
    name = "ppo_actor/kl_rewards/avg"  # OpenRLHF logs the KL as a (negative) reward term
    seg = Segment(kind="table", ref="run.csv", source="x", series={name: kl, "reward": reward})
    lin = Lineage(id="neg", name="neg", segments=[seg], pieces=[{name: kl, "reward": reward}], piece_segments=[0],
                  kl_metric=name, kl_negated=True)
    fig = charts.run_figure(LineageResult(lin, name, "ok"), linked=["reward"])
    drawn_kl, drawn_reward = fig.data
    assert np.all(np.asarray(drawn_kl.y) >= 0) and np.max(drawn_kl.y) == pytest.approx(0.05 * (1 - np.exp(-6.0)))
    assert list(drawn_reward.y) == pytest.approx(list(reward.values))  # only the KL is flipped back
    assert fig.layout.annotations[0].text == f"−{name} (logged negated)"


def test_a_long_series_is_thinned_with_min_max_and_drawn_with_webgl_keeping_the_drop() -> None:
    n, drop = 200_000, 123_457
    fig = charts.run_figure(_one_long_piece(n, drop), max_points=2_000, webgl_above=1_000)
    (trace,) = fig.data
    assert trace.type == "scattergl"
    assert len(trace.x) <= 2_000
    x, y = np.asarray(trace.x), np.asarray(trace.y)
    assert list(x[np.abs(y) < 1e-12]) == [drop + 1]  # the one-step drop to 0 survives the thinning
    assert "min/max" in fig.layout.title.text


def test_a_long_run_thinned_to_the_panel_cap_is_drawn_as_svg() -> None:
    """WebGL is chosen by the points drawn, not the points logged: a 200,000-step run thinned to the
    default cap draws SVG lines (a WebGL context costs a browser without a GPU seconds)."""
    fig = charts.run_figure(_one_long_piece(200_000, 123_457))
    (trace,) = fig.data
    assert trace.type == "scatter"
    assert len(trace.x) <= charts.PANEL_POINTS
    assert 123_458 in set(np.asarray(trace.x).tolist())  # the one-step drop still drawn


def test_a_short_series_is_drawn_whole_as_svg(fleet: data.Fleet) -> None:
    result = _by_name(fleet, "grpo-continuous")
    fig = charts.run_figure(result)
    assert [t.type for t in fig.data] == ["scatter"]
    assert len(fig.data[0].x) == 120
    assert not [s for s in fig.layout.shapes if s.type == "line"]


def test_linked_panels_are_picked_loosely_by_kind() -> None:
    names = ["actor/pg_loss", "actor/entropy", "actor/grad_norm", "optim/lr", "critic/score/mean", "actor/kl_loss",
             "actor/pg_loss_per_token", "perf/throughput", "_runtime", "train/global_step"]
    assert charts.pick_linked_metrics(names, exclude=["actor/kl_loss"]) == [
        "actor/pg_loss", "critic/score/mean", "optim/lr", "actor/grad_norm", "actor/entropy"]
    assert charts.pick_linked_metrics(["train/kl_penalty", "perf/tokens"]) == []


def test_linked_panels_are_the_series_the_metric_families_rank_first() -> None:
    # the training curves, not the validation ones; no value-head loss, no KL coefficient, no KL
    names = ["val/loss", "train/loss", "critic/vf_loss", "eval/reward", "train/reward", "lr-Adam", "train/kl_coef",
             "kl/loss", "train/kl"]
    assert charts.pick_linked_metrics(names, exclude=["train/kl"]) == ["train/loss", "train/reward", "lr-Adam"]
    assert charts.pick_linked_metrics(["critic/vf_loss", "val/loss", "reward_std", "kl_coef"]) == []


def test_fleet_picture_puts_each_boundary_at_its_score_and_kl_ratio() -> None:
    points = pd.DataFrame([
        {"key": "a", "run": "a", "step": 41, "verdict": "reference_reset", "score": 0.99, "kl_before": 0.04,
         "kl_after": 0.001, "ratio": 0.025},
        {"key": "b", "run": "b", "step": 41, "verdict": "ok", "score": 0.01, "kl_before": 0.04, "kl_after": 0.041,
         "ratio": 1.025},
        {"key": "c", "run": "c", "step": 9, "verdict": "inconclusive", "score": 0.5, "kl_before": 0.0, "kl_after": 0.0,
         "ratio": None},
    ])
    fig = charts.fleet_figure(points, thresholds=ReferenceResetConfig())
    by_name = {t.name.split(" ")[0]: t for t in fig.data}
    assert list(by_name["reference_reset"].y) == [0.025] and list(by_name["reference_reset"].x) == [0.99]
    assert list(by_name["ok"].customdata[0][:1]) == ["b"]  # the run key, for click-to-open
    assert list(by_name["inconclusive"].y) == [1.0]  # no ratio: drawn on the 'no change' line
    cuts = sorted(s.x0 for s in fig.layout.shapes if s.type == "line" and s.x0 == s.x1)
    assert cuts == [ReferenceResetConfig().ok_score, ReferenceResetConfig().reset_score]


def test_html_export_is_self_contained(fleet: data.Fleet, tmp_path: Path) -> None:
    fig = charts.run_figure(_by_name(fleet, "grpo-resume-buggy"))
    html = charts.figure_html(fig, filename="grpo-resume-buggy")
    assert "<script src=\"http" not in html  # plotly.js is inlined: opens offline
    assert "RESET" in html and '"filename": "grpo-resume-buggy"' in html


def _many_pieces(pieces: int, length: int) -> LineageResult:
    """A run of ``pieces`` restarts of ``length`` steps each (a wrongly stitched fleet looks like this)."""
    parts, segs = [], []
    for k in range(pieces):
        steps = np.arange(k * length + 1, (k + 1) * length + 1)
        s = Series(steps, 0.05 + 0.01 * np.sin(steps / 5.0), 1.7e9 + steps * 2.0)
        parts.append({"kl": s, "loss": s})
        segs.append(Segment(kind="table", ref=f"p{k}.csv", source="x", series={"kl": s, "loss": s}))
    lin = Lineage(id="many", name="many", segments=segs, pieces=parts, piece_segments=list(range(pieces)), kl_metric="kl")
    return LineageResult(lin, "kl", "ok")


def _points_per_panel(fig) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in fig.data:
        if t.yaxis and t.x is not None and t.legendgroup != "windows":
            out[t.yaxis] = out.get(t.yaxis, 0) + len(t.x)
    return out


def test_points_are_capped_per_panel_not_per_piece_and_many_pieces_are_one_line() -> None:
    fig = charts.run_figure(_many_pieces(300, 400), linked=["loss"], max_points=1_000)
    assert _points_per_panel(fig) == {"y": pytest.approx(1_000, abs=300), "y2": pytest.approx(1_000, abs=300)}
    assert max(_points_per_panel(fig).values()) <= 1_000 + 299  # 299 gaps between the 300 pieces
    assert len([t for t in fig.data if t.legendgroup != "windows"]) == 2  # one line per panel, not 600 traces
    few = charts.run_figure(_many_pieces(5, 4_000), max_points=1_000)
    assert len(few.data) == 5 and sum(len(t.x) for t in few.data) <= 1_000  # five pieces share one panel's budget


def test_smoothing_keeps_the_raw_series_faint_and_never_smears_across_a_resume(fleet: data.Fleet) -> None:
    result = _by_name(fleet, "grpo-resume-buggy")
    fig = charts.run_figure(result, smoothing=0.9)
    raw = [t for t in fig.data if t.opacity is not None and t.opacity < 1]
    smooth = [t for t in fig.data if t.opacity == 1 and t.legendgroup != "windows"]
    assert len(raw) == len(smooth) == 3 and all(t.hoverinfo == "skip" for t in raw)
    after = smooth[1]  # the piece after the first resume starts where its own KL starts (the collapse stays visible)
    assert after.y[0] == pytest.approx(raw[1].y[0])
    assert charts.ema(np.array([1.0, 1.0, 1.0]), 0.9) == pytest.approx([1.0, 1.0, 1.0])  # debiased: no pull to 0


def test_log_y_and_the_clock_axes(fleet: data.Fleet) -> None:
    result = _by_name(fleet, "grpo-resume-buggy")
    assert charts.run_figure(result, log_y=True, linked=["train/loss"]).layout.yaxis2.type == "log"
    wall = charts.run_figure(result, x_axis="wall")
    assert wall.layout.xaxis.type == "date"
    first_after = result.lineage.pieces[1]["train/kl_penalty"]
    line = [s for s in wall.layout.shapes if s.type == "line"][0]
    assert line.x0 == pytest.approx(first_after.wall_times[0] * 1000)  # the resume where that launch was then
    rel = charts.run_figure(result, x_axis="relative")
    assert rel.data[0].x[0] == 0 and rel.layout.xaxis.title.text == "hours since the run's first point"


def test_compared_windows_stay_visible_on_a_long_run_and_are_named_in_the_legend(fleet: data.Fleet) -> None:
    result = _by_name(fleet, "grpo-resume-fixed")
    stretched = charts.run_figure(result, x_range=(-100_000, 100_000))  # as on a run 200,000 steps long
    rects = [s for s in stretched.layout.shapes if s.type == "rect"]
    assert rects and all(r.x1 - r.x0 >= 200_000 * charts.MIN_WINDOW_FRACTION - 1e-6 for r in rects)
    for v in result.verdicts:  # widened away from the boundary: before stays left of it, after right of it
        assert any(r.x1 == v.window_before[1] and r.x1 < v.boundary.step for r in rects)
        assert any(r.x0 == v.window_after[0] and r.x0 >= v.boundary.step for r in rects)
    assert [t.name for t in stretched.data if t.legendgroup == "windows"] == [
        "KL compared before the resume", "KL compared after (verdict colour)"]
    zoomed = charts.run_figure(result, x_range=(1, 100))
    assert list(zoomed.layout.xaxis.range) == [1, 100]


def test_a_control_run_is_overlaid_with_the_step_where_they_part(fleet: data.Fleet) -> None:
    from klwatch.comparison import compare_runs

    resumed, control = _by_name(fleet, "grpo-resume-buggy"), _by_name(fleet, "grpo-continuous")
    cmp = compare_runs(control, resumed, resume_step=41)
    fig = charts.run_figure(resumed, control=control, comparison=cmp)
    (overlay,) = [t for t in fig.data if t.legendgroup == "control"]
    assert overlay.name == "control: grpo-continuous" and overlay.line.dash == "dash"
    assert cmp.verdict == "parted"
    (label,) = [a for a in fig.layout.annotations if "parted at step" in (a.text or "")]
    assert label.x == cmp.part_step
    assert any(s.type == "line" and s.x0 == cmp.part_step and s.line.color == charts.PART_COLOR for s in fig.layout.shapes)


def test_every_status_reads_on_both_themes() -> None:
    def luminance(hex_color: str) -> float:
        rgb = [int(hex_color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    def contrast(a: float, b: float) -> float:
        return (max(a, b) + 0.05) / (min(a, b) + 0.05)

    backgrounds = {"light": luminance("#ffffff"), "dark": luminance("#0e1117")}  # Streamlit's page backgrounds
    for theme, background in backgrounds.items():
        for status in [s for s in charts.STATUS_COLORS if s != "inconclusive"]:  # a verdict, never a run's status
            assert contrast(luminance(charts.status_color(status, theme)), background) >= 2.5, (theme, status)
