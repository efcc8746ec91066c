"""Read local MLflow stores (an ``*.db`` SQLite store, an ``mlruns/`` file store) without MLflow.

Why not ``MlflowClient``: it fetches one (run, metric) history per call through the ORM, which is
one to two orders of magnitude slower on a store of real size, and opening a store through it may
run schema migrations, i.e. write to a file klwatch must only read. The SQLite path opens the file
with ``mode=ro`` and reads every run with a handful of queries; the file-store path reads the
documented layout (``<exp_id>/<run_id>/{meta.yaml,metrics/,params/,tags/}``) directly.

Both give one Segment per (non-deleted) run. A metric's points are ordered by timestamp, then by
the order they were logged: a run resumed in place re-logs steps it already logged, and ordering
by time keeps that rewind (and the duplicated steps) visible instead of sorting it away.
"""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import yaml

from ..model import Segment, Series
from .local import ReadError

SQLITE_BUSY_TIMEOUT_S = 2.0
"""How long to wait for a writer's lock before giving up: a scan must never hang on a busy store."""

# MLflow's RunStatus enum as the file store writes it in meta.yaml.
_RUN_STATUS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}

_INT = re.compile(r"[+-]?\d+\Z")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?\Z")

PARENT_RUN_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"


def parse_param(value: str) -> Any:
    """MLflow stores every param as a string; configs compare better as the numbers they were.

    Only plain literals are converted (``"nan"``, ``"1_000"`` or ``"[1, 2]"`` stay strings).
    """
    s = value.strip()
    if _INT.match(s):
        return int(s)
    if _FLOAT.match(s):
        return float(s)
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    return value


def run_group(*, tags: dict[str, str], run_names: dict[str, str | None]) -> str | None:
    """A ``group`` tag, else the parent run's name (nested runs), else None.

    When the parent run is not known, its id still groups the siblings together.
    """
    if tags.get("group"):
        return tags["group"]
    parent = tags.get(PARENT_RUN_TAG)
    if parent:
        return run_names.get(parent) or parent
    return None


def run_segment(*, run_id: str, source: str, run_names: dict[str, str | None], tags: dict[str, str],
                config: dict[str, Any], series: dict[str, Series], start_ms: Any, end_ms: Any, store: str,
                experiment: str, experiment_id: str, status: Any, stage: str, error: str | None = None,
                **meta: Any) -> Segment:
    """One MLflow run as a Segment, the same whether it was read from a SQLite store, an ``mlruns``
    folder or a tracking server (``meta`` adds what only that source knows)."""
    return Segment(
        kind="mlflow",
        ref=run_id,
        source=source,
        run_id=run_id,
        name=run_names.get(run_id),
        group=run_group(tags=tags, run_names=run_names),
        config=config,
        tags=dict(tags),
        series=series,
        start_time=_seconds(start_ms),
        store=store,
        error=error,
        meta={"experiment": experiment, "experiment_id": experiment_id, "status": status,
              "lifecycle_stage": stage, "end_time": _seconds(end_ms), "parent_run_id": tags.get(PARENT_RUN_TAG),
              **meta},
    )


def _seconds(ms: Any) -> float | None:
    """MLflow's epoch milliseconds (a number, or a string from the REST API) as float seconds."""
    return None if ms is None else float(ms) / 1000.0


def by_start_time(seg: Segment) -> tuple[bool, float, str]:
    """Sort key of a store's runs: by start time (runs without one last), then by id."""
    return seg.start_time is None, seg.start_time or 0.0, seg.ref


def _who(path: Path, ref: str) -> str:
    """Name the file in a message: ``ref`` when it already names it, else the path."""
    return ref if ref.endswith(path.name) else str(path)


# --------------------------------------------------------------------------------------------
# SQLite


def _connect_ro(path: Path, who: str) -> sqlite3.Connection:
    uri = "file:" + quote(str(path)) + "?mode=ro"
    try:
        return sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        raise ReadError(f"{who}: cannot open MLflow SQLite store read-only: {exc}") from exc


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f'PRAGMA table_info("{table}")')}


def read_mlflow_sqlite(path: Path, *, ref: str, source: str) -> list[Segment]:
    """Every non-deleted run of an MLflow SQLite store, read-only, in a few vectorised queries."""
    abspath = Path(path).resolve()
    who = _who(Path(path), ref)
    con = _connect_ro(abspath, who)
    try:
        con.execute("BEGIN")  # one read snapshot for all queries (a shared lock, never a write)
        return _read_sqlite(con, abspath=abspath, source=source, who=who)
    except sqlite3.OperationalError as exc:
        msg = str(exc)
        if "locked" in msg or "busy" in msg:
            raise ReadError(
                f"{who}: the MLflow SQLite store is locked by another process (waited "
                f"{SQLITE_BUSY_TIMEOUT_S:g}s for the lock); try again when the writer is done"
            ) from exc
        raise ReadError(f"{who}: cannot read MLflow SQLite store: {msg}") from exc
    except sqlite3.DatabaseError as exc:  # "file is not a database", "malformed", ...
        raise ReadError(f"{who}: not a readable SQLite database ({exc})") from exc
    finally:
        con.close()


def _read_sqlite(con: sqlite3.Connection, *, abspath: Path, source: str, who: str) -> list[Segment]:
    """Every live run of the store, each query inside the read snapshot the caller began (it ends
    once the metrics are read)."""
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    missing = {"runs", "metrics", "experiments"} - tables
    if missing:
        raise ReadError(f"{who}: not an MLflow store (no {', '.join(sorted(missing))} table)")

    exps = {
        str(eid): (name, stage or "active")
        for eid, name, stage in con.execute(
            "SELECT experiment_id, name, lifecycle_stage FROM experiments")
    }
    run_cols = _columns(con, "runs")
    name_col = "name" if "name" in run_cols else "NULL"
    runs = con.execute(
        f"SELECT run_uuid, {name_col}, status, start_time, end_time, lifecycle_stage, "
        "experiment_id FROM runs ORDER BY start_time, run_uuid").fetchall()
    tags, params = _sqlite_tags_and_params(con, tables)
    series = _sqlite_series(con, who)

    run_names = {r[0]: (r[1] or tags[r[0]].get(RUN_NAME_TAG)) for r in runs}
    out: list[Segment] = []
    for rid, _name, status, start_ms, end_ms, stage, eid in runs:
        exp_name, exp_stage = exps.get(str(eid), (str(eid), "active"))
        if (stage or "active") == "deleted" or exp_stage == "deleted":
            continue
        run_tags = tags.get(rid, {})
        out.append(run_segment(run_id=rid, source=source, run_names=run_names, tags=run_tags,
                               config=dict(params.get(rid, {})), series=series.get(rid, {}), start_ms=start_ms,
                               end_ms=end_ms, store=f"{abspath}#{exp_name}", experiment=exp_name,
                               experiment_id=str(eid), status=status, stage=stage or "active"))
    out.sort(key=by_start_time)
    return out


def _sqlite_tags_and_params(con: sqlite3.Connection, tables: set[str]
                            ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    """Run id -> its tags, and run id -> its params (as the numbers they were); an old store may
    lack either table."""
    tags: dict[str, dict[str, str]] = defaultdict(dict)
    if "tags" in tables:
        for rid, key, value in con.execute("SELECT run_uuid, key, value FROM tags"):
            tags[rid][key] = value if value is not None else ""
    params: dict[str, dict[str, Any]] = defaultdict(dict)
    if "params" in tables:
        for rid, key, value in con.execute("SELECT run_uuid, key, value FROM params"):
            params[rid][key] = parse_param(value) if isinstance(value, str) else value
    return tags, params


def _sqlite_series(con: sqlite3.Connection, who: str) -> dict[str, dict[str, Series]]:
    """Run id -> metric -> Series, of the live runs in live experiments, in two queries (the
    (run, metric) counts, then every point in that order) that end the read snapshot."""
    live = (
        "SELECT r.run_uuid FROM runs r LEFT JOIN experiments e ON e.experiment_id = r.experiment_id "
        "WHERE COALESCE(r.lifecycle_stage, 'active') != 'deleted' "
        "AND COALESCE(e.lifecycle_stage, 'active') != 'deleted'"
    )  # the same filter in both queries
    mcols = _columns(con, "metrics")
    step = "step" if "step" in mcols else "0"
    is_nan = "is_nan" if "is_nan" in mcols else "0"
    groups = con.execute(
        f"SELECT run_uuid, key, COUNT(*) FROM metrics WHERE run_uuid IN ({live}) "
        "GROUP BY run_uuid, key ORDER BY run_uuid, key").fetchall()
    rows = con.execute(
        f"SELECT value, timestamp, {step}, {is_nan} FROM metrics WHERE run_uuid IN ({live}) "
        "ORDER BY run_uuid, key, timestamp, rowid").fetchall()
    con.execute("COMMIT")

    data = np.array(rows, dtype=np.float64).reshape(-1, 4)
    values = data[:, 0].copy()
    values[data[:, 3] != 0] = np.nan  # MLflow stores NaN as value 0 with is_nan set
    timestamps = data[:, 1].astype(np.int64)
    steps = data[:, 2].astype(np.int64)
    wall = timestamps / 1000.0

    series: dict[str, dict[str, Series]] = defaultdict(dict)
    start = 0
    for rid, key, count in groups:
        end = start + count
        series[rid][key] = Series(steps[start:end], values[start:end], wall[start:end])
        start = end
    if start != len(data):  # the two queries disagree: the store changed under a non-snapshot read
        raise ReadError(f"{who}: the store changed while it was read; try again")
    return series


# --------------------------------------------------------------------------------------------
# mlruns/ file store


def _load_yaml(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    if not isinstance(doc, dict):
        raise ReadError(f"{path.name} is not a YAML mapping")
    return doc


def _read_kv_dir(folder: Path) -> dict[str, str]:
    """``params/`` and ``tags/``: one file per key (a key with ``/`` is a nested path)."""
    out: dict[str, str] = {}
    if not folder.is_dir():
        return out
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            out[f.relative_to(folder).as_posix()] = f.read_text(encoding="utf-8")
    return out


def _parse_metric_file(f: Path) -> Series:
    """Lines ``timestamp value [step [dataset_name dataset_digest]]``, ordered by timestamp then
    line order (the order they were logged)."""
    lines = [ln for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()]
    parts = [ln.split() for ln in lines]
    bad = next((i for i, p in enumerate(parts) if len(p) not in (2, 3, 5)), None)
    if bad is not None:
        raise ReadError(f"metric file {f.name} line {bad + 1}: expected 'timestamp value step', "
                        f"got {lines[bad][:80]!r}")
    try:
        ts = np.array([p[0] for p in parts], dtype=np.int64)
        vals = np.array([p[1] for p in parts], dtype=np.float64)
        steps = np.array([p[2] if len(p) >= 3 else "0" for p in parts], dtype=np.int64)
    except ValueError as exc:
        raise ReadError(f"metric file {f.name}: {exc}") from exc
    order = np.argsort(ts, kind="stable")
    return Series(steps[order], vals[order], ts[order] / 1000.0)


def _read_run_dir(run_dir: Path) -> dict[str, Any]:
    meta_file = run_dir / "meta.yaml"
    if not meta_file.is_file():
        raise ReadError("no meta.yaml")
    meta = _load_yaml(meta_file)
    metrics: dict[str, Series] = {}
    mdir = run_dir / "metrics"
    if mdir.is_dir():
        for f in sorted(mdir.rglob("*")):
            if f.is_file():
                metrics[f.relative_to(mdir).as_posix()] = _parse_metric_file(f)
    return {"meta": meta, "tags": _read_kv_dir(run_dir / "tags"),
            "params": _read_kv_dir(run_dir / "params"), "metrics": metrics}


def _is_run_dir(p: Path) -> bool:
    return p.is_dir() and any((p / n).exists() for n in ("meta.yaml", "metrics", "params", "tags"))


def read_mlruns(path: Path, *, ref: str, source: str) -> list[Segment]:
    """Every non-deleted run of an ``mlruns/`` file store; a bad run folder becomes an error
    Segment naming it and the other runs are still read."""
    root = Path(path).resolve()
    out: list[Segment] = []
    raw: list[tuple[str, str, str, dict[str, Any]]] = []  # (run ref, run id, exp name, parts)
    for exp_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        exp_ref = f"{ref}/{exp_dir.name}" if ref not in ("", ".") else exp_dir.name
        run_dirs = sorted(p for p in exp_dir.iterdir() if _is_run_dir(p))
        exp_meta_file = exp_dir / "meta.yaml"
        if not exp_meta_file.is_file():
            if run_dirs:
                out.append(Segment(kind="mlflow", ref=exp_ref, source=source, store=str(root),
                                   error=f"{exp_ref}: experiment folder has no meta.yaml"))
            continue
        try:
            exp_meta = _load_yaml(exp_meta_file)
        except (OSError, yaml.YAMLError, ReadError) as exc:
            out.append(Segment(kind="mlflow", ref=exp_ref, source=source, store=str(root),
                               error=f"{exp_ref}: bad experiment meta.yaml: {exc}"))
            continue
        if exp_meta.get("lifecycle_stage") == "deleted":
            continue
        exp_name = str(exp_meta.get("name", exp_dir.name))
        for run_dir in run_dirs:
            run_ref = f"{exp_ref}/{run_dir.name}"
            try:
                parts = _read_run_dir(run_dir)
            except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError, ReadError) as exc:
                out.append(Segment(kind="mlflow", ref=run_ref, source=source,
                                   store=f"{root}#{exp_name}", run_id=run_dir.name,
                                   error=f"{run_ref}: cannot read MLflow run folder: {exc}"))
                continue
            if parts["meta"].get("lifecycle_stage") == "deleted":
                continue
            rid = str(parts["meta"].get("run_id") or parts["meta"].get("run_uuid") or run_dir.name)
            raw.append((run_ref, rid, exp_name, parts))

    run_names = {rid: (p["meta"].get("run_name") or p["tags"].get(RUN_NAME_TAG))
                 for _, rid, _, p in raw}
    for run_ref, rid, exp_name, p in raw:
        meta = p["meta"]
        status = meta.get("status")
        out.append(run_segment(run_id=rid, source=source, run_names=run_names, tags=p["tags"],
                               config={k: parse_param(v) for k, v in p["params"].items()}, series=p["metrics"],
                               start_ms=meta.get("start_time"), end_ms=meta.get("end_time"), store=f"{root}#{exp_name}",
                               experiment=exp_name, experiment_id=str(meta.get("experiment_id", "")),
                               status=_RUN_STATUS.get(status, status) if isinstance(status, int) else status,
                               stage=meta.get("lifecycle_stage", "active"), folder=run_ref))
    out.sort(key=by_start_time)
    return out
