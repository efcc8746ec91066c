"""Fuzzing the ``.wandb`` log reader (issue 12) with logs the real wandb client wrote (the committed
sample runs): truncations, bit flips, huge declared lengths, random bytes, with the chunk CRCs made
right again for half of them so that the protobuf decoding behind the framing is reached. Every input
must give a clear error or warning naming the log, in bounded time and memory, without touching it
(``fuzz_helpers.check_read``).

The default number of examples keeps this module to a few seconds; ``KLWATCH_FUZZ_EXAMPLES=N`` (e.g.
5000) runs a long fuzz: ``KLWATCH_FUZZ_EXAMPLES=5000 pytest -p no:cacheprovider tests/fuzz``.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import check_read, damage, fuzz_settings, tally  # noqa: F401  (tally: the module's totals)
from klwatch.model import SourceRead
from klwatch.sources.wandb_log import BLOCK, CHUNK_HEADER, CHUNK_SEEDS, FILE_HEADER_LEN

SAMPLES = Path(__file__).resolve().parents[2] / "sample_runs"
LOGS = {p.parent.name.rsplit("-", 1)[-1]: p for p in sorted(SAMPLES.rglob("*.wandb"))}
SMALL = [LOGS[k] for k in ("uzmhvovx", "oht3uhie", "gmpaocth", "7hs9caxh")]
"""Logs of 8-36 KiB written by wandb 0.2x offline (one and two 32 KiB blocks)."""


def fix_chunk_crcs(data: bytes) -> bytes:
    """Every chunk whose header still makes sense gets the CRC its type and payload have: damage that
    passes the framing, as a bug in a writer (or a flip before the CRC was taken) would."""
    out = bytearray(data)
    pos, n = FILE_HEADER_LEN, len(out)
    while pos + CHUNK_HEADER <= n:
        block_end = pos - pos % BLOCK + BLOCK
        if block_end - pos < CHUNK_HEADER:
            pos = block_end
            continue
        _, length, ctype = struct.unpack_from("<IHB", out, pos)
        end = pos + CHUNK_HEADER + length
        if end > min(block_end, n) or not 0 < ctype < 5:
            pos = block_end
            continue
        struct.pack_into("<I", out, pos, zlib.crc32(bytes(out[pos + CHUNK_HEADER:end]), CHUNK_SEEDS[ctype]))
        pos = end
    return bytes(out)


def huge_field(data: bytes, at: int) -> bytes:
    """A protobuf field declaring 2^55 bytes written over a record's bytes (past the file header)."""
    at = max(at, FILE_HEADER_LEN + CHUNK_HEADER)
    field = b"\x12" + b"\xff" * 7 + b"\x3f"
    return data[:at] + field + data[at + len(field):]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder as wandb lays it out, its log rewritten for each example."""
    root = tmp_path_factory.mktemp("fuzz-wandb")
    run = root / "wandb" / "offline-run-20260101_000000-fuzz1"
    run.mkdir(parents=True)
    return run


def read_damaged(folder: Path, data: bytes) -> SourceRead:
    """Put ``data`` in the run folder as its log and read the tree above it as a scan does."""
    log = folder / "run-fuzz1.wandb"
    log.write_bytes(data)
    read = check_read(folder.parents[1], folder=folder.parents[1], names=(log.name, folder.name), size=len(data))
    assert len(read.segments) <= 1
    return read


@fuzz_settings(150)
@given(source=st.sampled_from(SMALL), data=st.data())
def test_a_damaged_wandb_log_gives_a_clear_error_or_warning_in_bounded_time_and_memory(
        folder: Path, source: Path, data: st.DataObject) -> None:
    _, damaged = data.draw(damage(source.read_bytes(), huge=huge_field, fix=fix_chunk_crcs))
    read_damaged(folder, damaged)


# What fuzzing found before issue 12: byte flips (with the chunk CRCs made right) that dropped the whole
# run with a bare TypeError / DecodeError. (log, [(byte, xor mask)]) of each, and the error it gave.
FOUND = {
    "DecodeError in read_history": ("lcqjuza5", [(4058, 64), (15373, 2), (20150, 128), (36738, 16)]),
    "DecodeError in read_summary": ("7hs9caxh", [(2927, 64), (27353, 4), (30495, 16), (33304, 16)]),
    "TypeError in _slow_item": ("ffc93gef", [(9899, 4), (16598, 128), (18029, 4), (19217, 4)]),
    "TypeError in read_summary": ("gmpaocth", [(2278, 4), (7533, 4), (9533, 4), (9939, 16)]),
}


@pytest.mark.parametrize("found", list(FOUND))
def test_fuzzed_logs_that_once_dropped_their_run_with_an_internal_error_keep_it(folder: Path, found: str) -> None:
    name, flips = FOUND[found]
    data = bytearray(LOGS[name].read_bytes())
    for at, mask in flips:
        data[at] ^= mask
    [seg] = read_damaged(folder, fix_chunk_crcs(bytes(data))).segments
    assert seg.error is None and seg.series, seg.warnings
