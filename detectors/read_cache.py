"""The watcher's incremental reads: poll a local SOURCE often without re-reading what did not change.

``LocalReadCache`` reads a local SOURCE with ``klwatch.sources.local.read_local`` itself (so a poll
sees a tree exactly as ``klwatch scan`` does), but re-reads only the files (or run folders, stores)
whose size or mtime changed since the last poll and reuses the Segments of the rest. A TensorBoard
event file or a ``.wandb`` log that only grew (the bytes read before unchanged) is read on from the
last whole record the previous poll took (``klwatch.sources.resume``): a poll costs in proportion
to what was written since, not to the run's length. Remote sources
(``wandb://``, ``mlflow://``) are read in full at every poll: their readers fetch whole histories
and expose no "since step N" query. Every poll of a SOURCE reads within the scan's ``ReadLimits``
(``--max-read-bytes``, ``--max-read-seconds``), as ``read_source`` does: a hostile source costs a
watch poll no more than it costs a scan.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import incremental
from .model import Segment, SourceError, SourceRead
from .scan_cache import can_read_on, checkpoint_entries, log_anchor, read_unit_since, unit_fingerprint
from .source_names import REMOTE_PREFIXES
from .sources import read_source
from .sources.limits import Budget, LimitExceeded, ReadLimits, reading, walk
from .sources.local import Unit, UnitRead, read_local
from .sources.resume import Resume


@dataclass
class ReadStats:
    """What the last poll of one source cost: units read from disk vs reused from the cache."""

    read: int = 0
    reused: int = 0
    read_on: int = 0
    """Units (among ``read``) that were read on from where the last poll stopped, not from their start."""
    full: bool = False
    """True when the source was read in full (a remote one: its reader has no incremental form)."""


def _stat(p: Path) -> tuple[int, int]:
    """(size, mtime in ns), or (-1, -1) for a file gone between listing and stat: gone is a change too."""
    try:
        st = p.stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return -1, -1


def _fingerprint(unit: Unit) -> tuple[Any, ...]:
    """Changes whenever what the unit's reader would read changes (size or mtime of its files)."""
    path = unit.path
    if unit.kind == "mlflow" and path.is_file():  # a SQLite store: a live writer may hold recent rows in the WAL
        return _stat(path) + _stat(path.with_name(path.name + "-wal"))
    if unit.kind in ("tensorboard", "table"):
        return _stat(path)
    if unit.kind == "checkpoints":  # the checkpoint folders and their top-level files, never the weights
        out: list[Any] = [_stat(path)]
        with contextlib.suppress(OSError):
            out.extend((*names, _stat(p)) for p, names in checkpoint_entries(path))
        return tuple(out)
    out = []
    for dirpath, _, filenames in walk(path):  # wandb run folders, mlruns trees (no recursion on depth)
        for f in filenames:
            p = Path(dirpath) / f
            out.append((str(p.relative_to(path)), _stat(p)))
    return tuple(sorted(out))


def _copy_segment(seg: Segment) -> Segment:
    """A copy the pipeline may annotate without touching the cached one (series arrays are shared)."""
    out = copy.copy(seg)
    out.series = dict(seg.series)
    out.config = dict(seg.config)
    out.tags = dict(seg.tags)
    out.meta = dict(seg.meta)
    out.warnings = list(seg.warnings)
    out.checkpoint_steps = list(seg.checkpoint_steps)
    return out


class LocalReadCache:
    """Reads SOURCEs for the watcher, re-reading only what changed on disk since the last poll.

    ``read`` has the signature of ``klwatch.sources.read_source``, so ``pipeline.scan(...,
    read=cache.read)`` judges exactly what a plain scan would."""

    def __init__(self, limits: ReadLimits = ReadLimits()) -> None:
        self.limits = limits
        self._units: dict[tuple[str, str, str], _Kept] = {}
        self._live: dict[str, set[tuple[str, str, str]]] = {}
        """The units each SOURCE read at its last poll."""
        self.stats: dict[str, ReadStats] = {}
        self._stats = ReadStats()  # the SOURCE being read now

    def read(self, spec: str) -> SourceRead:
        """Read one SOURCE (``#PATTERN`` already removed)."""
        if spec.startswith(REMOTE_PREFIXES):
            self.stats[spec] = ReadStats(full=True)
            return read_source(spec, limits=self.limits)
        with reading(Budget(self.limits, what=spec)):
            try:
                return self._read_local(spec)
            except LimitExceeded as exc:  # as read_source reports it: this SOURCE fails, the poll goes on
                return SourceRead(spec=spec, errors=[SourceError(spec, str(exc))])
            except Exception as exc:  # a reader bug must not take the watcher down
                return SourceRead(spec=spec, errors=[SourceError(spec, f"{type(exc).__name__}: {exc}")])

    def _read_local(self, spec: str) -> SourceRead:
        """``read_local`` itself, with each unit whose fingerprint is unchanged served from the cache."""
        stats = self.stats[spec] = ReadStats()
        live: set[tuple[str, str, str]] = set()

        def cached_read_unit(unit: Unit, *, root: Path, spec: str) -> UnitRead:
            """``read_unit``, or its cached result when the unit's files have not changed."""
            key = (spec, unit.kind, str(unit.path))
            live.add(key)
            fp = _fingerprint(unit)
            kept = self._units.get(key)
            if kept is not None and kept.stat == fp:
                got = kept.read
                stats.reused += 1
            else:
                got = self._read_changed(unit, root=root, spec=spec, key=key, stat=fp, kept=kept)
                stats.read += 1
            return UnitRead([_copy_segment(s) for s in got.segments], list(got.warnings), skipped=got.skipped)

        self._stats = stats
        out = read_local(spec, read_unit=cached_read_unit)
        for key in self._live.get(spec, set()) - live:
            self._units.pop(key, None)  # a file that went away is forgotten, not reported from the cache
        self._live[spec] = live  # by SOURCE: pooled SOURCEs share the spec their units are read under
        return out

    def _read_changed(self, unit: Unit, *, root: Path, spec: str, key: tuple[str, str, str], stat: tuple[Any, ...],
                      kept: _Kept | None) -> UnitRead:
        """A unit whose files changed: read on from the last poll's end when only its log grew, else
        read whole; kept with what the next poll needs to go on."""
        try:
            fingerprint = unit_fingerprint(unit)
        except OSError:
            fingerprint = None
        since = None
        if kept is not None and kept.resume is not None and fingerprint is not None and kept.fingerprint is not None \
                and can_read_on(kept.fingerprint, fingerprint, log=Path(kept.resume.file), anchor=kept.anchor):
            since = kept.resume
            self._stats.read_on += 1
        got, resume = read_unit_since(unit, root=root, spec=spec, since=since)
        _keep_facts(got)
        self._units[key] = _Kept(stat, got, fingerprint, resume, log_anchor(resume) if resume is not None else None)
        return got


def _keep_facts(got: UnitRead) -> None:
    """What a unit read is kept until its files change, unchanged: its runs' whole-run statistics can be
    kept beside it and updated as it grows (``klwatch.incremental``), so a poll judges what is new."""
    for seg in got.segments:
        for s in seg.series.values():
            for a in (s.steps, s.values, s.wall_times):
                if a is not None:
                    incremental.freeze(a)


@dataclass
class _Kept:
    """One unit as the last poll read it: its files' stat, what it read, and where its log can be read on from."""

    stat: tuple[Any, ...]
    read: UnitRead
    fingerprint: dict[str, Any] | None
    resume: Resume | None
    anchor: dict[str, Any] | None
