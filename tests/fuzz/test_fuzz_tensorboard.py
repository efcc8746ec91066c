"""Fuzzing the TensorBoard event-file reader (issue 12) with files the real writers wrote (tensorboardX
``simple_value`` scalars and a config text summary; ``tensorboard.summary.Writer`` v2 tensor
scalars): truncations, bit flips, huge declared record lengths (with their length CRC right, so the
reader believes them), random bytes, and for half of the inputs both CRCs of every record made right
again so that the protobuf decoding behind the framing is reached. Every input must give a clear
error or warning naming the file, in bounded time and memory, without touching it
(``fuzz_helpers.check_read``).

The default number of examples keeps this module to a few seconds; ``KLWATCH_FUZZ_EXAMPLES=N`` (e.g.
5000) runs a long fuzz: ``KLWATCH_FUZZ_EXAMPLES=5000 pytest -p no:cacheprovider tests/fuzz``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import google_crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import check_read, damage, fuzz_settings, tally  # noqa: F401  (tally: the module's totals)

EVENT_NAME = "events.out.tfevents.1700000000.fuzzhost.4242.0"


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C (written here, apart from the reader's numpy version)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fix_record_crcs(data: bytes) -> bytes:
    """Both CRCs of every record the lengths still lead to, made right: damage the framing passes."""
    out = bytearray(data)
    pos, n = 0, len(out)
    while pos + 12 <= n:
        struct.pack_into("<I", out, pos + 8, masked_crc(bytes(out[pos:pos + 8])))
        length = struct.unpack_from("<Q", out, pos)[0]
        end = pos + 12 + length
        if end + 4 > n:
            break
        struct.pack_into("<I", out, end, masked_crc(bytes(out[pos + 12:end])))
        pos = end + 4
    return bytes(out)


def record_heads(data: bytes) -> list[int]:
    heads, pos = [], 0
    while pos + 12 <= len(data):
        heads.append(pos)
        pos += struct.unpack_from("<Q", data, pos)[0] + 16
    return heads


def declare_length(data: bytes, head: int, length: int) -> bytes:
    """The record at ``head`` declares ``length`` bytes, its length CRC right (so the reader believes it)."""
    raw = struct.pack("<Q", length)
    return data[:head] + raw + struct.pack("<I", masked_crc(raw)) + data[head + 12:]


def huge_length(data: bytes, at: int) -> bytes:
    """The record nearest before ``at`` declares between 2^32 and 2^63 bytes."""
    heads = [h for h in record_heads(data) if h <= at] or [0]
    return declare_length(data, heads[-1], (1 << (32 + at % 32)) - 1)


def write_tensorboardx(folder: Path) -> bytes:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(folder), flush_secs=3600)
    writer.add_text("config", json.dumps({"lr": 1e-6, "kl_coef": 0.05}))
    for step in range(1, 25):
        writer.add_scalar("train/kl", 0.01 * step, step, walltime=1_700_000_000.0 + step)
        writer.add_scalar("train/reward", 1.0 / step, step, walltime=1_700_000_000.5 + step)
    writer.close()
    return next(folder.glob("events.out.tfevents.*")).read_bytes()


def write_summary_writer(folder: Path) -> bytes:
    from tensorboard.summary import Writer

    writer = Writer(str(folder))
    for step in range(1, 25):
        writer.add_scalar("train/kl", 0.01 * step, step, wall_time=1_700_000_000.0 + step)
    writer.close()
    return next(folder.glob("events.out.tfevents.*")).read_bytes()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The bytes of one event file from each writer."""
    root = tmp_path_factory.mktemp("fuzz-tb-written")
    return {"tensorboardX": write_tensorboardx(root / "tbx"), "summary.Writer": write_summary_writer(root / "v2")}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A logdir holding one run folder, its event file rewritten for each example."""
    root = tmp_path_factory.mktemp("fuzz-tb")
    (root / "run").mkdir()
    return root


@fuzz_settings(150)
@given(writer=st.sampled_from(["tensorboardX", "summary.Writer"]), data=st.data())
def test_a_damaged_event_file_gives_a_clear_error_or_warning_in_bounded_time_and_memory(
        written: dict[str, bytes], folder: Path, writer: str, data: st.DataObject) -> None:
    _, damaged = data.draw(damage(written[writer], huge=huge_length, fix=fix_record_crcs))
    (folder / "run" / EVENT_NAME).write_bytes(damaged)
    read = check_read(folder, folder=folder, names=(EVENT_NAME,), size=len(damaged))
    assert len(read.segments) <= 1


def test_a_huge_declared_length_is_never_allocated(written: dict[str, bytes], folder: Path) -> None:
    """Every record of a real file declaring 2^63 - 1 bytes in turn: read within the memory bound,
    the records before it kept with a warning, and those after it read past the damage where they are
    whole (none before the first: an error)."""
    data = written["tensorboardX"]
    for h in record_heads(data):
        damaged = declare_length(data, h, (1 << 63) - 1)
        (folder / "run" / EVENT_NAME).write_bytes(damaged)
        [seg] = check_read(folder, folder=folder, names=(EVENT_NAME,), size=len(damaged)).segments
        if h == 0:
            assert "no whole record" in seg.error
        else:
            assert seg.error is None and any("truncated event file" in w or "damaged event file" in w
                                             for w in seg.warnings), seg.warnings
