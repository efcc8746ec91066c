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
import os
import stat
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30


@dataclass(frozen=True)
class ReadLimits:
    """The most one SOURCE may cost to read (``--max-read-bytes``, ``--max-read-seconds``)."""

    max_bytes: int = 16 * GIB
    """Bytes read from one SOURCE, files and server responses together (a 100-run x 4,000-step
    TensorBoard fleet is ~0.1 GiB)."""
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


def read_regular(path: Path, *, budget: Budget | None = None, start: int = 0, length: int | None = None,
                 charge: bool = True) -> bytes:
    """The bytes of a regular file from ``start`` (at most ``length`` of them), as long as it was when
    opened, charged to the budget (``charge``: only ``sniff`` reads uncharged).

    Opened without blocking and checked after opening, so a FIFO or a device swapped in under a name
    is refused rather than read (``NotRegularFile``); a file growing while read is read up to the size
    it had when opened.
    """
    budget = budget or current_budget()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = file_kind(st.st_mode)
            raise NotRegularFile(f"{path}: not a regular file ({kind}); skipped", kind=kind)
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
