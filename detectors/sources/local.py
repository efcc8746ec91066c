"""Find what a local path holds and hand each piece to its reader.

Detected (SPEC.md): W&B run folders (``run-*``, ``offline-run-*`` with a ``.wandb`` log), MLflow
stores (an ``mlruns/`` folder, an ``*.db`` SQLite store), TensorBoard event files at any depth,
tables (``.csv``, ``.jsonl``, ``.parquet``) and checkpoint folders (NeMo-RL ``step_N``, Hugging Face
``checkpoint-N``, verl ``global_step_N``). A file that cannot be read becomes a Segment with
``error`` set naming it; the rest of the tree is still read.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

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


def read_local(spec: str) -> SourceRead:
    """Read every run a local file or folder holds."""
    root = Path(spec).expanduser()
    out = SourceRead(spec=spec)
    if not root.exists():
        out.errors.append(SourceError(spec, f"no such file or folder: {spec}"))
        return out
    if not os.access(root, os.R_OK):
        out.errors.append(SourceError(spec, f"permission denied: {spec}"))
        return out

    tb_files: list[Path] = []
    wandb_dirs: list[Path] = []
    mlruns_dirs: list[Path] = []
    sqlite_files: list[Path] = []
    tables: list[Path] = []
    checkpoint_parents: set[Path] = set()

    def visit_file(p: Path) -> None:
        name = p.name
        if name.startswith("events.out.tfevents") and not name.endswith(".profile-empty"):
            tb_files.append(p)
        elif p.suffix in TABLE_SUFFIXES:
            tables.append(p)
        elif p.suffix == ".db" and is_mlflow_sqlite(p):
            sqlite_files.append(p)

    if root.is_file():
        visit_file(root)
    else:
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: out.errors.append(
            SourceError(spec, f"cannot list {e.filename}: {e.strerror}", ref=str(e.filename)))):
            d = Path(dirpath)
            if is_wandb_run_dir(d):
                wandb_dirs.append(d)
                dirnames[:] = []  # a run folder's files/ may hold anything; it is one segment
                continue
            if is_mlruns_dir(d):
                mlruns_dirs.append(d)
                dirnames[:] = []
                continue
            if CHECKPOINT_DIR.match(d.name):
                checkpoint_parents.add(d.parent)
                dirnames[:] = []  # never descend into model weights
                continue
            dirnames[:] = sorted(n for n in dirnames if n not in SKIP_DIRS)
            for f in sorted(filenames):
                visit_file(d / f)

    base = root if root.is_dir() else root.parent

    def run(kind: SegmentKind, path: Path, reader: Callable[..., list[Segment]]) -> None:
        ref = _rel(path, base, spec)
        try:
            segs = reader(path, ref=ref, source=spec)
        except NotALog as exc:
            if path != root:
                out.warnings.append(f"{ref}: skipped, {exc}")
                return
            segs = [Segment(kind=kind, ref=ref, source=spec, store=str(path), error=f"{ref}: {exc}")]
        except (ReadError, OSError, ValueError, sqlite3.Error) as exc:
            segs = [Segment(kind=kind, ref=ref, source=spec, store=str(path), error=f"{ref}: {exc}")]
        except Exception as exc:  # reader bug: still name the file, keep going
            segs = [Segment(kind=kind, ref=ref, source=spec, store=str(path),
                            error=f"{ref}: {type(exc).__name__}: {exc}")]
        for s in segs:
            if s.error and not s.error.startswith(s.ref):
                s.error = f"{s.ref}: {s.error}"
        out.segments.extend(segs)
        if kind not in out.kinds:
            out.kinds.append(kind)

    if tb_files:
        from .tensorboard import read_tensorboard_file

        for p in sorted(tb_files):
            run("tensorboard", p, read_tensorboard_file)
    if tables:
        from .tables import read_table

        for p in sorted(tables):
            run("table", p, read_table)
    if wandb_dirs:
        from .wandb_log import read_wandb_run_dir

        for p in sorted(wandb_dirs):
            run("wandb-offline", p, read_wandb_run_dir)
    if sqlite_files:
        from .mlflow_local import read_mlflow_sqlite

        for p in sorted(sqlite_files):
            run("mlflow", p, read_mlflow_sqlite)
    if mlruns_dirs:
        from .mlflow_local import read_mlruns

        for p in sorted(mlruns_dirs):
            run("mlflow", p, read_mlruns)
    if checkpoint_parents:
        from .checkpoints import read_checkpoint_dir

        for p in sorted(checkpoint_parents):
            run("checkpoints", p, read_checkpoint_dir)

    if not out.segments and not out.errors:
        out.errors.append(SourceError(spec, f"{spec}: no runs found (no W&B run folders, MLflow stores, "
                                            "TensorBoard event files, tables or checkpoint folders)"))
    return out
