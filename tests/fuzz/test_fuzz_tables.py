"""Fuzzing the table reader (issue 12) with tables pandas wrote (CSV, JSON lines, Parquet; a step, a
wall time, a segment column and two metrics): truncations, bit flips, huge numbers over the bytes
(for Parquet also a huge declared footer length), random bytes. Every input must give a clear error
or warning naming the file, in bounded time and memory, without touching it
(``fuzz_helpers.check_read``); a torn last row is never read as if whole.

The default number of examples keeps this module to a few seconds; ``KLWATCH_FUZZ_EXAMPLES=N`` (e.g.
5000) runs a long fuzz: ``KLWATCH_FUZZ_EXAMPLES=5000 pytest -p no:cacheprovider tests/fuzz``.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import check_read, damage, fuzz_settings, tally  # noqa: F401  (tally: the module's totals)

FORMATS = ("csv", "jsonl", "parquet")


def frame() -> pd.DataFrame:
    steps = list(range(1, 31))
    return pd.DataFrame({"step": steps, "wall_time": [1_700_000_000.0 + 2 * s for s in steps],
                         "restart": [0 if s <= 15 else 1 for s in steps],
                         "train/kl": [0.01 * s for s in steps], "reward": [1.0 / s for s in steps]})


def written(fmt: str) -> bytes:
    """The frame as pandas writes each format."""
    df, buf = frame(), io.BytesIO()
    if fmt == "csv":
        df.to_csv(buf, index=False)
    elif fmt == "jsonl":
        df.to_json(buf, orient="records", lines=True)
    else:
        df.to_parquet(buf, index=False)
    return buf.getvalue()


def huge_footer(data: bytes, at: int) -> bytes:
    """Parquet: the footer declares up to 2^31 bytes (its length sits before the closing magic)."""
    return data[:-8] + struct.pack("<I", 0x7FFFFFFF >> (at % 16)) + data[-4:]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of exported tables, the one under test rewritten for each example."""
    return tmp_path_factory.mktemp("fuzz-tables")


@fuzz_settings(150)
@given(fmt=st.sampled_from(FORMATS), data=st.data())
def test_a_damaged_table_gives_a_clear_error_or_warning_in_bounded_time_and_memory(
        folder: Path, fmt: str, data: st.DataObject) -> None:
    _, damaged = data.draw(damage(written(fmt), huge=huge_footer if fmt == "parquet" else None))
    for old in folder.iterdir():
        old.unlink()
    path = folder / f"metrics.{fmt}"
    path.write_bytes(damaged)
    check_read(folder, folder=folder, names=(path.name,), size=len(damaged))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_text_table_cut_anywhere_in_its_last_rows_never_reads_a_row_missing_its_fields(
        folder: Path, fmt: str) -> None:
    """Cut after every byte of the last two rows: every row read holds all its metrics and every value
    of a middle column is one that was written (a row cut short is dropped, not read with cells
    missing or shortened). A cut inside the last cell of a CSV row can still leave a number there,
    which no reader can tell from a whole one."""
    data = written(fmt)
    whole = set(zip(frame()["step"], frame()["train/kl"]))
    for cut in range(data.rindex(b"\n", 0, data.rindex(b"\n", 0, len(data) - 1)), len(data) + 1):
        for old in folder.iterdir():
            old.unlink()
        path = folder / f"metrics.{fmt}"
        path.write_bytes(data[:cut])
        read = check_read(path, folder=folder, names=(path.name,), size=cut)
        got = {(int(s), float(v)) for seg in read.segments for s, v in
               zip(seg.series["train/kl"].steps, seg.series["train/kl"].values)}
        assert got <= whole and len(got) >= 28, cut
        for seg in read.segments:  # every row read holds every metric: none was read with cells missing
            assert seg.series["reward"].steps.tolist() == seg.series["train/kl"].steps.tolist(), cut
