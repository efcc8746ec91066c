"""Read a W&B run folder's ``.wandb`` transaction log ourselves.

wandb >= 0.30 no longer ships a Python reader for this file, and offline folders hold nothing else
(no ``config.yaml``, no ``wandb-summary.json``), so the log is the only record of what the process
logged. Its framing is the LevelDB log format as wandb-core writes it (``core/pkg/leveldb``, opened
with ``CRCAlgoIEEE``): a 7-byte file header (``:W&B``, 0xBEE1 little-endian, version 0) at the start
of the first 32 KiB block; then chunks that never cross a block boundary, each with a 7-byte header
(CRC-32/IEEE of the type byte followed by the payload, i.e. ``zlib.crc32(payload, crc32(type))``;
payload length, 2 bytes LE; type FULL/FIRST/MIDDLE/LAST); a block tail shorter than a chunk header
is zero padding. Each record is a serialized ``wandb_internal_pb2.Record``.

Speed: a run logs a history row, and wandb-core writes summary updates beside it, at every step,
so a long run holds hundreds of thousands of records. Building a protobuf object per record and per
item, and calling ``json.loads`` per value, costs seconds; instead the records are parsed in one
protobuf parse of their concatenation (repeated fields append, so rows keep their order), history
items in one more (a flat message collecting every key and every value), each distinct key is
decoded once, and values become floats a column at a time in numpy, which accepts exactly the
JSON numbers (plus the ``Infinity``/``NaN`` the writers emit) and rejects every other JSON value.
A large history (``ARROW_MIN_VALUES``) goes through Arrow instead of a Python object per item: its
keys are coded by dictionary encoding and a column of plain decimal numbers is parsed by Arrow
(correctly rounded: the same doubles). The summary is folded with a ``dict`` over the items' key
bytes.

A run's log grows while the run lives, and the watcher reads it again and again:
``read_wandb_run_dir_since`` reads only the bytes after where its last read stopped (a
``sources.resume.Resume``) and adds what they hold to what that read had decoded, giving the
Segment a read of the whole log gives.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from ..model import Segment, Series, steps_out_of_range
from .limits import current_budget, path_kind, read_regular, sniff, zero_stretches
from .local import ReadError
from .resume import Resume

FILE_HEADER = b":W&B" + struct.pack("<H", 0xBEE1)
FILE_HEADER_LEN = 7
FORMAT_VERSION = 0
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
CHUNK_SEEDS = [zlib.crc32(bytes([t])) for t in range(5)]
VALUE_TAG = b"\x82\x01"  # item field 16 (value_json), wire type 2
NUMERIC_START = frozenset(b"-0123456789IN")  # how a JSON number (or Infinity/NaN) can begin
_NUMERIC_BYTES = np.frombuffer(bytes(sorted(NUMERIC_START)), dtype=np.uint8)
MAX_WARNINGS = 5


def _schemas() -> dict[str, Any]:
    """The part of ``wandb_internal.proto`` we read, wire-compatible (same field numbers and types).

    Declared here rather than imported from ``wandb.proto`` because importing that imports all of
    ``wandb`` (about a second), and because declaring items as ``bytes`` lets a whole file be read
    in one parse (``Batch``) with the history/summary items left raw.
    """
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="klwatch_wandb_log.proto", package="klwatch_wandb_log")
    scalar = {"bytes": F.TYPE_BYTES, "string": F.TYPE_STRING, "int64": F.TYPE_INT64, "int32": F.TYPE_INT32,
              "sint64": F.TYPE_SINT64, "double": F.TYPE_DOUBLE, "bool": F.TYPE_BOOL}

    def message(name: str, *fields: str) -> None:
        """Fields written as ``[repeated] type name = number``."""
        m = f.message_type.add(name=name)
        for spec in fields:
            words = spec.replace("=", " ").split()
            ftype, fname, number = words[-3:]
            fd = m.field.add(name=fname, number=int(number),
                             label=F.LABEL_REPEATED if words[0] == "repeated" else F.LABEL_OPTIONAL)
            if ftype in scalar:
                fd.type = scalar[ftype]
            else:
                fd.type, fd.type_name = F.TYPE_MESSAGE, f".klwatch_wandb_log.{ftype}"

    message("Step", "int64 num = 1")
    message("HistoryStep", "Step step = 2")
    message("ItemList", "repeated bytes item = 1")
    message("Empty")
    message("Flat", "repeated bytes key = 1", "repeated bytes nested_key = 2", "repeated sint64 integer = 5",
            "repeated double number = 6", "repeated bytes json = 8", "repeated bytes value_json = 16")
    message("Summary", "repeated bytes update = 1", "repeated bytes remove = 2")
    message("Item", "string key = 1", "repeated string nested_key = 2", "sint64 integer = 5",
            "double number = 6", "string json = 8", "string value_json = 16")
    message("Config", "repeated Item update = 1", "repeated Item remove = 2")
    message("Timestamp", "int64 seconds = 1", "int32 nanos = 2")
    message("BranchPoint", "string run = 1", "double value = 2", "string metric = 3")
    message("Run", "string run_id = 1", "string entity = 2", "string project = 3", "Config config = 4",
            "string run_group = 6", "string job_type = 7", "string display_name = 8",
            "repeated string tags = 10", "int64 starting_step = 14", "Timestamp start_time = 17",
            "bool resumed = 18", "int32 runtime = 20", "bool forked = 22", "BranchPoint branch_point = 23",
            "bool resume = 24")
    message("Exit", "int32 exit_code = 1", "int32 runtime = 2")
    # History records whose items all merge into one Flat (a message field that is not repeated
    # merges every occurrence): a whole history's keys and values in one parse.
    message("FlatRows", "Flat item = 1")
    # Record's record_type oneof members we read. As a batch over many concatenated Records every
    # member is repeated (order kept); history and summary records are kept as bytes.
    message("Batch", "repeated bytes history = 2", "repeated bytes summary = 3", "repeated Config config = 5",
            "repeated Run run = 17", "repeated Exit exit = 18", "repeated Empty preempting = 23")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"klwatch_wandb_log.{m.name}"))
            for m in f.message_type}


_SCHEMAS: dict[str, Any] = {}


def _msg(name: str) -> Any:
    if not _SCHEMAS:
        _SCHEMAS.update(_schemas())
    return _SCHEMAS[name]


# -- framing ------------------------------------------------------------------------------------


def read_records(data: bytes, *, name: str) -> tuple[list[bytes], list[str]]:
    """Un-frame a ``.wandb`` file: its whole records (payloads, in order) and warnings.

    A file cut short (crash, or a run still being written) is read up to its last whole record,
    with a warning. A corrupt chunk (CRC mismatch, impossible length or type) is skipped soundly only
    by jumping to the next 32 KiB block, where a chunk must start (continuation chunks of a record
    that began before it are skipped too), with a warning; when no later block exists there is no
    sound way on: ReadError.
    """
    got = _unframe(data, name)
    return got.out, got.warnings


def _unframe(data: bytes, name: str) -> _Unframer:
    """``read_records``, keeping where each record begins (``offsets``) for the messages."""
    _check_file_header(data)
    got = _Unframer(data, name)
    got.run()
    return got


def _check_file_header(data: bytes) -> None:
    """Refuse a file that is not a version-0 W&B log before reading any chunk of it."""
    if len(data) < FILE_HEADER_LEN:
        raise ReadError(f"not a W&B transaction log: {len(data)} bytes, shorter than its 7-byte header")
    if data[:6] != FILE_HEADER:
        raise ReadError(f"not a W&B transaction log: header {data[:7]!r}, expected b':W&B\\xe1\\xbe\\x00'")
    if data[6] != FORMAT_VERSION:
        raise ReadError(f"unsupported .wandb format version {data[6]} (this reader knows version 0)")


_CHUNK_HEADER = struct.Struct("<IHB")  # CRC-32, payload length, chunk type


class _Unframer:
    """One pass over a ``.wandb`` file's chunks (or over its bytes from ``base`` on, for a resumed
    read), holding what the pass has found so far.

    The state (records out, a FIRST..LAST record being assembled, whether corruption was just
    skipped) is shared by the fast path for runs of whole FULL chunks and the careful path for
    everything else, which is why it lives in one object rather than in the functions' locals.
    Positions inside are relative to ``data``; blocks and every byte named in a message are
    absolute (``base`` + position), so a resumed pass frames and words things as a whole pass does.
    """

    def __init__(self, data: bytes, name: str, *, base: int = 0, prior: int = 0, skipped: int = 0) -> None:
        self.data = data
        self.name = name
        self.base = base
        self.n = len(data)
        self.prior = prior
        """Whole records before ``base`` (a resumed pass): the messages count them."""
        self.out: list[bytes] = []
        self.offsets: list[int] = []
        """The (absolute) byte at which each record of ``out`` begins (its first chunk's header)."""
        self.warnings: list[str] = []
        self.parts: list[bytes] | None = None  # chunks of a FIRST..LAST record being assembled
        self.part_start = 0  # absolute
        self.resyncing = False  # just jumped past corruption: skip MIDDLE/LAST chunks of a lost record
        self.skipped = skipped
        self.last_end = 0 if base else FILE_HEADER_LEN
        """Where the last whole record ends (relative): a later read may go on from there."""
        self.warned_at = 0
        self.skipped_at = skipped
        """``len(warnings)`` and ``skipped`` when the last whole record was taken: what a read of
        the bytes before ``last_end`` alone would have warned."""

    def run(self) -> tuple[list[bytes], list[str]]:
        """Every chunk from the file header (or ``base``) on, block by block; then the warnings for
        the end."""
        n, base = self.n, self.base
        pos = 0 if base else FILE_HEADER_LEN
        while pos < n:
            block_end = pos - (pos + base) % BLOCK + BLOCK
            if self.parts is None:
                pos = self._full_chunks(pos, min(block_end, n))
                if pos >= n:
                    break
            if block_end - pos < CHUNK_HEADER:  # block tail too short for a chunk: zero padding
                pos = block_end
                continue
            pos = self._chunk(pos, block_end)
            if pos < 0:
                break
        if self.parts is not None:
            self.warnings.append(
                f"{self.name} is cut short inside a record that began at byte {self.part_start} (crash, or "
                f"a run still being written): read the {self.records} whole records before it")
        summary = self.skipped_summary(self.skipped)
        if summary:
            self.warnings.append(summary)
        return self.out, self.warnings

    @property
    def records(self) -> int:
        """Whole records before the current position, counting those before ``base``."""
        return self.prior + len(self.out)

    def skipped_summary(self, skipped: int) -> str | None:
        """The closing warning for many skipped stretches (each past the first few had none)."""
        return f"{self.name}: {skipped} corrupt stretches skipped in all" if skipped > MAX_WARNINGS else None

    def _full_chunks(self, pos: int, limit: int) -> int:
        """The fast path: whole FULL chunks with a good CRC, as far as they go before ``limit``;
        where the first other chunk starts. This loop runs once per record of a long run, so it
        stays a tight loop over locals."""
        data, append, at = self.data, self.out.append, self.offsets.append
        unpack, crc32, seed_full = _CHUNK_HEADER.unpack_from, zlib.crc32, CHUNK_SEEDS[FULL]
        count, base, last_header = len(self.out), self.base, limit - CHUNK_HEADER
        while pos <= last_header:
            crc, length, ctype = unpack(data, pos)
            start = pos + 7  # CHUNK_HEADER, FULL: literals, as globals cost a lookup per record
            end = start + length
            if ctype != 1 or end > limit:
                break
            payload = data[start:end]
            if crc32(payload, seed_full) != crc:
                break
            append(payload)
            at(pos)
            pos = end
        if len(self.out) > count:
            self.resyncing = False
            if base:
                self.offsets[count:] = [o + base for o in self.offsets[count:]]
            self.last_end, self.warned_at, self.skipped_at = pos, len(self.warnings), self.skipped
        return pos

    def _chunk(self, pos: int, block_end: int) -> int:
        """The careful path for the chunk at ``pos``: where to go on, or -1 to stop reading."""
        data, n = self.data, self.n
        if pos + CHUNK_HEADER > n:
            self._cut_short("inside a chunk header")
            return -1
        crc, length, ctype = _CHUNK_HEADER.unpack_from(data, pos)
        start = pos + CHUNK_HEADER
        end = start + length
        if end > block_end or not 0 < ctype < 5:
            why = (f"chunk type {ctype}" if not 0 < ctype < 5
                   else f"chunk length {length} runs past its 32 KiB block")
            return self._corrupt(pos, why)
        if end > n:
            self._cut_short("inside a record")
            return -1
        payload = data[start:end]
        computed = zlib.crc32(payload, CHUNK_SEEDS[ctype])
        if computed != crc:
            return self._corrupt(pos, f"CRC mismatch (stored {crc:#010x}, computed {computed:#010x})")
        self._take(ctype, payload, pos, end)
        return end

    def _take(self, ctype: int, payload: bytes, pos: int, end: int) -> None:
        """Assemble a whole chunk whose CRC holds: the framing stays aligned whatever its type says."""
        at = self.base + pos
        if ctype == FULL or ctype == FIRST:
            if self.parts is not None:
                self.warnings.append(f"{self.name}: record at byte {self.part_start} never finished; dropped")
            self.resyncing = False
            if ctype == FULL:
                self.parts = None
                self._record(payload, at, end)
            else:
                self.parts, self.part_start = [payload], at
        elif self.parts is None:
            if not self.resyncing:
                self.warnings.append(f"{self.name}: continuation chunk at byte {at} without a first chunk; "
                                     "skipped")
        else:
            self.parts.append(payload)
            if ctype == LAST:
                self._record(b"".join(self.parts), self.part_start, end)
                self.parts = None

    def _record(self, payload: bytes, at: int, end: int) -> None:
        """A whole record taken: out it goes, and a later read may go on after it."""
        self.out.append(payload)
        self.offsets.append(at)
        self.last_end, self.warned_at, self.skipped_at = end, len(self.warnings), self.skipped

    def _cut_short(self, where: str) -> None:
        """The file ends inside a chunk: keep the whole records before it; a record being assembled
        is lost with it, so it gets no warning of its own."""
        self.warnings.append(f"{self.name} is cut short at byte {self.base + self.n} {where} (crash, or a run "
                             f"still being written): read the {self.records} whole records before it")
        self.parts = None

    def _corrupt(self, at: int, why: str) -> int:
        """Where to go on after a corrupt chunk at ``at``: the next block, or -1 (zero-filled end)."""
        data, n, name, base = self.data, self.n, self.name, self.base
        if not any(data[at:]):
            self.warnings.append(f"{name} ends in {n - at} zero bytes from byte {base + at} (cut short by a "
                                 f"crash?): read the {self.records} whole records before them")
            return -1
        next_block = ((base + at) // BLOCK + 1) * BLOCK
        if next_block >= base + n:
            raise ReadError(f"corrupt record at byte {base + at}: {why}; no later 32 KiB block to resume from")
        self.skipped += 1
        if self.skipped <= MAX_WARNINGS:
            lost = " and the record it continued" if self.parts is not None else ""
            self.warnings.append(f"{name}: corrupt record at byte {base + at}: {why}; skipped to the next 32 KiB "
                                 f"block at byte {next_block}, losing the records in between{lost}")
        self.parts, self.resyncing = None, True
        return next_block - base


def _bytes_at(offsets: list[int]) -> str:
    """``byte 7`` / ``bytes 7, 93, ...``: where a few records begin, for a message."""
    shown = ", ".join(map(str, offsets[:MAX_WARNINGS])) + (", ..." if len(offsets) > MAX_WARNINGS else "")
    return f"byte{'s' if len(offsets) > 1 else ''} {shown}"


def _decodable(messages: list[bytes], schema: str) -> tuple[list[bytes], int]:
    """The messages that parse, and how many did not (after a batch of them failed to parse)."""
    good = []
    for m in messages:
        try:
            _msg(schema).FromString(m)
            good.append(m)
        except DecodeError:
            pass
    return good, len(messages) - len(good)


def _parse_joined(messages: list[bytes], schema: str, *, sep: bytes = b"",
                  strict: bool = False) -> tuple[Any, list[bytes], int]:
    """``messages`` joined (with ``sep`` before each) and parsed as one ``schema`` message; those that
    do not parse alone (a good CRC over bad bytes) are dropped: (message, kept, dropped).
    ``strict``: a message that does not parse is a DecodeError instead."""
    out = _msg(schema)()
    try:
        out.ParseFromString(sep + sep.join(messages) if sep else b"".join(messages))
        return out, messages, 0
    except DecodeError:
        if strict:
            raise
        kept, dropped = _decodable(messages, schema)
        out.ParseFromString(sep + sep.join(kept) if sep else b"".join(kept))
        return out, kept, dropped


# -- items --------------------------------------------------------------------------------------

ROW_MARK_ITEM = b"\x12\x01\xfe\x82\x01\x01\xfe"
"""An item (nested_key and value_json both b"\\xfe", never valid UTF-8, so never a real item) put
before each history row so that one flat list of items still tells where rows begin."""
ROW_MARK = b"\x0a\x07" + ROW_MARK_ITEM  # the same, as a HistoryRecord ``item`` field


def _varint(b: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        if c < 0x80:
            return value, i
        shift += 7


def _prefix_key(pre: bytes) -> str | None:
    """The key spelled by an item's fields before ``value_json`` (key / nested_key only), else None."""
    key, nested, i, n = "", [], 0, len(pre)
    try:
        while i < n:
            tag, i = _varint(pre, i)
            if tag & 7 != 2 or (tag >> 3) not in (1, 2):
                return None
            length, i = _varint(pre, i)
            if i + length > n:
                return None
            text = pre[i:i + length].decode("utf-8", "replace")
            i += length
            if tag >> 3 == 1:
                key = text
            else:
                nested.append(text)
    except IndexError:
        return None
    return ".".join(nested) if nested else (key or None)


def _slow_item(raw: bytes, *, typed: bool) -> tuple[str | None, Any]:
    """One item parsed fully: (key, JSON value bytes, or None when it has no value)."""
    try:
        item = _msg("Item").FromString(raw)
    except DecodeError:
        return None, None
    key = ".".join(map(_text, item.nested_key)) or _text(item.key) or None
    if item.HasField("value_json"):
        return key, _utf8(item.value_json)
    if typed:  # history items may carry typed values instead of value_json: as JSON text too
        if item.HasField("number"):
            return key, json.dumps(item.number).encode()
        if item.HasField("integer"):
            return key, str(item.integer).encode()
        if item.HasField("json"):
            return key, _utf8(item.json)
    return key, None


def _text(value: str | bytes) -> str:
    """A string field as text: protobuf gives bytes for a (proto2) string that is not valid UTF-8,
    which a damaged record with a good CRC can hold."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _utf8(value: str | bytes) -> bytes:
    """A string field as UTF-8 bytes (it may come as bytes already: see ``_text``)."""
    return value if isinstance(value, bytes) else value.encode()


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_str_len = getattr(np, "strings", np.char).str_len

ARROW_MIN_VALUES = 20_000
"""From this many history items (or summary items) on, they are read through Arrow: keys coded by
dictionary encoding and numbers parsed a column at a time (``Items._plain_floats``), with no Python
object per item; below it pyarrow is not even imported."""


def _plain_key(key: bytes) -> bool:
    """A key that is valid UTF-8, not empty, and not the row marker's name: its name stands for it
    alone."""
    try:
        return key.decode("utf-8") not in ("", "\ufffd")
    except UnicodeDecodeError:
        return False


def _value_bytes(v: bytes) -> bytes | None:
    """``varint length + value_json`` -> value_json, when that is all there is."""
    try:
        length, i = _varint(v, 0)
    except IndexError:
        return None
    return v[i:] if len(v) - i == length else None


class Items:
    """The keys and values of a list of raw history/summary items, decoded in bulk.

    ``codes[i]`` indexes ``names`` (the item's key, nested keys joined with '.', or None when it
    has none); ``values(idx)`` gives the JSON values of the items at ``idx`` as a numpy bytes
    array, with a mask of the items that have one.

    Fast path (every item exactly one ``nested_key`` and one ``value_json``, as wandb-core writes
    for flat keys): all items are parsed in one go as one message whose repeated fields collect
    every key and every value in order; the counts must match the items, and the row markers
    (``marks``) must sit where their key does. Otherwise each item is split at its
    ``value_json`` tag and each distinct key encoding is decoded once (``split``: always).

    ``regular`` says whether these items read the same appended to others read the same way
    (``read_wandb_run_dir_since``): distinct keys keep distinct names, and every item is read
    from its key fields and its ``value_json`` alone.
    """

    def __init__(self, raws: list[bytes], *, typed: bool, marks: np.ndarray | None = None,
                 split: bool = False) -> None:
        self.raws = raws
        self.typed = typed
        self._count = len(raws)
        self._list: list[bytes] | None = None  # the values, on the fast path (or ``_arrow_values``)
        self._arrow_values: Any = None
        self._arrow: Any = None
        self._values = np.empty(len(raws), dtype=object)
        self._prefixed = False  # values still carry their varint length (split path)
        self.flat = not split and self._try_flat(marks)
        self.odd = False  # an item parsed fully, or a value that is not exactly a varint length + JSON
        if not self.flat:
            self._split()

    @property
    def regular(self) -> bool:
        if self.flat:
            return self._plain_keys
        return not self.odd

    @property
    def _values(self) -> np.ndarray:
        """The values as a numpy object array of bytes (made from the Arrow array on first use)."""
        if self._objects is None:
            self._objects = np.empty(self._count, dtype=object)
            self._objects[:] = self._list if self._list is not None else self._arrow_values.to_pylist()
        return self._objects

    @_values.setter
    def _values(self, values: np.ndarray) -> None:
        self._objects = values

    @classmethod
    def flat_rows(cls, joined: bytes, nrows: int) -> tuple[Items, np.ndarray] | None:
        """The items of ``nrows`` history records joined with ``ROW_MARK`` before each, parsed
        straight into one ``Flat`` (no list of items, no second join), and the row marks; None
        unless it reads exactly as ``Items(..., marks=...)`` reads the listed items on its fast
        path: every item parses alone, with one ``nested_key`` and one ``value_json``, and the
        items keyed like a row mark are the ``nrows`` row marks."""
        try:
            flat = _msg("FlatRows").FromString(joined).item
            n = len(_msg("ItemList").FromString(joined).item)  # counted, never turned into bytes objects
        except DecodeError:
            return None
        if (len(flat.nested_key) != n or len(flat.value_json) != n or len(flat.key)
                or len(flat.number) or len(flat.integer) or len(flat.json)):
            return None
        self = cls.__new__(cls)
        self.raws, self.typed, self._prefixed, self.flat, self.odd = [], True, False, True, False
        self._count, self._list, self._arrow_values, self._arrow, self._objects = n, None, None, None, None
        encoded = _arrow_binary(flat.nested_key, flat.value_json) if n >= ARROW_MIN_VALUES else None
        if encoded is not None:  # many items: keys coded and values held by Arrow, no object per item
            keys, self._arrow_values = encoded
            keys = keys.dictionary_encode()  # codes in the order keys first appear, as dict.fromkeys
            code_of = {k: i for i, k in enumerate(keys.dictionary.to_pylist())}
            self.codes = keys.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            marks = self.codes == code_of.get(b"\xfe", -1)
            offsets, raw = _arrow_layout(self._arrow_values)
            at = offsets[:-1][marks]
            if int(marks.sum()) != nrows or not ((offsets[1:][marks] - at == 1).all()
                                                  and (raw[np.minimum(at, max(raw.size - 1, 0))] == 0xFE).all()):
                return None
        else:
            keys = list(flat.nested_key)
            code_of = {k: i for i, k in enumerate(dict.fromkeys(keys))}
            self.codes = np.fromiter(map(code_of.__getitem__, keys), dtype=np.int64, count=n)
            marks = self.codes == code_of.get(b"\xfe", -1)
            self._list = list(flat.value_json)
            if int(marks.sum()) != nrows or not (self._values[marks] == b"\xfe").all():
                return None
        self.names = [k.decode("utf-8", "replace") or None for k in code_of]
        self._plain_keys = all(k == b"\xfe" or _plain_key(k) for k in code_of)
        return self, marks

    def _try_flat(self, marks: np.ndarray | None) -> bool:
        flat = _msg("Flat")()
        try:
            flat.ParseFromString(b"".join(self.raws))
        except DecodeError:
            return False
        n = len(self.raws)
        if (len(flat.nested_key) != n or len(flat.value_json) != n or len(flat.key)
                or len(flat.number) or len(flat.integer) or len(flat.json)):
            return False
        keys = list(flat.nested_key)
        code_of = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        self.codes = np.fromiter(map(code_of.__getitem__, keys), dtype=np.int64, count=n)
        if marks is not None and not np.array_equal(marks, self.codes == code_of.get(b"\xfe", -1)):
            return False
        self.names = [k.decode("utf-8", "replace") or None for k in code_of]
        self._plain_keys = all(k == b"\xfe" or _plain_key(k) for k in code_of)
        self._list = list(flat.value_json)
        self._values[:] = self._list
        return True

    def _split(self) -> None:
        parts = list(map(bytes.partition, self.raws, repeat(VALUE_TAG)))
        pres = [p for p, _, _ in parts]
        self._values[:] = [v for _, _, v in parts]
        self._prefixed = True
        distinct = list(dict.fromkeys(pres))
        code_of = {p: i for i, p in enumerate(distinct)}
        codes = np.fromiter(map(code_of.__getitem__, pres), dtype=np.int64, count=len(pres))
        names = [_prefix_key(p) for p in distinct]
        name_code = {name: i for i, name in enumerate(dict.fromkeys(names))}
        self.names = list(name_code)
        self.codes = np.array([name_code[name] for name in names], dtype=np.int64)[codes]
        # a prefix that spells no key: a typed value, or no value_json tag at all: parse those fully
        unknown = [c for c, name in enumerate(names) if name is None]
        self.odd = bool(unknown)
        for i in (np.flatnonzero(np.isin(codes, unknown)).tolist() if unknown else []):
            key, value = _slow_item(self.raws[i], typed=self.typed)
            self._values[i] = b"" if value is None else _encode_varint(len(value)) + value
            if key not in name_code:
                name_code[key] = len(self.names)
                self.names.append(key)
            self.codes[i] = name_code[key]

    def values(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raw = self._values[idx].astype(np.bytes_)
        n, width = len(raw), raw.dtype.itemsize
        if not self._prefixed:
            return raw, np.ones(n, dtype=bool)
        if width < 2:
            self.odd = True
            return np.zeros(n, dtype="S1"), np.zeros(n, dtype=bool)
        # strip the one-byte varint length in numpy; longer values one by one
        mat = raw.view(np.uint8).reshape(n, width)
        present = mat[:, 0].astype(np.int64) == _str_len(raw) - 1
        body = np.ascontiguousarray(mat[:, 1:]).view(f"S{width - 1}").ravel()
        if not present.all():
            self.odd = True
        for i in np.flatnonzero(~present).tolist():
            value = _value_bytes(self._values[idx[i]])
            if value is not None:
                body[i], present[i] = value, True
        return body, present

    def floats(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``json_floats(*self.values(idx))``: the values at ``idx`` as floats, and which are numbers.

        On the fast path the values are bytes already, and Python's ``float`` reads them straight
        from the object array (no fixed-width copy first): for every value that begins like a JSON
        number it accepts exactly what numpy's parse (with ``float`` after it) accepts, to the same
        double. Any value it refuses (a trailing NUL, which the copy would have dropped, or no
        number at all) sends the column the careful way."""
        if self._prefixed:
            return json_floats(*self.values(idx))
        if self._count >= ARROW_MIN_VALUES:
            got = self._plain_floats(idx)
            if got is not None:
                return got, np.ones(len(idx), dtype=bool)
        raw = self._values[idx]
        first = raw.astype("S1").view(np.uint8)
        numeric = np.isin(first, _NUMERIC_BYTES)
        try:
            if numeric.all():  # the usual column: no copies for a mask
                return raw.astype(np.float64), numeric
            out = np.zeros(len(raw), dtype=np.float64)
            out[numeric] = raw[numeric].astype(np.float64)
        except (ValueError, TypeError):
            return json_floats(*self.values(idx))
        return out, numeric

    def _plain_floats(self, idx: np.ndarray) -> np.ndarray | None:
        """The values at ``idx`` as floats, parsed by Arrow, when every one is a plain decimal
        number (its first byte a digit, or a minus sign and a digit) that Arrow reads; else None
        (the column goes the ways above).

        Arrow parses decimal numbers correctly rounded, as Python's ``float`` does, so on the
        values it accepts among those that begin this way the two give the same double
        (``tests/sources/test_wandb_log_speedpaths.py``); ``NaN``, ``Infinity`` and anything
        else are left to ``float``, as Arrow also reads forms ``float`` refuses (``nan(1)``)."""
        import pyarrow as pa

        if self._arrow is None:
            arr = self._arrow_values
            if arr is None:
                arr = _arrow_binary(self._list)
                if arr is None:
                    return None
                arr = arr[0]
            offsets, raw = _arrow_layout(arr)
            plain = np.zeros(len(arr), dtype=bool)
            if raw.size:
                start, length = offsets[:-1], np.diff(offsets)
                last = raw.size - 1
                first = raw[np.minimum(start, last)]
                second = raw[np.minimum(start + 1, last)]
                digit1 = (first >= 0x30) & (first <= 0x39)
                digit2 = (second >= 0x30) & (second <= 0x39)
                plain = (length >= 1) & digit1 | (length >= 2) & (first == 0x2D) & digit2
            self._arrow = (arr, plain)
        arr, plain = self._arrow
        if not plain[idx].all():
            return None
        try:
            parsed = arr.take(pa.array(idx)).cast(pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        return np.array(parsed.to_numpy(zero_copy_only=False), dtype=np.float64)  # an array of its own

    def groups(self) -> dict[str, np.ndarray]:
        """Key -> positions of its items, in logged order."""
        if not len(self.codes):
            return {}
        order = np.argsort(self.codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(self.codes, minlength=len(self.names)))])
        return {name: order[bounds[c]:bounds[c + 1]] for c, name in enumerate(self.names)
                if name is not None and bounds[c + 1] > bounds[c]}


def _arrow_binary(*columns: Any) -> tuple[Any, ...] | None:
    """Each column (a sequence of bytes) as one Arrow binary array, or None when one would not fit
    in one (more than 2 GiB of bytes)."""
    import pyarrow as pa

    out = []
    for column in columns:
        try:
            arr = pa.array(column, type=pa.binary())
        except pa.ArrowException:  # e.g. ArrowCapacityError: the per-item ways have no such bound
            return None
        if not isinstance(arr, pa.Array):
            return None
        out.append(arr)
    return tuple(out)


def _arrow_layout(arr: Any) -> tuple[np.ndarray, np.ndarray]:
    """An Arrow binary array's offsets (one more than its values) and bytes, as numpy arrays."""
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + n + 1]
    data = arr.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None and data.size else np.zeros(0, dtype=np.uint8)
    return offsets, raw


def to_floats(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """JSON values (bytes, or None) -> (floats, mask of the numeric ones), one by one."""
    n = len(values)
    out = np.zeros(n, dtype=np.float64)
    ok = np.ones(n, dtype=bool)
    for i, v in enumerate(values):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            ok[i] = False
    return out, ok


def json_floats(arr: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """JSON values (numpy bytes array; ``present`` marks the items that have one) -> (floats,
    numeric mask), parsed by numpy; only a column with something exotic goes one by one."""
    n = len(arr)
    out = np.zeros(n, dtype=np.float64)
    if not n or arr.dtype.itemsize == 0:
        return out, np.zeros(n, dtype=bool)
    first = arr.view(np.uint8).reshape(n, arr.dtype.itemsize)[:, 0]
    numeric = np.isin(first, _NUMERIC_BYTES) & present
    idx = slice(None) if numeric.all() else np.flatnonzero(numeric)
    try:
        out[idx] = arr[idx].astype(np.float64)
    except ValueError:
        out[idx], numeric[idx] = to_floats(arr[idx].tolist())
    return out, numeric


# -- history, summary ---------------------------------------------------------------------------


@dataclass
class _Rows:
    """What a stretch of history rows decodes to: enough to append it to the rows before it."""

    names: list[Any]
    """Every key the items name (numeric or not), in the order they first appear."""
    columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    """Key -> (steps, values, wall times) of its numeric items, keys in ``names`` order (not
    ``_step``/``_timestamp``, nor keys without a numeric item)."""
    nrows: int = 0
    dropped: int = 0
    missing: int = 0
    """Rows without a ``_step`` (numbered from the row before)."""
    last_step: float = -1.0
    """The step of the last row, as the numbering of rows without ``_step`` goes on from it."""
    flat: bool | None = None
    """How the items were read (``Items``); None without items."""
    regular: bool = True


def _decode_rows(rows: list[bytes], *, strict: bool = False, prev: float = -1.0, split: bool = False) -> _Rows:
    """History records (``HistoryRecord`` bytes, in logged order) -> their numeric items per key.
    ``prev``: the step of the row before them; ``split``: read items the way the rows before them
    were (``Items``)."""
    if not rows:
        return _Rows([], {}, last_step=prev)
    nrows, dropped = len(rows), 0
    got = None if split else Items.flat_rows(ROW_MARK + ROW_MARK.join(rows), nrows)
    if got is not None:
        items, mark = got
    else:
        listing, rows, dropped = _parse_joined(rows, "ItemList", sep=ROW_MARK, strict=strict)
        nrows = len(rows)
        raws = list(listing.item)
        del listing
        mark = np.fromiter(map(ROW_MARK_ITEM.__eq__, raws), dtype=bool, count=len(raws))
        items = Items(raws, typed=True, marks=mark, split=split)
    row_of = np.cumsum(mark) - 1

    columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # key -> (rows, floats) of numeric items
    for key, idx in items.groups().items():
        idx = idx[~mark[idx]]
        if not len(idx):
            continue
        floats, ok = items.floats(idx)
        columns[key] = (row_of[idx], floats) if ok.all() else (row_of[idx[ok]], floats[ok])

    def per_row(key: str) -> np.ndarray:
        col = np.full(nrows, np.nan)
        if key in columns:
            r, f = columns[key]
            col[r] = f
        return col

    step_col, time_col = per_row("_step"), per_row("_timestamp")
    step_col[steps_out_of_range(step_col) & ~np.isnan(step_col)] = np.nan  # never cast to another number
    missing = np.isnan(step_col)
    if missing.any():  # rare: take the record's own step, else count on from the row before
        for r in range(nrows):
            if missing[r]:
                step_col[r] = _record_step(rows[r]) or prev + 1
            prev = step_col[r]
    steps = step_col.astype(np.int64)
    out = {key: (steps[r], f, time_col[r]) for key, (r, f) in columns.items()
           if key not in ("_step", "_timestamp") and len(r)}
    return _Rows(items.names, out, nrows=nrows, dropped=dropped, missing=int(missing.sum()),
                 last_step=float(step_col[-1]) if nrows else prev, flat=items.flat,
                 regular=items.regular and not dropped)


def _series(steps: np.ndarray, values: np.ndarray, wall: np.ndarray) -> Series:
    return Series(steps, values, None if np.isnan(wall).all() else wall)


def _history_warnings(dropped: int, missing: int) -> list[str]:
    warnings = []
    if dropped:
        warnings.append(f"{dropped} history records with a good CRC could not be decoded; skipped")
    if missing:
        warnings.append(f"{missing} history rows have no usable _step (none, or one beyond +-2**53); "
                        "numbered from their neighbours")
    return warnings


def read_history(rows: list[bytes], *, strict: bool = False) -> tuple[dict[str, Series], list[str]]:
    """History records (``HistoryRecord`` bytes, in logged order) -> one Series per numeric key.
    Records that do not decode are dropped with a warning (``strict``: a DecodeError)."""
    got = _decode_rows(rows, strict=strict)
    return {k: _series(*c) for k, c in got.columns.items()}, _history_warnings(got.dropped, got.missing)


def _append_rows(series: dict[str, Series], names: list[str], more: _Rows) -> tuple[dict[str, Series], list[str]]:
    """The Series of rows read before (``series``, their keys ``names``) with ``more`` rows after
    them: what reading all the rows at once gives, keys in the same order."""
    seen = set(names)
    names = names + [k for k in more.names if k not in seen]
    out: dict[str, Series] = {}
    for key in names:
        old, new = series.get(key), more.columns.get(key)
        if new is None:
            if old is not None:
                out[key] = old
            continue
        steps, values, wall = new
        if old is None:
            out[key] = _series(steps, values, wall)
        elif old.wall_times is not None:  # grown in place: a poll costs the new rows, not the run's length
            out[key] = old.extended(Series(steps, values, wall))
        elif np.isnan(wall).all():
            out[key] = old.extended(Series(steps, values, None))
        else:  # the first clock: the rows before get NaN times, as one read gives them
            out[key] = Series(old.steps, old.values, np.full(len(old), np.nan)).extended(Series(steps, values, wall))
    return out, names


def _record_step(row: bytes) -> int | None:
    """The step a history record carries beside its items, if any (and if it decodes)."""
    try:
        h = _msg("HistoryStep").FromString(row)
    except DecodeError:
        return None
    return h.step.num if h.HasField("step") and h.step.num else None


def _fold(raws: Sequence[bytes]) -> dict[str, Any]:
    """Summary items -> key: value after all of them (a later item wins)."""
    return _fold_items(raws)[0]


def _fold_items(raws: Sequence[bytes]) -> tuple[dict[str, Any], dict[str, bytes], bool]:
    """``_fold``, with the prefix under which each key first appears and whether any item had to
    be parsed fully (its key goes after all the others).

    ``dict`` does the fold: items of one key share the bytes before their value, so the last
    position per prefix is the answer (found in one pass of C calls, no list of the parts kept);
    each distinct prefix is decoded once."""
    if not raws:
        return {}, {}, False
    last = _last_per_prefix(raws) if len(raws) >= ARROW_MIN_VALUES else None
    if last is None:
        last = dict(zip(map(_first, map(bytes.partition, raws, repeat(VALUE_TAG))), count()))
    found: dict[str, tuple[int, Any]] = {}
    first_prefix: dict[str, bytes] = {}
    odd: set[bytes] = set()
    for pre, i in last.items():
        key = _prefix_key(pre)
        _, tag, v = raws[i].partition(VALUE_TAG)
        if key is None or not tag:  # no plain key before a value_json tag: parse fully
            odd.add(pre)
            continue
        first_prefix.setdefault(key, pre)
        if key not in found or found[key][0] < i:
            found[key] = (i, v[1:] if v and len(v) - 1 == v[0] else _value_bytes(v))
    if odd:
        for i, raw in enumerate(raws):
            if raw.partition(VALUE_TAG)[0] not in odd:
                continue
            key, value = _slow_item(raw, typed=False)
            if key is not None and (key not in found or found[key][0] < i):
                found[key] = (i, value)
    return {k: v for k, (_, v) in found.items()}, first_prefix, bool(odd)


_first = itemgetter(0)


def _last_per_prefix(raws: Sequence[bytes]) -> dict[bytes, int] | None:
    """What ``_fold_items`` folds over, by Arrow for many items: each item's bytes before its first
    ``value_json`` tag (all of it without one), as ``bytes.partition`` splits it, -> the position of
    the last item under it, in the order the prefixes first appear (as a ``dict`` built item by
    item keeps them); None when the items do not fit one Arrow array."""
    import pyarrow.compute as pc

    [items] = _arrow_binary(raws) or [None]
    if items is None:
        return None
    prefixes = pc.list_element(pc.split_pattern(items, pattern=VALUE_TAG, max_splits=1), 0)
    coded = prefixes.dictionary_encode()  # codes in the order prefixes first appear
    codes = coded.indices.to_numpy(zero_copy_only=False)
    last = np.full(len(coded.dictionary), -1, dtype=np.int64)
    np.maximum.at(last, codes, np.arange(len(codes)))
    return dict(zip(coded.dictionary.to_pylist(), last.tolist()))


def read_summary(records: list[bytes], *, strict: bool = False) -> dict[str, Any]:
    """The run summary after every update and removal (``SummaryRecord`` bytes, in order), nested
    keys joined with '.'. Records that do not decode are left out (``strict``: a DecodeError)."""
    return _summary_out(_fold_summary(None, records, strict=strict).final)


@dataclass
class _Summary:
    """The summary folded so far, and what folding more records onto it needs."""

    final: dict[str, Any]
    """Key -> JSON value bytes (or None), every key, ``_wandb`` ones too, in a whole read's order."""
    removed: bool = False
    """Some record removed a key: a whole read replays the records one by one."""
    witness: dict[str, bytes] | None = None
    """Key -> the record that puts it where it is in ``final`` (the first to set it, or to set it
    again after a removal), for the keys a Segment shows (not wandb's ``_wandb`` ones); None when
    not kept (a read that cannot be gone on from)."""
    odd: bool = False
    """An item was read fully in a batch fold: its key goes after all others, wherever it came."""


def _fold_summary(before: _Summary | None, records: list[bytes], *, strict: bool = False,
                  witness: bool = False) -> _Summary:
    """The summary after ``before`` (the records before these; None: none) and ``records``
    (``SummaryRecord`` bytes, in order); ``witness``: keep which record puts each key where it is.

    Only the last copy of a record that repeats byte for byte can matter (every key it sets or
    removes is set or removed again by the later copy), so repeats (wandb-core's runtime updates)
    are dropped first. Concatenated, the records parse as one ``Summary`` whose updates are in order.
    Records that do not decode are left out (``strict``: a DecodeError).
    """
    kept = list(dict.fromkeys(reversed(records)))[::-1]
    joined, dropped = b"".join(kept), 0
    merged = _msg("Summary")()
    try:
        merged.ParseFromString(joined)
    except DecodeError:  # as _parse_joined: the records that decode alone
        if strict:
            raise
        kept, dropped = _decodable(kept, "Summary")
        joined = b"".join(kept)
        merged.ParseFromString(joined)
    before = before or _Summary({}, witness={} if witness else None)
    final = dict(before.final)
    wit = None if before.witness is None or dropped else dict(before.witness)
    if not len(merged.remove) and not before.removed:  # the usual case: the last update of a key wins
        folded, first_prefix, odd = _fold_items(merged.update)  # the repeated field itself: no list of it
        if wit is not None:
            new = {k: first_prefix[k] for k in folded if k not in final and _shown(k) and k in first_prefix}
            found = _first_records(kept, joined, list(new.values()))
            wit = None if found is None else {**wit, **{k: found[p] for k, p in new.items()}}
        final.update(folded)
        return _Summary(final, False, wit, before.odd or odd)
    for raw in kept:  # a key was removed: replay record by record
        try:
            rec = _msg("Summary").FromString(raw)
        except DecodeError:
            if strict:
                raise
            continue
        folded = _fold(list(rec.update))
        if wit is not None:
            wit.update({k: raw for k in folded if k not in final and _shown(k)})
        final.update(folded)
        for k in _fold(list(rec.remove)):
            final.pop(k, None)
            if wit is not None:
                wit.pop(k, None)
    return _Summary(final, True, wit, before.odd)


def _shown(key: str) -> bool:
    """A summary key a Segment shows (``_summary_out``): where the others fall in the fold matters not."""
    return not key.startswith("_wandb")


def _first_records(records: list[bytes], joined: bytes, prefixes: list[bytes]) -> dict[bytes, bytes] | None:
    """For each item prefix (in the order they first appear), the first of ``records`` holding an
    item under it: found by searching the joined records for the prefix and its value tag (C
    speed), each hit checked against the items of the record it falls in (a hit may lie inside a
    longer prefix). None if one is not found. ``joined``: the records joined."""
    out: dict[bytes, bytes] = {}
    ri, start, end = 0, 0, len(records[0]) if records else 0
    for pre in prefixes:
        at = start
        while True:
            at = joined.find(pre + VALUE_TAG, at)
            if at < 0:
                return None
            while end <= at:
                ri += 1
                start, end = end, end + len(records[ri])
            try:
                items = _msg("Summary").FromString(records[ri]).update
            except DecodeError:
                return None
            if any(item.partition(VALUE_TAG)[0] == pre for item in items):
                break
            at += 1
        out[pre] = records[ri]
    return out


def _summary_out(final: dict[str, Any]) -> dict[str, Any]:
    """The summary as a Segment holds it: JSON values decoded, wandb's own ``_wandb`` keys left out."""
    out: dict[str, Any] = {}
    for k, v in final.items():
        if not _shown(k) or v is None:
            continue
        try:
            out[k] = json.loads(v) if isinstance(v, bytes) else v
        except (ValueError, RecursionError):
            continue
    return out


# -- config -------------------------------------------------------------------------------------


def _unwrap(value: Any) -> Any:
    """config.yaml style ``{"value": v, "desc": ...}`` -> v; anything else unchanged."""
    if isinstance(value, dict) and "value" in value and set(value) <= {"value", "desc"}:
        return value["value"]
    return value


def apply_config(config: dict[str, Any], record: Any, internal: dict[str, Any]) -> None:
    """Apply a config update (updates, then removals) to a nested dict; ``_wandb`` goes to ``internal``."""
    for item in record.update:
        path = [_text(k) for k in item.nested_key] or [_text(item.key)]
        try:
            value = _unwrap(json.loads(item.value_json))
        except (ValueError, RecursionError):
            value = _text(item.value_json)
        if path[0] == "_wandb":
            if isinstance(value, dict):
                internal.update(value)
            continue
        node = config
        for p in path[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = node[p] = {}
            node = nxt
        node[path[-1]] = value
    for item in record.remove:
        path = [_text(k) for k in item.nested_key] or [_text(item.key)]
        node = config
        for p in path[:-1]:
            nxt = node.get(p)
            node = nxt if isinstance(nxt, dict) else {}
        node.pop(path[-1], None)


# -- the run folder -----------------------------------------------------------------------------


def _log_file(path: Path) -> tuple[Path, list[str]]:
    """The run folder's log (``run-<id>.wandb``, else the first ``.wandb``), and warnings for the other
    ``.wandb`` files and for those that are not regular files (never opened: a FIFO would block)."""
    warnings: list[str] = []
    logs = []
    for p in sorted(path.iterdir()):
        if p.suffix != ".wandb":
            continue
        kind = path_kind(p)
        if kind == "a regular file":
            logs.append(p)
        elif kind is not None:
            warnings.append(f"{path.name}/{p.name}: not a regular file ({kind}); skipped")
    if not logs:
        raise ReadError("no .wandb log in the run folder" + (f" ({warnings[0]})" if warnings else ""))
    run_id = path.name.rsplit("-", 1)[-1]
    chosen = next((p for p in logs if p.name == f"run-{run_id}.wandb"), logs[0])
    others = [p.name for p in logs if p != chosen]
    if others:
        warnings.append(f"{path.name} also holds {', '.join(others)}; read {chosen.name} only")
    return chosen, warnings


_DAMAGE = (DecodeError, TypeError, ValueError, IndexError, KeyError, AttributeError, OverflowError,
           RecursionError)
"""What decoding a record that has a good CRC but damaged contents can raise (a fuzzed file does)."""


def read_wandb_run_dir(path: Path, *, ref: str, source: str) -> list[Segment]:
    """One W&B run folder (``run-*``/``offline-run-*``) -> one Segment, everything from its log.

    Each process that logged (a first launch, a resume reusing the run id, a rewind, a fork) has
    its own folder, so each folder is a Segment of its own; stitching joins them later. Records with
    a good CRC whose contents cannot be decoded cost themselves only (``_read_damaged``).
    """
    return read_wandb_run_dir_since(path, ref=ref, source=source, since=None)[0]


STATE_VERSION = 1
"""Of ``Resume.state`` as this reader writes it: a state of another version is not read on."""


def read_wandb_run_dir_since(path: Path, *, ref: str, source: str, since: Resume | None
                             ) -> tuple[list[Segment], Resume | None]:
    """``read_wandb_run_dir``, reading only the bytes of the log after ``since`` (a ``Resume`` an
    earlier read of the same log returned), and a ``Resume`` for the end of its last whole record.

    A run's log only grows while the run lives, and a watcher reads it again and again: a read on
    from ``since`` costs the new bytes only, and gives exactly the Segment a read of the whole log
    gives. Anything that could make the two differ (records that do not decode, items read
    otherwise than the ones before, a log other than ``since``'s) is read from the beginning
    instead; the Resume is None when the log cannot be read on from its end (records whose
    contents are damaged).
    """
    path = Path(path)
    log, warnings = _log_file(path)
    if since is not None:
        got = _read_on(path, log=log, since=since, ref=ref, source=source, warnings=warnings)
        if got is not None:
            return [got[0]], got[1]
    return _read_whole(path, log=log, ref=ref, source=source, warnings=warnings)


def _read_whole(path: Path, *, log: Path, ref: str, source: str, warnings: list[str]
                ) -> tuple[list[Segment], Resume | None]:
    """The whole log, and a Resume for its end (None when its records had to be read as damaged)."""
    batch, size, framed = _parse_log(log)
    if batch is not None:
        try:
            decoded = _decode(batch, strict=True)
        except _DAMAGE:
            pass
        else:
            seg = _segment_of(decoded, path=path, log=log, size=size, ref=ref, source=source,
                              warnings=warnings + framed.warnings)
            return [seg], _resume(decoded, path=path, log=log, ref=ref, source=source, warnings=warnings,
                                  framed=framed, framing=[])
    return [_read_damaged(path, log=log, size=size, ref=ref, source=source,
                          warnings=warnings + framed.warnings)], None


def _read_on(path: Path, *, log: Path, since: Resume, ref: str, source: str, warnings: list[str]
             ) -> tuple[Segment, Resume | None] | None:
    """The log read on from ``since``: only its bytes after ``since.offset`` are read, decoded and
    added to what ``since`` holds. None when they must be read with all the others instead."""
    state = since.state
    offset = since.offset
    size = os.stat(log).st_size
    if (state.get("version") != STATE_VERSION or since.file != os.path.abspath(log)
            or not FILE_HEADER_LEN <= offset <= size):
        return None
    if zero_stretches(log, start=offset):
        return None  # a whole read says where the zeros are and holds none of them
    data = read_regular(log, start=offset)
    framed = _Unframer(data, log.name, base=offset, prior=state["records"], skipped=state["skipped"])
    try:
        framed.run()
    except ReadError:  # a whole read says it the same way
        return None
    size = offset + len(data)
    del data
    try:
        batch = _msg("Batch").FromString(b"".join(framed.out))
        decoded = _decode_on(batch, state=state, before=since.segment)
    except _DAMAGE:
        return None
    if decoded is None:
        return None
    framing = list(state["framing_warnings"])
    seg = _segment_of(decoded, path=path, log=log, size=size, ref=ref, source=source,
                      warnings=warnings + framing + framed.warnings)
    return seg, _resume(decoded, path=path, log=log, ref=ref, source=source, warnings=warnings,
                        framed=framed, framing=framing)


def _log_bytes(log: Path) -> tuple[bytes, tuple[int, int, int] | None]:
    """The log's bytes up to its first stretch of 16 MiB or more of zeros (``limits.zero_stretches``: a
    crash into a pre-extended file, a sparse file; W&B writes its log in order and never leaves one), and
    that stretch with the file's size when there is one: the zeros are never held, so a 1 GiB hole after a
    valid head costs the head."""
    holes = zero_stretches(log)  # a FIFO or a device is refused, here as in the read
    if not holes:
        return read_regular(log), None  # the bytes are charged to the SOURCE
    lo, hi = holes[0]
    return read_regular(log, length=lo), (lo, hi, os.stat(log).st_size)


def _hole_warning(name: str, hole: tuple[int, int, int], records: int) -> str:
    lo, hi, size = hole
    rest = "" if hi >= size else f", and the {size - hi} bytes after them not read"
    return (f"{name} ends in {hi - lo} zero bytes from byte {lo} (cut short by a crash, or a sparse file?){rest}: "
            f"read the {records} whole records before them")


def _parse_log(log: Path) -> tuple[Any, int, _Unframer]:
    """The log's records parsed as one batch (None when they do not parse), the file's size and
    its framing (records dropped). A function of its own so that the file's bytes and the raw
    records are freed on return: the peak memory stays near a few times the file, not more."""
    if (head := sniff(log, length=FILE_HEADER_LEN)) is not None:  # a 1 GiB file of zeros costs 7 bytes
        _check_file_header(head)
    data, hole = _log_bytes(log)
    framed = _unframe(data, log.name)
    if hole:
        framed.warnings.append(_hole_warning(log.name, hole, framed.records))
    size = len(data)
    del data
    joined = b"".join(framed.out)
    framed.prior, framed.out = framed.records, []  # the records dropped, their count kept (a later read counts on)
    try:
        return _msg("Batch").FromString(joined), size, framed
    except DecodeError:
        return None, size, framed


@dataclass
class _Decoded:
    """What a run's records decode to, before it becomes a Segment; as much as reading more of its
    log needs (``_decode_on``)."""

    rows: _Rows
    series: dict[str, Series]
    names: list[str]
    history_rows: int
    summary: _Summary
    run: Any
    config: dict[str, Any]
    internal: dict[str, Any]
    config_records: int
    exit_code: int | None
    preempted: bool


def _decode(batch: Any, *, strict: bool = False) -> _Decoded:
    """A log's records, parsed as one batch (``strict``: a record part that does not decode is a
    DecodeError rather than a warning)."""
    rows = _decode_rows(list(batch.history), strict=strict)
    summary = _fold_summary(None, list(batch.summary), strict=strict, witness=strict)
    run, config, internal = _run_and_config(batch)
    return _Decoded(rows=rows, series={k: _series(*c) for k, c in rows.columns.items()}, names=rows.names,
                    history_rows=len(batch.history), summary=summary, run=run,
                    config=config, internal=internal, config_records=len(batch.config),
                    exit_code=batch.exit[-1].exit_code if len(batch.exit) else None,
                    preempted=bool(len(batch.preempting)))


def _decode_on(batch: Any, *, state: dict[str, Any], before: Segment) -> _Decoded | None:
    """The records after a Resume's offset (``batch``) added to what the records before it made
    (``state``, ``before``), strictly; None when the sum could differ from decoding all of them
    at once: history items read another way than the ones before, a run record after config
    records (a whole read applies every run record's config before any config record), or a
    summary record that placed a key coming again (a whole read drops all but a record's last
    copy, so the key would stand where that copy stands).

    Not caught (damage only, never a writer's output): a summary record before the offset that
    decodes only joined to the one after it, which a whole read would drop once their order or
    its way of reading them (record by record, after a removal) changes."""
    if len(batch.run) and state["config_records"]:
        return None
    flat = state["flat"]
    rows = _decode_rows(list(batch.history), strict=True, prev=float.fromhex(state["last_step"]),
                        split=flat is False)
    if not rows.regular or (flat is True and rows.flat is False):
        return None
    series, names = _append_rows(before.series, state["names"], rows)
    witnesses = [bytes.fromhex(w) for w in state["witnesses"]]
    records = list(batch.summary)
    if not set(witnesses).isdisjoint(records):
        return None
    so_far = _Summary({k: None if v is None else bytes.fromhex(v) for k, v, _ in state["summary"]},
                      state["removed"], {k: witnesses[w] for k, _, w in state["summary"] if w is not None})
    summary = _fold_summary(so_far, records, strict=True, witness=True)
    run = _msg("Run").FromString(bytes.fromhex(state["run"])) if state["run"] is not None else None
    run, config, internal = _run_and_config(batch, run=run, config=json.loads(state["config"]),
                                            internal=json.loads(state["internal"]))
    totals = _Rows(names, {}, nrows=state["rows"] + rows.nrows, missing=state["missing"] + rows.missing,
                   last_step=rows.last_step, flat=flat if rows.flat is None else rows.flat, regular=True)
    return _Decoded(rows=totals, series=series, names=names,
                    history_rows=state["history_rows"] + len(batch.history), summary=summary, run=run,
                    config=config, internal=internal,
                    config_records=state["config_records"] + len(batch.config),
                    exit_code=batch.exit[-1].exit_code if len(batch.exit) else state["exit_code"],
                    preempted=state["preempted"] or bool(len(batch.preempting)))


def _resume(decoded: _Decoded, *, path: Path, log: Path, ref: str, source: str, warnings: list[str],
            framed: _Unframer, framing: list[str]) -> Resume | None:
    """Where the next read of the log goes on (after the last whole record ``framed`` took), with
    the Segment the bytes before it make and the state to go on from; None when the records
    were not read the way one can go on from (``Items.regular``)."""
    rows, summary = decoded.rows, decoded.summary
    if (not rows.regular or any(not isinstance(k, str) for k in decoded.names) or summary.odd
            or summary.witness is None or set(summary.witness) != set(filter(_shown, summary.final))):
        return None
    witnesses = list(dict.fromkeys(summary.witness.values()))
    wid = {w: i for i, w in enumerate(witnesses)}
    framing = framing + framed.warnings[:framed.warned_at]
    try:
        state = {
            "version": STATE_VERSION, "records": framed.records, "skipped": framed.skipped_at,
            "framing_warnings": framing, "history_rows": decoded.history_rows, "rows": rows.nrows,
            "names": decoded.names, "last_step": float(rows.last_step).hex(), "missing": rows.missing,
            "flat": rows.flat, "removed": summary.removed, "witnesses": [w.hex() for w in witnesses],
            "summary": [[k, None if v is None else v.hex(), wid[summary.witness[k]] if _shown(k) else None]
                        for k, v in summary.final.items()],
            "config": json.dumps(decoded.config),
            "internal": json.dumps(decoded.internal), "config_records": decoded.config_records,
            "run": None if decoded.run is None else decoded.run.SerializeToString().hex(),
            "exit_code": decoded.exit_code, "preempted": decoded.preempted,
        }
    except (TypeError, ValueError, RecursionError):  # a config JSON cannot hold (never from wandb)
        return None
    offset = framed.base + framed.last_end
    closing = framed.skipped_summary(framed.skipped_at)
    seg = _segment_of(decoded, path=path, log=log, size=offset, ref=ref, source=source,
                      warnings=warnings + framing + ([closing] if closing else []))
    return Resume(file=os.path.abspath(log), offset=offset, segment=seg, state=state)


def _read_damaged(path: Path, *, log: Path, size: int, ref: str, source: str, warnings: list[str]) -> Segment:
    """A log holding records with a good CRC whose contents cannot be decoded (a fuzzed or damaged
    file): read again, those records are found, left out with one warning naming where they
    begin, and the rest is read. Rare, so the cost of reading twice is paid only here."""
    framed = _unframe(_log_bytes(log)[0], log.name)  # its framing warnings were given the first time
    records = framed.out
    bad = _undecodable_records(records, path=path, log=log)
    if bad:
        warnings = [*warnings, f"{log.name}: {len(bad)} record{'s' if len(bad) > 1 else ''} with a good CRC "
                    f"could not be decoded (at {_bytes_at([framed.offsets[i] for i, _ in bad])}; the first: "
                    f"{_damage(bad[0][1])}); skipped, the other {len(records) - len(bad)} records read"]
        skip = {i for i, _ in bad}
        records = [r for i, r in enumerate(records) if i not in skip]
    try:
        batch = _msg("Batch").FromString(b"".join(records))
        return _run_segment(batch, path=path, log=log, size=size, ref=ref, source=source, warnings=warnings)
    except _DAMAGE as exc:  # every record decodes, but not all of them together
        raise ReadError(f"{log.name}: records with a good CRC hold data that cannot be decoded together "
                        f"({_damage(exc)}); the run cannot be read") from exc


def _damage(exc: BaseException) -> str:
    """What went wrong decoding a damaged record, for a message that already says where."""
    return str(exc) if isinstance(exc, DecodeError) else f"{type(exc).__name__}: {exc}"


def _undecodable_records(records: list[bytes], *, path: Path, log: Path) -> list[tuple[int, BaseException]]:
    """The records (position, why) that cannot be decoded, found by halves: a half that decodes is
    done, one that does not is halved again, down to single records; k bad records cost about
    k * log2(n) tries of shrinking slices rather than n tries."""
    bad: list[tuple[int, BaseException]] = []
    mid = len(records) // 2  # the whole is known not to decode: start from its halves
    todo = [(mid, len(records)), (0, mid)] if len(records) > 1 else [(0, len(records))]
    budget = current_budget()
    while todo:
        budget.check_time(str(log))  # a log damaged all through costs about 2n tries: within the SOURCE's bound
        lo, hi = todo.pop()
        why = _decode_problem(records[lo:hi], path=path, log=log)
        if why is None:
            continue
        if hi - lo == 1:
            bad.append((lo, why))
            continue
        mid = (lo + hi) // 2
        todo += [(mid, hi), (lo, mid)]  # the first half first: ``bad`` comes out in file order
    return bad


def _decode_problem(records: list[bytes], *, path: Path, log: Path) -> BaseException | None:
    """Why ``records`` cannot be decoded as one run, strictly (no record dropped), or None."""
    if not records:
        return None
    try:
        batch = _msg("Batch").FromString(b"".join(records))
        _run_segment(batch, path=path, log=log, size=0, ref="", source="", warnings=[], strict=True)
    except _DAMAGE as exc:
        return exc
    return None


def _run_segment(batch: Any, *, path: Path, log: Path, size: int, ref: str, source: str,
                 warnings: list[str], strict: bool = False) -> Segment:
    """The Segment the decoded records make (``warnings`` are copied, not added to). ``strict``: a
    record part that does not decode is a DecodeError rather than a warning."""
    return _segment_of(_decode(batch, strict=strict), path=path, log=log, size=size, ref=ref, source=source,
                       warnings=warnings)


def _segment_of(decoded: _Decoded, *, path: Path, log: Path, size: int, ref: str, source: str,
                warnings: list[str]) -> Segment:
    """The Segment of decoded records (``warnings``, the log's and its framing's, are copied)."""
    warnings = list(warnings)
    warnings += [f"{log.name}: {w}" for w in _history_warnings(decoded.rows.dropped, decoded.rows.missing)]
    meta: dict[str, Any] = {"log": log.name, "log_bytes": size, "history_rows": decoded.history_rows,
                            "summary": _summary_out(decoded.summary.final)}
    if decoded.exit_code is not None:
        meta["exit_code"] = decoded.exit_code
    if decoded.preempted:
        meta["preempted"] = True
    folder_id = path.name.rsplit("-", 1)[-1]
    seg = Segment(kind="wandb-offline", ref=ref, source=source, run_id=folder_id, store=str(path.parent),
                  series=dict(decoded.series), config=_copy_json(decoded.config), warnings=warnings, meta=meta)
    if decoded.run is None:
        warnings.append(f"{log.name} has no run record (cut short at the start?): run id taken from "
                        "the folder name")
        return seg
    _apply_run_record(seg, decoded.run, meta)
    if decoded.internal:
        meta["wandb"] = _copy_json(decoded.internal)
    return seg


def _copy_json(value: Any) -> Any:
    """A copy of JSON data (dicts and lists copied, the rest shared): two Segments never share a
    dict one of their users might change."""
    if isinstance(value, dict):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


def _run_and_config(batch: Any, *, run: Any = None, config: dict[str, Any] | None = None,
                    internal: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The run record (the first one, completed by any later one, e.g. a server update), the config
    its records and the config records build, and wandb's own ``_wandb`` config (going on from
    ``run``, ``config`` and ``internal`` when given)."""
    config = {} if config is None else config
    internal = {} if internal is None else internal
    for r in batch.run:
        if run is None:
            run = type(r)()
        run.MergeFrom(r)
        apply_config(config, r.config, internal)
    for c in batch.config:
        apply_config(config, c, internal)
    return run, config, internal


def _apply_run_record(seg: Segment, run: Any, meta: dict[str, Any]) -> None:
    """What the run record says about the run: its id, names, start, and how it began (a resume, a
    rewind or a fork of another run)."""
    seg.run_id = _text(run.run_id) or seg.run_id
    seg.name = _text(run.display_name) or None
    seg.group = _text(run.run_group) or None
    tags = [_text(t) for t in run.tags]
    seg.tags = {t: "" for t in tags}
    if run.HasField("start_time"):
        seg.start_time = run.start_time.seconds + run.start_time.nanos / 1e9
    meta.update(entity=_text(run.entity) or None, project=_text(run.project) or None,
                job_type=_text(run.job_type) or None, tags=tags, resumed=bool(run.resumed or run.resume))
    if run.starting_step:
        meta["starting_step"] = run.starting_step
    if run.runtime:
        meta["prior_runtime"] = run.runtime
    if run.HasField("branch_point") and run.branch_point.run:
        bp = run.branch_point
        bp_run, metric = _text(bp.run), _text(bp.metric) or "_step"
        meta["branch_point"] = {"run": bp_run, "value": bp.value, "metric": metric}
        meta["forked"] = bool(run.forked) or bp_run != seg.run_id  # a fork branches off another run
        if metric == "_step" and abs(bp.value) < 2.0 ** 62:  # a finite step (a damaged record may hold any double)
            seg.resumed_from_step = int(bp.value)
