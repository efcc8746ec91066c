"""A scan's memory flat in the fleet's size (issue 26, item 1): stitching on summaries, runs built and
judged one at a time, only what the reports read kept. Proved by behaviour, never by measuring RSS
(``benchmarks/bench_memory.py`` measures it)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from klwatch.fleet_memory import SegmentStore, StepSummary, keep_for_reports, summarize
from klwatch.model import Lineage, LineageResult, Series, cadence_of
from klwatch.parallel import Execution
from klwatch.pipeline import (ScanConfig, judge_kept, judge_reads, keep_pieces, on_step_axis, read_kept, read_sources,
                              scan, stitch_summaries)
from klwatch.report import to_json
from klwatch.sources import read_source
from klwatch.stitching import stitch

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


def _report(result: object) -> str:
    result.generated_at = "-"  # type: ignore[attr-defined]
    return to_json(result)  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [
    [1, 2, 3, 4, 5, 6],
    [5, 10, 15, 12, 13, 14, 30, 30, 31],  # a rewind, a repeated step
    [7],
    [],
    [0, 2**40, -3, 2**40 + 1],
])
def test_a_step_summary_gives_back_the_very_steps_and_the_clock_stitching_reads(steps):
    walls = np.array([100.0 + 3 * ((k * 7) % 5) for k in range(len(steps))])
    if len(walls) > 2:
        walls[1] = np.nan
    s = Series(np.array(steps, dtype=np.int64), np.arange(len(steps), dtype=float), walls)
    summary = StepSummary(s)
    assert len(summary) == len(s)
    assert summary.steps.dtype == np.int64 and summary.steps.tolist() == list(steps)
    if len(s):  # what stitching reads of the clock: the first, the lowest and the highest wall time
        assert summary.wall_times[0] == pytest.approx(walls[0])
        assert np.isnan(summary.wall_times.min()) == np.isnan(walls.min())
        assert np.isnan(summary.wall_times.max()) == np.isnan(walls.max())
    assert not hasattr(summary, "values")


def test_a_regularly_logged_series_is_summarized_in_a_few_bytes_whatever_its_length():
    long = Series(np.arange(1, 1_000_001), np.zeros(1_000_000), np.arange(1_000_000, dtype=float))
    summary = StepSummary(long)
    assert len(summary.__getstate__()[1]) <= 8 * (2 + 3 + 2)  # first step, clock, one run: (1, 999,999)
    assert summary.steps[-1] == 1_000_000


def _sample_segments() -> list:
    read = read_source(str(SAMPLES))
    assert read.segments, "sample_runs/ holds runs"
    return [on_step_axis(s) for s in read.segments]


def test_stitching_the_summaries_groups_the_sample_runs_as_stitching_the_whole_pieces():
    whole = _sample_segments()
    summaries = [summarize(s) for s in whole]
    index = {id(s): k for k, s in enumerate(whole)} | {id(s): k for k, s in enumerate(summaries)}
    notes_whole: dict[int, list[str]] = {}
    notes_summary: dict[int, list[str]] = {}
    by_whole = stitch(whole, notes=notes_whole)
    by_summary = stitch(summaries, notes=notes_summary)
    assert [(lid, name, [index[id(s)] for s in segs]) for lid, name, segs in by_summary] == \
        [(lid, name, [index[id(s)] for s in segs]) for lid, name, segs in by_whole]
    assert {index[k]: v for k, v in notes_summary.items()} == {index[k]: v for k, v in notes_whole.items()}
    for w, s in zip(whole, summaries):  # and what the report reads of each member
        assert s.extent() == w.extent() and s.step_range() == w.step_range()
        assert s.first_wall_time() == w.first_wall_time()
        assert cadence_of(s.series) == cadence_of(w.series)


def test_a_thinned_scan_reports_byte_for_byte_what_a_scan_keeping_every_series_reports():
    full = scan([str(SAMPLES)])
    lean = scan([str(SAMPLES)], config=ScanConfig(chart_points=16))
    assert _report(lean) == _report(full)


def test_after_a_thinned_scan_each_run_holds_only_its_kl_thinned_and_its_members_summaries():
    result = scan([str(SAMPLES)], config=ScanConfig(chart_points=16))
    assert result.results
    for r in result.results:
        lin = r.lineage
        assert all(isinstance(s, StepSummary) for seg in lin.segments for s in seg.series.values())
        assert all(isinstance(s, StepSummary) for read in result.sources for seg in read.segments
                   for s in seg.series.values())
        for piece in lin.pieces:
            assert set(piece) <= {lin.kl_metric}
            if r.status != "reference_reset":
                assert all(len(s) <= 16 for s in piece.values())


def test_a_run_with_a_reset_keeps_its_kl_whole_for_the_ci_sparkline_and_others_thin_it():
    full = scan([str(SAMPLES / "tensorboard")])
    reset = next(r for r in full.results if any(v.verdict == "reference_reset" for v in r.verdicts))
    ok = next(r for r in full.results if r.status == "ok" and r.lineage.kl_metric
              and sum(len(p[r.lineage.kl_metric]) for p in r.lineage.pieces if r.lineage.kl_metric in p) > 8)
    kept_reset = keep_for_reports(reset, points=4)
    assert [len(s) for s in kept_reset.lineage.kl_pieces() if s is not None] == \
        [len(s) for s in reset.lineage.kl_pieces() if s is not None]
    kept_ok = keep_for_reports(ok, points=4)
    thin = [s for s in kept_ok.lineage.kl_pieces() if s is not None]
    assert thin and all(len(s) <= 4 for s in thin)
    for whole, s in zip([s for s in ok.lineage.kl_pieces() if s is not None], thin):  # min and max survive
        assert s.values.min() == whole.values.min() and s.values.max() == whole.values.max()


def test_each_run_is_built_and_judged_before_the_next_is_built_and_its_series_then_released():
    config = ScanConfig(chart_points=16)
    alive_when_next_came: list[int] = []
    results: list[LineageResult] = []

    def judge_watching(lineages: Iterable[Lineage]) -> Iterator[LineageResult]:
        earlier: list[weakref.ref] = []
        for lin in lineages:
            gc.collect()
            alive_when_next_came.append(sum(ref() is not None for ref in earlier))
            earlier = [weakref.ref(s) for series in [*lin.pieces, *(seg.series for seg in lin.segments)]
                       for name, s in series.items() if name != lin.kl_metric]  # a reset's KL is kept whole
            result = judge_kept(lin, config=config)
            results.append(result)
            yield result

    with SegmentStore.spilled() as store:
        reads = read_sources([str(SAMPLES / "tensorboard")],
                             read=lambda spec: read_kept(spec, limits=config.limits, read_unit=None, store=store))
        judged = judge_reads(reads, config=config, judge=judge_watching, store=store)
    assert len(alive_when_next_came) == len(judged.results) > 3
    assert alive_when_next_came == [0] * len(alive_when_next_came)  # the run before was let go of whole


def test_the_pieces_wait_on_disk_and_come_back_whole():
    read = read_source(str(SAMPLES / "tensorboard"))
    with SegmentStore.spilled() as store:
        summaries = keep_pieces(store, read.segments)
        assert store.directory is not None and len(list(store.directory.iterdir())) == len(read.segments)
        for original, summary in zip(read.segments, summaries):
            back = store.take(summary)
            assert back.ref == original.ref and back.series.keys() == on_step_axis(original).series.keys()
            for name, s in on_step_axis(original).series.items():
                assert np.array_equal(back.series[name].steps, s.steps)
                assert np.array_equal(back.series[name].values, s.values, equal_nan=True)
        folder = store.directory
    assert not folder.exists()


def test_a_store_in_memory_stitches_on_the_pieces_themselves_and_copies_none_of_their_steps():
    """Reads held in memory anyway (the watcher's cache, the dashboard's) gain nothing from a summary, and a
    watched run keeps its whole-run facts only on its own arrays (``klwatch.incremental``)."""
    read = read_source(str(SAMPLES / "tensorboard"))
    store = SegmentStore.in_memory()
    kept = keep_pieces(store, read.segments)
    assert all(isinstance(series, Series) for k in kept for series in k.series.values())  # no summary made
    assert all(k is s for k, s in zip(kept, read.segments) if "step_axis" not in k.meta)  # the read's own pieces
    assert all(store.take(k) is k for k in kept)


def test_stitch_summaries_notes_every_join_on_its_group():
    whole = _sample_segments()
    groups = stitch_summaries(SegmentStore.in_memory().keep(whole), config=ScanConfig())
    assert sum(len(g.segments) for g in groups) >= len(whole)
    assert any(g.notes for g in groups)


def test_a_thinned_scan_on_a_process_pool_reports_and_keeps_what_one_process_does():
    config = ScanConfig(chart_points=16)
    here = scan([str(SAMPLES / "tensorboard")], config=config)
    pool = scan([str(SAMPLES / "tensorboard")], config=ScanConfig(chart_points=16, execution=Execution(
        jobs=2, pool_min_units=1, pool_min_bytes=1, pool_min_lineages=1)))
    assert _report(pool) == _report(here)
    assert [[len(s) for p in r.lineage.pieces for s in p.values()] for r in pool.results] == \
        [[len(s) for p in r.lineage.pieces for s in p.values()] for r in here.results]


def test_a_summarys_series_answer_by_name_as_the_pieces_series_do():
    whole = _sample_segments()
    for seg in whole:
        summary = summarize(seg)
        assert list(summary.series) == list(seg.series) and len(summary.series) == len(seg.series)
        for name, s in seg.series.items():
            assert name in summary.series
            assert summary.series[name].steps.tolist() == s.steps.tolist() and len(summary.series.get(name)) == len(s)
        assert "no such series" not in summary.series and summary.series.get("no such series") is None
        with pytest.raises(KeyError):
            summary.series["no such series"]


def test_a_thinned_scan_result_comes_back_from_a_pickle_reporting_the_same_for_the_scan_cache():
    import pickle

    result = scan([str(SAMPLES)], config=ScanConfig(chart_points=16))
    back = pickle.loads(pickle.dumps(result))
    assert _report(back) == _report(result)
    empty = next(s for r in back.results for s in r.lineage.segments if not s.config)
    with pytest.raises(TypeError):  # a summary's shared empty config stays read-only through a pickle
        empty.config["lr"] = 1.0
