"""``limits``: finding zeros and NUL bytes in a file one block at a time, so readers stop before a hole."""

from __future__ import annotations

from pathlib import Path

import pytest

from klwatch.sources.limits import (ZERO_STRETCH_MIN, BinaryText, NotRegularFile, first_nul, read_text_bytes,
                                    zero_stretches)

MIB = 1 << 20


def _write(path: Path, *parts: bytes | int) -> Path:
    """A file of the given bytes, an int being a sparse hole of that many zero bytes (nothing on disk)."""
    with open(path, "wb") as f:
        for part in parts:
            if isinstance(part, int):
                f.seek(part, 1)
            else:
                f.write(part)
        f.truncate(f.tell())
    return path


def test_a_sparse_hole_after_a_valid_head_is_found_with_its_exact_bytes(tmp_path: Path) -> None:
    f = _write(tmp_path / "f", b"head" * 1000, 1 << 30)
    assert zero_stretches(f) == [(4000, 4000 + (1 << 30))]


def test_zeros_written_to_disk_are_found_like_a_hole(tmp_path: Path) -> None:
    f = _write(tmp_path / "f", b"x" * 100, bytes(40 * MIB), b"y" * 5)
    assert zero_stretches(f) == [(100, 100 + 40 * MIB)]


def test_zeros_shorter_than_the_minimum_are_data(tmp_path: Path) -> None:
    f = _write(tmp_path / "f", b"x" * 100, bytes(ZERO_STRETCH_MIN - 1), b"y")
    assert zero_stretches(f) == []


def test_a_hole_beside_written_zeros_is_one_stretch(tmp_path: Path) -> None:
    f = _write(tmp_path / "f", b"x" * 10, bytes(3 * MIB), 20 * MIB, bytes(5 * MIB), b"z")
    assert zero_stretches(f) == [(10, 10 + 28 * MIB)]


def test_stretches_are_looked_for_only_from_start(tmp_path: Path) -> None:
    f = _write(tmp_path / "f", b"x", 20 * MIB, b"y" * 10, 30 * MIB, b"z")
    first, second = zero_stretches(f)
    assert first == (1, 1 + 20 * MIB)
    assert zero_stretches(f, start=second[0] - 5) == [second]
    assert zero_stretches(f, start=second[0] + MIB) == [(second[0] + MIB, second[1])]


def test_first_nul_is_found_in_data_and_at_a_hole(tmp_path: Path) -> None:
    assert first_nul(_write(tmp_path / "a", b"a,b\n" * 100_000, b"\0", b"1,2\n")) == 400_000
    assert first_nul(_write(tmp_path / "b", b"a,b\n" * 100_000, 1 << 30)) == 400_000
    assert first_nul(_write(tmp_path / "c", b"a,b\n" * 100_000)) is None


def test_a_large_text_file_with_a_hole_is_refused_before_it_is_read(tmp_path: Path) -> None:
    f = _write(tmp_path / "m", b"1700000000000 0.5 1\n" * 60_000, 1 << 30)
    with pytest.raises(BinaryText, match="NUL byte at byte 1200000"):
        read_text_bytes(f)
    small = _write(tmp_path / "s", b"1700000000000 0.5 1\n")
    assert read_text_bytes(small) == b"1700000000000 0.5 1\n"


def test_a_fifo_is_never_scanned(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "events.out.tfevents.1.h"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile):
        zero_stretches(fifo)
    with pytest.raises(NotRegularFile):
        first_nul(fifo)
