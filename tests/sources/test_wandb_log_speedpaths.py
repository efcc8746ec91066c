"""The ``.wandb`` reader's Arrow path for large histories reads exactly what its plain path reads
(issue 14, part 6).

From ``ARROW_MIN_VALUES`` history values on, keys are coded by Arrow's dictionary encoding and the
values held in one Arrow array (no Python object per item), and a column of plain decimal numbers is
parsed by Arrow (``Items._plain_floats``); below it (or with the threshold out of reach), by
``dict.fromkeys`` and Python's ``float`` through numpy. On every literal both give the same double,
bit for bit (``-0.0``, denormals, the largest doubles, integers beyond 2**53, overflow to infinity),
and what only ``float`` reads (``NaN``, ``Infinity``) or nothing reads still goes ``float``'s way.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klwatch.sources import wandb_log
from klwatch.sources.wandb_log import ROW_MARK, Items, _decode_rows
from segment_equality import assert_same_segment
from wandb_framing import frame_wandb_log

OFF = 10 ** 9


# -- numbers ------------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _row(step: int, values: dict[str | bytes, bytes]) -> bytes:
    """A HistoryRecord as wandb-core writes it: one nested_key and one value_json per item."""
    items = [(b"_step", str(step).encode()), *values.items()]
    return b"".join(_ld(1, _ld(2, k if isinstance(k, bytes) else k.encode()) + _ld(16, v)) for k, v in items)


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


KEYS = st.sampled_from([b"a", b"b", b"train/kl", "ключ".encode(), b"k\xff", b"", b"\xfe", b"_timestamp", b"_step"])


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # a _step of NaN or 1e400, both ways
@settings(max_examples=150)
@given(values=st.lists(literals, min_size=1, max_size=60), other=st.lists(literals, min_size=1, max_size=60),
       keys=st.lists(st.tuples(KEYS, KEYS), min_size=1, max_size=5))
def test_history_columns_read_the_same_with_and_without_arrow(values: list[bytes], other: list[bytes],
                                                              keys: list[tuple[bytes, bytes]]) -> None:
    """Any keys (one not UTF-8, one empty, one spelled like the row marker), in any order per row."""
    rows = [_row(i, {keys[i % len(keys)][0]: values[i % len(values)], keys[i % len(keys)][1]: other[i % len(other)],
                     b"c": b"1.5"})
            for i in range(max(len(values), len(other)))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wandb_log, "ARROW_MIN_VALUES", OFF)
        want = _decode_rows(rows, strict=True)
        mp.setattr(wandb_log, "ARROW_MIN_VALUES", 0)
        got = _decode_rows(rows, strict=True)
    assert (got.flat, got.regular, got.nrows, got.missing) == (want.flat, want.regular, want.nrows, want.missing)
    assert got.names == want.names and list(got.columns) == list(want.columns)
    for key, (steps, vals, wall) in want.columns.items():
        g_steps, g_vals, g_wall = got.columns[key]
        assert np.array_equal(g_steps, steps)
        assert np.array_equal(_bits(g_vals), _bits(vals)), key
        assert np.array_equal(g_wall, wall, equal_nan=True)
        assert g_vals.flags.writeable


def test_a_large_run_reads_the_same_through_every_fast_path(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole folders of a few thousand rows and summary updates (one log cut short), read with and
    without Arrow: the same Segment, and the same state to read on from."""
    rng = np.random.default_rng(3)
    records = [b"\x8a\x01" + _varint(len(r := _ld(1, b"big1"))) + r]  # Record.run (field 17)
    for s in range(6000):
        v = {"train/kl": json.dumps(float(rng.normal())).encode(), "train/int": str(int(rng.integers(-9, 2 ** 60))).encode(),
             "_timestamp": json.dumps(1.7e9 + s * 0.25).encode()}
        if s == 4000:
            v["train/kl"] = b"NaN"
        runtime = _ld(1, _ld(2, b"_wandb") + _ld(2, b"runtime") + _ld(16, str(s // 500).encode())) + \
            _ld(1, _ld(1, b"_runtime") + _ld(16, str(s // 500).encode()))
        update = b"".join(_ld(1, _ld(2, k.encode()) + _ld(16, x)) for k, x in v.items())
        records += [b"\x1a" + _varint(len(runtime)) + runtime, b"\x1a" + _varint(len(update)) + update,
                    b"\x12" + _varint(len(r := _row(s, v))) + r]  # Record.summary twice, Record.history
    data = frame_wandb_log(records)
    folder = tmp_path / "run-20260101_000000-big1"
    folder.mkdir()
    log = folder / "run-big1.wandb"
    for variant in (data, data[:-1000]):
        log.write_bytes(variant)
        monkeypatch.setattr(wandb_log, "ARROW_MIN_VALUES", OFF)
        [want], want_resume = wandb_log.read_wandb_run_dir_since(folder, ref="r", source="s", since=None)
        monkeypatch.setattr(wandb_log, "ARROW_MIN_VALUES", 1000)
        [got], got_resume = wandb_log.read_wandb_run_dir_since(folder, ref="r", source="s", since=None)
        assert_same_segment(got, want)
        assert len(want.series["train/kl"]) > 5000 and want.meta["summary"]["train/int"] == got.meta["summary"]["train/int"]
        assert want_resume is not None and got_resume.state == want_resume.state


# -- summary ------------------------------------------------------------------------------------

_keys = st.sampled_from([b"a", b"train/kl", b"_wandb", b"runtime", b"k\xff", b"", b"x\x82\x01y", b"\x82"])
summary_items = st.one_of(
    st.tuples(_keys, literals).map(lambda kv: _ld(2, kv[0]) + _ld(16, kv[1])),  # as wandb-core writes them
    st.tuples(_keys, literals).map(lambda kv: _ld(1, kv[0]) + _ld(16, kv[1])),  # keyed by ``key``
    st.tuples(_keys, _keys, literals).map(lambda k: _ld(2, k[0]) + _ld(2, k[1]) + _ld(16, k[2])),  # nested
    st.tuples(_keys, literals).map(lambda kv: _ld(16, kv[1]) + _ld(2, kv[0])),  # value first
    st.tuples(_keys, literals).map(lambda kv: _ld(2, kv[0]) + _ld(8, kv[1])),  # a typed value, no value_json
    st.binary(max_size=12),  # anything
)


@settings(max_examples=200)
@given(items=st.lists(summary_items, min_size=1, max_size=80), repeats=st.integers(1, 3))
def test_summary_items_fold_the_same_with_and_without_arrow(items: list[bytes], repeats: int) -> None:
    items = items * repeats  # later copies of a key win; its place is where it first came
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wandb_log, "ARROW_MIN_VALUES", OFF)
        want = wandb_log._fold_items(items)
        mp.setattr(wandb_log, "ARROW_MIN_VALUES", 0)
        got = wandb_log._fold_items(items)
    assert list(got[0].items()) == list(want[0].items())
    assert list(got[1].items()) == list(want[1].items())
    assert got[2] == want[2]
