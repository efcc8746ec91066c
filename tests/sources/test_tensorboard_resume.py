"""An event file read on from where an earlier read stopped gives what one read of the whole file gives.

The scan cache and the watcher read a growing event file only from the end of the last whole record
they had (``read_tensorboard_file_since``). Whatever the cut (between records, inside one, inside a
header), whatever the events (several values, v2 tensors whose plugin is named by an earlier event,
text configs, hparams, NaNs) and whatever follows (more records, a cut-off record, zeros, damage),
the resumed read must equal the cold read of the grown file, field for field, having read only the
new bytes.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto import summary_pb2, tensor_pb2, types_pb2

import klwatch.sources.tensorboard as tb
from klwatch.sources.local import ReadError
from segment_equality import assert_same_segment
from test_tensorboard_shapes import event, summary_value

EXAMPLES = int(os.environ.get("KLWATCH_FUZZ_EXAMPLES", "40"))


def _plugin_md(name: str) -> summary_pb2.SummaryMetadata:
    return summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=name))


def _bare_tensor(tag: str, x: float, md: summary_pb2.SummaryMetadata | None) -> summary_pb2.Summary.Value:
    """A rank-0 float tensor; TF2 writes the plugin metadata with a tag's first value only."""
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[x]))
    if md is not None:
        value.metadata.CopyFrom(md)
    return value


def write_events(path: Path, events: list, *, extra: list[tuple[int, summary_pb2.Summary]] = ()) -> None:
    """``events`` (each one Summary), then ``extra`` summaries (the inheritance cases), through the
    real tensorboardX writer (framing, CRCs, file_version record), into ``path``."""
    from tensorboardX import SummaryWriter
    from tensorboardX.proto import summary_pb2 as tbx_summary_pb2

    summaries = [(step, wall, summary_pb2.Summary(value=[v for n, (kind, tag, x) in enumerate(vals)
                                                         for v in summary_value(kind, tag, x, n)]))
                 for step, wall, vals in events]
    summaries += [(step, 1.7e9 + step, summary) for step, summary in extra]
    writer = SummaryWriter(str(path.parent), max_queue=10_000, flush_secs=3600)
    for step, wall, summary in summaries:
        writer.file_writer.add_summary(tbx_summary_pb2.Summary.FromString(summary.SerializeToString()), step, wall)
    writer.close()
    (made,) = path.parent.glob("events.out.tfevents.*")
    made.rename(path)


def inheritance_summaries(n: int) -> list[tuple[int, summary_pb2.Summary]]:
    """Tensors whose plugin only the first value names: one tag a scalar, one another plugin's
    (never a metric), each named once, early, and bare afterwards."""
    out = []
    for i in range(n):
        first = i == 0
        out.append((1000 + i, summary_pb2.Summary(value=[
            _bare_tensor("inherit/scalar", float(i), _plugin_md("scalars") if first else None),
            _bare_tensor("inherit/custom", float(-i), _plugin_md("my_custom_plugin") if first else None),
        ])))
    return out


def cold(path: Path):
    (seg,) = tb.read_tensorboard_file(path, ref=path.name, source=str(path.parent))
    return seg


def cold_or_error(path: Path):
    try:
        return cold(path), None
    except ReadError as exc:
        return None, str(exc)


def resumed(path: Path, since):
    (seg,), resume = tb.read_tensorboard_file_since(path, ref=path.name, source=str(path.parent), since=since)
    return seg, resume


def read_prefix_then_grow(path: Path, data: bytes, cut: int):
    """Read the file when it held ``data[:cut]``, let it grow to ``data``, read it on; or None when
    the prefix alone is no readable event file (nothing to resume from)."""
    path.write_bytes(data[:cut])
    try:
        _, resume = resumed(path, None)
    except ReadError:
        return None
    with open(path, "ab") as f:
        f.write(data[cut:])
    return resume


@settings(max_examples=EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=st.lists(event, min_size=1, max_size=12), cut_at=st.floats(0.0, 1.0),
       inherit=st.integers(0, 3))
def test_read_on_from_any_cut_equals_one_read_of_the_grown_file(tmp_path_factory, events, cut_at, inherit) -> None:
    folder = tmp_path_factory.mktemp("tb")
    whole = folder / "whole" / "events.out.tfevents.1700000000.host.4242.0"
    whole.parent.mkdir()
    write_events(whole, events, extra=inheritance_summaries(inherit))
    data = whole.read_bytes()
    cut = max(1, int(cut_at * len(data)))
    growing = folder / "grow" / whole.name
    growing.parent.mkdir()
    resume = read_prefix_then_grow(growing, data, cut)
    if resume is None:
        return
    assert resume.offset <= cut
    got, _ = resumed(growing, resume)
    assert_same_segment(got, cold(growing))  # the grown file holds the whole file's bytes


def test_read_on_at_every_record_boundary_and_inside_every_record(tmp_path: Path) -> None:
    events = [(s, 1.7e9 + s, [("simple", "loss", 1.0 / (s + 1)), ("v2_f32", "train/kl_penalty", 0.1 * s),
                              ("text", "", 0.0), ("simple", "nan/sometimes", math.nan if s % 3 else s)])
              for s in range(12)]
    whole = tmp_path / "whole" / "events.out.tfevents.1700000000.host.1.0"
    whole.parent.mkdir()
    write_events(whole, events, extra=inheritance_summaries(4))
    data = whole.read_bytes()
    heads, _ = tb._record_heads(data)
    cuts = sorted({h for h in heads[1:]} | {h + 5 for h in heads} | {h + 13 for h in heads} | {len(data) - 1})
    growing = tmp_path / "grow" / whole.name
    growing.parent.mkdir()
    growing.write_bytes(data)
    want = cold(growing)
    for cut in cuts:
        resume = read_prefix_then_grow(growing, data, cut)
        if resume is None:  # not one whole record before the cut: nothing to read on from
            assert cut < heads[1]
            continue
        got, again = resumed(growing, resume)
        assert_same_segment(got, want)
        assert again.offset == len(data)
        assert again.state["records"] == len(heads)
    assert "inherit/scalar" in want.series and "inherit/custom" not in want.series


def test_resumed_read_reads_only_the_new_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = [(s, 1.7e9 + s, [("simple", "loss", float(s)), ("v2_f64", "kl", 0.5 * s)]) for s in range(200)]
    whole = tmp_path / "whole" / "events.out.tfevents.1700000000.host.1.0"
    whole.parent.mkdir()
    write_events(whole, events)
    data = whole.read_bytes()
    growing = tmp_path / "grow" / whole.name
    growing.parent.mkdir()
    heads, _ = tb._record_heads(data)
    cut = heads[150]
    resume = read_prefix_then_grow(growing, data, cut)
    calls: list[tuple[int, int]] = []
    real = tb.read_regular

    def spy(path, **kw):
        got = real(path, **kw)
        calls.append((kw.get("start", 0), len(got)))
        return got

    monkeypatch.setattr(tb, "read_regular", spy)
    # damage the bytes already read: a read that looked at them again would fail its CRC check
    raw = bytearray(growing.read_bytes())
    raw[cut // 2] ^= 0xFF
    growing.write_bytes(bytes(raw))
    got, _ = resumed(growing, resume)
    assert calls == [(cut, len(data) - cut)]
    growing.write_bytes(data)
    assert_same_segment(got, cold(growing))


@pytest.mark.parametrize("tail", ["zeros", "cut_record", "garbage_then_records", "stray_bytes"])
def test_what_follows_the_resumed_point_is_judged_as_a_whole_read_judges_it(tmp_path: Path, tail: str) -> None:
    events = [(s, 1.7e9 + s, [("simple", "loss", float(s))]) for s in range(30)]
    whole = tmp_path / "whole" / "events.out.tfevents.1700000000.host.1.0"
    whole.parent.mkdir()
    write_events(whole, events)
    data = whole.read_bytes()
    heads, _ = tb._record_heads(data)
    more = {"zeros": b"\0" * 300, "cut_record": data[heads[5]:heads[6] - 3], "stray_bytes": b"\x01\x02\x03",
            "garbage_then_records": b"\x99" * 40 + data[heads[5]:heads[9]]}[tail]
    grown = data + more
    growing = tmp_path / "grow" / whole.name
    growing.parent.mkdir()
    growing.write_bytes(grown)
    want, want_error = cold_or_error(growing)
    resume = read_prefix_then_grow(growing, grown, len(data))
    if want_error is not None:
        with pytest.raises(ReadError) as err:
            resumed(growing, resume)
        assert str(err.value) == want_error
        assert tail == "garbage_then_records"
    else:
        got, _ = resumed(growing, resume)
        assert_same_segment(got, want)
        said = "damaged event file" if tail == "garbage_then_records" else "truncated event file"
        assert got.warnings and said in got.warnings[0], got.warnings


WRITER = textwrap.dedent("""
    import sys, time
    from tensorboardX import SummaryWriter
    w = SummaryWriter(sys.argv[1], flush_secs=3600)
    for step in range(int(sys.argv[2])):
        w.add_scalar("train/kl_penalty", 0.01 * step, step)
        w.add_scalar("loss", 1.0 / (step + 1), step)
        if step % 25 == 0:
            w.flush()
    w.close()
""")


def test_a_file_growing_under_a_live_writer_reads_on_as_prefixes_of_the_final_run(tmp_path: Path) -> None:
    folder = tmp_path / "live"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), "3000"])
    resume = None
    seen: list = []
    deadline = time.monotonic() + 120
    try:
        while True:
            done = proc.poll() is not None
            files = list(folder.glob("events.out.tfevents.*")) if folder.exists() else []
            if files:
                try:
                    seg, resume = resumed(files[0], resume)
                    seen.append(seg)
                except ReadError:
                    pass  # not one whole record yet
            if done:
                break
            assert time.monotonic() < deadline, "the writer did not finish"
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0
    final = cold(files[0])
    assert len(final.series["loss"]) == 3000
    got, _ = resumed(files[0], resume)
    assert_same_segment(got, final)
    for seg in seen:  # every read on the way is the run so far: a prefix of each series
        for name, ser in seg.series.items():
            n = len(ser)
            np.testing.assert_array_equal(ser.steps, final.series[name].steps[:n])
            np.testing.assert_array_equal(ser.values, final.series[name].values[:n])
