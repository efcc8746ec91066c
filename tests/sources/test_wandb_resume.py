"""Reading a growing ``.wandb`` log on from where the last read stopped (issue 14, part 4).

One real wandb process (offline mode) writes two runs while this module reads them again and again
with ``read_wandb_run_dir_since``: a run whose rows carry non-numeric values and a 70 KB string (records
of FIRST/MIDDLE/LAST chunks across 32 KiB blocks), config updates, summary updates and removals; then a
resume of the same run id whose rows hold nested keys. Every live read must equal a whole read of the
same bytes. The finished logs are then cut at many points (every record boundary, inside records and
chunks, around block boundaries): read up to the cut, appended to, and read on, a log must read exactly
as it does whole, and the read on must have touched only the bytes after the cut.

``KLWATCH_FUZZ_EXAMPLES=N`` raises the number of random cuts (default: a few seconds' worth).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from klwatch.model import Segment
from klwatch.sources import wandb_log
from klwatch.sources.resume import Resume
from klwatch.sources.wandb_log import (BLOCK, CHUNK_HEADER, FULL, _unframe, read_wandb_run_dir,
                                       read_wandb_run_dir_since)
from segment_equality import assert_same_segment
from wandb_framing import frame_wandb_log
from wandb_offline import offline_env

EXAMPLES = int(os.environ.get("KLWATCH_FUZZ_EXAMPLES", 15))

WRITER = r"""
import json, math, os, sys, time, wandb
out = sys.argv[1]


def tell(suffix, text):  # whole or not at all: the test reads these while this process runs
    open(out + suffix + ".tmp", "w").write(text)
    os.replace(out + suffix + ".tmp", out + suffix)


run = wandb.init(project="klwatch-test", id="live1", name="live", config={"lr": 1e-6, "model": {"name": "q"}})
tell(".first", str(__import__("pathlib").Path(run.dir).parent))
for s in range(150):
    row = {"train/kl": 0.01 * s, "train/reward": math.sin(s / 7), "label": "warm" if s < 50 else "main",
           "flag": s % 3 == 0, "none": None, "big": 10 ** 20, "neg_inf": float("-inf"), "nan": float("nan")}
    if s == 60:
        row["blob"] = "x" * 70000  # a record spanning three 32 KiB blocks
    if s >= 100:
        row["eval/score"] = s / 10  # a key that first appears later
    run.log(row, step=s)
    if s == 20:
        run.summary["best"] = 1.5
    if s == 80:
        del run.summary["best"]
    if s == 120:
        run.config.update({"added_later": 3})
    if s == 130:
        run.summary.update({"best": 2.5, "note": "hi"})
    time.sleep(0.006)  # the reader polls while the log grows
run.finish()
time.sleep(1.05 - time.time() % 1)  # folders are named by the second: never reuse one
run = wandb.init(project="klwatch-test", id="live1", name="live", resume="allow")
tell(".second", str(__import__("pathlib").Path(run.dir).parent))
for s in range(240, 300):
    run.log({"train": {"kl": 0.5 * s, "deep": {"x": s - 2}}, "train/reward": math.cos(s), "text": "abc"}, step=s)
    if s == 270:
        run.summary["after_resume"] = s
    time.sleep(0.004)
run.finish()
tell(".done", "done")
"""


@dataclasses.dataclass
class Poll:
    """One live read: its Segment and Resume, and how much of the log it had."""

    segment: Segment
    resume: Resume | None
    reads: list[tuple[int, int]]
    """Where each read of the log started, and how many bytes it got."""


@dataclasses.dataclass
class LiveRuns:
    folders: dict[str, Path]
    polls: dict[str, list[Poll]]


def _wait_for(path: Path, proc: subprocess.Popen, deadline: float) -> None:
    """Until ``path`` exists (the writer names each run folder once it has one)."""
    while not path.exists():
        if proc.poll() is not None and not path.exists():
            raise AssertionError(f"the wandb writer exited ({proc.returncode}) before writing {path.name}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, f"no {path.name} in time"
        try:
            proc.wait(timeout=0.02)
        except subprocess.TimeoutExpired:
            pass


def _poll_until(folder: Path, done: Path, proc: subprocess.Popen, deadline: float, reads: Reads) -> list[Poll]:
    """Read the run folder on and on (``since`` = the last Resume) until ``done`` appears, then once more."""
    polls: list[Poll] = []
    since: Resume | None = None
    while True:
        finished = done.exists()
        if next(folder.glob("*.wandb"), None) is not None:
            reads.calls.clear()
            [seg], since = read_wandb_run_dir_since(folder, ref="r", source="s", since=since)
            polls.append(Poll(seg, since, list(reads.calls)))
        if finished:
            return polls
        assert time.monotonic() < deadline, "the wandb writer did not finish in time"
        try:
            proc.wait(timeout=0.1)  # paces the reads: a few dozen per run
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> LiveRuns:
    """Two runs written by one real wandb process, each read on and on while it is written."""
    root = tmp_path_factory.mktemp("wandb-live")
    script = root / "writer.py"
    script.write_text(WRITER)
    env = offline_env(root)
    out = root / "names"
    proc = subprocess.Popen([sys.executable, str(script), str(out)], env=env, cwd=root, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 180
    patch = pytest.MonkeyPatch()
    try:
        reads = Reads(patch)
        folders, polls = {}, {}
        for label, done in (("first", ".second"), ("second", ".done")):
            name = out.with_name(out.name + f".{label}")
            _wait_for(name, proc, deadline)
            folders[label] = Path(name.read_text())
            polls[label] = _poll_until(folders[label], out.with_name(out.name + done), proc, deadline, reads)
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0
    finally:
        patch.undo()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return LiveRuns(folders, polls)


def _log(folder: Path) -> Path:
    return next(folder.glob("*.wandb"))


def _cold(folder: Path) -> Segment:
    [seg] = read_wandb_run_dir(folder, ref="r", source="s")
    return seg


def _same_as_copy(got: Segment, want: Segment) -> None:
    """``assert_same_segment`` of reads of two copies of a log (``store`` names the folder a log is in),
    and their dicts' keys in the same order (a JSON dump of either is the same)."""
    assert_same_segment(got, dataclasses.replace(want, store=got.store))
    assert list(got.meta) == list(want.meta) and list(got.config) == list(want.config)
    assert list(got.meta["summary"]) == list(want.meta["summary"]), "summary keys in another order"


def _with_log(tmp: Path, folder: Path, data: bytes) -> Path:
    """A copy of the run folder whose log holds ``data``."""
    copy = tmp / folder.name
    copy.mkdir(parents=True, exist_ok=True)
    (copy / _log(folder).name).write_bytes(data)
    return copy


def test_each_live_read_equals_a_whole_read_of_the_same_bytes(live: LiveRuns, tmp_path: Path) -> None:
    """While wandb writes, every read on from the last one gives what a whole read of the bytes it saw
    gives (the log only grows: the bytes it saw are the finished log's first ``log_bytes``), its
    Resume's Segment what a whole read of the bytes before its offset gives, and the series of each
    read are a prefix of the finished run's."""
    for label, folder in live.folders.items():
        polls = live.polls[label]
        assert len(polls) >= 3, f"{label}: too few reads while the run was written"
        data = _log(folder).read_bytes()
        final = _cold(folder)
        assert_same_segment(polls[-1].segment, final)
        for i, poll in enumerate(polls):
            size = poll.segment.meta["log_bytes"]
            _same_as_copy(poll.segment, _cold(_with_log(tmp_path / f"{label}{i}", folder, data[:size])))
            assert poll.resume is not None and poll.resume.offset <= size
            _same_as_copy(poll.resume.segment,
                          _cold(_with_log(tmp_path / f"{label}{i}r", folder, data[:poll.resume.offset])))
            if i:  # read on from the last read: only the bytes after its offset
                _assert_read_on(poll.reads, polls[i - 1].resume, size, _run_start(data))
            for key, s in poll.segment.series.items():
                n = len(s.steps)
                assert s.steps.tolist() == final.series[key].steps[:n].tolist()
                assert s.values.tobytes() == final.series[key].values[:n].tobytes()


def test_the_live_runs_hold_what_resuming_must_carry_over(live: LiveRuns) -> None:
    """The written runs exercise the carried state: config updated later, a summary key removed and
    set again, non-numeric values skipped, a key first logged late, multi-chunk records, a resumed
    process whose rows hold nested keys (items read the slower way)."""
    first, second = _cold(live.folders["first"]), _cold(live.folders["second"])
    assert first.warnings == [] and second.warnings == []
    assert first.config == {"lr": 1e-6, "model": {"name": "q"}, "added_later": 3}
    assert first.meta["summary"]["best"] == pytest.approx(2.5) and first.meta["summary"]["note"] == "hi"
    assert "label" not in first.series and "flag" not in first.series and len(first.series["eval/score"]) == 50
    assert second.meta["resumed"] is True and second.series["train.deep.x"].steps.tolist() == list(range(240, 300))
    assert second.meta["summary"]["after_resume"] == 270
    data = _log(live.folders["first"]).read_bytes()
    kinds = {data[at + 6] for at in _chunk_starts(data)}
    assert kinds >= {1, 2, 3, 4}, "no record spans blocks"
    assert any(p.resume is not None and p.resume.state["removed"] for p in live.polls["first"])


def _chunk_starts(data: bytes) -> Iterator[int]:
    """Where each chunk of a well-formed log begins."""
    pos = 7
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:
            pos += BLOCK - pos % BLOCK
            continue
        yield pos
        pos += CHUNK_HEADER + struct.unpack_from("<H", data, pos + 4)[0]


def _record_bounds(data: bytes) -> list[int]:
    """Every byte at which a record begins, and the end of the last one."""
    framed = _unframe(data, "log")
    return [*framed.offsets, framed.last_end]


def _run_start(data: bytes) -> int:
    """Where a log's second history record ends: before it, wandb-core's first runtime record may
    still be the one that places ``_runtime`` in the summary, and it comes again (identical) until
    the runtime's first second is over. A whole read places the key by the record's last copy, so
    a read on from there reads the whole log (the only time a read on of a sound log does)."""
    framed = _unframe(data, "log")
    rows = [i for i, r in enumerate(framed.out) if wandb_log._msg("Batch").FromString(r).history]
    return _record_bounds(data)[rows[1] + 1] if len(rows) > 1 else len(data)


def _assert_read_on(calls: list[tuple[int, int]], since: Resume, size: int, run_start: int) -> None:
    """A read on from ``since`` read only the bytes after its offset (or, in a run's first moments,
    see ``_run_start``, those and then the whole log)."""
    on = (since.offset, size - since.offset)
    assert calls == [on] or (since.offset < run_start and calls == [on, (0, size)]), \
        f"a read on from byte {since.offset} read {calls}"


class Reads:
    """``read_regular`` as the reader calls it, recorded: where each read of the log starts and how much
    it returns (the proof that a read on touches only the new bytes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int]] = []
        real = wandb_log.read_regular

        def recorded(path: Path, **kw) -> bytes:
            got = real(path, **kw)
            self.calls.append((kw.get("start", 0), len(got)))
            return got

        monkeypatch.setattr(wandb_log, "read_regular", recorded)


def _check_resume(folder: Path, data: bytes, cuts: list[int], whole: Segment, reads: Reads, tmp: Path) -> None:
    """Write ``data`` up to each cut in turn, reading on from the last read each time: each read on
    reads only from the last offset (``_assert_read_on``), and the last read gives exactly the
    whole read."""
    copy = _with_log(tmp, folder, b"")
    log = copy / _log(folder).name
    since: Resume | None = None
    for cut in [*cuts, len(data)]:
        log.write_bytes(data[:cut])
        reads.calls.clear()
        [seg], resume = read_wandb_run_dir_since(copy, ref="r", source="s", since=since)
        if since is not None:
            _assert_read_on(reads.calls, since, cut, _run_start(data))
        assert resume is not None
        json.dumps(resume.state, allow_nan=False)  # plain JSON, persisted by the scan cache
        since = Resume(resume.file, resume.offset, resume.segment, json.loads(json.dumps(resume.state)))
    _same_as_copy(seg, whole)


@pytest.mark.parametrize("label", ["first", "second"])
def test_reading_on_from_every_record_boundary_equals_the_whole_read(
        live: LiveRuns, label: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = live.folders[label]
    data = _log(folder).read_bytes()
    whole = _cold(folder)
    reads = Reads(monkeypatch)
    bounds = _record_bounds(data)
    step = 4 if label == "second" else 16  # the hypothesis test below takes any cut
    for k, cut in enumerate(bounds[::step]):
        _check_resume(folder, data, [cut], whole, reads, tmp_path / f"b{k}")
    for k, cut in enumerate(bounds[3::step]):  # read on twice: from a boundary, then from one further on
        later = bounds[min(len(bounds) - 1, bounds.index(cut) + 5)]
        _check_resume(folder, data, [cut, later], whole, reads, tmp_path / f"c{k}")


def _block_cuts(data: bytes) -> list[int]:
    """Cuts at and around each 32 KiB block boundary, and inside the chunks of records spanning blocks."""
    cuts = []
    for b in range(BLOCK, len(data), BLOCK):
        cuts += [b - 8, b - 7, b - 6, b - 1, b, b + 1, b + 6, b + 7, b + 8, b + 100]
    for at in _chunk_starts(data):
        if data[at + 6] != FULL:
            cuts += [at, at + 3, at + CHUNK_HEADER, at + CHUNK_HEADER + 1000]
    return sorted({c for c in cuts if 7 <= c <= len(data)})


def test_reading_on_from_cuts_around_block_boundaries_and_inside_spanning_records(
        live: LiveRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = live.folders["first"]
    data = _log(folder).read_bytes()
    whole = _cold(folder)
    reads = Reads(monkeypatch)
    cuts = _block_cuts(data)
    assert len(cuts) > 40
    for k, cut in enumerate(cuts):
        _check_resume(folder, data, [cut], whole, reads, tmp_path / f"k{k}")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(label=st.sampled_from(["first", "second"]), data=st.data())
def test_reading_on_through_any_cuts_equals_the_whole_read(
        live: LiveRuns, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        label: str, data: st.DataObject) -> None:
    """Cuts anywhere (inside chunk headers, payloads, padding), one to three reads on in a row."""
    folder = live.folders[label]
    log = _log(folder).read_bytes()
    cuts = sorted(data.draw(st.lists(st.integers(7, len(log)), min_size=1, max_size=3)))
    _check_resume(folder, log, cuts, _cold(folder), Reads(monkeypatch), tmp_path_factory.mktemp("cuts"))


def test_a_read_on_never_looks_at_the_bytes_before_its_offset(live: LiveRuns, tmp_path: Path) -> None:
    """Overwrite every byte before the offset with garbage once the first read is done: the read on
    still gives the whole read of the intact log."""
    folder = live.folders["first"]
    data = _log(folder).read_bytes()
    whole = _cold(folder)
    cut = len(data) * 2 // 3
    copy = _with_log(tmp_path, folder, data[:cut])
    [_], resume = read_wandb_run_dir_since(copy, ref="r", source="s", since=None)
    assert resume is not None and resume.offset > BLOCK
    (copy / _log(folder).name).write_bytes(b"\xa5" * resume.offset + data[resume.offset:])
    [seg], _ = read_wandb_run_dir_since(copy, ref="r", source="s", since=resume)
    _same_as_copy(seg, whole)


def test_a_cut_short_record_warns_in_the_read_but_not_in_its_resume(live: LiveRuns, tmp_path: Path) -> None:
    folder = live.folders["second"]
    data = _log(folder).read_bytes()
    bounds = _record_bounds(data)
    cut = bounds[len(bounds) // 2] + 20
    copy = _with_log(tmp_path, folder, data[:cut])
    [seg], resume = read_wandb_run_dir_since(copy, ref="r", source="s", since=None)
    assert any("cut short" in w for w in seg.warnings)
    assert resume is not None and resume.offset == bounds[len(bounds) // 2]
    assert not any("cut short" in w for w in resume.segment.warnings)
    assert resume.segment.meta["log_bytes"] == resume.offset and seg.meta["log_bytes"] == cut


def test_a_read_on_that_ends_inside_a_record_counts_the_records_as_a_whole_read_does(
        live: LiveRuns, tmp_path: Path) -> None:
    """A watcher's poll that catches the log mid-record says how many whole records it read: all of them,
    those before the last read's offset too (a first read drops its records once decoded, not their count)."""
    folder = live.folders["second"]
    data = _log(folder).read_bytes()
    bounds = _record_bounds(data)
    first, later = bounds[len(bounds) // 3], bounds[2 * len(bounds) // 3] + 20
    copy = _with_log(tmp_path, folder, data[:first])
    [_], resume = read_wandb_run_dir_since(copy, ref="r", source="s", since=None)
    (copy / _log(folder).name).write_bytes(data[:later])
    [on], _ = read_wandb_run_dir_since(copy, ref="r", source="s", since=resume)
    [whole], _ = read_wandb_run_dir_since(copy, ref="r", source="s", since=None)
    said = [w for w in whole.warnings if "cut short" in w]
    assert said and f"read the {bounds.index(later - 20)} whole records" in said[0]
    assert on.warnings == whole.warnings


def _fix_crcs(data: bytes) -> bytes:
    out = bytearray(data)
    for at in _chunk_starts(data):
        length, ctype = struct.unpack_from("<HB", out, at + 4)
        struct.pack_into("<I", out, at, zlib.crc32(bytes(out[at + 7:at + 7 + length]), zlib.crc32(bytes([ctype]))))
    return bytes(out)


def test_damage_after_the_offset_is_read_as_a_whole_read_reads_it(live: LiveRuns, tmp_path: Path) -> None:
    """A corrupt chunk, and a record with a good CRC that does not decode, in the new bytes: the read
    on gives what a whole read gives (the latter by reading the whole log again), with no Resume for
    contents read as damaged."""
    folder = live.folders["first"]
    data = _log(folder).read_bytes()
    cut = next(b for b in _record_bounds(data) if b > BLOCK)
    at = next(a for a in _chunk_starts(data) if a > cut + 1000 and data[a + 6] == FULL) + CHUNK_HEADER
    assert at // BLOCK < (len(data) - 1) // BLOCK  # a later block to skip to
    flipped = data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1:]
    undecodable = data[:at] + b"\x0f" + data[at + 1:]  # a field of wire type 7: no protobuf parses it
    for k, damaged in enumerate([flipped, _fix_crcs(undecodable)]):
        copy = _with_log(tmp_path / str(k), folder, data[:cut])
        [_], resume = read_wandb_run_dir_since(copy, ref="r", source="s", since=None)
        (copy / _log(folder).name).write_bytes(damaged)
        [seg], after = read_wandb_run_dir_since(copy, ref="r", source="s", since=resume)
        assert_same_segment(seg, _cold(copy))
        assert seg.warnings, "the damage went unnoticed"
        assert (after is None) == (k == 1)  # contents read as damaged: the next read reads it whole


def test_a_resume_of_another_log_or_past_the_end_reads_the_whole_log(live: LiveRuns, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = live.folders["first"], live.folders["second"]
    [_], other = read_wandb_run_dir_since(second, ref="r", source="s", since=None)
    [_], own = read_wandb_run_dir_since(first, ref="r", source="s", since=None)
    assert other is not None and own is not None
    short = _with_log(tmp_path, first, _log(first).read_bytes()[:own.offset // 2])
    stale = dataclasses.replace(own, file=os.path.abspath(_log(short)))
    old_version = dataclasses.replace(own, state={**own.state, "version": -1})
    reads = Reads(monkeypatch)
    for folder, since in ((first, other), (short, stale), (first, old_version)):
        reads.calls.clear()
        [seg], _ = read_wandb_run_dir_since(folder, ref="r", source="s", since=since)
        assert reads.calls[-1][0] == 0, "read on from a Resume that does not fit the log"
        [want], _ = read_wandb_run_dir_since(folder, ref="r", source="s", since=None)
        assert_same_segment(seg, want)


def test_framed_records_spanning_many_blocks_read_on_from_any_boundary(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-framed history rows of every size up to several blocks (FIRST, MIDDLE..., LAST chunks),
    typed and keyed items (the older layouts), cut at every record boundary."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = [pb.Record(run=pb.RunRecord(run_id="span1", display_name="span")).SerializeToString()]
    for step, size in enumerate([10, 33000, 5, 100000, 7, 32750, 32761, 1, 70000, 3]):
        h = pb.HistoryRecord()
        h.item.add(nested_key=["_step"], value_json=str(step))
        h.item.add(nested_key=["kl"], value_json=repr(0.5 * step))
        h.item.add(nested_key=["pad"], value_json=json.dumps("p" * size))
        records.append(pb.Record(history=h).SerializeToString())
        s = pb.SummaryRecord()
        s.update.add(key="kl", value_json=repr(0.5 * step))
        records.append(pb.Record(summary=s).SerializeToString())
    data = frame_wandb_log(records)
    folder = tmp_path / "whole" / "run-20260101_000000-span1"
    folder.mkdir(parents=True)
    (folder / "run-span1.wandb").write_bytes(data)
    whole = _cold(folder)
    assert whole.series["kl"].steps.tolist() == list(range(10)) and whole.meta["summary"] == {"kl": 4.5}
    reads = Reads(monkeypatch)
    for k, cut in enumerate(_record_bounds(data)):
        _check_resume(folder, data, [cut], whole, reads, tmp_path / f"s{k}")


def test_a_copy_of_the_finished_logs_reads_on_with_no_change(live: LiveRuns, tmp_path: Path) -> None:
    """Nothing appended: the read on reads no record and gives the same Segment and offset."""
    for label, folder in live.folders.items():
        copy = tmp_path / label
        shutil.copytree(folder, copy / folder.name)
        run = copy / folder.name
        [seg], resume = read_wandb_run_dir_since(run, ref="r", source="s", since=None)
        [again], resume2 = read_wandb_run_dir_since(run, ref="r", source="s", since=resume)
        assert_same_segment(again, seg)
        assert resume is not None and resume2 is not None and resume2.offset == resume.offset


def test_items_read_one_by_one_give_no_resume_and_the_next_read_is_whole(tmp_path: Path) -> None:
    """Typed history values (the pre-core writer) are read item by item, which places their keys
    after all others: a read on could not know where, so there is no Resume to go on from."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = [pb.Record(run=pb.RunRecord(run_id="typed1")).SerializeToString()]
    for step in range(3):
        h = pb.HistoryRecord()
        h.item.add(nested_key=["_step"], value_json=str(step))
        h.item.add(nested_key=["t"], number=0.25 * step)
        records.append(pb.Record(history=h).SerializeToString())
    folder = tmp_path / "run-20260101_000000-typed1"
    folder.mkdir()
    (folder / "run-typed1.wandb").write_bytes(frame_wandb_log(records))
    [seg], resume = read_wandb_run_dir_since(folder, ref="r", source="s", since=None)
    assert resume is None and seg.series["t"].values.tolist() == [0.0, 0.25, 0.5]
    assert_same_segment(seg, _cold(folder))
