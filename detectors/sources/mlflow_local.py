"""Read local MLflow stores (an ``*.db`` SQLite store, an ``mlruns/`` file store) without MLflow.

Why not ``MlflowClient``: it fetches one (run, metric) history per call through the ORM, which is
one to two orders of magnitude slower on a store of real size, and opening a store through it may
run schema migrations, i.e. write to a file klwatch must only read. The SQLite path reads every
run with a handful of queries; the file-store path reads the documented layout
(``<exp_id>/<run_id>/{meta.yaml,metrics/,params/,tags/}``) directly.

Both give one Segment per (non-deleted) run. A metric's points are ordered by timestamp, then by
the order they were logged: a run resumed in place re-logs steps it already logged, and ordering
by time keeps that rewind (and the duplicated steps) visible instead of sorting it away.

A store is untrusted input (issue 12), so:

- Nothing is created or touched. A rollback-journal store (MLflow's default) is opened ``mode=ro``
  (shared locks only); a WAL store whose ``-wal`` is missing or empty ``immutable=1`` (no ``-shm``,
  no locks; read again when the files changed meanwhile); a WAL store with frames in its ``-wal``
  from a private copy of db + wal in a temporary folder (charged to the read budget). Each works
  from a read-only folder, for any user.
- Every file is charged to the SOURCE's read budget and opened only if it is a regular file; SQLite
  queries are interrupted at the SOURCE's deadline; folders are walked without recursion.
- The unit of failure is the smallest thing that failed: a metric, param or tag file that cannot be
  read (not UTF-8, a bad line, a step beyond 64 bits) costs that metric, param or tag, with a
  warning naming the file; an unterminated last line of a metric file (a write in progress) costs
  that point; a run's unreadable ``meta.yaml`` costs that run; an experiment's costs only the
  experiment's name (its runs are read, the experiment named by its id). ``meta.yaml`` is parsed
  refusing aliases (MLflow never writes them; an alias bomb would take minutes and gigabytes) and
  only when it is of a plausible size.
- A ``.db`` with some of MLflow's tables but not its ``runs`` or ``metrics`` is an error naming it;
  one with none of them is not a log (skipped with a warning in a folder walk).
- Values that are not finite are read as NaN: MLflow's SQL stores write ±inf as ±float64 max,
  which would overflow every difference taken from it.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sqlite3
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import yaml

from ..model import Segment, Series
from .limits import (Budget, BinaryText, NotRegularFile, YamlAliasRefused, current_budget, load_yaml, read_regular,
                     read_text_bytes, walk)
from .local import NotALog, ReadError

SQLITE_BUSY_TIMEOUT_S = 2.0
"""How long to wait for a writer's lock before giving up: a scan must never hang on a busy store."""
SQLITE_ATTEMPTS = 3
"""Reads of a WAL store that changed while it was read (a live writer) before giving up."""
SQLITE_HEADER = b"SQLite format 3\x00"
MLFLOW_TABLES = frozenset({"experiments", "runs", "metrics", "latest_metrics", "params", "tags",
                           "alembic_version"})
REQUIRED_TABLES = ("metrics", "runs")
META_MAX_BYTES = 1 << 20
"""A meta.yaml is a few hundred bytes; one bigger than this is not MLflow's and is not parsed."""
MLFLOW_INF = float(np.finfo(np.float64).max)
"""What MLflow's SQL stores write for +inf (and its negative for -inf): SQL has no infinity."""
_COPY_CHUNK = 1 << 20
_INT64 = 2 ** 63

# MLflow's RunStatus enum as the file store writes it in meta.yaml.
_RUN_STATUS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}

_INT = re.compile(r"[+-]?\d+\Z")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?\Z")

PARENT_RUN_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
REGISTRY_FOLDER = "models"
"""The model registry's folder beside the experiments of a file store: not an experiment."""


def parse_param(value: str) -> Any:
    """MLflow stores every param as a string; configs compare better as the numbers they were.

    Only plain, representable literals are converted (``"nan"``, ``"1_000"``, ``"[1, 2]"``, ``"1e999"``
    or a 5,000-digit number stay strings).
    """
    s = value.strip()
    try:
        if _INT.match(s):
            return int(s)
        if _FLOAT.match(s):
            x = float(s)
            return x if math.isfinite(x) else value
    except ValueError:  # more digits than Python converts
        return value
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    return value


def finite_or_nan(values: Any) -> np.ndarray:
    """Values as float64 with ±inf, and MLflow's SQL stand-in for it (±float64 max), as NaN: the
    model reads a non-finite value as "no number here", while a ±1.8e308 would overflow every
    difference taken from it (and print ``"score": NaN``)."""
    v = np.array(values, dtype=np.float64)
    v[~(np.abs(v) < MLFLOW_INF)] = np.nan
    return v


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
    """MLflow's epoch milliseconds (a number, or a string from the REST API) as float seconds; None
    for anything that is not a finite number (a damaged store must not fail the run for it)."""
    if ms is None or isinstance(ms, bool):
        return None
    try:
        x = float(ms) / 1000.0
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


def by_start_time(seg: Segment) -> tuple[bool, float, str]:
    """Sort key of a store's runs: by start time (runs without one last), then by id."""
    return seg.start_time is None, seg.start_time or 0.0, seg.ref


def _who(path: Path, ref: str) -> str:
    """Name the file in a message: ``ref`` when it already names it, else the path."""
    return ref if ref.endswith(path.name) else str(path)


def _text(v: Any) -> str:
    """A cell as text: a damaged store may hold a blob or a number where text belongs."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)


# --------------------------------------------------------------------------------------------
# SQLite: open without creating or touching anything


def _head(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of a regular file (never a FIFO named ``*.db``: that would block)."""
    return read_regular(path, length=n)


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is written or replaced; None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


SQLITE_MAX_VALUE_BYTES = 1 << 20
"""The longest text or blob a store's query may produce (``SQLITE_LIMIT_LENGTH``)."""


def _wal_of(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _uri(path: Path, query: str) -> str:
    """A ``file:`` URI for any path, a non-UTF-8 one included (quoted as bytes)."""
    return "file:" + quote(os.fsencode(path)) + "?" + query


def _connect(uri: str, budget: Budget) -> sqlite3.Connection:
    """A connection that waits for a writer's lock at most briefly and is interrupted at the
    SOURCE's deadline; text that is not UTF-8 is read with replacement characters."""
    timeout = max(0.0, min(SQLITE_BUSY_TIMEOUT_S, budget.remaining_seconds()))
    try:
        con = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
    except sqlite3.Error as exc:
        raise ReadError(f"cannot open MLflow SQLite store read-only: {exc}") from exc
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    con.set_progress_handler(lambda: int(budget.remaining_seconds() < 0), 10_000)
    # no value may grow past what MLflow stores (a tag is at most 8,000 characters): a generated column of
    # 100 MB a row is refused by SQLite itself ("string or blob too big"), not expanded into memory
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, SQLITE_MAX_VALUE_BYTES)
    return con


def _copy_file(src: Path, dst: Path, budget: Budget) -> None:
    """Copy a regular file as long as it was when the copy began, a chunk at a time (each opened
    without blocking, checked to be a regular file and charged to the budget)."""
    size = os.stat(src).st_size
    with open(dst, "wb") as out:
        for start in range(0, size, _COPY_CHUNK):
            chunk = read_regular(src, budget=budget, start=start, length=min(_COPY_CHUNK, size - start))
            if not chunk:
                break
            out.write(chunk)


def _private_copy(db: Path, suffix: str, into: Path, budget: Budget) -> Path:
    """Copy the db and its ``-wal`` or ``-journal`` (``suffix``) into ``into`` as a consistent pair:
    the db unchanged and the sidecar's header (a wal's salts) unchanged while both were copied, so
    frames appended meanwhile are harmless (SQLite stops at the first incomplete one) but a
    checkpoint or a restarted wal is copied again."""
    side, copy = db.with_name(db.name + suffix), into / "store.db"
    for _ in range(SQLITE_ATTEMPTS):
        before = _stat_key(db), _sidecar_header(side)
        _copy_file(db, copy, budget)
        if before[1]:
            _copy_file(side, copy.with_name(copy.name + suffix), budget)
        if (_stat_key(db), _sidecar_header(side)) == before:
            return copy
    raise ReadError("the store kept changing while it was copied to be read; try again when "
                    "its writer pauses")


def _sidecar_header(side: Path) -> bytes:
    try:
        return _head(side, 32)
    except FileNotFoundError:
        return b""


class _HotJournal(Exception):
    """A rollback journal left by a writer that died mid-transaction: only a writer may roll it back."""


@contextlib.contextmanager
def _snapshot(path: Path, who: str, budget: Budget, *, private: bool = False
              ) -> Iterator[tuple[sqlite3.Connection, str]]:
    """A connection reading the store as it is, creating and touching nothing, and how it was
    opened: ``ro`` (rollback journal: shared locks only), ``immutable`` (WAL with nothing in the
    wal: no locks, no ``-shm``) or ``copy`` (WAL with frames, or ``private``: a private copy of the
    db and its wal or journal, beside which SQLite may build its index or roll back)."""
    head = _head(path, 100)
    if not head.startswith(SQLITE_HEADER):
        raise ReadError("not a SQLite database")
    wal_mode = len(head) >= 20 and 2 in (head[18], head[19])
    wal = _stat_key(_wal_of(path))
    if not private and (not wal_mode or wal is None or wal[1] == 0):
        mode = "immutable" if wal_mode else "ro"
        budget.charge(os.stat(path).st_size, who)
        con = _connect(_uri(path, "mode=ro&immutable=1" if wal_mode else "mode=ro"), budget)
        try:
            yield con, mode
        finally:
            con.close()
        return
    with tempfile.TemporaryDirectory(prefix="klwatch-sqlite-", ignore_cleanup_errors=True) as tmp:
        copy = _private_copy(path, "-wal" if wal_mode else "-journal", Path(tmp), budget)
        con = _connect(_uri(copy, "mode=rw"), budget)
        try:
            yield con, "copy"
        finally:
            con.close()


def read_mlflow_sqlite(path: Path, *, ref: str, source: str) -> list[Segment]:
    """Every non-deleted run of an MLflow SQLite store, read without creating or touching a file,
    in a few vectorised queries."""
    abspath = Path(path).resolve()
    who = _who(Path(path), ref)
    budget = current_budget()
    private = False
    for _ in range(SQLITE_ATTEMPTS):
        before = _stat_key(abspath), _stat_key(_wal_of(abspath))
        with _snapshot(abspath, who, budget, private=private) as (con, mode):
            try:
                segs = _query_store(con, abspath=abspath, source=source, who=who, budget=budget)
            except _HotJournal:
                private = True  # read what was committed: the journal rolled back in a private copy
                continue
        # immutable=1 trusts that nothing writes meanwhile: a live writer's change means read again
        if mode != "immutable" or (_stat_key(abspath), _stat_key(_wal_of(abspath))) == before:
            return segs
    raise ReadError("the store kept changing while it was read; try again when its writer pauses")


def _query_store(con: sqlite3.Connection, *, abspath: Path, source: str, who: str,
                 budget: Budget) -> list[Segment]:
    """Every run, inside one read snapshot; SQLite's errors as a ReadError naming the file."""
    try:
        con.execute("BEGIN")  # one read snapshot for all queries (a shared lock, never a write)
        return _read_sqlite(con, abspath=abspath, source=source, who=who)
    except sqlite3.OperationalError as exc:
        msg = str(exc)
        if "interrupt" in msg:
            budget.check_time(who)  # raises LimitExceeded: the SOURCE's deadline passed
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY_ROLLBACK":
            raise _HotJournal(msg) from exc
        if "locked" in msg or "busy" in msg:
            raise ReadError(
                f"the MLflow SQLite store is locked by another process (waited "
                f"{SQLITE_BUSY_TIMEOUT_S:g}s for the lock); try again when the writer is done"
            ) from exc
        raise ReadError(f"cannot read MLflow SQLite store: {msg}") from exc
    except sqlite3.DataError as exc:  # SQLITE_TOOBIG: a value past SQLITE_LIMIT_LENGTH (see _connect)
        raise ReadError(f"a value in the store is longer than {SQLITE_MAX_VALUE_BYTES:,} bytes, more than MLflow "
                        f"ever stores (a generated column?); not read ({exc})") from exc
    except sqlite3.DatabaseError as exc:  # "file is not a database", "malformed", ...
        raise ReadError(f"not a readable SQLite database ({exc})") from exc
    except sqlite3.Error as exc:
        raise ReadError(f"cannot read MLflow SQLite store: {exc}") from exc
    except UnicodeDecodeError as exc:  # SQLite's own message quotes damaged bytes (a broken schema)
        raise ReadError("not a readable SQLite database (damaged: SQLite's error quotes bytes that are "
                        "not UTF-8)") from exc


# --------------------------------------------------------------------------------------------
# SQLite: queries


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {_text(row[1]) for row in con.execute(f'PRAGMA table_info("{table}")')}


def _check_tables(tables: set[str]) -> None:
    """A database without any of MLflow's tables is not a log; one missing ``runs`` or ``metrics``
    is a damaged (or half-migrated) store, an error naming it."""
    if not tables & MLFLOW_TABLES:
        raise NotALog("a SQLite database without MLflow's tables (runs, metrics, experiments): "
                      "not an MLflow store")
    missing = [t for t in REQUIRED_TABLES if t not in tables]
    if missing:
        raise ReadError(f"not an MLflow store (no {', '.join(missing)} table)")


def _read_sqlite(con: sqlite3.Connection, *, abspath: Path, source: str, who: str) -> list[Segment]:
    """Every live run of the store, each query inside the read snapshot the caller began (it ends
    once the metrics are read)."""
    tables = {_text(r[0]) for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    _check_tables(tables)
    exps: dict[str, tuple[str, str]] = {}
    if "experiments" in tables:
        exps = {_text(eid): (_text(name) or _text(eid), _text(stage) or "active") for eid, name, stage in
                con.execute("SELECT experiment_id, name, lifecycle_stage FROM experiments")}
    name_col = "name" if "name" in _columns(con, "runs") else "NULL"
    runs = [(_text(r[0]), *r[1:]) for r in con.execute(
        f"SELECT run_uuid, {name_col}, status, start_time, end_time, lifecycle_stage, "
        "experiment_id FROM runs ORDER BY start_time, run_uuid")]
    tags, params = _sqlite_tags_and_params(con, tables)
    series, warnings = _sqlite_series(con, who, with_experiments="experiments" in tables)

    run_names = {r[0]: (_text(r[1]) or tags[r[0]].get(RUN_NAME_TAG) or None) for r in runs}
    out: list[Segment] = []
    for rid, _name, status, start_ms, end_ms, stage, eid in runs:
        eid, stage = _text(eid), _text(stage) or "active"
        exp_name, exp_stage = exps.get(eid, (eid, "active"))
        if stage == "deleted" or exp_stage == "deleted":
            continue
        seg = run_segment(run_id=rid, source=source, run_names=run_names, tags=tags.get(rid, {}),
                          config=dict(params.get(rid, {})), series=series.get(rid, {}), start_ms=start_ms,
                          end_ms=end_ms, store=f"{abspath}#{exp_name}", experiment=exp_name,
                          experiment_id=eid, status=_text(status) or None, stage=stage)
        seg.warnings.extend(warnings.get(rid, []))
        out.append(seg)
    out.sort(key=by_start_time)
    return out


def _sqlite_tags_and_params(con: sqlite3.Connection, tables: set[str]
                            ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    """Run id -> its tags, and run id -> its params (as the numbers they were); an old store may
    lack either table."""
    tags: dict[str, dict[str, str]] = defaultdict(dict)
    if "tags" in tables:
        for rid, key, value in con.execute("SELECT run_uuid, key, value FROM tags"):
            tags[_text(rid)][_text(key)] = _text(value)
    params: dict[str, dict[str, Any]] = defaultdict(dict)
    if "params" in tables:
        for rid, key, value in con.execute("SELECT run_uuid, key, value FROM params"):
            params[_text(rid)][_text(key)] = parse_param(_text(value))
    return tags, params


def _cell(c: Any) -> float:
    try:
        return float(c)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _metric_rows(rows: list[tuple[Any, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(value, timestamp, step, is_nan) rows as float64, and which rows hold a timestamp or step that
    is not a 64-bit integer (a damaged store); vectorised unless a cell is not a number at all."""
    try:
        data = np.array(rows, dtype=np.float64).reshape(-1, 4)
    except (TypeError, ValueError, OverflowError):
        data = np.array([[_cell(c) for c in r] for r in rows], dtype=np.float64).reshape(-1, 4)
    clock = data[:, 1:3]
    bad = ~(np.abs(clock) < _INT64).all(axis=1)
    return data, bad


def _sqlite_series(con: sqlite3.Connection, who: str, *, with_experiments: bool
                   ) -> tuple[dict[str, dict[str, Series]], dict[str, list[str]]]:
    """Run id -> metric -> Series, of the live runs in live experiments, in two queries (the
    (run, metric) counts, then every point in that order) that end the read snapshot; and run id ->
    warnings for metrics left out (a step or timestamp that is not a 64-bit integer)."""
    live = (
        "SELECT r.run_uuid FROM runs r LEFT JOIN experiments e ON e.experiment_id = r.experiment_id "
        "WHERE COALESCE(r.lifecycle_stage, 'active') != 'deleted' "
        "AND COALESCE(e.lifecycle_stage, 'active') != 'deleted'"
    ) if with_experiments else "SELECT run_uuid FROM runs WHERE COALESCE(lifecycle_stage, 'active') != 'deleted'"
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

    data, bad = _metric_rows(rows)
    values = data[:, 0].copy()
    values[data[:, 3] != 0] = np.nan  # MLflow stores NaN as value 0 with is_nan set
    values = finite_or_nan(values)
    clock = np.where(bad[:, None], 0.0, data[:, 1:3])
    timestamps, steps = clock[:, 0].astype(np.int64), clock[:, 1].astype(np.int64)
    wall = timestamps / 1000.0

    series: dict[str, dict[str, Series]] = defaultdict(dict)
    warnings: dict[str, list[str]] = defaultdict(list)
    start = 0
    for rid, key, count in groups:
        rid, key, end = _text(rid), _text(key), start + int(count)
        if bad[start:end].any():
            warnings[rid].append(f"{who}: metric {key!r} of run {rid} has a step or timestamp that is not "
                                 "a 64-bit integer (a damaged store?); this metric is left out")
        else:
            series[rid][key] = Series(steps[start:end], values[start:end], wall[start:end])
        start = end
    if start != len(data):  # the two queries disagree: the store changed under a non-snapshot read
        raise ReadError("the store changed while it was read; try again")
    return series, warnings


# --------------------------------------------------------------------------------------------
# mlruns/ file store


def _yaml_reason(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        return f"{exc.problem}" + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark else "")
    return " ".join(str(exc).split())[:200]


def _why(exc: OSError) -> str:
    """An OSError's reason without the path (the message names the file its own way)."""
    if isinstance(exc, NotRegularFile):
        return f"not a regular file ({exc.kind}); not opened"
    return exc.strerror or str(exc)


def _load_yaml(path: Path) -> dict[str, Any]:
    """A meta.yaml as a mapping; ReadError saying why not (the caller names the file)."""
    try:
        size = os.stat(path).st_size
        if size > META_MAX_BYTES:
            raise ReadError(f"{size:,} bytes, far more than an MLflow meta.yaml holds; not parsed")
        data = read_regular(path)
    except OSError as exc:
        raise ReadError(_why(exc)) from exc
    try:
        doc = load_yaml(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ReadError(f"not UTF-8 (byte {exc.start})") from exc
    except YamlAliasRefused as exc:
        raise ReadError(str(exc)) from exc
    except yaml.YAMLError as exc:
        raise ReadError(f"not valid YAML: {_yaml_reason(exc)}") from exc
    except (RecursionError, ValueError, OverflowError) as exc:  # nested too deep, a 5,000-digit int
        raise ReadError(f"cannot be parsed ({type(exc).__name__})") from exc
    if not isinstance(doc, dict):
        raise ReadError("not a YAML mapping")
    return doc


def _files_under(folder: Path) -> list[tuple[str, Path]]:
    """(key, file) for every file under ``metrics/``, ``params/`` or ``tags/`` (a key with ``/`` is a
    nested path), walked without recursion, in path order."""
    if not folder.is_dir():
        return []
    found = [(top / name) for top, _dirs, files in walk(folder) for name in files]
    found.sort(key=lambda p: p.parts)
    return [(p.relative_to(folder).as_posix(), p) for p in found]


def _parse_metric(data: bytes) -> tuple[Series, str | None]:
    """Lines ``timestamp value [step [dataset_name dataset_digest]]``, ordered by timestamp then
    line order (the order they were logged), and a note when the last line has no line end (MLflow
    ends every line it writes: one without is a write in progress, and may be cut mid-number)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReadError(f"not UTF-8 (byte {exc.start})") from exc
    note = None
    if text and not text.endswith("\n"):
        text, _, torn = text.rpartition("\n")
        if torn.strip():
            note = f"its last line {torn[:80]!r} has no line end (a write in progress?); that point is left out"
    lines = [ln for ln in text.split("\n") if ln.strip()]
    parts = [ln.split() for ln in lines]
    bad = next((i for i, p in enumerate(parts) if len(p) not in (2, 3, 5)), None)
    if bad is not None:
        raise ReadError(f"line {bad + 1}: expected 'timestamp value step', got {lines[bad][:80]!r}")
    try:
        ts = np.array([p[0] for p in parts], dtype=np.int64)
        vals = np.array([p[1] for p in parts], dtype=np.float64)
        steps = np.array([p[2] if len(p) >= 3 else "0" for p in parts], dtype=np.int64)
    except (ValueError, OverflowError) as exc:
        raise ReadError(_bad_number(parts)) from exc
    order = np.argsort(ts, kind="stable")
    return Series(steps[order], finite_or_nan(vals[order]), ts[order] / 1000.0), note


def _bad_number(parts: list[list[str]]) -> str:
    """Where a metric file holds a number that cannot be read, for the message."""
    for i, p in enumerate(parts):
        for j, what in ((0, "timestamp"), (2, "step")):
            if j >= len(p):
                continue
            try:
                n = int(p[j])
            except ValueError:
                return f"line {i + 1}: {what} {p[j][:40]!r} is not an integer"
            if not -_INT64 <= n < _INT64:
                return f"line {i + 1}: {what} {p[j][:40]!r} does not fit in 64 bits"
        try:
            float(p[1])
        except ValueError:
            return f"line {i + 1}: value {p[1][:40]!r} is not a number"
    return "a number that cannot be read"


def _read_metrics(folder: Path, where: str, warnings: list[str]) -> dict[str, Series]:
    """Every metric file of a run; one that cannot be read is left out with a warning naming it."""
    metrics: dict[str, Series] = {}
    for key, f in _files_under(folder):
        try:
            series, note = _parse_metric(read_text_bytes(f))
        except OSError as exc:
            warnings.append(f"{where}/{key}: {_why(exc)}; this metric is left out")
            continue
        except (ReadError, BinaryText) as exc:
            warnings.append(f"{where}/{key}: {exc}; this metric is left out")
            continue
        if note:
            warnings.append(f"{where}/{key}: {note}")
        metrics[key] = series
    return metrics


KV_MAX_BYTES = 1 << 20
"""A param or tag file larger than this is not MLflow's (it caps values at a few thousand characters)."""


def _read_kv(folder: Path, where: str, what: str, warnings: list[str]) -> dict[str, str]:
    """``params/`` and ``tags/``: one file per key; one that cannot be read is left out with a warning."""
    out: dict[str, str] = {}
    for key, f in _files_under(folder):
        try:
            if (size := os.stat(f).st_size) > KV_MAX_BYTES:
                warnings.append(f"{where}/{key}: {size:,} bytes, far more than MLflow lets a {what} hold; "
                                f"this {what} is left out")
                continue
            out[key] = read_regular(f).decode("utf-8")
        except OSError as exc:
            warnings.append(f"{where}/{key}: {_why(exc)}; this {what} is left out")
        except UnicodeDecodeError as exc:
            warnings.append(f"{where}/{key}: not UTF-8 (byte {exc.start}); this {what} is left out")
    return out


def _read_run_dir(run_dir: Path, run_ref: str) -> dict[str, Any]:
    """A run folder's parts; a meta.yaml that cannot be read fails the run (ReadError), a metric,
    param or tag file only itself (a warning)."""
    meta_file = run_dir / "meta.yaml"
    if not os.path.lexists(meta_file):
        raise ReadError("no meta.yaml")
    try:
        meta = _load_yaml(meta_file)
    except ReadError as exc:
        raise ReadError(f"meta.yaml: {exc}") from exc
    warnings: list[str] = []
    metrics = _read_metrics(run_dir / "metrics", f"{run_ref}/metrics", warnings)
    tags = _read_kv(run_dir / "tags", f"{run_ref}/tags", "tag", warnings)
    params = _read_kv(run_dir / "params", f"{run_ref}/params", "param", warnings)
    return {"meta": meta, "tags": tags, "params": params, "metrics": metrics, "warnings": warnings}


def _is_run_dir(p: Path) -> bool:
    return p.is_dir() and any(os.path.lexists(p / n) for n in ("meta.yaml", "metrics", "params", "tags"))


def _subdirs(folder: Path) -> list[Path]:
    """The folders in ``folder`` (not hidden), sorted; none when it cannot be listed."""
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.is_dir())
    except OSError:
        return []


def _experiment(exp_dir: Path, exp_ref: str) -> tuple[bool, str, str | None]:
    """(deleted, name, warning) of an experiment folder: a missing or damaged meta.yaml costs only
    the experiment's name (its id, the folder's name, stands in) and says so."""
    meta_file = exp_dir / "meta.yaml"
    if not os.path.lexists(meta_file):
        return False, exp_dir.name, (f"{exp_ref}: experiment folder has no meta.yaml; its runs are read, "
                                     f"the experiment named by its id {exp_dir.name}")
    try:
        meta = _load_yaml(meta_file)
    except ReadError as exc:
        return False, exp_dir.name, (f"{exp_ref}/meta.yaml: damaged experiment meta.yaml ({exc}); its runs "
                                     f"are read, the experiment named by its id {exp_dir.name}")
    if meta.get("lifecycle_stage") == "deleted":
        return True, "", None
    return False, _scalar_text(meta.get("name")) or exp_dir.name, None


def _scalar_text(v: Any) -> str | None:
    """A YAML scalar as text; None for a list, a mapping, a date or nothing."""
    if isinstance(v, (str, int, float)) and not isinstance(v, bool):
        return str(v)
    return None


def _run_fields(meta: dict[str, Any], run_dir: Path, run_ref: str, warnings: list[str]) -> dict[str, Any]:
    """The fields of a run's meta.yaml the Segment needs, each checked: a time that is not a number
    is left out with a warning instead of failing the run."""
    times: dict[str, Any] = {}
    for key in ("start_time", "end_time"):
        v = meta.get(key)
        times[key] = v if _seconds(v) is not None else None
        if v is not None and times[key] is None:
            warnings.append(f"{run_ref}/meta.yaml: {key} {str(v)[:40]!r} is not a time; left out")
    status = meta.get("status")
    return {
        "rid": _scalar_text(meta.get("run_id")) or _scalar_text(meta.get("run_uuid")) or run_dir.name,
        "name": _scalar_text(meta.get("run_name")),
        "status": _RUN_STATUS.get(status, status) if isinstance(status, int) else _scalar_text(status),
        "start_ms": times["start_time"],
        "end_ms": times["end_time"],
        "stage": _scalar_text(meta.get("lifecycle_stage")) or "active",
        "experiment_id": _scalar_text(meta.get("experiment_id")) or "",
    }


def read_mlruns(path: Path, *, ref: str, source: str) -> list[Segment]:
    """Every non-deleted run of an ``mlruns/`` file store; a run that cannot be read becomes an error
    Segment naming it, a file that cannot be read a warning naming it, and the rest is read."""
    root = Path(path).resolve()
    budget = current_budget()
    out: list[Segment] = []
    raw: list[dict[str, Any]] = []
    for exp_dir in _subdirs(root):
        budget.check_time(str(exp_dir))
        exp_ref = f"{ref}/{exp_dir.name}" if ref not in ("", ".") else exp_dir.name
        run_dirs = [p for p in _subdirs(exp_dir) if _is_run_dir(p)]
        if not run_dirs or (exp_dir.name == REGISTRY_FOLDER and not os.path.lexists(exp_dir / "meta.yaml")):
            continue
        deleted, exp_name, exp_warning = _experiment(exp_dir, exp_ref)
        if deleted:
            continue
        for run_dir in run_dirs:
            run = _read_run(run_dir, f"{exp_ref}/{run_dir.name}", root=root, source=source, exp_name=exp_name)
            if isinstance(run, Segment):
                out.append(run)
            elif run is not None:
                raw.append(run)
            if exp_warning and run is not None:
                (run.warnings if isinstance(run, Segment) else run["warnings"]).insert(0, exp_warning)
                exp_warning = None  # said once, on the experiment's first run
    out.extend(_run_segments(raw, root=root, source=source))
    out.sort(key=by_start_time)
    return out


def _read_run(run_dir: Path, run_ref: str, *, root: Path, source: str, exp_name: str
              ) -> Segment | dict[str, Any] | None:
    """A run folder's parts and checked fields; an error Segment naming it when it cannot be read;
    None for a deleted run."""
    try:
        parts = _read_run_dir(run_dir, run_ref)
    except ReadError as exc:
        return Segment(kind="mlflow", ref=run_ref, source=source, store=f"{root}#{exp_name}",
                       run_id=run_dir.name, error=f"{run_ref}: cannot read MLflow run folder: {exc}")
    if parts["meta"].get("lifecycle_stage") == "deleted":
        return None
    fields = _run_fields(parts["meta"], run_dir, run_ref, parts["warnings"])
    return {**parts, **fields, "ref": run_ref, "exp_name": exp_name}


def _run_segments(raw: list[dict[str, Any]], *, root: Path, source: str) -> list[Segment]:
    """The runs read, as Segments (after all are read: a nested run is grouped under its parent's name)."""
    run_names = {r["rid"]: (r["name"] or r["tags"].get(RUN_NAME_TAG)) for r in raw}
    out = []
    for r in raw:
        seg = run_segment(run_id=r["rid"], source=source, run_names=run_names, tags=r["tags"],
                          config={k: parse_param(v) for k, v in r["params"].items()}, series=r["metrics"],
                          start_ms=r["start_ms"], end_ms=r["end_ms"], store=f"{root}#{r['exp_name']}",
                          experiment=r["exp_name"], experiment_id=r["experiment_id"], status=r["status"],
                          stage=r["stage"], folder=r["ref"])
        seg.warnings.extend(r["warnings"])
        out.append(seg)
    return out
