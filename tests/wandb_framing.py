"""The LevelDB-log framing of a ``.wandb`` file, written independently of klwatch's reader: the tests and
``benchmarks/bench_wandb.py`` frame hand-made records with it."""

from __future__ import annotations

import struct
import zlib

from klwatch.sources.wandb_log import BLOCK


def frame_wandb_log(records: list[bytes]) -> bytes:
    """LevelDB-log framing as wandb-core writes it."""
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for rec in records:
        first, rest = True, rec
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < 7:
                out += b"\x00" * left
                continue
            take, rest = rest[: left - 7], rest[left - 7:]
            ctype = (1 if not rest else 2) if first else (4 if not rest else 3)
            out += struct.pack("<IHB", zlib.crc32(take, zlib.crc32(bytes([ctype]))), len(take), ctype) + take
            first = False
            if not rest:
                break
    return bytes(out)
