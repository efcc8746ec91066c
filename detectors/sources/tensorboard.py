"""Read TensorBoard event files ourselves: every scalar point, in file order, CRC checked.

Why not ``EventAccumulator``: its defaults reservoir-sample scalars (a resume boundary can vanish
from a 10k-step run), it silently purges "out of order" events after a restart, and it is slow.
Why not ``tf.data``: TensorFlow is far too heavy a dependency for reading a framing this simple.

An event file is a TFRecord stream: ``uint64 length | masked crc32c(length) | data | masked
crc32c(data)``, little-endian, each ``data`` a serialized ``tensorboard.Event``. Speed matters
(a long run is millions of points), so the per-record Python work is kept to the one sequential
step, following the lengths. CRCs are computed with numpy over all records of one length at once
(length headers, and the short scalar records, which come in a handful of lengths), and with
``google-crc32c`` (C) for the rest. Records whose every value is a scalar (one or several per
event: ``simple_value``s as torch and tensorboardX write, rank-0 float or double tensors as TF2,
torch ``new_style`` and ``tensorboard.summary.Writer`` write) are decoded with numpy in bulk after
an exact byte-layout match; all others (text, hparams, histograms, other dtypes) are parsed with
the ``tensorboard`` protobufs.
Each event file becomes one Segment: a restart writes a new file, so a file is a process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2

from ..model import Segment, Series
from .limits import read_regular, sniff, zero_stretches
from .local import ReadError
from .resume import Resume

_LENGTH = struct.Struct("<Q")
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

# TensorProto dtype enum (tensorboard/compat/proto/types.proto) -> (repeated field, numpy dtype of
# tensor_content). Only numeric types: a string or bool tensor is never a scalar metric.
_DT_FIELDS: dict[int, tuple[str, str]] = {
    1: ("float_val", "<f4"),  # DT_FLOAT
    2: ("double_val", "<f8"),  # DT_DOUBLE
    3: ("int_val", "<i4"),  # DT_INT32
    4: ("int_val", "u1"),  # DT_UINT8
    5: ("int_val", "<i2"),  # DT_INT16
    6: ("int_val", "i1"),  # DT_INT8
    9: ("int64_val", "<i8"),  # DT_INT64
    14: ("half_val", "<u2"),  # DT_BFLOAT16 (bit patterns)
    17: ("int_val", "<u2"),  # DT_UINT16
    19: ("half_val", "<f2"),  # DT_HALF (bit patterns in half_val)
    22: ("uint32_val", "<u4"),  # DT_UINT32
    23: ("uint64_val", "<u8"),  # DT_UINT64
}
_DT_STRING = 7
_DT_BFLOAT16 = 14
_DT_HALF = 19
_DATA_CLASS_SCALAR = 1

# Plugins whose tensors are never scalar metrics even when they hold one number.
_NON_SCALAR_PLUGINS = {"hparams", "text", "histograms", "images", "audio", "pr_curves", "mesh",
                       "custom_scalars", "graphs", "projector", "distributions"}

_CONFIG_TAGS = {"config", "hparams", "args"}
"""Text summaries read as config. ``args`` is what the Hugging Face Trainer (and so TRL) writes:
its TrainingArguments JSON, which holds keys such as ``sync_ref_model``."""

_EVENT_NAME = re.compile(
    r"tfevents\.(?P<time>\d+)\.(?P<host>.+?)(?:\.(?P<pid>\d+))?(?:\.(?P<n>\d+))?(?:\.v2)?$")
"""``events.out.tfevents.<time>.<host>[.<pid>.<n>]``: the pid tells two processes apart."""


def _run_folder(path: Path, ref: str) -> str:
    """The event file's folder relative to the source root: what TensorBoard calls the run."""
    folder = str(Path(ref).parent)
    if folder in ("", "."):
        return path.resolve().parent.name
    return folder


def _tensor_scalar(t: Any) -> float | None:
    """The single number a TensorProto holds, or None when it is not a one-element numeric tensor."""
    size = 1
    for d in t.tensor_shape.dim:
        size *= d.size
    if size != 1:
        return None
    spec = _DT_FIELDS.get(t.dtype)
    if spec is None:
        return None
    field, npdtype = spec
    content = t.tensor_content
    if content:
        arr = np.frombuffer(content, dtype=npdtype)
        if arr.size != 1:
            return None
        if t.dtype == _DT_BFLOAT16:
            return float((arr.astype(np.uint32) << 16).view(np.float32)[0])
        return float(arr[0])
    vals = getattr(t, field)
    if len(vals) < 1:
        return None
    if t.dtype == _DT_HALF:
        return float(np.array([vals[0]], dtype=np.uint16).view(np.float16)[0])
    if t.dtype == _DT_BFLOAT16:
        return float((np.array([vals[0]], dtype=np.uint32) << 16).view(np.float32)[0])
    return float(vals[0])


def _config_name(tag: str) -> str | None:
    """The config key a text summary tag stands for, or None when it is not a config tag."""
    name = tag[: -len("/text_summary")] if tag.endswith("/text_summary") else tag
    low = name.lower()
    if low in _CONFIG_TAGS or low.endswith("/config"):
        return name
    return None


def _parse_config_text(text: str) -> Any:
    s = text.strip()
    if s.startswith("```"):  # a markdown code fence around the JSON
        s = s.strip("`").strip()
        if s.lower().startswith("json"):
            s = s[4:]
    return json.loads(s)


def _hparams_config(content: bytes) -> tuple[dict[str, Any], str | None]:
    """hparams plugin ``session_start_info``: the hyperparameters of this run, and its group name."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    if not data.HasField("session_start_info"):
        return {}, None
    info = data.session_start_info
    out: dict[str, Any] = {}
    for key, value in info.hparams.items():
        kind = value.WhichOneof("kind")
        if kind == "number_value":
            v = value.number_value
            out[key] = int(v) if math.isfinite(v) and v.is_integer() else v
        elif kind == "string_value":
            out[key] = value.string_value
        elif kind == "bool_value":
            out[key] = value.bool_value
        elif kind is not None:
            from google.protobuf.json_format import MessageToDict

            out[key] = MessageToDict(value)
    return out, (info.group_name or None)


def read_tensorboard_file(path: Path, *, ref: str, source: str) -> list[Segment]:
    """One event file -> one Segment holding every scalar point it records, in file order."""
    return read_tensorboard_file_since(path, ref=ref, source=source, since=None)[0]


def read_tensorboard_file_since(path: Path, *, ref: str, source: str, since: Resume | None
                                ) -> tuple[list[Segment], Resume | None]:
    """``read_tensorboard_file``, reading only the bytes after ``since.offset`` when given (a
    ``ResumableReader``): the framing checks and messages count bytes and records from the file's
    start, the tag's plugins carry over, so the Segment is the one a read of the whole file gives.
    New bytes that are damaged are read again with the whole file, so the error or warnings are
    exactly a whole read's."""
    path = Path(path)
    if since is not None and not zero_stretches(path, start=since.offset):
        try:
            data = read_regular(path, start=since.offset)  # only the new bytes are charged to the SOURCE
            return _read_chunk(data, path=path, ref=ref, source=source, since=since)
        except (ReadError, KeyError, TypeError, ValueError):  # damaged new bytes, or a state not ours
            pass
    if (head := sniff(path, length=12)) is not None:  # a 1 GiB file of zeros costs 12 bytes
        _check_first_header(head)
    if holes := zero_stretches(path):
        return _read_around_holes(path, holes=holes, ref=ref, source=source)
    data = read_regular(path)  # a FIFO or a device is refused, the bytes are charged to the SOURCE
    if not data:
        raise ReadError("empty event file (0 bytes)")
    return _read_chunk(data, path=path, ref=ref, source=source, since=None)


def _read_around_holes(path: Path, *, holes: list[tuple[int, int]], ref: str, source: str
                       ) -> tuple[list[Segment], Resume]:
    """An event file with stretches of zeros no writer leaves (a crash into a pre-extended file, a sparse
    file): the bytes between them read one stretch after another, each on from the records before it (as a
    resumed read), the zeros never held, each hole named in a warning; so a 1 GiB hole after a valid head
    costs the head. Damage at the start of the bytes after a hole is read past as anywhere else (``_frame``)."""
    size = path.stat().st_size
    spans = [(lo, hi) for lo, hi in zip([0] + [h for _, h in holes], [lo for lo, _ in holes] + [size]) if hi > lo]
    frame_warnings: list[str] = []
    since: Resume | None = None
    for (lo, hi), hole in zip(spans, holes + [None]):
        try:
            segs, resume = _read_chunk(read_regular(path, start=lo, length=hi - lo), path=path, ref=ref,
                                       source=source, since=since)
        except ReadError as exc:
            if since is None:
                raise
            frame_warnings.append(f"{ref}: bytes {lo}-{size - 1} not read: {exc}")
            break
        frame_warnings += segs[0].warnings[:len(segs[0].warnings) - len(resume.segment.warnings)]
        since = resume
        if hole is not None:
            frame_warnings.append(_hole_warning(hole, size=size, ref=ref, kept=int(resume.state["records"])))
            since = dataclasses.replace(resume, offset=hole[1])
        if len(frame_warnings) > MAX_DAMAGED_STRETCHES:
            frame_warnings.append(f"{ref}: more than {MAX_DAMAGED_STRETCHES} damaged stretches: bytes from "
                                  f"{hi} on were not read")
            break
    assert since is not None
    last = since.segment
    return [dataclasses.replace(last, warnings=frame_warnings + list(last.warnings))], since


def _hole_warning(hole: tuple[int, int], *, size: int, ref: str, kept: int) -> str:
    lo, hi = hole
    if hi >= size:
        return (f"{ref}: truncated event file: {hi - lo} zero bytes from byte {lo} to its end (crash mid-write "
                f"into a pre-extended file, or a sparse file?); kept {kept} whole records before them")
    return (f"{ref}: damaged event file: {hi - lo} zero bytes at bytes {lo}-{hi - 1} (a hole a crash or a sparse "
            f"copy left); skipped, not held, reading on from byte {hi}; kept {kept} whole records before it")


def _check_first_header(head: bytes) -> None:
    """Refuse a file whose first record header is not a TFRecord header, from its first 12 bytes (what
    ``_frame`` would find after reading the whole file)."""
    buf = np.frombuffer(head, dtype=np.uint8)
    stored = int(np.frombuffer(head[8:12], dtype="<u4")[0])
    if int(_mask(_crc32c_rows(buf[None, :8]))[0]) != stored:
        raise ReadError("corrupt event file: CRC mismatch in the length header of record 0 at byte 0 "
                        "(not a TFRecord event file?)")


def _read_chunk(data: bytes, *, path: Path, ref: str, source: str, since: Resume | None
                ) -> tuple[list[Segment], Resume]:
    """Decode the records in ``data`` (the whole file, or what follows ``since.offset``) and add
    them to what ``since`` had decoded."""
    prior = since.state if since is not None else {}
    base = since.offset if since is not None else 0
    before = int(prior.get("records", 0))
    frame_warnings: list[str] = []
    dstart, dlen = _frame(data, ref=ref, warnings=frame_warnings, base=base, before=before)
    buf = np.frombuffer(data, dtype=np.uint8)

    # Most records hold only scalars: decode those with numpy, the rest with protobuf.
    fast = _fast_scalars(buf, dstart=dstart, dlen=dlen)
    state = _State()
    state.plugin_of.update(prior.get("plugin_of", {}))
    md_code = _fast_plugins(fast, buf=buf, state=state)
    from_string = event_pb2.Event.FromString
    slow_idx = np.flatnonzero(~fast.matched)
    for i, a, ln in zip(slow_idx.tolist(), dstart[slow_idx].tolist(), dlen[slow_idx].tolist()):
        try:
            event = from_string(data[a:a + ln])
        except DecodeError as exc:
            raise ReadError(f"record {before + i} at byte {base + a - 12} is not a valid Event protobuf: "
                            f"{exc}") from exc
        _read_event(event, index=i, state=state, ref=ref)
    fast_codes, fast_plugins, fast_named = _fast_tags_and_plugins(fast, md_code=md_code, buf=buf,
                                                                  state=state)
    seeds = np.array([[-1, 0, state.code(t), state.plugin(n)] for t, n in prior.get("last_named", {}).items()],
                     dtype=np.int64).reshape(-1, 4)  # what the tags' plugins were where ``since`` stopped
    series, dropped, last_named = _assemble(fast=fast, fast_codes=fast_codes, fast_plugins=fast_plugins,
                                            fast_named=np.concatenate([seeds, fast_named]), state=state)

    if since is None:
        first = from_string(data[dstart[0]:dstart[0] + dlen[0]])  # CRC-checked above
        start_time: float | None = first.wall_time
        config: dict[str, Any] = {}
        tb_meta: dict[str, Any] = {}
        old_series: dict[str, Series] = {}
        old_dropped: dict[str, int] = {}
        decode_warnings: list[str] = []
        session_starts: list[int] = []
    else:
        start_time = since.segment.start_time
        config, tb_meta = dict(since.segment.config), dict(prior["tb_meta"])
        old_series, old_dropped = since.segment.series, prior["dropped"]
        decode_warnings, session_starts = list(prior["decode_warnings"]), list(prior["session_starts"])
    config.update(state.config)  # in file order, as one read would apply them
    tb_meta.update(state.meta)
    merged = dict(old_series)
    for tag, ser in series.items():
        merged[tag] = merged[tag].extended(ser) if tag in merged else ser
    all_dropped = {t: old_dropped.get(t, 0) + dropped.get(t, 0) for t in merged
                   if old_dropped.get(t, 0) + dropped.get(t, 0)}
    decode_warnings += state.warnings
    session_starts += state.session_starts
    records = before + len(dstart)
    end = base + (int(dstart[-1] + dlen[-1]) + 4 if len(dstart) else 0)
    resolved = path.resolve()  # once: it walks every component of the path
    parts = dict(path=path, resolved=resolved, ref=ref, source=source, series=merged, config=config,
                 start_time=start_time,
                 tb_meta=tb_meta, session_starts=session_starts, records=records, dropped=all_dropped,
                 decode_warnings=decode_warnings)
    resume = Resume(file=str(resolved), offset=end if len(dstart) else base,
                    segment=_segment(**parts, frame_warnings=[]), state={
                        "records": records, "dropped": all_dropped, "decode_warnings": decode_warnings,
                        "session_starts": session_starts, "tb_meta": tb_meta,
                        "plugin_of": {**prior.get("plugin_of", {}), **state.plugin_of},
                        "last_named": {**prior.get("last_named", {}), **last_named}})
    return [_segment(**parts, frame_warnings=frame_warnings)], resume


def _segment(*, path: Path, resolved: Path, ref: str, source: str, series: dict[str, Series], config: dict[str, Any],
             start_time: float | None, tb_meta: dict[str, Any], session_starts: list[int], records: int,
             dropped: dict[str, int], decode_warnings: list[str], frame_warnings: list[str]) -> Segment:
    """The Segment an event file's decoded records make (the same whether read whole or on from an
    earlier read)."""
    meta: dict[str, Any] = {"file": path.name, "records": records}
    meta.update(tb_meta)
    if session_starts:
        meta["session_starts"] = list(session_starts)
    m = _EVENT_NAME.search(path.name)
    if m:
        meta["hostname"] = m.group("host")
        if m.group("pid"):
            meta["pid"] = int(m.group("pid"))
    nan_warnings = [f"{ref}: dropped {n} NaN/inf value{'s' if n != 1 else ''} of '{tag}'"
                    for tag, n in dropped.items()]
    folder = _run_folder(path, ref)
    return Segment(
        kind="tensorboard", ref=ref, source=source, run_id=folder, name=folder, group=folder,
        config=dict(config), series=dict(series), start_time=start_time, store=str(resolved.parent),
        warnings=frame_warnings + nan_warnings + list(decode_warnings), meta=meta,
    )


MAX_DAMAGED_STRETCHES = 64
"""Damaged stretches read past in one event file; after that many the rest of it is left unread, said."""

_Skip = tuple[int, int, str]
"""A damaged stretch of an event file: from byte, to the next whole record, and what was wrong there."""


def _frame(data: bytes, *, ref: str, warnings: list[str], base: int = 0, before: int = 0
           ) -> tuple[np.ndarray, np.ndarray]:
    """Split the TFRecord stream and check both CRCs of every whole record, reading past damage inside
    the file (a stretch a node crash zeroed, a corrupt record) to the next whole record whose CRCs hold,
    each stretch skipped named by its bytes in a warning (``_frame_stretch`` reads up to the damage)."""
    starts, lengths, offset, kept = [], [], 0, before
    for _ in range(MAX_DAMAGED_STRETCHES + 1):
        part = data if offset == 0 else data[offset:]
        dstart, dlen, skip = _frame_stretch(part, ref=ref, warnings=warnings, base=base + offset, before=kept)
        starts.append(dstart + offset)
        lengths.append(dlen)
        kept += len(dstart)
        if skip is None:
            break
        lo, hi, problem = skip
        warnings.append(f"{ref}: damaged event file: {problem}; skipped bytes {base + offset + lo}-"
                        f"{base + offset + hi - 1} ({hi - lo} bytes) to the next whole record, whose CRCs hold "
                        f"(TensorBoard's loader would stop there); kept {kept} whole records before it")
        offset += hi
    else:
        warnings.append(f"{ref}: more than {MAX_DAMAGED_STRETCHES} damaged stretches: bytes from "
                        f"{base + offset} on were not read")
    return np.concatenate(starts), np.concatenate(lengths)


def _frame_stretch(data: bytes, *, ref: str, warnings: list[str], base: int = 0, before: int = 0
                   ) -> tuple[np.ndarray, np.ndarray, _Skip | None]:
    """Split the TFRecord stream up to the first damage and check both CRCs of every whole record.

    ``data`` is the file from byte ``base`` on, after ``before`` whole records read earlier (a read
    resumed where an earlier one stopped): messages count bytes and records from the file's start,
    and those records count as kept, so the outcome is the one a read of the whole file gives.

    Returns the data offset and length of each good record, and the damaged stretch to skip when whole
    records follow it. What follows the last good record is handled as TensorBoard's own readers handle it
    (the Python ``EventFileLoader`` and the Rust data server both keep every record before the first
    unreadable one and stop there), with a warning naming the file instead of silence:

    - a record cut short at the end of the file, or a tail of zero bytes (a crash mid-write, the
      file pre-extended with zeros), or a corrupt tail after which no whole record can be found:
      the good records are kept, with a warning;
    - damage (zeros, a bad CRC) with whole records after it: the stretch up to the next whole record
      is returned to be skipped (``_frame`` reads on from there);
    - a first record that fails its CRC is an error (not a TFRecord event file?).
    """
    n = len(data)
    heads, pos = _record_heads(data, resumed=base > 0)
    empty = np.empty(0, dtype=np.int64)
    if not heads:  # a resumed read with no new record header yet
        _warn_cut_off_end(heads=[], lengths=empty, whole=0, end=0, n=n, ref=ref, warnings=warnings, base=base,
                          before=before)
        return empty, empty, None
    buf = np.frombuffer(data, dtype=np.uint8)
    h = np.asarray(heads, dtype=np.int64)
    lengths = np.ascontiguousarray(_le(buf, h, 8)).view("<u8")[:, 0].astype(np.int64)
    whole, problem = _check_length_headers(buf, heads=heads, h=h, lengths=lengths, n=n, base=base, before=before)
    dstart = h[:whole] + 12
    dlen = lengths[:whole]
    stored = np.ascontiguousarray(_le(buf, dstart + dlen, 4)).view("<u4")[:, 0]
    computed = _mask(_crc32c_ranges(data, buf, start=dstart, length=dlen)) if whole else stored
    bad = np.flatnonzero(computed != stored)
    if len(bad):
        whole = int(bad[0])
        problem = (f"CRC mismatch in the data of record {before + whole} at byte {base + heads[whole]} "
                   f"({int(dlen[whole])} bytes)")
    if problem is None:  # every record whole and good, except perhaps a cut-off last one or a hole of zeros
        end = heads[whole] if whole < len(heads) else pos
        if before + whole and end < n and buf[end:].any() and (later := _next_good_record(data, buf, start=end)):
            return dstart[:whole], dlen[:whole], (end, later, f"no record at byte {base + end}")
        _warn_cut_off_end(heads=heads, lengths=lengths, whole=whole, end=pos, n=n, ref=ref, warnings=warnings,
                          base=base, before=before)
        return dstart, dlen, None
    tail = heads[whole]
    if before + whole and buf[tail:].any() and (later := _next_good_record(data, buf, start=tail + 1)):
        return dstart[:whole], dlen[:whole], (tail, later, problem)
    _judge_damaged_tail(buf, tail=tail, whole=whole, problem=problem, ref=ref, warnings=warnings, base=base,
                        before=before)
    return dstart[:whole], dlen[:whole], None


def _record_heads(data: bytes, *, resumed: bool = False) -> tuple[list[int], int]:
    """Where each record header starts, following the lengths, and where that walk ended.

    The only sequential part of reading a file (each length says where the next record is), so
    it does nothing else; the CRCs are checked afterwards, in bulk. ``resumed``: ``data`` follows
    records read earlier, so holding no header is no error."""
    n = len(data)
    unpack = _LENGTH.unpack_from
    heads: list[int] = []
    append = heads.append
    pos = 0
    while pos + 12 <= n:
        append(pos)
        (length,) = unpack(data, pos)
        if not length and not any(data[pos + 8:pos + 12]):  # no record has an all-zero header: a zero tail
            break
        pos += length + 16
    if not heads and not resumed:
        raise ReadError(f"no whole record in the event file: {n} bytes, shorter than a record header")
    return heads, pos


def _check_length_headers(buf: np.ndarray, *, heads: list[int], h: np.ndarray, lengths: np.ndarray,
                          n: int, base: int = 0, before: int = 0) -> tuple[int, str | None]:
    """How many records lie before the first bad length-header CRC (or the first record that runs
    past the end of the file), and the problem found, if any."""
    stored = np.ascontiguousarray(_le(buf, h + 8, 4)).view("<u4")[:, 0]
    computed = _mask(_crc32c_rows(_le(buf, h, 8)))
    bad = np.flatnonzero(computed != stored)
    first_bad = int(bad[0]) if len(bad) else len(heads)
    problem = (f"CRC mismatch in the length header of record {before + first_bad} at byte {base + heads[first_bad]}"
               if len(bad) else None)
    whole = first_bad
    if whole and heads[whole - 1] + int(lengths[whole - 1]) + 16 > n:
        whole -= 1  # the last header is whole but its record runs past the end of the file
    return whole, problem


def _warn_cut_off_end(*, heads: list[int], lengths: np.ndarray, whole: int, end: int, n: int, ref: str,
                      warnings: list[str], base: int = 0, before: int = 0) -> None:
    """Every record is good but the file may end in a cut-off one or in stray bytes: say so (an
    error when not one record is whole)."""
    kept = before + whole
    if whole < len(heads):
        warnings.append(f"{ref}: truncated event file: the last record (at byte {base + heads[-1]}, "
                        f"{int(lengths[-1]) + 16} bytes) is cut off after {n - heads[-1]} bytes "
                        f"(crash mid-write?); kept {kept} whole records")
    elif end < n:
        warnings.append(f"{ref}: truncated event file: {n - end} stray bytes after the last whole "
                        f"record (crash mid-write?); kept {kept} whole records")
    if kept == 0:
        raise ReadError(f"no whole record in the event file ({base + n} bytes; truncated)")


def _judge_damaged_tail(buf: np.ndarray, *, tail: int, whole: int, problem: str, ref: str,
                        warnings: list[str], base: int = 0, before: int = 0) -> None:
    """A bad record at byte ``tail`` with no whole record after it: a cut-off tail keeps the ``whole``
    records before it with a warning; a bad first record is an error. (``base``/``before``: as for ``_frame``.)"""
    n = len(buf)
    if whole + before == 0:
        raise ReadError(f"corrupt event file: {problem}" + (" (not a TFRecord event file?)"
                                                            if "length header" in problem else ""))
    if not buf[tail:].any():
        warnings.append(f"{ref}: truncated event file: {n - tail} zero bytes after the last whole record "
                        f"(byte {base + tail}; crash mid-write into a pre-extended file?); kept {before + whole} "
                        "whole records")
    else:
        warnings.append(f"{ref}: truncated event file: {problem} and no whole record after it "
                        f"(crash mid-write?); kept {before + whole} whole records, dropped the last {n - tail} bytes")


def _next_good_record(data: bytes, buf: np.ndarray, *, start: int, chunk: int = 1 << 20) -> int | None:
    """The first byte offset at or after ``start`` where a whole record with both CRCs right begins,
    or None. Only called on a damaged file, to tell a corrupt tail from damage in the middle."""
    n = len(data)
    last = n - 16  # a record is at least 16 bytes
    for lo in range(start, last + 1, chunk):
        pos = np.arange(lo, min(lo + chunk, last + 1), dtype=np.int64)
        head = _le(buf, pos, 8)
        ok = _mask(_crc32c_rows(head)) == np.ascontiguousarray(_le(buf, pos + 8, 4)).view("<u4")[:, 0]
        for p in pos[ok].tolist():
            length = _LENGTH.unpack_from(data, p)[0]
            if p + 16 + length > n:
                continue
            stored = struct.unpack_from("<I", data, p + 12 + length)[0]
            if int(_mask(np.array([google_crc32c.value(data[p + 12:p + 12 + length])]))[0]) == stored:
                return p
    return None


def _le(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes at each position (clipped to the buffer), as an (N, width) uint8 array.

    Called a few dozen times per file on small arrays, so the window view is made directly (numpy's
    ``sliding_window_view`` and ``np.clip`` cost more in checks than the gather itself)."""
    last = len(buf) - width  # the last position a whole window starts at
    if last < 0 or not buf.flags.c_contiguous:
        windows = np.lib.stride_tricks.sliding_window_view(buf, width)
        return windows[np.clip(pos, 0, len(windows) - 1)]
    windows = np.ndarray((last + 1, width), dtype=np.uint8, buffer=buf, strides=(1, 1))
    return windows[np.minimum(np.maximum(pos, 0), last)]


def _byte(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The byte at each position (clipped to the buffer)."""
    return buf.take(pos, mode="clip")


def _crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """crc32c of each row of an (N, L) uint8 array: table-driven, one numpy step per column.

    Short records come in a few lengths, so all records of one length are checked together in L
    vector steps instead of one C call per record (the per-call overhead is what costs).
    """
    cols = np.ascontiguousarray(rows.T)
    crc = np.full(len(rows), 0xFFFFFFFF, dtype=np.uint32)
    for col in cols:
        crc = _CRC_TABLE[(crc ^ col) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def _crc32c_ranges(data: bytes, buf: np.ndarray, *, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """crc32c of each byte range: numpy for the many short ranges of one length, C for the rest."""
    out = np.empty(len(start), dtype=np.uint32)
    done = np.zeros(len(start), dtype=bool)
    short = length <= _BULK_CRC_MAX
    sizes, counts = np.unique(length[short], return_counts=True)
    for size in sizes[counts >= _BULK_CRC_MIN_ROWS].tolist():
        rows = np.flatnonzero(length == size)
        out[rows] = _crc32c_rows(_le(buf, start[rows], size)) if size else 0
        done[rows] = True
    rest = np.flatnonzero(~done)
    crc = google_crc32c.value
    out[rest] = np.fromiter([crc(data[a:a + n]) for a, n in
                             zip(start[rest].tolist(), length[rest].tolist())],
                            dtype=np.uint32, count=len(rest))
    return out


_BULK_CRC_MAX = 48
"""Ranges up to this long are checked with numpy, all ranges of one length at once (one vector step
per byte); longer ones by one C call each, which costs about as much as 48 numpy byte steps (a record
of five scalars, ~140 bytes, is three times cheaper in C)."""
_BULK_CRC_MIN_ROWS = 64


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc_table()


def _mask(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC, vectorised."""
    crc = crc.astype(np.uint64)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


# Plugin codes of a point: a simple_value is a scalar whatever its metadata says; a tensor takes the
# plugin named by its own metadata, else by the last earlier value of its tag that named one.
_SIMPLE = -2
_INHERIT = -1


class _Fast:
    """Scalars decoded without protobuf, one row per point, in file order (record, then position
    in the record's Summary): ``Event{wall_time, step, summary{value{tag, scalar}...}}``."""

    def __init__(self, n: int) -> None:
        empty = np.empty(0, dtype=np.int64)
        self.matched = np.zeros(n, dtype=bool)
        """Per record: every value of it is a point below (the protobuf path skips it)."""
        self.index = self.sub = self.steps = self.tag_start = self.tag_end = empty
        self.values = self.walls = np.empty(0, dtype=np.float64)
        self.tensor = np.empty(0, dtype=bool)
        """A v2 float/double tensor (its plugin decides) rather than a ``simple_value``."""
        self.md_start = self.md_end = empty
        """The value's SummaryMetadata bytes (``md_start == md_end``: none)."""

    def take(self, rows: np.ndarray) -> None:
        """Keep only the points ``rows`` (a bool mask or indices), in order."""
        for name in ("index", "sub", "steps", "tag_start", "tag_end", "values", "walls", "tensor",
                     "md_start", "md_end"):
            setattr(self, name, getattr(self, name)[rows])

    def drop_records(self, bad_points: np.ndarray) -> np.ndarray:
        """Hand every record holding one of ``bad_points`` (a mask) back to the protobuf path whole
        (an event is read by one path only, so its values keep their order and meaning); returns
        the mask of the points kept."""
        if not bad_points.any():
            return np.ones(len(bad_points), dtype=bool)
        bad = np.unique(self.index[bad_points])
        self.matched[bad] = False
        keep = ~np.isin(self.index, bad)
        self.take(keep)
        return keep


def _varint(buf: np.ndarray, pos: np.ndarray, width: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A varint of at most ``width`` bytes at each position: (value, bytes used, well formed)."""
    last = len(buf) - width
    if last >= 0:  # the first byte of each ``_le`` window (positions clipped as it clips them)
        first = buf.take(np.minimum(np.maximum(pos, 0), last))
        if (first < 0x80).all():  # every varint one byte long (the usual case: short lengths)
            return first.astype(np.int64), np.ones(len(pos), dtype=np.int64), np.ones(len(pos), dtype=bool)
    raw = _le(buf, pos, width)
    term = raw < 0x80  # the last byte of a varint has its high bit clear
    used = term.argmax(axis=1) + 1
    value = (raw[:, 0] & 0x7F).astype(np.int64)
    for i in range(1, int(used.max())):  # bytes past every varint's end add nothing
        value |= np.where(i < used, (raw[:, i].astype(np.int64) & 0x7F) << (7 * i), 0)
    return value, used, term.any(axis=1)


_MAX_VALUES = 256
"""Values per event the bulk walk follows; an event with more (none seen) goes to protobuf."""


def _fast_scalars(buf: np.ndarray, *, dstart: np.ndarray, dlen: np.ndarray) -> _Fast:
    """Decode, with numpy over all records at once, the records whose every value is a scalar.

    A record is taken only when its bytes match these layouts completely (every field tag, every
    length, nothing left over), so its meaning is the one protobuf would give it::

        09 <f64 wall_time> [10 <varint step>] 2a L1 (0a Lv VALUE)+
        VALUE  = 0a Lt <tag> (15 <f32> | 42 Lx TENSOR) [4a Lm <SummaryMetadata>]
                                      simple_value (torch, tensorboardX, TF1) or a tensor:
        TENSOR = 08 01 [12 00] (2a|22) 04 <f32>    rank-0 DT_FLOAT (TF2, summary.Writer, torch v2)
               | 08 02 [12 00] (32|22) 08 <f64>    rank-0 DT_DOUBLE (torch double_precision)

    Any number of values per event (writers that batch a step's summaries). Everything else
    (file_version, text, hparams, histograms, images, other dtypes) goes to protobuf, the whole
    event. Each stage reads one part of the layout for every candidate at once; the walk over an
    event's values takes one numpy round per value position, not one Python step per value.
    """
    out = _Fast(len(dstart))
    idx = np.flatnonzero((dlen >= 20) & (_byte(buf, dstart) == 0x09))
    if not len(idx):
        return out
    st, end = dstart[idx], dstart[idx] + dlen[idx]
    walls = _le(buf, st + 1, 8).view("<f8")[:, 0]
    steps, p, ok = _fast_steps(buf, st + 9)
    length, used, good = _varint(buf, p + 1)  # Event.summary: must run to the end of the record
    ok &= (_byte(buf, p) == 0x2A) & good & (p + 1 + used + length == end)
    rec, sub, vs, ve, ok = _fast_value_spans(buf, start=p + 1 + used, end=end, ok=ok)
    tag_start, tag_end, tag_ok = _fast_tag(buf, vs, ve)
    is_value, values, tensor, md_start = _fast_values(buf, tag_end, ve)
    ok[rec[~(tag_ok & is_value)]] = False
    keep = ok[rec]
    rec, sub = rec[keep], sub[keep]
    out.matched[idx[ok]] = True
    out.index, out.sub = idx[rec], sub
    out.steps, out.walls = steps[rec], walls[rec]
    out.values, out.tensor = values[keep], tensor[keep]
    out.tag_start, out.tag_end = tag_start[keep], tag_end[keep]
    out.md_start, out.md_end = md_start[keep], ve[keep]
    return out


def _fast_value_spans(buf: np.ndarray, *, start: np.ndarray, end: np.ndarray, ok: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Walk the ``Summary.value`` fields from ``start`` to ``end`` of every record at once.

    Returns, per value in file order: its record (position in ``start``), its position in the
    Summary, its byte range; and per record whether the walk framed it exactly (at least one
    value, each a well-formed field inside the Summary, the last one ending at ``end``)."""
    ok = ok & (start < end)
    active = np.flatnonzero(ok)
    pos = start.copy()
    parts: list[tuple[np.ndarray, int, np.ndarray, np.ndarray]] = []
    for k in range(_MAX_VALUES):
        if not len(active):
            break
        p = pos[active]
        length, used, good = _varint(buf, p + 1)
        vs = p + 1 + used
        good &= (_byte(buf, p) == 0x0A) & (vs + length <= end[active])
        ok[active[~good]] = False
        active, vs = active[good], vs[good]
        ve = vs + length[good]
        parts.append((active, k, vs, ve))
        pos[active] = ve
        active = active[ve < end[active]]
    ok[active] = False  # more values than _MAX_VALUES
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty, empty, ok
    if all(len(a) == len(parts[0][0]) for a, _, _, _ in parts):
        # every record framed holds as many values (each round's records are among the round
        # before's, so the same records): file order is the rounds side by side, no sort needed
        first, m = parts[0][0], len(parts)
        return (np.repeat(first, m), np.tile(np.arange(m, dtype=np.int64), len(first)),
                np.stack([v for _, _, v, _ in parts], axis=1).ravel(),
                np.stack([v for _, _, _, v in parts], axis=1).ravel(), ok)
    rec = np.concatenate([a for a, _, _, _ in parts])
    sub = np.concatenate([np.full(len(a), k, dtype=np.int64) for a, k, _, _ in parts])
    order = np.lexsort((sub, rec))
    vs = np.concatenate([v for _, _, v, _ in parts])[order]
    ve = np.concatenate([v for _, _, _, v in parts])[order]
    return rec[order], sub[order], vs, ve, ok


def _fast_steps(buf: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The optional ``Event.step`` varint at each ``p``: (step, 0 when absent; where the summary
    field must start; the varint is well formed)."""
    has_step = _byte(buf, p) == 0x10
    raw = _le(buf, p + 1, 10)
    term = raw < 0x80  # the last byte of a varint has its high bit clear
    vlen = term.argmax(axis=1) + 1
    ok = ~has_step | (term.any(axis=1) & ((vlen < 10) | (raw[:, 9] <= 1)))
    steps = np.zeros(len(p), dtype=np.uint64)
    for i in range(int(vlen[has_step].max()) if has_step.any() else 0):  # few bytes: small steps
        part = (raw[:, i] & 0x7F).astype(np.uint64) << np.uint64(7 * i)
        steps |= np.where(i < vlen, part, np.uint64(0))
    steps = np.where(has_step, steps.view(np.int64), 0)
    return steps, np.where(has_step, p + 1 + vlen, p), ok


def _fast_tag(buf: np.ndarray, vs: np.ndarray, ve: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each value's leading non-empty ``Value.tag``: (tag start, tag end, framed inside the value)."""
    tag_len, used, good = _varint(buf, vs + 1, 2)
    tag_start = vs + 1 + used
    tag_end = tag_start + tag_len
    return tag_start, tag_end, (_byte(buf, vs) == 0x0A) & good & (tag_len > 0) & (tag_end < ve)


def _fast_values(buf: np.ndarray, s: np.ndarray, end: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The value after the tag (at ``s``), up to the value's ``end``: (a scalar layout matches,
    its number, it is a v2 tensor rather than a ``simple_value``, where its SummaryMetadata
    starts, ``end`` when it has none)."""
    simple = _byte(buf, s) == 0x15
    t = s + 2  # the TensorProto
    dbl = _byte(buf, t + 1) == 2
    shaped = (_byte(buf, t + 2) == 0x12) & (_byte(buf, t + 3) == 0)
    q = np.where(shaped, t + 4, t + 2)  # the one number's field
    field, size = _byte(buf, q), _byte(buf, q + 1)
    tensor = ((_byte(buf, s) == 0x42) & (_byte(buf, t) == 0x08)
              & np.where(dbl, (field == 0x32) | (field == 0x22), (field == 0x2A) | (field == 0x22))
              & (size == np.where(dbl, 8, 4)) & ((_byte(buf, t + 1) == 1) | dbl)
              & (t + _byte(buf, s + 1) == q + 2 + size))
    after = np.where(simple, s + 5, q + 2 + size)
    md_len, used, good = _varint(buf, after + 1)
    with_md = (_byte(buf, after) == 0x4A) & good & (after + 1 + used + md_len == end)
    matched = (simple | tensor) & ((after == end) | with_md)
    at = np.where(simple, s + 1, q + 2)
    values = _le(buf, at, 4).view("<f4")[:, 0].astype(np.float64)
    wide = np.flatnonzero(tensor & dbl & matched)
    values[wide] = _le(buf, at[wide], 8).view("<f8")[:, 0]
    return matched, values, tensor & ~simple, np.where(with_md & matched, after + 1 + used, end)


class _State:
    """What the protobuf path gathers, record by record in file order, and the tag/plugin codes
    both paths share."""

    def __init__(self) -> None:
        self.tag_code: dict[str, int] = {}
        self.raw_tags: dict[bytes, int] = {}
        self.plugin_code: dict[str, int] = {}
        self.md_plugin: dict[bytes, int] = {}
        # points: record index, position in the record, tag code, plugin code, step, value, clock
        self.index: list[int] = []
        self.sub: list[int] = []
        self.codes: list[int] = []
        self.plugins: list[int] = []
        self.steps: list[int] = []
        self.values: list[float] = []
        self.walls: list[float] = []
        # every value whose metadata names a plugin: (record index, position, tag code, plugin code)
        self.named: list[tuple[int, int, int, int]] = []
        self.plugin_of: dict[str, str] = {}
        self.config: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.session_starts: list[int] = []

    def code(self, tag: str) -> int:
        code = self.tag_code.get(tag)
        if code is None:
            code = self.tag_code[tag] = len(self.tag_code)
            self.raw_tags[tag.encode("utf-8")] = code
        return code

    def plugin(self, name: str) -> int:
        return self.plugin_code.setdefault(name, len(self.plugin_code))


def _plugin_name(md: Any) -> str:
    """The plugin a SummaryMetadata names; a scalar data class counts as ``scalars``."""
    name = md.plugin_data.plugin_name
    if not name and md.data_class == _DATA_CLASS_SCALAR:
        return "scalars"
    return name


def _read_event(event: Any, *, index: int, state: _State, ref: str) -> None:
    """Take the scalars, config texts and hparams out of one Event."""
    what = event.WhichOneof("what")
    if what != "summary":
        if what == "file_version":
            state.meta["file_version"] = event.file_version
        elif what == "session_log" and event.session_log.status == 1:  # SessionLog.START
            state.session_starts.append(event.step)
        return
    step = event.step
    wall = event.wall_time
    for sub, value in enumerate(event.summary.value):
        tag = value.tag
        kind = value.WhichOneof("value")
        named = _plugin_name(value.metadata) if value.HasField("metadata") else ""
        if named:
            state.plugin_of[tag] = named
            state.named.append((index, sub, state.code(tag), state.plugin(named)))
        if kind == "simple_value":
            number = value.simple_value
            plugin_code = _SIMPLE
        elif kind == "tensor":
            plugin = state.plugin_of.get(tag, "")
            if plugin in _NON_SCALAR_PLUGINS:
                if plugin == "text":
                    _read_config_text(tag, value.tensor, state, ref)
                elif plugin == "hparams":
                    _read_hparams(value.metadata.plugin_data.content, state, ref)
                continue
            got = _tensor_scalar(value.tensor)
            if got is None:
                if plugin == "" and value.tensor.dtype == _DT_STRING:
                    _read_config_text(tag, value.tensor, state, ref)
                continue
            number = got
            plugin_code = state.plugin(named) if named else _INHERIT
        else:  # no payload: tensorboardX writes its hparams summaries as bare metadata
            if named == "hparams":
                _read_hparams(value.metadata.plugin_data.content, state, ref)
            continue
        state.index.append(index)
        state.sub.append(sub)
        state.codes.append(state.code(tag))
        state.plugins.append(plugin_code)
        state.steps.append(step)
        state.values.append(number)
        state.walls.append(wall)


def _distinct_slices(buf: np.ndarray, *, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """Group byte ranges by content without a Python step per range: (group of each, group bytes).

    Ranges of one length are hashed with numpy; every range is then compared byte for byte with
    its group's first, so a hash collision can only cost time (the exact ``np.unique`` below),
    never a wrong grouping.
    """
    lengths = end - start
    inverse = np.empty(len(start), dtype=np.int64)
    blobs: list[bytes] = []
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        if length == 0:
            inverse[rows] = len(blobs)
            blobs.append(b"")
            continue
        mat = _le(buf, start[rows], length)
        if (mat == mat[0]).all():  # one content (a tag logged at every step): nothing to hash or sort
            inverse[rows] = len(blobs)
            blobs.append(mat[0].tobytes())
            continue
        h = np.zeros(len(rows), dtype=np.uint64)
        for j in range(length):
            h = h * np.uint64(1099511628211) + mat[:, j]
        _, first, inv = np.unique(h, return_index=True, return_inverse=True)
        if not (mat == mat[first][inv]).all():
            _, first, inv = np.unique(mat, axis=0, return_index=True, return_inverse=True)
        inverse[rows] = inv.ravel() + len(blobs)
        blobs.extend(mat[f].tobytes() for f in first.tolist())
    return inverse, blobs


def _fast_plugins(fast: _Fast, *, buf: np.ndarray, state: _State) -> np.ndarray:
    """Plugin codes of the bulk-decoded points (a tensor: from its own metadata, else inherited).

    An event with a value whose metadata names another plugin than ``scalars`` (hparams, text, a
    histogram's, a custom one) is handed back to the protobuf path whole, before it runs: those
    have side effects (config, the plugin a tag's later tensors inherit) only it handles."""
    from tensorboard.compat.proto import summary_pb2

    with_md = np.flatnonzero(fast.md_start < fast.md_end)
    group, blobs = _distinct_slices(buf, start=fast.md_start[with_md], end=fast.md_end[with_md])
    blob_code = np.empty(len(blobs), dtype=np.int64)
    for k, blob in enumerate(blobs):
        try:
            name = _plugin_name(summary_pb2.SummaryMetadata.FromString(blob))
        except DecodeError:
            name = "?"  # unreadable: the protobuf path reports it with its record
        blob_code[k] = state.plugin(name) if name else _INHERIT
    md_code = np.full(len(fast.index), _INHERIT, dtype=np.int64)
    md_code[with_md] = blob_code[group]
    scalars = state.plugin("scalars")
    return md_code[fast.drop_records((md_code != _INHERIT) & (md_code != scalars))]


def _fast_tags_and_plugins(fast: _Fast, *, md_code: np.ndarray, buf: np.ndarray, state: _State
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the bulk-decoded points: tag codes, plugin codes, and the (record index, position, tag
    code, plugin code) rows of those whose metadata names a plugin."""
    group, blobs = _distinct_slices(buf, start=fast.tag_start, end=fast.tag_end)
    blob_code = np.empty(len(blobs), dtype=np.int64)
    for k, t in enumerate(blobs):
        try:
            blob_code[k] = state.code(t.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ReadError(f"a scalar's tag is not valid UTF-8: {t!r}") from exc
    codes = blob_code[group]
    plugins = np.where(fast.tensor, md_code, _SIMPLE).astype(np.int64)
    named = np.flatnonzero(md_code >= 0)
    named_rows = np.stack([fast.index[named], fast.sub[named], codes[named], md_code[named]], axis=1)
    return codes, plugins, named_rows


def _resolve_plugins(*, index: np.ndarray, sub: np.ndarray, codes: np.ndarray, plugins: np.ndarray,
                     named: np.ndarray, state: _State) -> np.ndarray:
    """Which points are scalars: a tensor whose own metadata names no plugin takes the plugin last
    named for its tag before it (TF writes the metadata with a tag's first value only)."""
    simple = plugins == _SIMPLE
    if simple.all():  # simple_values only: scalars whatever their metadata says
        return simple
    keep_codes = {state.plugin_code[n] for n in ("", "scalars") if n in state.plugin_code}
    keep = simple | np.isin(plugins, list(keep_codes))
    inherit = np.flatnonzero(plugins == _INHERIT)
    if not len(inherit):
        return keep
    keep[inherit] = True  # a tag no metadata ever named: a legacy scalar tensor
    if not len(named):
        return keep
    named = named[np.lexsort((named[:, 1], named[:, 0]))]
    order_key = index * 4096 + np.minimum(sub, 4095)
    named_key = named[:, 0] * 4096 + np.minimum(named[:, 1], 4095)
    for tag in np.unique(codes[inherit]):
        rows = inherit[codes[inherit] == tag]
        mine = named[:, 2] == tag
        if not mine.any():
            continue
        keys, names = named_key[mine], named[mine, 3]
        at = np.searchsorted(keys, order_key[rows], side="right") - 1
        has = at >= 0
        keep[rows[has]] = np.isin(names[at[has]], list(keep_codes))
    return keep


def _assemble(*, fast: _Fast, fast_codes: np.ndarray, fast_plugins: np.ndarray, fast_named: np.ndarray,
              state: _State) -> tuple[dict[str, Series], dict[str, int], dict[str, str]]:
    """Merge both paths back into file order and cut one Series per tag (first-seen tag first).

    Also returns how many NaN/inf values of each tag were dropped, and the plugin each tag was
    last named with (what a later read resumed after these records inherits)."""
    index = np.concatenate([fast.index, np.asarray(state.index, dtype=np.int64)])
    sub = np.concatenate([fast.sub, np.asarray(state.sub, np.int64)])
    codes = np.concatenate([fast_codes, np.asarray(state.codes, dtype=np.int64)])
    plugins = np.concatenate([fast_plugins, np.asarray(state.plugins, dtype=np.int64)])
    steps = np.concatenate([fast.steps, np.asarray(state.steps, dtype=np.int64)])
    values = np.concatenate([fast.values, np.asarray(state.values, dtype=np.float64)])
    walls = np.concatenate([fast.walls, np.asarray(state.walls, dtype=np.float64)])
    if len(state.index) and len(fast.index):  # each path alone is already in file order
        order = np.lexsort((sub, index))
        index, sub, codes, plugins = index[order], sub[order], codes[order], plugins[order]
        steps, values, walls = steps[order], values[order], walls[order]
    named = np.concatenate([fast_named, np.asarray(state.named, dtype=np.int64).reshape(-1, 4)])
    plugin_names = {c: n for n, c in state.plugin_code.items()}
    tag_names = {c: t for t, c in state.tag_code.items()}
    last_named = {tag_names[int(r[2])]: plugin_names[int(r[3])]
                  for r in named[np.lexsort((named[:, 1], named[:, 0]))].tolist()} if len(named) else {}
    keep = _resolve_plugins(index=index, sub=sub, codes=codes, plugins=plugins, named=named,
                            state=state)
    if not keep.all():
        codes, steps, values, walls = codes[keep], steps[keep], values[keep], walls[keep]
    names = {c: t for t, c in state.tag_code.items()}
    # tag codes are small: sorted as bytes where they fit (numpy's stable sort of bytes is a radix
    # sort; the order is the same, a stable sort's order being unique)
    small = codes.astype(np.uint8) if len(codes) and 0 <= codes.min() and codes.max() < 256 else codes
    by_tag = np.argsort(small, kind="stable")
    uniq, first, counts = np.unique(codes, return_index=True, return_counts=True)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    series: dict[str, Series] = {}
    dropped: dict[str, int] = {}
    for k in np.argsort(first, kind="stable"):
        sel = by_tag[starts[k]:starts[k] + counts[k]]
        tag = names[int(uniq[k])]
        v = values[sel]
        finite = np.isfinite(v)
        if not finite.all():
            dropped[tag] = int((~finite).sum())
            sel = sel[finite]
            v = v[finite]
        series[tag] = Series(steps[sel], v, walls[sel])
    return series, dropped, last_named


def _read_config_text(tag: str, tensor: Any, state: _State, ref: str) -> None:
    """A text summary named like a config, holding JSON, is merged into the Segment's config."""
    name = _config_name(tag)
    if name is None or not tensor.string_val:
        return
    text = tensor.string_val[0].decode("utf-8", errors="replace")
    try:
        parsed = _parse_config_text(text)
    except ValueError:
        state.warnings.append(f"{ref}: text summary '{tag}' looks like a config but is not JSON; "
                              "ignored")
        return
    if isinstance(parsed, dict):
        state.config.update(parsed)
    else:
        state.config[name] = parsed


def _read_hparams(content: bytes, state: _State, ref: str) -> None:
    try:
        hparams, group = _hparams_config(content)
    except DecodeError:
        state.warnings.append(f"{ref}: unreadable hparams plugin data; ignored")
        return
    state.config.update(hparams)
    if group:
        state.meta["hparams_group"] = group
