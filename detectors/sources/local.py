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
from ..source_names import SKIP_DIRS, TABLE_SUFFIXES, is_input_name
from .pool import current_pool
from .limits import LimitExceeded, NotRegularFile, current_budget, is_regular_file, path_kind, read_regular, walk

CHECKPOINT_DIR = re.compile(r"^(step_\d+|checkpoint-\d+|global_step_\d+)$")
WANDB_RUN_DIR = re.compile(r"^(offline-)?run-\d{8}_\d{6}-[0-9A-Za-z]+$")


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
        return any(p.suffix == ".wandb" and is_regular_file(p) for p in path.iterdir())
    except OSError:
        return False


def looks_like_wandb_run_dir(path: Path) -> bool:
    """Named as wandb names a run folder (``[offline-]run-<date>_<time>-<id>``): one without a
    ``.wandb`` log is worth a word, where any other ``run-*`` folder (TensorBoard's) is not."""
    return WANDB_RUN_DIR.match(path.name) is not None


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
    """A ``.db`` that is an SQLite file holding MLflow's tables, or one that cannot be told apart (let
    the MLflow reader say why, naming it). Looked at as an immutable file: nothing is created beside
    it (no ``-wal``/``-shm``) and nothing is touched."""
    if path.suffix != ".db":
        return False
    try:
        if read_regular(path, length=16) != b"SQLite format 3\x00":
            return False
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, timeout=0.2)
        con.text_factory = bytes  # a damaged schema may hold names that are not UTF-8
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
        # one of MLflow's tables is enough (a store missing another is the reader's error to name); tables
        # still only in the write-ahead log are invisible to an immutable read: the reader decides
        return bool(names & {b"metrics", b"runs", b"experiments"}) or path.with_name(path.name + "-wal").exists()
    except NotRegularFile:
        return False
    except (OSError, ValueError, sqlite3.Error):
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


def discover(root: Path, *, spec: str, warnings: list[str] | None = None) -> tuple[list[Unit], list[SourceError]]:
    """Every readable unit under ``root`` (a file or folder), in the order ``read_local`` reads them,
    and the folders that could not be listed. What was skipped on the way (a FIFO or a device named
    like an input, a W&B run folder without its log) is added to ``warnings``.

    The tree is walked without recursion, so any depth is read; the SOURCE's time bound is checked
    at every folder."""
    errors: list[SourceError] = []
    warnings = [] if warnings is None else warnings
    found: dict[str, set[Path]] = {name: set() for name in _READERS}
    budget = current_budget()
    base = root if root.is_dir() else root.parent

    def visit_file(p: Path) -> None:
        name = p.name
        if not is_input_name(name):
            return
        kind = path_kind(p)
        if kind is not None and kind != "a regular file":  # never opened: a FIFO would block, /dev/zero never ends
            rel = _rel(p, base, spec)  # unread, so said as unreadable: a CI gate must not pass on it (exit 3)
            errors.append(SourceError(spec, f"{rel}: not a regular file ({kind}); not read", ref=rel))
        elif name.startswith("events.out.tfevents"):
            found["tensorboard"].add(p)
        elif p.suffix in TABLE_SUFFIXES:
            found["table"].add(p)
        elif p.suffix == ".db" and is_mlflow_sqlite(p):
            found["mlflow-sqlite"].add(p)

    if not root.is_dir():
        visit_file(root)
        return _units(found), errors
    for dirpath, dirnames, filenames in walk(root, onerror=lambda e: errors.append(
            SourceError(spec, f"cannot list {e.filename}: {e.strerror}", ref=str(e.filename)))):
        budget.check_time(str(dirpath))
        unit = _folder_unit(dirpath)
        if unit is None and looks_like_wandb_run_dir(dirpath) and not any(
                n.endswith(".wandb") for n in dirnames + filenames):  # said, then walked into as before
            message = (f"{spec if dirpath == root else _rel(dirpath, base, spec)}: a W&B run folder with no "
                       ".wandb log (deleted, or the run never started logging); nothing read from it")
            if dirpath == root:
                errors.append(SourceError(spec, message, ref=str(dirpath)))
            else:
                warnings.append(message)
        if unit is not None:
            found[unit].add(dirpath.parent if unit == "checkpoints" else dirpath)
            dirnames[:] = []  # a run folder, a store, model weights: one unit, never walked into
            continue
        dirnames[:] = sorted(n for n in dirnames if n not in SKIP_DIRS)
        for f in filenames:
            visit_file(dirpath / f)
    return _units(found), errors


def _folder_unit(d: Path) -> str | None:
    """The unit a folder is as a whole (``wandb``, ``mlruns``, ``checkpoints`` for its parent), or
    None when it is walked into."""
    if is_wandb_run_dir(d):
        return "wandb"
    if is_mlruns_dir(d):
        return "mlruns"
    if CHECKPOINT_DIR.match(d.name):
        return "checkpoints"
    return None


def _units(found: dict[str, set[Path]]) -> list[Unit]:
    """The units found, by reader (in reading order) then by path; a reader is imported only when
    the tree holds something for it."""
    units: list[Unit] = []
    for name, (kind, module, func) in _READERS.items():
        if found[name]:
            reader = getattr(importlib.import_module(f".{module}", __package__), func)
            units += [Unit(kind, p, reader) for p in sorted(found[name])]
    return units


_EVENT_FILE_TIME = re.compile(r"tfevents\.(\d+)\.")
"""The second an event file was created, as its writer names it (``events.out.tfevents.<time>.<host>``)."""


def error_segment(kind: SegmentKind, path: Path, *, ref: str, spec: str, error: str) -> Segment:
    """The Segment of a unit that could not be read: its error, and the identity its reader would have
    given it as far as the path tells, so stitching puts it into the training run of its readable
    siblings (a corrupt event file beside the healthy ones of its run) rather than in a row of its own.

    TensorBoard: the event file's run folder (run id and group, as the reader's ``_run_folder``)
    and its creation second (the start time its name records); a W&B run folder: the run id its name
    ends in (``run-<date>_<time>-<id>``); a table: its store (the file). Anything else keeps only its
    path as the store."""
    seg = Segment(kind=kind, ref=ref, source=spec, store=str(path), error=error)
    try:
        if kind == "tensorboard":
            from .tensorboard import _run_folder

            # its run folder as run id and group, as the reader gives them; no name, so a file that joins
            # no run stays a row named by the file (the run folder alone would not say which file failed)
            seg.run_id = seg.group = _run_folder(path, ref)
            seg.store = str(path.resolve().parent)
            seg.meta["file"] = path.name
            stamp = _EVENT_FILE_TIME.search(path.name)
            if stamp:
                seg.start_time = float(stamp.group(1))
        elif kind == "wandb-offline" and looks_like_wandb_run_dir(path):
            seg.run_id = path.name.rsplit("-", 1)[-1]
            seg.store = str(path.parent)
        elif kind == "table":
            seg.store = str(path.resolve())
    except (OSError, RuntimeError, ValueError):  # a path that cannot be resolved keeps its plain identity
        pass
    return seg


def read_unit(unit: Unit, *, root: Path, spec: str) -> UnitRead:
    """One reader call; a failure becomes an error Segment naming the file, a file that holds no run
    met during a walk a warning (an error when it is the path the user named)."""
    kind, path = unit.kind, unit.path
    ref = _rel(path, root if root.is_dir() else root.parent, spec)
    try:
        segs = unit.reader(path, ref=ref, source=spec)
    except LimitExceeded:
        raise  # the SOURCE's bound, not this file's fault: read_local stops the SOURCE there
    except NotALog as exc:
        if path != root:
            return UnitRead([], [f"{ref}: skipped, {exc}"], skipped=True)
        segs = [error_segment(kind, path, ref=ref, spec=spec, error=f"{ref}: {exc}")]
    except (ReadError, OSError, ValueError, sqlite3.Error) as exc:
        segs = [error_segment(kind, path, ref=ref, spec=spec, error=f"{ref}: {exc}")]
    except Exception as exc:  # reader bug: still name the file, keep going
        segs = [error_segment(kind, path, ref=ref, spec=spec, error=f"{ref}: {type(exc).__name__}: {exc}")]
    for s in segs:
        if s.error and not s.error.startswith(s.ref):
            s.error = f"{s.ref}: {s.error}"
    return UnitRead(segs)


def unit_failed(unit: Unit, *, root: Path, spec: str, message: str) -> UnitRead:
    """An error Segment naming the unit's file, as ``read_unit`` makes for a reader's failure: for a
    unit whose read could not finish at all (its worker process died, a pluggable ``read_unit``
    raised)."""
    ref = _rel(unit.path, root if root.is_dir() else root.parent, spec)
    return UnitRead([error_segment(unit.kind, unit.path, ref=ref, spec=spec, error=f"{ref}: {message}")])


@dataclass
class LocalPlan:
    """A local SOURCE once looked through: its units to read, and what the look already says (the
    folders that could not be listed, what was skipped). ``read_local`` reads the units one after
    another; ``klwatch.parallel`` hands them to worker processes and adds what they read back in the
    same order, so both give the same SourceRead."""

    spec: str
    root: Path
    units: list[Unit]
    out: SourceRead
    read_root: Path | None = None
    """Where the units' refs are taken from: ``root``, or the common parent of a pool (``sources.pool``)."""
    read_spec: str | None = None
    """The ``source`` of every Segment read: ``spec``, or the pool's parent."""
    shared: int = 0
    """Units left out as an earlier pooled SOURCE planned them already."""

    def __post_init__(self) -> None:
        self.read_root = self.read_root or self.root
        self.read_spec = self.read_spec or self.spec


def plan_local(spec: str) -> LocalPlan:
    """Discover the units of a local SOURCE within the current budget (no units when the path cannot
    be read or the bound passed while looking: ``out`` then holds the error)."""
    root = Path(spec).expanduser()
    out = SourceRead(spec=spec)
    problem = _root_problem(root, spec)
    if problem is not None:
        out.errors.append(SourceError(spec, problem))
        return LocalPlan(spec, root, [], out)
    try:
        units, errors = discover(root, spec=spec, warnings=out.warnings)
    except LimitExceeded as exc:
        out.errors.append(SourceError(spec, f"{exc}; stopped while looking for runs, nothing read"))
        return LocalPlan(spec, root, [], out)
    out.errors.extend(errors)
    pool = current_pool(spec)
    if pool is None:
        return LocalPlan(spec, root, units, out)
    mine = [u for u in units if str(u.path) not in pool.claimed]
    pool.claimed.update(str(u.path) for u in mine)
    out.pooled_under = pool.spec
    return LocalPlan(spec, root, mine, out, read_root=pool.root, read_spec=pool.spec, shared=len(units) - len(mine))


def add_unit_read(plan: LocalPlan, unit: Unit, got: UnitRead) -> None:
    """Add what reading one of the plan's units gave to its SourceRead (units are added in order)."""
    out = plan.out
    out.warnings.extend(got.warnings)
    out.segments.extend(got.segments)
    if not got.skipped and unit.kind not in out.kinds:
        out.kinds.append(unit.kind)


def stop_at_bound(plan: LocalPlan, message: str, *, done: int, unit: Unit) -> None:
    """The SOURCE's read bound passed at ``unit`` (the ``done``-th): one error naming the bound and its
    flag; what was read before it is kept, the rest is not read."""
    plan.out.errors.append(SourceError(plan.spec, f"{message}; stopped there: {done} of {len(plan.units)} files or "
                                                  f"run folders read, the rest not", ref=str(unit.path)))


def finish_local(plan: LocalPlan) -> SourceRead:
    """The SourceRead of a plan whose units were all added (or stopped at the bound)."""
    out = plan.out
    if not out.segments and not out.errors and not plan.shared:
        out.errors.append(SourceError(plan.spec, f"{plan.spec}: no runs found (no W&B run folders, MLflow stores, "
                                                 "TensorBoard event files, tables or checkpoint folders)"
                                      + what_to_give(plan.root, plan.spec)))
    return out


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")


def what_to_give(root: Path, spec: str) -> str:
    """What to name instead of a SOURCE that holds no run but looks like it meant one: a W&B run's log file, an
    MLflow experiment folder, a URL of a scheme klwatch does not read ("" when nothing better can be said)."""
    scheme = _SCHEME.match(spec)
    if scheme:
        kind = scheme.group(1).lower()
        if kind in ("http", "https"):
            return ("; for an MLflow server give mlflow://HOST:PORT (mlflow+https://HOST for TLS), for a W&B project "
                    "wandb://ENTITY/PROJECT")
        if kind == "sqlite" and spec.startswith("sqlite:///"):  # SQLAlchemy's form: the path follows the third /
            return f"; give the store's path itself: {spec[len('sqlite:///'):]}"
        if kind == "file" and spec.startswith("file://"):
            return f"; give the path itself: {spec[len('file://'):]}"
        return "; a SOURCE is a local path, wandb://ENTITY/PROJECT[/RUN_ID] or mlflow://HOST:PORT[/EXPERIMENT]"
    if root.suffix == ".wandb" and root.is_file():
        return f"; {root.name} is a W&B run's log: give its run folder {root.parent} (or the wandb/ folder above it)"
    if (root / "meta.yaml").is_file() and root.parent != root:
        return f"; {spec} is an MLflow experiment folder: give the store {root.parent} (and #PATTERN to keep some runs)"
    return ""


def read_local(spec: str, *, read_unit: ReadUnit = read_unit) -> SourceRead:
    """Read every run a local file or folder holds.

    ``read_unit`` reads one discovered unit; the watcher passes one that serves unchanged units from
    its cache, so both read a tree the same way. When the SOURCE's read bound is passed, reading
    stops there with one error naming the bound and its flag; what was read before it is kept."""
    plan = plan_local(spec)
    for done, unit in enumerate(plan.units):
        try:
            current_budget().check_time(str(unit.path))
            got = read_unit(unit, root=plan.read_root, spec=plan.read_spec)
        except LimitExceeded as exc:
            stop_at_bound(plan, str(exc), done=done, unit=unit)
            break
        add_unit_read(plan, unit, got)
    return finish_local(plan)


def _root_problem(root: Path, spec: str) -> str | None:
    """Why the path the user named cannot be read at all (missing, unreadable, not a regular file
    nor a folder), or None."""
    if not root.exists():
        return f"no such file or folder: {spec}" + what_to_give(root, spec)
    if not os.access(root, os.R_OK):
        return f"permission denied: {spec}"
    kind = path_kind(root)
    if kind not in ("a regular file", "a folder"):
        return f"{spec}: not a regular file ({kind or 'cannot be examined'}); not read"
    return None
