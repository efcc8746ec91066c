"""Reading an append-only log on from where an earlier read stopped.

TensorBoard event files and W&B ``.wandb`` logs only ever grow while their run lives. A reader that
can resume takes a ``Resume`` (where its last read of the file ended: the byte after the last whole
record it took, and what it had decoded up to there) and reads only the bytes after that point,
giving the same Segment a read of the whole file would give. The scan cache persists a ``Resume``
per file (``klwatch.scan_cache``); the watcher keeps them in memory between polls.

A resumable reader has the signature of ``ResumableReader``: with ``since=None`` it reads the whole
file; either way it returns its Segments and a ``Resume`` for the end of the last whole record (or
None when the file cannot soundly be read on from there, e.g. it ended in damage, so the next read
starts from the beginning). Whether the bytes before ``since.offset`` are still the ones that were
read is the caller's check (``klwatch.scan_cache.same_prefix``), made before it passes ``since``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..model import Segment


@dataclass
class Resume:
    """Where a read of one log stopped, and what it had decoded up to there."""

    file: str
    """The log file read (absolute path): for a W&B run folder, its ``.wandb`` log."""
    offset: int
    """The byte just after the last whole record taken: the next read starts here."""
    segment: Segment
    """The Segment the bytes before ``offset`` make, as a read of just those bytes gives it (no
    warning about what lay after them: a record cut off at the end belongs to the next read)."""
    state: dict[str, Any] = field(default_factory=dict)
    """What the reader needs beyond the Segment to go on (plain JSON: str, int, float, bool, None,
    lists and dicts of them; bytes as hex strings), persisted by the scan cache."""


class ResumableReader(Protocol):
    """``read_tensorboard_file_since`` / ``read_wandb_run_dir_since``."""

    def __call__(self, path: Path, *, ref: str, source: str, since: Resume | None
                 ) -> tuple[list[Segment], Resume | None]: ...
