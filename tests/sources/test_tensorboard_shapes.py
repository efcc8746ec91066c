"""Every common event shape, written by the real writers, read as TensorBoard itself reads it.

Events hold one or several values: ``simple_value`` scalars (torch, tensorboardX, with and
without display-name metadata), v2 tensor scalars (torch ``new_style`` float32 and
``double_precision`` float64, and tensorboard's own ``make_tensor_proto`` with a shape field),
mixed in one event or one file, with histograms and text summaries among them. klwatch's series
must equal what tensorboard's ``EventFileLoader`` (which migrates v1 values to v2 tensors) gives,
the bulk decoder must take every event that holds only scalars, and the protobuf path alone
must give the very same result.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

import klwatch.sources.tensorboard as tb
from klwatch.sources.limits import read_regular

SCALAR_TAGS = ["loss", "train/kl_penalty", "ünï/cödé", "日本/損失", "x" * 150]
SCALAR_KINDS = ["simple", "display", "v2_f32", "v2_f64", "v2_tb"]
RARE_KINDS = ["histogram", "text"]

values = st.floats(width=32) | st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0])
scalar_value = st.tuples(st.sampled_from(SCALAR_KINDS), st.sampled_from(SCALAR_TAGS), values)
rare_value = st.tuples(st.sampled_from(RARE_KINDS), st.just(""), st.floats(-10, 10))
event = st.tuples(st.integers(-(2**40), 2**62), st.floats(1.0, 4e9),
                  st.lists(scalar_value | rare_value, min_size=1, max_size=6))


try:  # torch is the trl extra's; the main suite's venv may not have it
    from torch.utils.tensorboard import summary as torch_summary
except ImportError:
    torch_summary = None
WRITERS = ["torch", "tensorboardX"] if torch_summary is not None else ["tensorboardX"]


def summary_value(kind: str, tag: str, x: float, n: int) -> list[summary_pb2.Summary.Value]:
    """One value of ``kind`` as the writer that writes that kind builds it (torch's summary ops when
    torch is installed, else the same protobufs built as torch builds them)."""
    if kind == "display":  # tensorboardX with a display name: a simple_value with metadata
        return [summary_pb2.Summary.Value(tag=tag, simple_value=x, metadata=summary_pb2.SummaryMetadata(
            display_name=f"shown {tag}"))]
    if kind == "v2_tb":  # as tensorboard.summary.Writer: a rank-0 tensor with an empty shape field
        return [summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(x)),
                                          metadata=scalar_metadata.create_summary_metadata("", ""))]
    if torch_summary is not None:
        if kind == "simple":
            return list(torch_summary.scalar(tag, x).value)
        if kind in ("v2_f32", "v2_f64"):
            return list(torch_summary.scalar(tag, x, new_style=True, double_precision=kind == "v2_f64").value)
        if kind == "histogram":
            return list(torch_summary.histogram("hist/w", np.array([x, x + 1, 2 * x]), bins="auto").value)
        return list(torch_summary.text("config" if n % 2 else "notes", json.dumps({"n": n})).value)
    return [_as_torch_builds_it(kind, tag, x, n)]


def _as_torch_builds_it(kind: str, tag: str, x: float, n: int) -> summary_pb2.Summary.Value:
    """torch.utils.tensorboard.summary's protobufs, for a venv without torch."""
    scalars = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    if kind == "simple":
        return summary_pb2.Summary.Value(tag=tag, simple_value=x)
    if kind == "v2_f32":
        return summary_pb2.Summary.Value(tag=tag, metadata=scalars, tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_FLOAT, float_val=[x]))
    if kind == "v2_f64":
        return summary_pb2.Summary.Value(tag=tag, metadata=scalars, tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_DOUBLE, double_val=[x]))
    if kind == "histogram":
        data = np.array([x, x + 1, 2 * x], dtype=float)
        counts, limits = np.histogram(data, bins="auto")
        return summary_pb2.Summary.Value(tag="hist/w", histo=summary_pb2.HistogramProto(
            min=float(data.min()), max=float(data.max()), num=3, sum=float(data.sum()),
            sum_squares=float(data.dot(data)), bucket_limit=limits.tolist(), bucket=[0.0, *counts.tolist()]))
    text = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    return summary_pb2.Summary.Value(
        tag=("config" if n % 2 else "notes") + "/text_summary", metadata=text,
        tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[json.dumps({"n": n}).encode()],
                                      tensor_shape=tensor_shape_pb2.TensorShapeProto(
                                          dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)])))


def write_file(folder: Path, events: list, writer_kind: str) -> Path:
    """Each drawn event as one Summary through the real writer's file writer (framing, CRCs,
    file_version record)."""
    summaries = [(step, wall, summary_pb2.Summary(value=[v for n, (kind, tag, x) in enumerate(vals)
                                                         for v in summary_value(kind, tag, x, n)]))
                 for step, wall, vals in events]
    if writer_kind == "torch":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(folder), max_queue=10_000, flush_secs=3600)
        file_writer = writer._get_file_writer()
        for step, wall, summary in summaries:
            file_writer.add_summary(summary, step, wall)
    else:
        from tensorboardX import SummaryWriter
        from tensorboardX.proto import summary_pb2 as tbx_summary_pb2

        writer = SummaryWriter(str(folder), max_queue=10_000, flush_secs=3600)
        for step, wall, summary in summaries:
            writer.file_writer.add_summary(tbx_summary_pb2.Summary.FromString(summary.SerializeToString()),
                                           step, wall)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def tensorboard_series(path: Path) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """Per scalar tag, in file order, the finite points TensorBoard's own loader gives: a tag is a
    scalar when its first value's (migrated) metadata names the scalars plugin."""
    first_md: dict[str, summary_pb2.SummaryMetadata] = {}
    out: dict[str, tuple[list[int], list[float], list[float]]] = {}
    for ev in EventFileLoader(str(path)).Load():
        for v in ev.summary.value:
            md = first_md.setdefault(v.tag, v.metadata)
            if md.plugin_data.plugin_name != "scalars":
                continue
            x = tensor_util.make_ndarray(v.tensor).item()
            steps, vals, walls = out.setdefault(v.tag, ([], [], []))
            if math.isfinite(x):
                steps.append(ev.step)
                vals.append(x)
                walls.append(ev.wall_time)
    return out


def read(path: Path):
    (seg,) = tb.read_tensorboard_file(path, ref=path.name, source=str(path.parent))
    return seg


def read_by_protobuf_only(path: Path, monkeypatch: pytest.MonkeyPatch):
    """The same file with the bulk decoder taking nothing: every event through protobuf."""
    with monkeypatch.context() as m:
        m.setattr(tb, "_fast_scalars", lambda buf, *, dstart, dlen: tb._Fast(len(dstart)))
        return read(path)


def bulk_decoded_records(path: Path) -> int:
    data = read_regular(path)
    dstart, dlen = tb._frame(data, ref=path.name, warnings=[])
    return int(tb._fast_scalars(np.frombuffer(data, np.uint8), dstart=dstart, dlen=dlen).matched.sum())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(event, min_size=1, max_size=25), writer_kind=st.sampled_from(WRITERS))
def test_every_shape_reads_as_tensorboard_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   events: list, writer_kind: str) -> None:
    path = write_file(tmp_path / uuid.uuid4().hex, events, writer_kind)
    seg = read(path)
    expected = tensorboard_series(path)
    assert list(seg.series) == list(expected)
    for tag, (steps, vals, walls) in expected.items():
        s = seg.series[tag]
        assert s.steps.tolist() == steps
        assert s.values.tolist() == pytest.approx(vals, rel=0, abs=0)  # stored numbers, read back
        assert s.wall_times.tolist() == walls

    scalar_only = sum(all(kind in SCALAR_KINDS for kind, _, _ in vals) for _, _, vals in events)
    assert bulk_decoded_records(path) == scalar_only

    slow = read_by_protobuf_only(path, monkeypatch)
    assert list(slow.series) == list(seg.series)
    for tag, s in seg.series.items():
        assert slow.series[tag].steps.tolist() == s.steps.tolist()
        assert slow.series[tag].values.tolist() == s.values.tolist()
        assert slow.series[tag].wall_times.tolist() == s.wall_times.tolist()
    assert (slow.warnings, slow.config) == (seg.warnings, seg.config)
    texts = [n for _, _, vals in events for n, (kind, _, _) in enumerate(vals) if kind == "text" and n % 2]
    assert seg.config == ({"n": texts[-1]} if texts else {})
