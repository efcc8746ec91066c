"""The TensorBoard reader: every point back exactly, in file order, from real writers' files."""

from __future__ import annotations

import json
import math
import re
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from klwatch.sources import read_source
from klwatch.sources.local import ReadError
from klwatch.sources.tensorboard import read_tensorboard_file

T0 = 1_780_000_000.0


def read_one(path: Path, root: Path):
    (seg,) = read_tensorboard_file(path, ref=str(path.relative_to(root)), source=str(root))
    return seg


def as_written(points: list[tuple[str, int, float, float]]) -> dict[str, tuple[list, list, list]]:
    """What a reader must give back: per tag, in order, values rounded to float32 as both writers store."""
    out: dict[str, tuple[list, list, list]] = {}
    for tag, step, value, wall in points:
        steps, values, walls = out.setdefault(tag, ([], [], []))
        steps.append(step)
        values.append(float(np.float32(value)))
        walls.append(wall)
    return out


def assert_same(seg, expected: dict[str, tuple[list, list, list]]) -> None:
    assert list(seg.series) == list(expected)
    for tag, (steps, values, walls) in expected.items():
        s = seg.series[tag]
        assert s.steps.tolist() == steps
        assert s.values.tolist() == values
        assert s.wall_times is not None and s.wall_times.tolist() == walls


def write_events(folder: Path, events: list[event_pb2.Event]) -> Path:
    """Hand-built Events through TensorBoard's own EventFileWriter (framing, CRCs, file_version)."""
    writer = EventFileWriter(str(folder))
    for ev in events:
        writer.add_event(ev)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def scalar_event(tag: str, step: int, wall: float, tensor: tensor_pb2.TensorProto,
                 metadata: summary_pb2.SummaryMetadata | None = None) -> event_pb2.Event:
    ev = event_pb2.Event(step=step, wall_time=wall)
    value = ev.summary.value.add(tag=tag, tensor=tensor)
    if metadata is not None:
        value.metadata.CopyFrom(metadata)
    return ev


SCALARS_MD = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


def test_both_scalar_kinds_come_back_exactly_in_file_order(tmp_path: Path, scalar_writer) -> None:
    points = [("train/kl_penalty", 1, 0.25, T0), ("loss", 1, 3.5, T0 + 0.5),
              ("train/kl_penalty", 2, 0.125, T0 + 1), ("train/kl_penalty", 2, 0.5, T0 + 2),
              ("loss", 0, -1e30, T0 + 3), ("train/kl_penalty", -7, 1e-40, T0 + 4)]
    path = scalar_writer(tmp_path / "run", points)
    seg = read_one(path, tmp_path)
    assert_same(seg, as_written(points))
    assert seg.kind == "tensorboard" and seg.error is None and seg.warnings == []


settings_fast = settings(max_examples=40, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture])
TAGS = ["kl", "train/kl_penalty", "ünï/cödé", "x" * 150]  # the long tag takes the protobuf path
point = st.tuples(st.sampled_from(TAGS), st.integers(-(2**40), 2**62),
                  st.floats(width=32, allow_nan=False, allow_infinity=False),
                  st.floats(0, 4e9, allow_nan=False))


@settings_fast
@given(points=st.lists(point, min_size=1, max_size=60))
def test_any_scalars_written_come_back_identical(tmp_path: Path, scalar_writer, points) -> None:
    """Repeated, decreasing, negative and huge steps; any float32; several tags interleaved."""
    folder = tmp_path / uuid.uuid4().hex
    path = scalar_writer(folder, points)
    assert_same(read_one(path, tmp_path), as_written(points))


def test_double_int_and_tensor_content_scalars_are_read(tmp_path: Path) -> None:
    content = tensor_pb2.TensorProto(dtype=1, tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                     tensor_content=np.float32(0.75).tobytes())
    half = tensor_pb2.TensorProto(dtype=19, tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                  half_val=[int(np.float16(1.5).view(np.uint16))])
    events = [
        scalar_event("d", 1, T0, tensor_util.make_tensor_proto(np.float64(0.1)), SCALARS_MD),
        scalar_event("d", 2, T0 + 1, tensor_util.make_tensor_proto(np.float64(0.2))),  # no metadata
        scalar_event("i", 3, T0 + 2, tensor_util.make_tensor_proto(np.int64(2**40)), SCALARS_MD),
        scalar_event("c", 4, T0 + 3, content, SCALARS_MD),
        scalar_event("h", 5, T0 + 4, half, SCALARS_MD),
        # legacy v2 scalar: a rank-0 float tensor with no plugin metadata at all
        scalar_event("legacy", 6, T0 + 5, tensor_util.make_tensor_proto(np.float32(4.0))),
    ]
    seg = read_one(write_events(tmp_path, events), tmp_path)
    got = {tag: (s.steps.tolist(), s.values.tolist()) for tag, s in seg.series.items()}
    assert got == {"d": ([1, 2], [0.1, 0.2]), "i": ([3], [2.0**40]), "c": ([4], [0.75]),
                   "h": ([5], [1.5]), "legacy": ([6], [4.0])}


def test_non_scalar_plugins_and_tensors_are_not_series(tmp_path: Path) -> None:
    hist_md = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="histograms"))
    events = [
        scalar_event("h", 1, T0, tensor_util.make_tensor_proto(np.float32(1.0)), hist_md),
        scalar_event("h", 2, T0 + 1, tensor_util.make_tensor_proto(np.float32(2.0))),  # inherits
        scalar_event("vec", 1, T0, tensor_util.make_tensor_proto(np.zeros(3, np.float32)), SCALARS_MD),
        scalar_event("kl", 1, T0, tensor_util.make_tensor_proto(np.float32(0.5)), SCALARS_MD),
        # the plugin named by a double (protobuf path) holds for later floats (bulk path)
        scalar_event("g", 1, T0, tensor_util.make_tensor_proto(np.float64(1.0)), hist_md),
        scalar_event("g", 2, T0 + 1, tensor_util.make_tensor_proto(np.float32(2.0))),
        scalar_event("kl", 2, T0 + 1, tensor_util.make_tensor_proto(np.float32(0.25))),
        # shaped like a float scalar but its 4 bytes are int_val: a DT_FLOAT with no float
        scalar_event("bogus", 1, T0, tensor_pb2.TensorProto(
            dtype=1, tensor_shape=tensor_shape_pb2.TensorShapeProto(), int_val=[1, 2, 3, 4]),
            SCALARS_MD),
    ]
    seg = read_one(write_events(tmp_path, events), tmp_path)
    assert list(seg.series) == ["kl"]
    assert seg.series["kl"].values.tolist() == [0.5, 0.25]


def test_records_of_both_paths_merge_in_file_order(tmp_path: Path) -> None:
    """Plain scalars are decoded in bulk, the rest by protobuf; the series must interleave them."""
    events = []
    for step in range(6):
        ev = event_pb2.Event(step=step, wall_time=T0 + step)
        if step % 3 == 1:  # two values in one event
            ev.summary.value.add(tag="kl", simple_value=step)
            ev.summary.value.add(tag="other", simple_value=-step)
        elif step % 3 == 2:
            ev.summary.value.add(tag="kl", tensor=tensor_util.make_tensor_proto(np.float32(step)),
                                 metadata=SCALARS_MD)
        else:
            ev.summary.value.add(tag="kl", simple_value=step)
        events.append(ev)
    events.append(event_pb2.Event(step=0, wall_time=0.0, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="kl", simple_value=9.0)])))  # step 0 and wall 0 omitted
    seg = read_one(write_events(tmp_path, events), tmp_path)
    assert seg.series["kl"].steps.tolist() == [0, 1, 2, 3, 4, 5, 0]
    assert seg.series["kl"].values.tolist() == [0, 1, 2, 3, 4, 5, 9]
    assert seg.series["kl"].wall_times.tolist() == [T0 + s for s in range(6)] + [0.0]
    assert seg.series["other"].values.tolist() == [-1, -4]


def test_an_event_whose_tensor_names_the_hparams_plugin_is_read_whole_by_protobuf(tmp_path: Path) -> None:
    """A float scalar tensor carrying hparams metadata, beside a plain scalar in the same event:
    the hparams are config, the tensor no series, the scalar a series."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData(version=0)
    data.session_start_info.hparams["lr"].number_value = 0.5
    md = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
        plugin_name="hparams", content=data.SerializeToString()))
    ev = scalar_event("_hparams_/session_start_info", 1, T0, tensor_util.make_tensor_proto(np.float32(0)), md)
    ev.summary.value.add(tag="kl", simple_value=0.25)
    seg = read_one(write_events(tmp_path, [ev]), tmp_path)
    assert seg.config == {"lr": 0.5}
    assert list(seg.series) == ["kl"] and seg.series["kl"].values.tolist() == [0.25]


def test_a_record_shaped_like_a_plain_scalar_but_holding_another_field_is_not_one(
        tmp_path: Path) -> None:
    ev = event_pb2.Event(step=1, wall_time=T0)
    ev.summary.value.add(tag="kl", obsolete_old_style_histogram=b"abc")  # as long as a float
    seg = read_one(write_events(tmp_path, [ev]), tmp_path)
    assert seg.series == {}


def last_record_size(step: int, value: float, wall: float, tag: str) -> int:
    ev = event_pb2.Event(step=step, wall_time=wall)
    ev.summary.value.add(tag=tag, simple_value=value)
    return len(ev.SerializeToString()) + 16


@pytest.mark.parametrize("keep_of_last", [0.5, 5, 12, -1], ids=["mid-data", "mid-header",
                                                                "header-only", "crc-cut"])
def test_truncated_file_keeps_whole_records_and_warns(tmp_path: Path, write_tbx,
                                                      keep_of_last: float) -> None:
    points = [("kl", s, s / 10, T0 + s) for s in range(10)]
    path = write_tbx(tmp_path / "run", points)
    size = last_record_size(9, 0.9, T0 + 9, "kl")
    data = path.read_bytes()
    keep = {0.5: size // 2, 5: 5, 12: 12, -1: size - 1}[keep_of_last]
    path.write_bytes(data[: len(data) - size + keep])
    seg = read_one(path, tmp_path)
    assert_same(seg, as_written(points[:9]))
    assert len(seg.warnings) == 1
    assert "truncated" in seg.warnings[0] and "run/events.out.tfevents" in seg.warnings[0]


@pytest.mark.parametrize("where", ["data", "length"])
@pytest.mark.parametrize("points", [10, 100], ids=["few", "many"])  # C and numpy CRC paths
def test_a_flipped_byte_inside_the_file_is_skipped_to_the_next_whole_record_and_named(
        tmp_path: Path, write_tbx, where: str, points: int) -> None:
    """Damage with whole records after it: the records before it and the whole records after it whose CRCs
    hold are read, one warning naming the CRC problem and the bytes skipped (TensorBoard's loader would
    stop at the damage)."""
    path = write_tbx(tmp_path, [("kl", s, s / 10, T0 + s) for s in range(points)])
    data = bytearray(path.read_bytes())
    size = last_record_size(5, 0.5, T0 + 5, "kl")
    at = len(data) - 4 * size + (20 if where == "data" else 3)  # inside the 4th record from the end
    assert len(read_one(path, tmp_path).series["kl"]) == points  # the intact file reads
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    seg = read_one(path, tmp_path)
    assert seg.series["kl"].steps.tolist() == [s for s in range(points) if s != points - 4]
    [warning] = [w for w in seg.warnings if "damaged event file" in w]
    assert "CRC mismatch" in warning and ("length header" if where == "length" else "data of record") in warning
    assert f"record {points + 1 - 4}" in warning  # file_version is record 0
    start = len(data) - 4 * size
    assert f"skipped bytes {start}-{start + size - 1} ({size} bytes)" in warning, warning


def test_a_zero_filled_hole_inside_an_event_file_is_skipped_and_the_records_after_it_read(tmp_path: Path,
                                                                                         write_tbx) -> None:
    """What a node crash leaves: a stretch of zeros over whole records, whole records after it."""
    path = write_tbx(tmp_path, [("kl", s, s / 10, T0 + s) for s in range(100)])
    data = bytearray(path.read_bytes())
    size = last_record_size(5, 0.5, T0 + 5, "kl")
    hole = slice(len(data) - 40 * size, len(data) - 30 * size + 7)  # 10 records and a bit of the 11th
    data[hole] = bytes(hole.stop - hole.start)
    path.write_bytes(bytes(data))
    seg = read_one(path, tmp_path)
    assert seg.series["kl"].steps.tolist() == list(range(60)) + list(range(71, 100))
    assert [w for w in seg.warnings if "damaged event file" in w and f"skipped bytes {hole.start}-" in w], seg.warnings


def test_not_an_event_file_fails_naming_the_crc_problem(tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.123.host"
    path.write_text("this is not a TFRecord file, only text that got the name\n" * 3)
    with pytest.raises(ReadError, match="CRC mismatch.*not a TFRecord"):
        read_one(path, tmp_path)


@pytest.mark.parametrize("content", [b"", b"\x01\x02\x03"], ids=["empty", "shorter-than-header"])
def test_empty_file_is_an_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "events.out.tfevents.123.host"
    path.write_bytes(content)
    with pytest.raises(ReadError, match="empty|no whole record"):
        read_one(path, tmp_path)


def test_nan_and_inf_points_are_dropped_with_a_warning(tmp_path: Path, scalar_writer) -> None:
    points = [("kl", 1, 0.1, T0), ("kl", 2, math.nan, T0 + 1), ("kl", 3, math.inf, T0 + 2),
              ("kl", 4, 0.4, T0 + 3), ("loss", 1, -math.inf, T0 + 4), ("loss", 2, 1.0, T0 + 5)]
    seg = read_one(scalar_writer(tmp_path / "r", points), tmp_path)
    assert_same(seg, as_written([p for p in points if math.isfinite(p[2])]))
    assert sorted(seg.warnings) == sorted([
        f"r/{seg.meta['file']}: dropped 2 NaN/inf values of 'kl'",
        f"r/{seg.meta['file']}: dropped 1 NaN/inf value of 'loss'"])


def test_config_text_summaries_become_the_segment_config(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    writer.add_text("config", json.dumps({"loss": {"reference_reset_interval": 50}, "lr": 1e-6}))
    writer.add_text("trainer/config", json.dumps({"seed": 3}))
    writer.add_text("args", json.dumps({"sync_ref_model": True}))  # the HF Trainer's TrainingArguments
    writer.add_text("notes", json.dumps({"not": "config"}))
    writer.add_text("model/config", "not json at all")
    writer.add_scalar("kl", 0.5, 1)
    writer.close()
    (path,) = tmp_path.glob("events*")
    seg = read_one(path, tmp_path)
    assert seg.config == {"loss": {"reference_reset_interval": 50}, "lr": 1e-6, "seed": 3,
                          "sync_ref_model": True}
    assert len(seg.warnings) == 1 and "model/config" in seg.warnings[0]
    assert seg.series["kl"].values.tolist() == [0.5]


def test_hparams_session_start_info_becomes_config(tmp_path: Path) -> None:
    from tensorboard.plugins.hparams import summary_v2
    from tensorboardX import SummaryWriter

    ev = event_pb2.Event(wall_time=T0, summary=summary_v2.hparams_pb(
        {"ref_update_interval": 10, "lr": 0.5, "algo": "grpo", "peft": True}))
    seg = read_one(write_events(tmp_path / "tb", [ev]), tmp_path)
    assert seg.config == {"ref_update_interval": 10, "lr": 0.5, "algo": "grpo", "peft": True}

    with SummaryWriter(str(tmp_path / "x")) as writer:  # tensorboardX writes a bare-metadata form
        writer.add_hparams({"kl_coef": 0.05, "bs": 8}, {"hp/reward": 1.0}, name="trial")
    (path,) = (tmp_path / "x" / "trial").glob("events*")
    seg = read_one(path, tmp_path)
    assert seg.config == {"kl_coef": 0.05, "bs": 8}
    assert seg.series["hp/reward"].values.tolist() == [1.0]


def test_segment_is_named_after_its_run_folder(tmp_path: Path, write_tbx) -> None:
    nested = write_tbx(tmp_path / "grpo" / "restart-2", [("kl", 5, 0.1, T0 + 5)])
    seg = read_one(nested, tmp_path)
    assert (seg.run_id, seg.name, seg.group) == ("grpo/restart-2",) * 3
    assert seg.store == str((tmp_path / "grpo" / "restart-2").resolve())
    first = event_pb2.Event.FromString(nested.read_bytes()[12:12 + nested.read_bytes()[0]])
    assert first.file_version and seg.start_time == first.wall_time

    top = write_tbx(tmp_path / "logs", [("kl", 1, 0.1, T0)])
    (seg,) = read_tensorboard_file(top, ref=top.name, source=str(tmp_path / "logs"))
    assert seg.run_id == "logs" and seg.store == str((tmp_path / "logs").resolve())


def test_discovery_reads_nested_event_files_and_isolates_a_bad_one(tmp_path: Path, write_tbx,
                                                                   write_v2) -> None:
    deep = tmp_path / "a" / "b" / "c" / "d" / "e"
    write_tbx(deep, [("kl", s, 0.1 * s, T0 + s) for s in range(3)])
    write_v2(tmp_path / "v2run", [("kl", s, 0.2 * s, T0 + s) for s in range(4)])
    bad = tmp_path / "broken" / "events.out.tfevents.1.host"
    bad.parent.mkdir()
    bad.write_bytes(b"")
    got = read_source(str(tmp_path))
    assert got.kinds == ["tensorboard"] and got.errors == []
    good = {s.run_id: s for s in got.segments if s.error is None}
    assert {k: len(s.series["kl"]) for k, s in good.items()} == {"a/b/c/d/e": 3, "v2run": 4}
    assert good["v2run"].meta["pid"] == os.getpid()  # from the file name: tells processes apart
    (broken,) = [s for s in got.segments if s.error is not None]
    assert broken.error.startswith(os.path.join("broken", bad.name)) and "empty" in broken.error


# ------------------------------------------------------------- crash-truncated tails (issue 10/7)


def tensorboard_reads(path: Path) -> dict[str, tuple[list[int], list[float]]]:
    """What TensorBoard's own loader reads from the file: per tag, steps and values (it stops at the
    first unreadable record and keeps everything before it)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[str, tuple[list[int], list[float]]] = {}
    for ev in EventFileLoader(str(path)).Load():
        for v in ev.summary.value:
            if v.metadata.plugin_data.plugin_name == "scalars":
                steps, values = out.setdefault(v.tag, ([], []))
                steps.append(ev.step)
                values.append(float(tensor_util.make_ndarray(v.tensor)))
    return out


def damage_tail(path: Path, how: str) -> int:
    """Damage the end of a real event file as a crash does; returns how many points survive of 40."""
    data = path.read_bytes()
    size = last_record_size(39, 3.9, T0 + 39, "kl")
    if how == "zeros-after":  # the writer pre-extended the file, then died before writing more
        path.write_bytes(data + bytes(4096))
        return 40
    if how == "zeros-over-last":  # the last record's header landed, its data never did
        cut = len(data) - size + 12
        path.write_bytes(data[:cut] + bytes(len(data) - cut + 4096))
        return 39
    path.write_bytes(data[: len(data) - size] + b"\x07garbage written by a dying process\xff" * 3)
    return 39


@pytest.mark.parametrize("how", ["zeros-after", "zeros-over-last", "garbage"])
def test_damaged_tail_reads_the_records_tensorboard_reads_with_a_warning(tmp_path: Path, scalar_writer,
                                                                         how: str) -> None:
    """A crash leaves zeros or junk after the last good record: TensorBoard shows the good records,
    so must we (with a warning naming the file), instead of rejecting the whole file."""
    points = [("kl", s, s / 10, T0 + s) for s in range(40)]
    path = scalar_writer(tmp_path / "run", points)
    kept = damage_tail(path, how)
    seg = read_one(path, tmp_path)
    theirs = tensorboard_reads(path)
    assert list(seg.series) == list(theirs) == ["kl"]
    steps, values = theirs["kl"]
    assert seg.series["kl"].steps.tolist() == steps == list(range(kept))
    assert seg.series["kl"].values.tolist() == pytest.approx(values, rel=1e-12, abs=0)
    assert len(seg.warnings) == 1
    assert "truncated event file" in seg.warnings[0] and f"run/{path.name}" in seg.warnings[0]
    assert f"kept {kept + 1} whole records" in seg.warnings[0]  # + file_version
    if how != "garbage":
        assert "zero bytes" in seg.warnings[0] or "CRC mismatch" in seg.warnings[0]


def test_a_zeroed_record_with_good_records_after_it_is_skipped_not_the_whole_file(tmp_path: Path, write_tbx) -> None:
    """Damage inside the file is not a crash's tail, and TensorBoard would silently drop every record after
    it: klwatch keeps the records on both sides and names the damaged bytes (the run is read in part)."""
    path = write_tbx(tmp_path, [("kl", s, s / 10, T0 + s) for s in range(20)])
    data = bytearray(path.read_bytes())
    size = last_record_size(5, 0.5, T0 + 5, "kl")
    at = len(data) - 4 * size
    data[at:at + size] = bytes(size)
    path.write_bytes(bytes(data))
    seg = read_one(path, tmp_path)
    assert seg.series["kl"].steps.tolist() == [s for s in range(20) if s != 16]
    assert any("damaged event file" in w and f"skipped bytes {at}-{at + size - 1}" in w for w in seg.warnings)


def test_scan_of_a_zero_padded_event_file_exits_0_with_the_warning_in_the_report(tmp_path: Path,
                                                                                 write_tbx) -> None:
    """SPEC.md: exit 3 is for sources or runs that could not be read. This file was read (every good
    record, as TensorBoard reads it); the lost tail is a warning, in the report and on stderr."""
    import subprocess
    import sys

    path = write_tbx(tmp_path / "grpo", [("train/kl_penalty", s, 0.05 * (1 - math.exp(-s / 8)), T0 + 5 * s)
                                          for s in range(1, 41)])
    path.write_bytes(path.read_bytes() + bytes(8192))
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", str(tmp_path), "--format", "json"],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [s["error"] for s in report["sources"]] == [None]
    (lin,) = report["lineages"]
    assert lin["error"] is None and lin["status"] == "ok"
    assert lin["members"][0]["last_step"] == 40
    (warning,) = lin["warnings"]
    assert "8192 zero bytes" in warning and path.name in warning
    assert "8192 zero bytes" in " ".join(out.stderr.split())  # rich wraps long lines


def test_scan_of_an_event_file_with_a_zero_filled_hole_exits_by_the_verdict_naming_the_bytes(tmp_path: Path,
                                                                                           write_tbx) -> None:
    """A node crash's hole inside the file: the run is judged on every whole record (exit by its verdict, not 3),
    incomplete, and the report names the bytes skipped."""
    import subprocess
    import sys

    path = write_tbx(tmp_path / "grpo", [("train/kl_penalty", s, 0.05 * (1 - math.exp(-s / 8)), T0 + 5 * s)
                                          for s in range(1, 81)])
    data = bytearray(path.read_bytes())
    lo = len(data) // 2
    data[lo:lo + 500] = bytes(500)
    path.write_bytes(bytes(data))
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", str(tmp_path), "--format", "json", "--no-cache"],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    (lin,) = json.loads(out.stdout)["lineages"]
    assert lin["error"] is None and lin["status"] == "ok" and lin["members"][0]["last_step"] == 80
    assert lin["incomplete"] and "damaged event file" in lin["incomplete"][0]
    first, last = map(int, re.search(r"skipped bytes (\d+)-(\d+)", lin["incomplete"][0]).groups())
    assert first <= lo and last >= lo + 499, (first, last, lo)  # the hole, from the record it starts in


def _le_as_before(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    windows = np.lib.stride_tricks.sliding_window_view(buf, width)
    return windows[np.clip(pos, 0, len(windows) - 1)]


def _varint_as_before(buf: np.ndarray, pos: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    raw = _le_as_before(buf, pos, width).astype(np.int64)
    term = raw < 0x80
    used = term.argmax(axis=1) + 1
    value = np.zeros(len(pos), dtype=np.int64)
    for i in range(width):
        value |= np.where(i < used, (raw[:, i] & 0x7F) << (7 * i), 0)
    return value, used, term.any(axis=1)


@settings(max_examples=300, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(data=st.binary(min_size=10, max_size=300), positions=st.lists(st.integers(-20, 330), max_size=40),
       width=st.sampled_from([2, 5, 8, 10]), small=st.booleans())
def test_the_bulk_decoders_byte_readers_give_what_they_gave_before(data: bytes, positions: list[int], width: int,
                                                                  small: bool) -> None:
    """``_le``, ``_byte`` and ``_varint`` (made cheaper per call: a direct window view, a one-byte fast
    path, no steps past the longest varint) read the very same numbers as before, positions out of the
    buffer clipped as before."""
    from klwatch.sources import tensorboard as tb

    if small:  # mostly one-byte varints, as in real event files
        data = bytes(b & 0x7F if i % 7 else b for i, b in enumerate(data))
    buf = np.frombuffer(data, dtype=np.uint8)
    pos = np.asarray(positions, dtype=np.int64)
    np.testing.assert_array_equal(tb._le(buf, pos, width), _le_as_before(buf, pos, width))
    np.testing.assert_array_equal(tb._byte(buf, pos), buf[np.clip(pos, 0, len(buf) - 1)])
    for got, want in zip(tb._varint(buf, pos, width), _varint_as_before(buf, pos, width)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@settings(max_examples=100, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(sizes=st.lists(st.integers(0, 200), min_size=1, max_size=150), seed=st.integers(0, 2**32 - 1))
def test_crc_of_ranges_is_crc32c_of_each_range_whichever_path_checks_it(sizes: list[int], seed: int) -> None:
    """Short ranges of one length are checked with numpy, the others with google-crc32c: each CRC is
    crc32c of its range (many ranges of a few lengths, on both sides of ``_BULK_CRC_MAX``)."""
    import google_crc32c

    from klwatch.sources import tensorboard as tb

    rng = np.random.default_rng(seed)
    lengths = np.repeat(np.asarray(sizes, dtype=np.int64), rng.integers(1, 80, len(sizes)))
    data = rng.integers(0, 256, int(lengths.sum()) + 5, dtype=np.uint8).tobytes()
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    buf = np.frombuffer(data, dtype=np.uint8)
    got = tb._crc32c_ranges(data, buf, start=start, length=lengths)
    want = [google_crc32c.value(data[a:a + n]) for a, n in zip(start.tolist(), lengths.tolist())]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(slices=st.lists(st.sampled_from([b"", b"a", b"b", b"train/loss", b"train/lr", b"train/kl", b"eval/kl",
                                        b"\x00\xff", b"\xff\x00"]), min_size=1, max_size=60))
def test_distinct_slices_groups_byte_ranges_by_their_content(slices: list[bytes]) -> None:
    """Ranges grouped by content (one content per length taken without hashing): each range's group
    holds its very bytes, and equal bytes share a group."""
    from klwatch.sources import tensorboard as tb

    data = b"".join(slices)
    ends = np.cumsum([len(b) for b in slices]).astype(np.int64)
    starts = ends - np.asarray([len(b) for b in slices], dtype=np.int64)
    group, blobs = tb._distinct_slices(np.frombuffer(data + b"\x00", dtype=np.uint8), start=starts, end=ends)
    assert [blobs[g] for g in group.tolist()] == slices
    assert len(set(blobs)) == len(blobs)


def test_a_stretch_of_zeros_inside_an_event_file_is_skipped_and_the_records_after_it_read(tmp_path: Path) -> None:
    """A 20 MiB zero-filled stretch (written zeros, not a sparse hole) between two halves of a real event file:
    the records on both sides are kept, the zeros named in a warning, never held as the file's bytes."""
    first = sorted((Path(__file__).resolve().parents[2] / "sample_runs" / "tensorboard" / "ratchet-buggy")
                   .glob("events.out.tfevents.*"))[0]
    data = first.read_bytes()
    whole = read_tensorboard_file(first, ref="r", source="s")[0]
    holed = tmp_path / first.name
    half = len(data) // 2
    holed.write_bytes(data[:half] + bytes(20 << 20) + data[half:])
    seg = read_tensorboard_file(holed, ref="r", source="s")[0]
    kept = sum(len(s.steps) for s in seg.series.values())
    assert sum(len(s.steps) for s in whole.series.values()) - 3 <= kept < sum(len(s.steps) for s in whole.series.values())
    assert any(f"{20 << 20} zero bytes at bytes {half}-{half + (20 << 20) - 1}" in w for w in seg.warnings), seg.warnings
    later = max(s.steps[-1] for s in seg.series.values())
    assert later == max(s.steps[-1] for s in whole.series.values())
