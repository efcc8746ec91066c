"""Bounds on reading one SOURCE: what a broken or hostile source can cost is fixed before it is read.

A SOURCE is untrusted input. A FIFO named like an event file would block a read forever, a symlink to
``/dev/zero`` would be read until memory runs out, a server that trickles or never ends its body would
hold a scan indefinitely. So every read of one SOURCE shares one ``Budget``: a number of bytes and a
wall-clock deadline for the whole SOURCE (not per request, which a trickle defeats), and only regular
files are opened. The budget of the SOURCE being read is the current one (``current_budget``), so
readers need no extra parameter; ``read_source`` installs it.

Folders are walked without recursion (``walk``): a tree ~1,000 levels deep is still read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..read_budget import DEFAULT_MAX_READ_BYTES

GIB = 1 << 30


@dataclass(frozen=True)
class ReadLimits:
    """The most one SOURCE may cost to read (``--max-read-bytes``, ``--max-read-seconds``)."""

    max_bytes: int = DEFAULT_MAX_READ_BYTES
    """Bytes read from one SOURCE, files and server responses together (a 100-run x 4,000-step
    TensorBoard fleet is ~0.1 GiB); by default half the machine's memory (``read_budget``)."""
    max_seconds: float = 3600.0
    """Wall time reading one SOURCE may take, however its server answers."""


class LimitExceeded(Exception):
    """A SOURCE went past its bounds; the message says which bound, where, and the flag that raises it."""


class NotRegularFile(OSError):
    """A path that is not a regular file (a FIFO, a device, a socket): never opened for reading."""

    def __init__(self, message: str, *, kind: str = "not a file") -> None:
        super().__init__(message)
        self.kind = kind
        """What the path is instead ("a FIFO", "a character device", ...)."""


class Budget:
    """The bytes and time left for one SOURCE."""

    def __init__(self, limits: ReadLimits = ReadLimits(), *, what: str = "the source") -> None:
        self.limits = limits
        self.what = what
        self.used = 0
        self.deadline = time.monotonic() + limits.max_seconds

    def remaining_seconds(self) -> float:
        return self.deadline - time.monotonic()

    def check_time(self, where: str) -> None:
        """Raise when the SOURCE's wall-time bound has passed."""
        if time.monotonic() > self.deadline:
            raise LimitExceeded(f"reading {self.what} took longer than {self.limits.max_seconds:g} s (at {where}); "
                                "raise the bound with --max-read-seconds")

    def charge(self, nbytes: int, where: str) -> None:
        """Count ``nbytes`` read at ``where``; raise when the SOURCE's byte bound is passed."""
        self.used += int(nbytes)
        if self.used > self.limits.max_bytes:
            raise LimitExceeded(f"reading {self.what} needs more than {self.limits.max_bytes:,} bytes (at {where}); "
                                "raise the bound with --max-read-bytes")
        self.check_time(where)


_current: ContextVar[Budget | None] = ContextVar("klwatch_read_budget", default=None)


def current_budget() -> Budget:
    """The budget of the SOURCE being read (an unbounded-by-default one outside ``read_source``)."""
    budget = _current.get()
    return budget if budget is not None else Budget()


@contextlib.contextmanager
def reading(budget: Budget) -> Iterator[Budget]:
    """Make ``budget`` the current one while a SOURCE is read."""
    token = _current.set(budget)
    try:
        yield budget
    finally:
        _current.reset(token)


def path_kind(path: Path) -> str | None:
    """What ``path`` is (following symlinks: "a regular file", "a FIFO", ...), or None when it cannot
    be stat'ed (gone, a broken symlink). Never blocks."""
    try:
        return file_kind(os.stat(path).st_mode)
    except OSError:
        return None


def is_regular_file(path: Path) -> bool:
    """True for a regular file (following symlinks): what klwatch may open. Never blocks."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


_ONE_READ_MAX = 0x7FFFF000
"""The most Linux's read(2) returns at once."""
SNIFF_ABOVE = 1 << 20
"""Files larger than this have their first bytes checked before they are read whole (``sniff``)."""
SNIFF_MAX = 1 << 16


def sniff(path: Path, *, length: int, start: int = 0) -> bytes | None:
    """At most ``length`` (<= 64 KiB) bytes of a regular file larger than ``SNIFF_ABOVE`` from ``start``, not
    charged to the budget (they are read again with the file): what a reader checks before reading a large
    file whole, so a 1 GiB file that is no log (a sparse file of zeros) costs a few bytes. None for a
    smaller file: it is read whole at once anyway."""
    if os.stat(path).st_size <= SNIFF_ABOVE:
        return None
    return read_regular(path, start=start, length=min(length, SNIFF_MAX), charge=False)


ZERO_STRETCH_MIN = 16 << 20
"""Zeros this long inside a tracker file are a hole (a sparse file, a crash into a pre-extended file), never
data: no log writes 16 MiB of NUL bytes. Readers stop or skip there instead of holding the zeros."""
_SCAN_BLOCK = ZERO_STRETCH_MIN // 2
_ZEROS = bytes(_SCAN_BLOCK)


def _open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its stat, opened without blocking; a FIFO or a device swapped in
    under the name is refused (``NotRegularFile``) rather than read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = file_kind(st.st_mode)
        raise NotRegularFile(f"{path}: not a regular file ({kind}); skipped", kind=kind)
    return fd, st


def _regions(fd: int, size: int, start: int = 0) -> Iterator[tuple[int, int, bool]]:
    """(start, end, is_hole) over the file's bytes from ``start`` to ``size``, holes as the file system reports them
    (``SEEK_DATA``/``SEEK_HOLE``: a sparse gigabyte costs no read), or one data region where it cannot say."""
    pos = start
    while pos < size:
        try:
            data = min(os.lseek(fd, pos, os.SEEK_DATA), size)
        except OSError as exc:
            yield (pos, size, exc.errno == errno.ENXIO)  # ENXIO: only a hole is left; else no hole support
            return
        if data > pos:
            yield (pos, data, True)
        if data >= size:
            return
        try:
            end = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        except OSError:
            end = size
        yield (data, max(end, data + 1), False)
        pos = max(end, data + 1)


def _blocks(fd: int, start: int, end: int, budget: Budget, where: str) -> Iterator[tuple[int, bytes]]:
    """The bytes from ``start`` to ``end`` in blocks of 8 MiB, one held at a time (time-checked, not charged)."""
    for off in range(start, end, _SCAN_BLOCK):
        budget.check_time(where)
        block = os.pread(fd, min(_SCAN_BLOCK, end - off), off)
        if not block:
            return
        yield off, block


def _zero_edge(fd: int, at: int, size: int, *, before: bool) -> int:
    """How many zero bytes lie right before (or from) byte ``at``: where a stretch found by blocks begins or ends."""
    if before:
        block = os.pread(fd, min(_SCAN_BLOCK, at), max(0, at - _SCAN_BLOCK))
        return len(block) - len(block.rstrip(b"\0"))
    block = os.pread(fd, min(_SCAN_BLOCK, max(0, size - at)), at)
    return len(block) - len(block.lstrip(b"\0"))


def zero_stretches(path: Path, *, start: int = 0, budget: Budget | None = None) -> list[tuple[int, int]]:
    """The stretches (from, to) of ``ZERO_STRETCH_MIN`` or more zero bytes in a regular file, found with one
    8 MiB block held at a time (file-system holes are not even read): where a reader must stop or skip rather
    than hold the file, so a 1 GiB sparse file with a valid head costs its head (from byte ``start`` on: what
    a resumed read would read). Not charged to the budget (the
    bytes kept are charged when read), but within its deadline."""
    budget = budget or current_budget()
    fd, st = _open_regular(path)
    try:
        if st.st_size - start < ZERO_STRETCH_MIN:
            return []  # too short to hold one: not looked through (most tracker files)
        found: list[list[int]] = []
        for a, b, hole in _regions(fd, st.st_size, start):
            for off, block in ([(a, b"")] if hole else _blocks(fd, a, b, budget, str(path))):
                if hole or block == (_ZEROS if len(block) == _SCAN_BLOCK else bytes(len(block))):
                    end = b if hole else off + len(block)
                    if found and found[-1][1] >= (a if hole else off):
                        found[-1][1] = max(found[-1][1], end)
                    else:
                        found.append([a if hole else off, end])
        out = []
        for lo, hi in found:
            lo -= _zero_edge(fd, lo, st.st_size, before=True) if lo > start else 0
            hi += _zero_edge(fd, hi, st.st_size, before=False)
            if hi - lo >= ZERO_STRETCH_MIN:
                out.append((lo, hi))
        return out
    finally:
        os.close(fd)


def first_nul(path: Path, *, budget: Budget | None = None) -> int | None:
    """Where the first NUL byte of a regular file is (None: it has none), one 8 MiB block held at a time,
    file-system holes not read: what a text reader checks before reading a large file whole, so a text file
    with a gigabyte hole after a valid head is refused for the cost of its head."""
    budget = budget or current_budget()
    fd, st = _open_regular(path)
    try:
        for a, b, hole in _regions(fd, st.st_size):
            if hole:
                return a
            for off, block in _blocks(fd, a, b, budget, str(path)):
                if (i := block.find(0)) >= 0:
                    return off + i
        return None
    finally:
        os.close(fd)


class BinaryText(ValueError):
    """A file that should be text holds a NUL byte (binary data, or a hole a crash or a sparse file left)."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"binary data (a NUL byte at byte {offset}), not text; not read")
        self.offset = offset


def read_text_bytes(path: Path, *, budget: Budget | None = None) -> bytes:
    """``read_regular`` for a file that must be text (a metric file, a JSON or YAML side file): a large one
    holding a NUL byte is refused (``BinaryText``) before it is read whole, so a gigabyte hole after a valid
    head costs the head."""
    if os.stat(path).st_size > SNIFF_ABOVE and (nul := first_nul(path, budget=budget)) is not None:
        raise BinaryText(nul)
    return read_regular(path, budget=budget)


def read_regular(path: Path, *, budget: Budget | None = None, start: int = 0, length: int | None = None,
                 charge: bool = True) -> bytes:
    """The bytes of a regular file from ``start`` (at most ``length`` of them), as long as it was when
    opened, charged to the budget (``charge``: only ``sniff`` reads uncharged).

    Opened without blocking and checked after opening, so a FIFO or a device swapped in under a name
    is refused rather than read (``NotRegularFile``); a file growing while read is read up to the size
    it had when opened.
    """
    budget = budget or current_budget()
    fd, st = _open_regular(path)
    try:
        size = max(0, st.st_size - start)
        if length is not None:
            size = min(size, max(0, length))
        if charge:
            budget.charge(size, str(path))
        os.lseek(fd, start, os.SEEK_SET)
        # one read where the kernel gives it all (up to ~2 GiB on Linux): the file's bytes held once, not
        # once in chunks and again joined; a short read (a pipe-like file system) goes on in chunks
        first = os.read(fd, min(size, _ONE_READ_MAX)) if size else b""
        if len(first) == size or not first:
            return first
        chunks, left = [first], size - len(first)
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a FIFO", "a socket", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a file"


def walk(root: Path, *, onerror: Callable[[OSError], None] | None = None
         ) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``os.walk`` without recursion (Python 3.11's recurses, and a tree ~1,000 levels deep overflows
    the stack): top-down, sorted, symlinked folders not followed (listed among the files), unreadable
    folders skipped (given to ``onerror``, as ``os.walk`` does). The caller may prune ``dirs`` in
    place, as with ``os.walk``."""
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        dirs, files = [], []
        for e in entries:
            try:
                (dirs if e.is_dir(follow_symlinks=False) else files).append(e.name)
            except OSError:
                files.append(e.name)
        dirs.sort()
        files.sort()
        yield top, dirs, files
        stack.extend(top / d for d in reversed(dirs))


class YamlRefused(ValueError):
    """A YAML document that uses an alias (``*name``), or nests deeper than ``YAML_MAX_DEPTH``:
    refused, since nested aliases expand exponentially (a "billion laughs" of a few hundred bytes
    needs gigabytes once walked) and deep nesting costs the pure-Python parser seconds before it
    overflows the stack."""


YamlAliasRefused = YamlRefused  # the name the readers first imported
YAML_MAX_DEPTH = 100
"""Far deeper than any MLflow ``meta.yaml`` or trainer ``config.yaml``."""


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, refusing aliases and deep nesting (``YamlRefused``, naming the
    line): the files klwatch reads (MLflow ``meta.yaml``, NeMo-RL ``config.yaml``) have neither."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                raise YamlRefused(f"YAML alias *{event.anchor} at line {event.start_mark.line + 1}: "
                                  "aliases are refused (they can expand without bound)")
            if self.depth >= YAML_MAX_DEPTH:
                raise YamlRefused(f"YAML nested deeper than {YAML_MAX_DEPTH} levels at line "
                                  f"{event.start_mark.line + 1}: refused")
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
