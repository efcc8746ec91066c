"""Find what a local path holds and hand each piece to its reader.

Detected (SPEC.md): W&B run folders (``run-*``, ``offline-run-*`` with a ``.wandb`` log), MLflow
stores (an ``mlruns/`` folder, an ``*.db`` SQLite store), TensorBoard event files at any depth,
tables (``.csv``, ``.jsonl``, ``.parquet``) and checkpoint folders (NeMo-RL ``step_N``, Hugging Face
``checkpoint-N``, verl ``global_step_N``). A file that cannot be read becomes a Segment with
``error`` set naming it; the rest of the tree is still read.
"""

from __future__ import annotations

import importlib
import os
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..model import Segment, SegmentKind, SourceError, SourceRead

TABLE_SUFFIXES = {".csv", ".jsonl", ".parquet"}
CHECKPOINT_DIR = re.compile(r"^(step_\d+|checkpoint-\d+|global_step_\d+)$")
SKIP_DIRS = {".git", "__pycache__", ".venv", "node_modules", ".ipynb_checkpoints"}


class ReadError(Exception):
    """A file or run that cannot be read; the message says why (the caller adds which)."""


class NotALog(ReadError):
    """A file that was found in a tree but holds no run (a dataset of prompts, say): skipped with a
    warning when met during a folder walk, an error only when the user named the file."""


def is_wandb_run_dir(path: Path) -> bool:
    name = path.name
    if not (name.startswith("run-") or name.startswith("offline-run-")):
        return False
    try:
        return any(p.suffix == ".wandb" for p in path.iterdir() if p.is_file())
    except OSError:
        return False


def is_mlruns_dir(path: Path) -> bool:
    if path.name == "mlruns":
        return True
    try:  # an experiment folder layout: <root>/<exp_id>/meta.yaml with run folders beside it
        return (path / "0" / "meta.yaml").is_file() or (
            path.name != "mlruns" and (path / ".trash").is_dir() and any(
                (p / "meta.yaml").is_file() for p in path.iterdir() if p.is_dir()
            )
        )
    except OSError:
        return False


def is_mlflow_sqlite(path: Path) -> bool:
    if path.suffix != ".db":
        return False
    try:
        with open(path, "rb") as fh:
            if fh.read(16) != b"SQLite format 3\x00":
                return False
        uri = f"file:{path}?mode=ro"
        con = sqlite3.connect(uri, uri=True, timeout=0.2)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
        return {"metrics", "runs", "experiments"} <= names
    except (OSError, sqlite3.Error):
        return True  # a .db we cannot open: let the MLflow reader report why, naming the file


def _rel(path: Path, root: Path, spec: str) -> str:
    if path == root:
        return path.name if root.is_file() else "."
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Unit:
    """One thing a reader reads whole (an event file, a table, a run folder, a store, the parent of
    checkpoint folders): the grain at which the watcher decides what changed since its last poll."""

    kind: SegmentKind
    path: Path
    reader: Callable[..., list[Segment]]


@dataclass
class UnitRead:
    """What reading one unit gave: its Segments and the warnings for the SourceRead."""

    segments: list[Segment]
    warnings: list[str] = field(default_factory=list)
    skipped: bool = False
    """The unit holds no run (a warning says why): its kind is not among the kinds found."""


class ReadUnit(Protocol):
    """How ``read_local`` reads each unit: ``read_unit`` below, or the watcher's cache in front of it."""

    def __call__(self, unit: Unit, *, root: Path, spec: str) -> UnitRead: ...


# unit name -> (segment kind, reader module in this package, reader function), in reading order
_READERS: dict[str, tuple[SegmentKind, str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard", "read_tensorboard_file"),
    "table": ("table", "tables", "read_table"),
    "wandb": ("wandb-offline", "wandb_log", "read_wandb_run_dir"),
    "mlflow-sqlite": ("mlflow", "mlflow_local", "read_mlflow_sqlite"),
    "mlruns": ("mlflow", "mlflow_local", "read_mlruns"),
    "checkpoints": ("checkpoints", "checkpoints", "read_checkpoint_dir"),
}


def discover(root: Path, *, spec: str) -> tuple[list[Unit], list[SourceError]]:
    """Every readable unit under ``root`` (a file or folder), in the order ``read_local`` reads them,
    and the folders that could not be listed."""
    errors: list[SourceError] = []
    found: dict[str, set[Path]] = {name: set() for name in _READERS}

    def visit_file(p: Path) -> None:
        name = p.name
        if name.startswith("events.out.tfevents") and not name.endswith(".profile-empty"):
            found["tensorboard"].add(p)
        elif p.suffix in TABLE_SUFFIXES:
            found["table"].add(p)
        elif p.suffix == ".db" and is_mlflow_sqlite(p):
            found["mlflow-sqlite"].add(p)

    if root.is_file():
        visit_file(root)
    else:
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: errors.append(
            SourceError(spec, f"cannot list {e.filename}: {e.strerror}", ref=str(e.filename)))):
            d = Path(dirpath)
            if is_wandb_run_dir(d):
                found["wandb"].add(d)
                dirnames[:] = []  # a run folder's files/ may hold anything; it is one segment
                continue
            if is_mlruns_dir(d):
                found["mlruns"].add(d)
                dirnames[:] = []
                continue
            if CHECKPOINT_DIR.match(d.name):
                found["checkpoints"].add(d.parent)
                dirnames[:] = []  # never descend into model weights
                continue
            dirnames[:] = sorted(n for n in dirnames if n not in SKIP_DIRS)
            for f in sorted(filenames):
                visit_file(d / f)

    units: list[Unit] = []
    for name, (kind, module, func) in _READERS.items():
        if found[name]:  # a reader is imported only when the tree holds something for it
            reader = getattr(importlib.import_module(f".{module}", __package__), func)
            units += [Unit(kind, p, reader) for p in sorted(found[name])]
    return units, errors


def read_unit(unit: Unit, *, root: Path, spec: str) -> UnitRead:
    """One reader call; a failure becomes an error Segment naming the file, a file that holds no run
    met during a walk a warning (an error when it is the path the user named)."""
    kind, path = unit.kind, unit.path
    ref = _rel(path, root if root.is_dir() else root.parent, spec)
    try:
        segs = unit.reader(path, ref=ref, source=spec)
    except NotALog as exc:
        if path != root:
            return UnitRead([], [f"{ref}: skipped, {exc}"], skipped=True)
        segs = [Segment(kind=kind, ref=ref, source=spec, store=str(path), error=f"{ref}: {exc}")]
    except (ReadError, OSError, ValueError, sqlite3.Error) as exc:
        segs = [Segment(kind=kind, ref=ref, source=spec, store=str(path), error=f"{ref}: {exc}")]
    except Exception as exc:  # reader bug: still name the file, keep going
        segs = [Segment(kind=kind, ref=ref, source=spec, store=str(path),
                        error=f"{ref}: {type(exc).__name__}: {exc}")]
    for s in segs:
        if s.error and not s.error.startswith(s.ref):
            s.error = f"{s.ref}: {s.error}"
    return UnitRead(segs)


def read_local(spec: str, *, read_unit: ReadUnit = read_unit) -> SourceRead:
    """Read every run a local file or folder holds.

    ``read_unit`` reads one discovered unit; the watcher passes one that serves unchanged units from
    its cache, so both read a tree the same way."""
    root = Path(spec).expanduser()
    out = SourceRead(spec=spec)
    if not root.exists():
        out.errors.append(SourceError(spec, f"no such file or folder: {spec}"))
        return out
    if not os.access(root, os.R_OK):
        out.errors.append(SourceError(spec, f"permission denied: {spec}"))
        return out

    units, errors = discover(root, spec=spec)
    out.errors.extend(errors)
    for unit in units:
        got = read_unit(unit, root=root, spec=spec)
        out.warnings.extend(got.warnings)
        out.segments.extend(got.segments)
        if not got.skipped and unit.kind not in out.kinds:
            out.kinds.append(unit.kind)

    if not out.segments and not out.errors:
        out.errors.append(SourceError(spec, f"{spec}: no runs found (no W&B run folders, MLflow stores, "
                                            "TensorBoard event files, tables or checkpoint folders)"))
    return out
