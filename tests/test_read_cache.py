"""The watcher's read cache (``klwatch.read_cache``): a poll sees a tree exactly as ``read_local``
does, re-reading only the files that changed since the last poll."""

from __future__ import annotations

from klwatch.pipeline import ScanConfig, scan
from klwatch.read_cache import LocalReadCache
from klwatch.sources.local import read_local
from tb_runs import write_run


def _shape(read):
    return sorted((s.kind, s.ref, s.error, tuple(sorted((n, tuple(v.steps), tuple(v.values)) for n, v in s.series.items())))
                  for s in read.segments), read.kinds, [e.message for e in read.errors], read.warnings


def test_cached_read_equals_read_local_and_rereads_only_changed_files(tmp_path):
    write_run(tmp_path / "a", resumes=[30], buggy=True)
    write_run(tmp_path / "b", resumes=[], buggy=False, seed=1)
    (tmp_path / "c.csv").write_text("step,kl\n1,0.01\n2,0.02\n3,0.03\n")
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "2+2?", "answer": "4"}\n')  # a dataset: skipped, warned
    cache = LocalReadCache()
    first = cache.read(str(tmp_path))
    assert _shape(first) == _shape(read_local(str(tmp_path)))
    assert first.warnings and "prompts.jsonl: skipped" in first.warnings[0]
    assert cache.stats[str(tmp_path)].read == 5 and cache.stats[str(tmp_path)].reused == 0

    again = cache.read(str(tmp_path))
    assert cache.stats[str(tmp_path)].read == 0 and cache.stats[str(tmp_path)].reused == 5
    assert _shape(again) == _shape(read_local(str(tmp_path)))

    write_run(tmp_path / "b", resumes=[], buggy=False, seed=2, start_wall=1_800_000_000.0)  # a new event file
    with open(tmp_path / "c.csv", "a") as fh:  # a table that grew
        fh.write("4,0.04\n")
    grown = cache.read(str(tmp_path))
    assert cache.stats[str(tmp_path)].read == 2 and cache.stats[str(tmp_path)].reused == 4
    assert _shape(grown) == _shape(read_local(str(tmp_path)))

    for p in (tmp_path / "a").iterdir():
        p.unlink()
    (tmp_path / "a").rmdir()
    assert _shape(cache.read(str(tmp_path))) == _shape(read_local(str(tmp_path)))


def test_a_cached_segment_is_not_changed_by_the_pipeline(tmp_path):
    write_run(tmp_path / "a", resumes=[30], buggy=True)
    cache = LocalReadCache()
    first = scan([str(tmp_path)], config=ScanConfig(), read=cache.read)
    second = scan([str(tmp_path)], config=ScanConfig(), read=cache.read)
    assert [(v.boundary.step, v.verdict) for r in first.results for v in r.verdicts] == \
           [(v.boundary.step, v.verdict) for r in second.results for v in r.verdicts] == [(31, "reference_reset")]


def test_a_missing_source_is_reported_as_read_local_reports_it(tmp_path):
    cache = LocalReadCache()
    got = cache.read(str(tmp_path / "missing"))
    assert _shape(got) == _shape(read_local(str(tmp_path / "missing")))
    assert [e.message for e in got.errors] == [f"no such file or folder: {tmp_path / 'missing'}"]
    assert cache.stats[str(tmp_path / "missing")].read == 0


def test_a_poll_reads_within_the_scan_read_limits(tmp_path, monkeypatch):
    """``--max-read-bytes`` / ``--max-read-seconds`` bound a watch poll as they bound a scan: every unit
    is read under the SOURCE's budget, and a bound passed fails that SOURCE with the flag named."""
    import klwatch.sources.local as read_path  # the watcher reads each changed unit through its read_unit
    from klwatch.sources.limits import ReadLimits, current_budget

    write_run(tmp_path / "a", resumes=[30], buggy=True)
    limits, seen = ReadLimits(max_bytes=12345, max_seconds=67.0), []
    real = read_path.read_unit

    def spy(unit, *, root, spec):
        seen.append((current_budget().limits, current_budget().what))
        return real(unit, root=root, spec=spec)

    monkeypatch.setattr(read_path, "read_unit", spy)
    got = LocalReadCache(limits=limits).read(str(tmp_path))
    assert got.errors == [] and seen and set(seen) == {(limits, str(tmp_path))}

    def over(unit, *, root, spec):
        current_budget().charge(10**6, str(unit.path))
        return real(unit, root=root, spec=spec)

    monkeypatch.setattr(read_path, "read_unit", over)
    bounded = LocalReadCache(limits=limits).read(str(tmp_path))
    assert [e.message for e in bounded.errors if "--max-read-bytes" in e.message], bounded.errors


def test_a_deep_tree_is_fingerprinted_without_recursion(tmp_path):
    """A folder ~1,500 levels deep inside a run folder: no RecursionError from the watcher's change check."""
    from klwatch.read_cache import _fingerprint
    from klwatch.sources.local import Unit

    deep = tmp_path / "wandb" / "run-1-abc"
    deep.mkdir(parents=True)
    p = deep
    for _ in range(1500):  # one level at a time: pathlib's own mkdir(parents=True) recurses
        p = p / "d"
        p.mkdir()
    (p / "x.txt").write_text("x")
    try:
        assert len(_fingerprint(Unit("wandb-offline", deep, reader=read_local))) == 1
    finally:  # pytest's own clean-up of tmp_path recurses: take the tree down level by level
        (p / "x.txt").unlink()
        while p != deep:
            p.rmdir()
            p = p.parent


GROWING_WRITER = """
import sys
from tensorboardX import SummaryWriter
w = SummaryWriter(sys.argv[1], flush_secs=3600)
for step in range(int(sys.argv[2])):
    w.add_scalar("train/kl_penalty", 0.01 + 1e-4 * step, step)
    w.add_scalar("loss", 1.0 / (step + 1), step)
    if step % 50 == 0:
        w.flush()
w.close()
"""


def test_a_poll_of_a_growing_event_file_reads_only_what_was_written_since(tmp_path, monkeypatch):
    """A writer appends to an event file while the watcher polls it: each poll reads from where the
    last one's whole records ended, so its cost follows the new bytes, not the file's length."""
    import subprocess
    import sys
    import time

    import numpy as np

    import klwatch.sources.tensorboard as tb

    reads: list[tuple[int, int]] = []
    real = tb.read_regular
    monkeypatch.setattr(tb, "read_regular", lambda p, **k: (lambda got: reads.append((k.get("start", 0), len(got)))
                                                             or got)(real(p, **k)))
    folder = tmp_path / "live"
    folder.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", GROWING_WRITER, str(folder), "6000"])
    cache, polls, deadline = LocalReadCache(), 0, time.monotonic() + 180
    try:
        while writer.poll() is None:
            assert time.monotonic() < deadline, "the writer did not finish"
            cache.read(str(folder))
            polls += 1
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.wait() == 0
    cache.read(str(folder))
    (path,) = folder.glob("events.out.tfevents.*")
    size = path.stat().st_size
    later = [r for r in reads if r[0] > 0]
    assert cache.stats[str(folder)].read_on <= len(later)
    assert len(later) >= 2, f"the file was never read on ({polls} polls, reads {reads[:5]})"
    starts = [s for s, _ in reads]
    assert starts[0] == 0 and starts == sorted(starts)  # never back to the start once read on
    # all polls together read the file about once: each only the bytes after the last whole record
    assert sum(n for _, n in reads) <= size + len(reads) * 200, (sum(n for _, n in reads), size)  # + a cut record each
    got = cache.read(str(folder)).segments[0].series
    want = read_local(str(folder)).segments[0].series
    np.testing.assert_array_equal(got["loss"].steps, want["loss"].steps)
    np.testing.assert_array_equal(got["train/kl_penalty"].values, want["train/kl_penalty"].values)
    assert len(want["loss"]) == 6000


def test_what_the_cache_keeps_is_read_only_and_its_runs_are_judged_as_a_scan_judges_them():
    """A kept read never changes (a write fails loudly), so its runs' whole-run statistics are kept beside it
    between polls (``klwatch.incremental``); a poll over every kind of sample store, the second from the
    kept statistics, reports what a scan reports."""
    from pathlib import Path

    import pytest
    from klwatch import incremental
    from klwatch.report import to_json

    samples = Path(__file__).resolve().parents[1] / "sample_runs"
    specs = [str(samples / "tensorboard"), str(samples / "mlflow" / "mlflow.db"), str(samples / "ui_csv")]
    cache, config = LocalReadCache(), ScanConfig(findings=False)
    for _ in range(2):
        watched = scan(specs, config=config, read=cache.read)
        whole = scan(specs, config=config)
        watched.generated_at = whole.generated_at
        assert to_json(watched) == to_json(whole)
    series = [s for read in map(cache.read, specs) for seg in read.segments for s in seg.series.values() if len(s) > 1]
    assert series and all(not s.steps.flags.writeable for s in series)
    assert all(incremental.step_facts(s.steps) is not None for s in series)
    with pytest.raises(ValueError):
        series[0].values[0] = 1.0
