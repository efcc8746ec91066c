"""The ``.wandb`` reader's fast paths read exactly what its plain paths read (issue 14, part 6).

- ``_ChunkTable``: a large log's chunk headers found for all 32 KiB blocks at once and the FULL
  chunks' CRCs checked in one pass; off (``TABLE_MIN_BLOCKS`` out of reach), the chunk-by-chunk loop
  alone. On generated logs with records of every size (FULL, and FIRST/MIDDLE/LAST across blocks) and
  damage of every kind (flipped bytes, cut ends, zeroed tails, impossible types and lengths), read
  whole and on from any byte, both give the same records, offsets, warnings and errors.
- ``Items._plain_floats``: history values parsed by Arrow; off (``ARROW_MIN_VALUES`` out of reach),
  by Python's ``float`` through numpy. On every literal, both give the same double, bit for bit
  (``-0.0``, denormals, the largest doubles, integers beyond 2**53, overflow to infinity), and what
  only ``float`` reads (``NaN``, ``Infinity``) or nothing reads still goes ``float``'s way.
"""

from __future__ import annotations

import json
import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klwatch.sources import wandb_log
from klwatch.sources.local import ReadError
from klwatch.sources.wandb_log import BLOCK, CHUNK_HEADER, FILE_HEADER_LEN, ROW_MARK, Items, _decode_rows, _Unframer
from segment_equality import assert_same_segment
from wandb_framing import frame_wandb_log

OFF = 10 ** 9


def _unframed(data: bytes, *, base: int, table_min_blocks: int) -> tuple:
    """What un-framing ``data[base:]`` (a whole read when ``base`` is 0) gives, or the error it raises."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wandb_log, "TABLE_MIN_BLOCKS", table_min_blocks)
        got = _Unframer(data[base:], "run-x.wandb", base=base, prior=3 if base else 0)
        try:
            got.run()
        except ReadError as exc:
            return ("error", str(exc))
    return (got.out, got.offsets, got.warnings, got.last_end, got.warned_at, got.skipped_at, got.skipped,
            got.parts is None)


def _records(draw: st.DrawFn) -> list[bytes]:
    sizes = draw(st.lists(st.integers(0, 300), min_size=1, max_size=800))  # FULL chunks, many per block
    for _ in range(draw(st.integers(0, 3))):  # and records spanning blocks (FIRST, MIDDLE, LAST)
        sizes.insert(draw(st.integers(0, len(sizes))), draw(st.integers(BLOCK // 2, 3 * BLOCK)))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


@st.composite
def damaged_logs(draw: st.DrawFn) -> bytes:
    data = bytearray(frame_wandb_log(_records(draw)))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "zeros", "type", "length", "crc-fixed-flip"]))
        if len(data) <= FILE_HEADER_LEN + 1:
            break
        at = draw(st.integers(FILE_HEADER_LEN, len(data) - 1))
        if kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "zeros":
            data[at:] = bytes(len(data) - at)
        elif kind == "type":  # an impossible chunk type where a header may be
            data[at] = draw(st.sampled_from([0, 5, 255]))
        elif kind == "length" and at + 2 <= len(data):
            data[at:at + 2] = struct.pack("<H", draw(st.integers(0, 0xFFFF)))
        else:  # a payload byte changed and its CRC made right: the framing holds, the record differs
            pos = FILE_HEADER_LEN
            while pos + CHUNK_HEADER <= len(data):
                block_end = pos - pos % BLOCK + BLOCK
                if block_end - pos < CHUNK_HEADER:
                    pos = block_end
                    continue
                _, length, ctype = struct.unpack_from("<IHB", data, pos)
                end = pos + CHUNK_HEADER + length
                if end > min(block_end, len(data)) or not 0 < ctype < 5:
                    break
                if pos + CHUNK_HEADER <= at < end:
                    data[at] ^= 1
                    crc = zlib.crc32(bytes(data[pos + CHUNK_HEADER:end]), zlib.crc32(bytes([ctype])))
                    struct.pack_into("<I", data, pos, crc)
                    break
                pos = end
    return bytes(data)


@settings(max_examples=60)
@given(data=damaged_logs(), cut=st.floats(0, 1), table_min_blocks=st.sampled_from([1, 2, 3]))
def test_the_chunk_table_unframes_as_the_loop_does_whole_and_on_from_any_byte(
        data: bytes, cut: float, table_min_blocks: int) -> None:
    plain = _unframed(data, base=0, table_min_blocks=OFF)
    assert _unframed(data, base=0, table_min_blocks=table_min_blocks) == plain
    offsets = plain[1] if plain[0] != "error" else []
    bases = [FILE_HEADER_LEN + int(cut * max(0, len(data) - FILE_HEADER_LEN))]
    if offsets:  # a record boundary, as a Resume holds
        bases.append(offsets[int(cut * (len(offsets) - 1))])
    for base in bases:
        want = _unframed(data, base=base, table_min_blocks=OFF)
        assert _unframed(data, base=base, table_min_blocks=table_min_blocks) == want


def test_a_large_log_takes_the_chunk_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log of many blocks is read through the table (its FULL runs), damaged or not, as the loop reads it."""
    rng = np.random.default_rng(7)
    records = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 400, 8000)]
    records[100] = bytes(70000)  # FIRST, MIDDLE, LAST
    data = frame_wandb_log(records)
    assert len(data) > 2 * wandb_log.TABLE_MIN_BLOCKS * BLOCK
    monkeypatch.setattr(wandb_log, "TABLE_MIN_BLOCKS", 16)
    table = wandb_log._ChunkTable.of(data, 0)
    assert table is not None and len(table.pos) > 7000
    flipped = bytearray(data)
    flipped[20 * BLOCK + 100] ^= 4  # a CRC mismatch mid-file: skipped to the next block
    crossing = bytearray(data)  # a FULL chunk whose length runs past its block, with a CRC that holds
    pos = int(table.pos[np.searchsorted(table.pos, 31 * BLOCK) - 1])
    length = 31 * BLOCK - pos - CHUNK_HEADER + 10
    struct.pack_into("<H", crossing, pos + 4, length)
    payload = bytes(crossing[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length])
    struct.pack_into("<I", crossing, pos, zlib.crc32(payload, zlib.crc32(b"\x01")))
    for log in (data, bytes(flipped), bytes(crossing), data[:-50]):
        want = _unframed(log, base=0, table_min_blocks=OFF)
        got = _unframed(log, base=0, table_min_blocks=16)
        assert got == want
    assert want[0][:len(records) - 1] == records[:len(records) - 1]


# -- numbers ------------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _row(step: int, values: dict[str, bytes]) -> bytes:
    """A HistoryRecord as wandb-core writes it: one nested_key and one value_json per item."""
    items = {"_step": str(step).encode(), **values}
    return b"".join(_ld(1, _ld(2, k.encode()) + _ld(16, v)) for k, v in items.items())


EDGES = [b"-0", b"-0.0", b"0", b"0.0", b"5e-324", b"2.2250738585072014e-308", b"2.225073858507201e-308",
         b"1.7976931348623157e+308", b"1e308", b"1.7976931348623159e308", b"1e400", b"-1e400", b"1e-400",
         b"9007199254740993", b"-9007199254740993", b"123456789012345678901234567890", b"1" * 400,
         b"0." + b"0" * 400 + b"1", b"2.4703282292062328e-324", b"2.4703282292062327e-324", b"0.1", b"1e5",
         b"1E+05", b"1.", b"01", b"-01.50e-0", b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf", b"NaN(1)",
         b"1_0", b" 1", b"1 ", b"1e", b"-", b"--1", b"+1", b".5", b"1\x00", b"0x10", b'"1"', b"true", b"null",
         b"[1]", b'{"a": 1}', b""]

literals = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: json.dumps(f).encode()),
    st.floats(width=32).map(lambda f: repr(f).encode()),
    st.integers(-2 ** 80, 2 ** 80).map(lambda i: str(i).encode()),
    st.sampled_from(EDGES),
    st.text("0123456789.eE+-_ xinfatyINFATY()\x00", min_size=0, max_size=12).map(str.encode),
    st.text("0123456789", min_size=1, max_size=30).flatmap(
        lambda d: st.sampled_from(["", "-"]).map(lambda s: (s + d).encode())),
)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.uint64)


@settings(max_examples=300)
@given(values=st.lists(literals, min_size=1, max_size=40))
def test_arrow_parses_each_value_to_the_double_float_gives(values: list[bytes]) -> None:
    rows = [_row(i, {"v": v}) for i, v in enumerate(values)]
    got = Items.flat_rows(ROW_MARK + ROW_MARK.join(rows), len(rows))
    assert got is not None
    items, marks = got
    idx = items.groups()["v"]
    parsed = items._plain_floats(idx)
    for v in values:  # each alone, as a column of its own
        one = Items.flat_rows(ROW_MARK + _row(0, {"v": v}), 1)[0]
        alone = one._plain_floats(one.groups()["v"])
        if alone is None:
            continue
        assert v[:1].isdigit() or v[:1] == b"-" and v[1:2].isdigit()
        want = float(v)  # what numpy's per-object parse gives (Python's float)
        assert _bits(alone).tolist() == _bits([want]).tolist(), v
        try:
            number = json.loads(v)
        except ValueError:
            continue
        if isinstance(number, float):  # json.loads reads a number with a fraction or exponent by float()
            assert _bits(alone).tolist() == _bits([number]).tolist(), v
        elif isinstance(number, int) and not isinstance(number, bool):  # "-0" is 0 to json, -0.0 to float
            try:
                assert alone[0] == float(number), v
            except OverflowError:  # an integer beyond the doubles: float() of its text is infinity
                assert math.isinf(alone[0])
    if parsed is not None:
        assert _bits(parsed).tolist() == _bits([float(v) for v in values]).tolist()


@settings(max_examples=150)
@given(values=st.lists(literals, min_size=1, max_size=60), other=st.lists(literals, min_size=1, max_size=60))
def test_history_columns_read_the_same_with_and_without_arrow(values: list[bytes], other: list[bytes]) -> None:
    rows = [_row(i, {"a": values[i % len(values)], "b": other[i % len(other)], "c": b"1.5"})
            for i in range(max(len(values), len(other)))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wandb_log, "ARROW_MIN_VALUES", OFF)
        want = _decode_rows(rows, strict=True)
        mp.setattr(wandb_log, "ARROW_MIN_VALUES", 0)
        got = _decode_rows(rows, strict=True)
    assert got.names == want.names and list(got.columns) == list(want.columns)
    for key, (steps, vals, wall) in want.columns.items():
        g_steps, g_vals, g_wall = got.columns[key]
        assert np.array_equal(g_steps, steps)
        assert np.array_equal(_bits(g_vals), _bits(vals)), key
        assert np.array_equal(g_wall, wall, equal_nan=True)
        assert g_vals.flags.writeable


def test_a_large_run_reads_the_same_through_every_fast_path(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole folders, a few thousand rows over many blocks, with and without the table and Arrow."""
    rng = np.random.default_rng(3)
    rows = []
    for s in range(6000):
        v = {"train/kl": json.dumps(float(rng.normal())).encode(), "train/int": str(int(rng.integers(-9, 2 ** 60))).encode(),
             "_timestamp": json.dumps(1.7e9 + s * 0.25).encode()}
        if s == 4000:
            v["train/kl"] = b"NaN"
        rows.append(b"\x12" + _varint(len(r := _row(s, v))) + r)  # Record.history
    summary = [b"\x1a" + _varint(len(x := _ld(1, _ld(2, b"train/kl") + _ld(16, b"0.5")))) + x] * 3
    run = b"\x8a\x01" + _varint(len(r := _ld(1, b"big1"))) + r  # Record.run (field 17)
    data = frame_wandb_log([run] + rows + summary)
    folder = tmp_path / "run-20260101_000000-big1"
    folder.mkdir()
    log = folder / "run-big1.wandb"
    for variant in (data, data[:-1000]):
        log.write_bytes(variant)
        monkeypatch.setattr(wandb_log, "TABLE_MIN_BLOCKS", OFF)
        monkeypatch.setattr(wandb_log, "ARROW_MIN_VALUES", OFF)
        [want] = wandb_log.read_wandb_run_dir(folder, ref="r", source="s")
        monkeypatch.setattr(wandb_log, "TABLE_MIN_BLOCKS", 4)
        monkeypatch.setattr(wandb_log, "ARROW_MIN_VALUES", 1000)
        [got] = wandb_log.read_wandb_run_dir(folder, ref="r", source="s")
        assert_same_segment(got, want)
        assert len(want.series["train/kl"]) > 5000
