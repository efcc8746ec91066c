"""Several local SOURCEs of one invocation read as one fleet: the pieces of every local SOURCE argument are
stitched together, so a shell glob over a run's launch folders (``runs/*``), a list of run folders or a list of
event files gives the training runs their common parent gives.

Each pooled SOURCE is still looked through, read, bounded and reported on its own (its errors name it); only
the identity of what is read changes: every file's ref is taken from the common parent and every Segment's
``source`` is that parent, exactly as a scan of the parent would give them, so stitching sees one store. A
SOURCE with a ``#PATTERN`` keeps its own runs (the pattern is about them) and is not pooled, nor is a remote
one; relative and absolute SOURCEs are pooled only among their own kind (their pieces could not be named
from one parent otherwise)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from ..source_names import REMOTE_PREFIXES, split_pattern


@dataclass
class Pool:
    """The local SOURCEs read as one, and the folder they are read from."""

    root: Path
    """Their common parent folder, spelled as they are (relative when they are)."""
    members: tuple[str, ...]
    """The pooled SOURCEs (without ``#PATTERN``), in the order given."""
    claimed: set[str] = field(default_factory=set)
    """The files and run folders an earlier member already planned (``runs/`` then ``runs/a``: read once)."""

    @property
    def spec(self) -> str:
        """The parent as a SOURCE: every pooled Segment's ``source``."""
        return str(self.root)


def local_pool(specs: Sequence[str]) -> Pool | None:
    """The pool of ``specs``: their local SOURCEs without ``#PATTERN`` that exist, when there are two or more
    of the same kind of spelling (all relative or all absolute); else None (each is read on its own)."""
    bases: list[str] = []
    for spec in specs:
        base, pattern = split_pattern(spec)
        if pattern is None and not base.startswith(REMOTE_PREFIXES) and base not in bases \
                and os.path.exists(os.path.expanduser(base)):
            bases.append(base)
    for absolute in (False, True):
        members = [b for b in bases if os.path.isabs(os.path.expanduser(b)) == absolute]
        if len(members) >= 2:
            break
    else:
        return None
    folders = [os.path.normpath(p if os.path.isdir(p) else os.path.dirname(p) or ".")
               for p in (os.path.expanduser(b) for b in members)]
    return Pool(root=Path(os.path.commonpath(folders) or "."), members=tuple(members))


_current: ContextVar[Pool | None] = ContextVar("klwatch_source_pool", default=None)


def current_pool(spec: str) -> Pool | None:
    """The pool ``spec`` (a local SOURCE without its pattern) is read into, if any."""
    pool = _current.get()
    return pool if pool is not None and spec in pool.members else None


@contextlib.contextmanager
def pooling(specs: Sequence[str]) -> Iterator[Pool | None]:
    """Read the local SOURCEs of ``specs`` as one fleet while inside (``local_pool``)."""
    token = _current.set(local_pool(specs))
    try:
        yield _current.get()
    finally:
        _current.reset(token)
