"""The LevelDB-log framing of a ``.wandb`` file, written independently of klwatch's reader: the tests and
``benchmarks/bench_wandb.py`` frame hand-made records with it, and the tests find in it a byte whose change
is certain to be damage (``in_payload``)."""

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


def in_payload(data: bytes, near: int) -> int:
    """A byte inside the payload of the first chunk that ends after ``near``, never in a chunk header nor in
    block padding: a byte the CRC covers, so changing it is damage a reader must see. (A byte of a header's
    length may instead declare a chunk running past the end of the file, which reads exactly like a log cut
    short by a crash or still being written.)"""
    pos = 7
    while True:
        if BLOCK - pos % BLOCK < 7:
            pos += BLOCK - pos % BLOCK
            continue
        length = struct.unpack_from("<H", data, pos + 4)[0]
        if pos + 7 + length > near and length:
            return max(pos + 7, min(near, pos + 7 + length - 1))
        pos += 7 + length
