"""Read metric tables (``.csv``, ``.jsonl``, ``.parquet``) into Segments.

Two layouts are accepted, told apart by their columns:
- wide: a step column and one column per metric (a W&B or MLflow export, a pandas dump);
- long: ``step``, ``tag``/``metric`` and ``value`` columns (what tbparse writes).

An optional wall-time column gives the clock; an optional segment column (``segment``, ``run_id``,
``run``, ``restart``, ``process``, or tbparse's ``dir_name``) cuts the table into one Segment per
value, in order of first appearance, because one table often holds every restart of a run.

A missing cell (empty CSV cell, JSON ``null`` or absent key, Parquet null) is "not logged at this
row", which wide tables are full of; only a cell that holds NaN or inf is a dropped value worth a
warning. Rows keep their order: a rewind must stay visible.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np  # (pandas is imported where a table is parsed: a scan that reads no table never loads it)

from ..model import MAX_STEP, Segment, Series, steps_out_of_range
from .limits import SNIFF_ABOVE, first_nul, read_regular, sniff, zero_stretches
from .local import NotALog, ReadError

STEP_COLUMNS = ("step", "_step", "global_step", "train/global_step", "iteration")
WALL_COLUMNS = ("wall_time", "wall time", "_timestamp", "timestamp", "time")
"""``Wall time`` is TensorBoard's UI CSV download (``Wall time,Step,Value``)."""
SEGMENT_COLUMNS = ("segment", "run_id", "run", "restart", "process", "dir_name")
NAME_COLUMNS = ("run_name", "name")
TAG_COLUMNS = ("tag", "metric")
VALUE_COLUMN = "value"

_NAN_WORDS = {"nan", "+nan", "-nan"}
_INF_WORDS = {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}


@dataclass
class _Column:
    """One column as read: the raw cells, which hold something, and which hold a number."""

    raw: np.ndarray
    present: np.ndarray
    """The cell holds something (not empty, null or absent)."""
    numeric: np.ndarray
    """The cell holds a number (NaN and inf included)."""
    num: np.ndarray
    """float64 value of numeric cells, NaN elsewhere."""


def read_table(path: Path, *, ref: str, source: str) -> list[Segment]:
    """One table file -> one Segment per segment value (or one for the whole file)."""
    path = Path(path)
    suffix = path.suffix.lower()
    warnings: list[str] = []
    if suffix not in (".csv", ".jsonl", ".parquet"):
        raise ReadError(f"not a table: unknown suffix {path.suffix!r} (expected .csv, .jsonl, .parquet)")
    _check_head(path, suffix)  # before reading it all: a 1 GiB file of zeros is refused from its first bytes
    data = read_regular(path)  # a FIFO or a device is refused, the bytes are charged to the SOURCE
    if suffix == ".csv":
        columns, nrows = _read_csv(_drop_torn_last_line(data, _torn_csv_row, ref=ref, warnings=warnings))
    elif suffix == ".jsonl":
        columns, nrows = _read_jsonl(_drop_torn_last_line(data, _torn_json_line, ref=ref, warnings=warnings))
    else:
        columns, nrows = _read_parquet(data)
    if nrows == 0:
        raise ReadError(f"empty table: no rows (columns: {_names(columns)})")
    return _segments(columns, nrows=nrows, path=path, ref=ref, source=source, warnings=warnings)


def _check_head(path: Path, suffix: str) -> None:
    """Refuse a large file that cannot be the table its suffix says before reading it whole, one block held at
    a time (``limits``): text with a NUL byte anywhere, Parquet without its magic at both ends or with a
    stretch of zeros no writer leaves (a sparse or crash-damaged file). A 1 GiB hole after a valid head costs
    its head, not a gigabyte."""
    if path.stat().st_size <= SNIFF_ABOVE:
        return  # read whole at once anyway; the parsers say what is wrong
    if suffix == ".parquet":
        size = path.stat().st_size
        head, tail = sniff(path, length=4), sniff(path, start=max(0, size - 4), length=4)
        if head != b"PAR1" or tail != b"PAR1":
            raise ReadError("not a readable Parquet table: it does not begin and end with the Parquet magic 'PAR1'")
        if stretches := zero_stretches(path):
            lo, hi = stretches[0]
            raise ReadError(f"not a readable Parquet table: bytes {lo}-{hi - 1} are zeros ({hi - lo:,} bytes; "
                            "a sparse or damaged file)")
        return
    if (nul := first_nul(path)) is not None:
        raise ReadError(f"not a {suffix[1:].upper()} table: binary data (a NUL byte at byte {nul})")


# ----------------------------------------------------------------------------- a torn last line


def _drop_torn_last_line(data: bytes, torn: Callable[[bytes, bytes], str | None], *, ref: str,
                         warnings: list[str]) -> bytes:
    """``data`` without its last line when that line has no newline after it and ``torn`` finds it
    cut short (a writer killed mid-row): dropped with a warning naming file and line, never read as
    if whole. A last line without a newline that is whole is kept."""
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    if not cut or not tail.strip():
        return data  # ends in a newline, or a single line (a header alone): nothing torn
    why = torn(data[:cut], tail)
    if why is None:
        return data
    line = data.count(b"\n", 0, cut) + 1
    warnings.append(f"{ref}: truncated last line {line} ({why}; no newline "
                    "after it: crash mid-write?); dropped, the rows before it kept")
    return data[:cut]


def _torn_csv_row(body: bytes, tail: bytes) -> str | None:
    """Why the CSV row ``tail`` is cut short: it does not decode or parse, has fewer fields than the
    header, or its last cell is empty or no number where the row above has one (``1.5e`` of
    ``1.5e-05``, or nothing after the last comma)."""
    try:
        text = tail.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        return "it ends inside a UTF-8 character"
    lines = body.decode("utf-8", "replace").splitlines()
    try:
        row = next(csv.reader([text], strict=True))
    except csv.Error:
        return "an unclosed quote"
    header = next(csv.reader([lines[0]]), [])
    if len(row) < len(header):
        return f"{len(row)} of {len(header)} fields"
    above = next(csv.reader([lines[-1]]), []) if len(lines) > 1 else []
    if row and above and _is_number(above[-1]) and not _is_number(row[-1]):
        return f"its last cell {row[-1]!r} is not a number" if row[-1].strip() else "its last cell is empty"
    return None


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _torn_json_line(body: bytes, tail: bytes) -> str | None:
    """Why the JSONL line ``tail`` is cut short: it does not decode, or is not whole JSON."""
    try:
        json.loads(tail.decode("utf-8"))
    except UnicodeDecodeError:
        return "it ends inside a UTF-8 character"
    except ValueError:
        return "not whole JSON"
    except RecursionError:
        return None  # whole, but nested too deeply: the reader says so
    return None


# ---------------------------------------------------------------------------------------- readers


def _read_csv(data: bytes) -> tuple[dict[str, _Column], int]:
    """Every cell as text first, so an empty cell (missing) stays apart from a written ``nan``."""
    import pandas as pd
    try:
        df = pd.read_csv(io.BytesIO(data), dtype=object, keep_default_na=False, na_filter=False)
    except pd.errors.EmptyDataError as exc:
        raise ReadError("empty table: the CSV file has no header and no rows") from exc
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ReadError(f"not a readable CSV table: {exc}") from exc
    # every cell at once, column after column (one pandas call per step, not per column: a header of
    # 100,000 names costs what its cells do)
    n = len(df)
    text = pd.Series(df.to_numpy(dtype=object).ravel(order="F"), dtype=object).str.strip()
    raw = text.to_numpy(dtype=object)
    present = (text != "").to_numpy()
    num = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    numeric = present & ~np.isnan(num)
    nanlike = present & np.isnan(num)
    if nanlike.any():  # "nan" / "inf" written out count as numbers that are not finite
        low = text[nanlike].str.lower()
        is_nan = low.isin(_NAN_WORDS).to_numpy()
        is_inf = low.isin(_INF_WORDS).to_numpy()
        idx = np.flatnonzero(nanlike)
        numeric[idx[is_nan | is_inf]] = True
        num[idx[is_inf]] = np.where(low[is_inf].str.startswith("-"), -np.inf, np.inf)
    columns: dict[str, _Column] = {}
    for j, name in enumerate(df.columns):
        cut = slice(j * n, (j + 1) * n)
        columns[str(name)] = _Column(raw[cut], present[cut], numeric[cut], num[cut])
    return columns, len(df)


def _read_jsonl(data: bytes) -> tuple[dict[str, _Column], int]:
    """One JSON object per line; nested objects are flattened with ``.`` (``{"a": {"b": 1}}`` -> ``a.b``)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReadError(f"not a readable JSONL table: {exc}") from exc
    records: list[dict[str, Any]] = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ReadError(f"line {i + 1} is a JSON {type(obj).__name__}, not an object")
            records.append(_flatten(obj))
        except ValueError as exc:
            raise ReadError(f"line {i + 1} is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise ReadError(f"line {i + 1} is JSON nested too deeply to read") from exc
    keys: dict[str, None] = {}
    for rec in records:
        keys.update(dict.fromkeys(rec))
    columns: dict[str, _Column] = {}
    for key in keys:
        cells = [rec.get(key) for rec in records]
        raw = np.empty(len(cells), dtype=object)
        raw[:] = cells
        present = np.fromiter((c is not None for c in cells), dtype=bool, count=len(cells))
        numeric = np.fromiter((isinstance(c, (int, float)) and not isinstance(c, bool) for c in cells),
                              dtype=bool, count=len(cells))
        num = np.full(len(cells), np.nan)
        if numeric.any():
            num[numeric] = [float(c) for c, ok in zip(cells, numeric) if ok]
        columns[key] = _Column(raw, present, numeric, num)
    return columns, len(records)


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


def _read_parquet(data: bytes) -> tuple[dict[str, _Column], int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    owned = pa.allocate_buffer(len(data))  # arrow's own copy: see below
    memoryview(owned).cast("B")[:] = data
    try:
        # Arrow may drop its last reference to the buffer on one of its own threads; a buffer wrapping
        # Python bytes then takes the GIL from that thread, which crashes CPython 3.11 when tracemalloc
        # is on (found by fuzzing with it on). Arrow's own memory is freed without Python.
        table = pq.read_table(pa.BufferReader(owned))
    except (pa.ArrowException, OSError) as exc:
        raise ReadError(f"not a readable Parquet table: {exc}") from exc
    while any(pa.types.is_struct(t) for t in table.schema.types):
        table = table.flatten()  # nested structs -> "outer.inner" columns
    columns: dict[str, _Column] = {}
    for name, col in zip(table.column_names, table.columns):
        present = ~col.is_null().to_numpy(zero_copy_only=False)
        kind = col.type
        if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
            num = col.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)
            num[~present] = np.nan
            columns[name] = _Column(num, present, present.copy(), num)
        else:
            raw = np.asarray(col.to_pandas().to_numpy(), dtype=object)
            n = len(raw)
            columns[name] = _Column(raw, present, np.zeros(n, dtype=bool), np.full(n, np.nan))
    return columns, table.num_rows


# ------------------------------------------------------------------------------------ the layout


def _names(columns: dict[str, _Column]) -> str:
    names = list(columns)
    shown = ", ".join(repr(n) for n in names[:20])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 20 else "") if names else "none"


def _find(columns: dict[str, _Column], candidates: tuple[str, ...]) -> str | None:
    """The first candidate present, matching names case-insensitively."""
    by_lower: dict[str, str] = {}
    for name in columns:
        by_lower.setdefault(name.lower(), name)
    for cand in candidates:
        if cand in by_lower:
            return by_lower[cand]
    return None


def _cell_text(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _wall_seconds(col: _Column, *, name: str, ref: str, warnings: list[str]) -> np.ndarray | None:
    """Seconds since the epoch from numbers (s, or ms/us/ns when that large) or datetimes."""
    import pandas as pd
    if col.numeric.any() and col.numeric.sum() >= col.present.sum() / 2:
        sec = np.where(col.numeric, col.num, np.nan)
        finite = sec[np.isfinite(sec)]
        scale = np.nanmedian(np.abs(finite)) if len(finite) else 0.0
        if scale > 1e17:
            sec = sec / 1e9
        elif scale > 1e14:
            sec = sec / 1e6
        elif scale > 1e11:
            sec = sec / 1e3
        return sec
    stamps = pd.to_datetime(pd.Series(col.raw), utc=True, errors="coerce", format="ISO8601")
    if stamps.isna().all():
        warnings.append(f"{ref}: wall-time column {name!r} holds neither numbers nor dates; ignored")
        return None
    values = stamps.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
    out = values.astype("int64").astype(np.float64) / 1e9
    out[np.isnat(values)] = np.nan
    return out


@dataclass
class _TableLayout:
    """The table's columns, resolved once for all of its segments: which column holds the step,
    the clock, the segment, the run name, the tag and the value, and the step of every row."""

    step_name: str
    has_step: np.ndarray
    """The row has a usable step; rows without one are left out of every series."""
    steps: np.ndarray
    wall_name: str | None
    walls: np.ndarray | None
    seg_name: str | None
    name_name: str | None
    tag_name: str | None
    value_name: str | None
    metric_names: list[str]
    """The wide layout's metric columns (numeric columns that are none of the above)."""
    group: str
    """The file's path without its suffix: the group, and the run id when it holds one run."""

    @property
    def long(self) -> bool:
        return self.tag_name is not None and self.value_name is not None

    @property
    def unnamed(self) -> str | None:
        """A value column without a tag column holds one series whose name the file does not hold (TensorBoard's
        UI CSV download): it is named after the file."""
        return Path(self.group).name if self.value_name is not None and self.tag_name is None else None


def _segments(columns: dict[str, _Column], *, nrows: int, path: Path, ref: str, source: str,
              warnings: list[str]) -> list[Segment]:
    """One Segment per value of the segment column (one for the file without one); the file-wide
    ``warnings`` go to the first."""
    import pandas as pd
    layout = _table_layout(columns, ref=ref, warnings=warnings)
    if layout.seg_name is not None:
        keys = np.array([_cell_text(x) for x in columns[layout.seg_name].raw], dtype=object)
        codes, uniques = pd.factorize(keys)
        parts = [(str(u), np.flatnonzero(codes == i)) for i, u in enumerate(uniques)]
    else:
        parts = [(None, np.arange(nrows))]
    return [_table_segment(columns, layout, value=value, rows=rows[layout.has_step[rows]], path=path,
                           ref=ref, source=source, warnings=list(warnings) if k == 0 else [])
            for k, (value, rows) in enumerate(parts)]


def _table_layout(columns: dict[str, _Column], *, ref: str, warnings: list[str]) -> _TableLayout:
    """Find the special columns by name (the step column is required) and read the steps and clock."""
    step_name, has_step, steps = _step_column(columns, ref=ref, warnings=warnings)
    wall_name = _find(columns, WALL_COLUMNS)
    walls = None
    if wall_name is not None:
        walls = _wall_seconds(columns[wall_name], name=wall_name, ref=ref, warnings=warnings)
    seg_name = _find(columns, SEGMENT_COLUMNS)
    name_name = _find(columns, NAME_COLUMNS)
    tag_name = _find(columns, TAG_COLUMNS)
    value_name = _find(columns, (VALUE_COLUMN,))
    special = {n for n in (step_name, wall_name, seg_name, name_name, tag_name, value_name) if n}
    metric_names = [n for n, c in columns.items() if n not in special and c.numeric.any()]
    group = str(Path(ref).with_suffix("")) if Path(ref).suffix else ref
    layout = _TableLayout(step_name, has_step, steps, wall_name, walls, seg_name, name_name, tag_name,
                          value_name, metric_names, group)
    if layout.unnamed:
        warnings.append(f"{ref}: one series without its name in column {value_name!r} (a TensorBoard UI CSV download "
                        f"names neither run nor tag inside); read as {layout.unnamed!r}: pass --metric "
                        f"{layout.unnamed!r} if it is the reference KL")
    elif not layout.long and not metric_names:
        warnings.append(f"{ref}: no numeric metric columns besides {step_name!r}")
    return layout


def _step_column(columns: dict[str, _Column], *, ref: str,
                 warnings: list[str]) -> tuple[str, np.ndarray, np.ndarray]:
    """The step column's name, which rows have a usable step, and the steps (0 where none).

    A table without one is no metrics log: NotALog when nothing in it is numeric (a dataset met
    during a walk), else an error naming the columns; a fractional step is an error too."""
    step_name = _find(columns, STEP_COLUMNS)
    if step_name is None:
        if not any(c.numeric.any() for c in columns.values()):
            raise NotALog(f"not a metrics table: no step column and no numeric column (columns: {_names(columns)})")
        raise ReadError(f"no step column (looked for {', '.join(STEP_COLUMNS)}, any case); "
                        f"columns found: {_names(columns)}")
    step_col = columns[step_name]
    if not step_col.numeric.any():
        raise ReadError(f"step column {step_name!r} holds no numbers")
    bad_step = step_col.numeric & ~np.isfinite(step_col.num)
    huge = step_col.numeric & ~bad_step & steps_out_of_range(step_col.num)
    if huge.any():
        row = int(np.flatnonzero(huge)[0])
        raise ReadError(f"step column {step_name!r} holds a step out of range ({step_col.raw[row]!r} at row {row + 1}; "
                        f"steps must lie within +-{MAX_STEP:,})")
    finite_steps = step_col.num[step_col.numeric & ~bad_step]
    if len(finite_steps) and not np.all(finite_steps == np.round(finite_steps)):
        row = int(np.flatnonzero(step_col.numeric & (step_col.num != np.round(step_col.num)))[0])
        raise ReadError(f"step column {step_name!r} holds a non-integer step "
                        f"({step_col.raw[row]!r} at row {row + 1})")
    has_step = step_col.numeric & ~bad_step
    if not has_step.all():
        warnings.append(f"{ref}: {int((~has_step).sum())} rows without a usable step in "
                        f"{step_name!r} were skipped")
    return step_name, has_step, np.where(has_step, step_col.num, 0).astype(np.int64)


def _table_segment(columns: dict[str, _Column], layout: _TableLayout, *, value: str | None, rows: np.ndarray,
                   path: Path, ref: str, source: str, warnings: list[str]) -> Segment:
    """The Segment of the rows (with a usable step) that hold one segment value."""
    if layout.long:
        series = _long_series(columns[layout.tag_name], columns[layout.value_name], rows=rows,
                              steps=layout.steps, walls=layout.walls, ref=ref, warnings=warnings)
    else:
        metrics = {n: columns[n] for n in layout.metric_names}
        if layout.unnamed is not None and layout.value_name is not None:
            metrics.setdefault(layout.unnamed, columns[layout.value_name])
        series = _wide_series(metrics, rows=rows, steps=layout.steps, walls=layout.walls, ref=ref, warnings=warnings)
    name = None
    if layout.name_name is not None:
        names = [_cell_text(x) for x in columns[layout.name_name].raw[rows]]
        name = next((x for x in names if x), None)
    seg_name, group = layout.seg_name, layout.group
    if value is None:
        seg_ref, run_id, shown = ref, group, group
    elif seg_name.lower() in ("run_id", "run"):
        seg_ref, run_id, shown = f"{ref}[{seg_name}={value}]", value, value
    else:  # restarts of the run the file holds
        seg_ref, run_id, shown = f"{ref}[{seg_name}={value}]", f"{group}[{seg_name}={value}]", group
    start = None
    if layout.walls is not None and len(rows):
        w = layout.walls[rows]
        w = w[np.isfinite(w)]
        start = float(w[0]) if len(w) else None
    meta: dict[str, Any] = {"file": path.name, "layout": "long" if layout.long else "wide",
                            "step_column": layout.step_name}
    if layout.wall_name is not None and layout.walls is not None:
        meta["wall_time_column"] = layout.wall_name
    if seg_name is not None:
        meta["segment_column"] = seg_name
        meta["segment_value"] = value
    return Segment(
        kind="table", ref=seg_ref, source=source, run_id=run_id, name=name or shown,
        group=group, series=series, start_time=start, store=str(path.resolve()),
        warnings=warnings, meta=meta,
    )


def _series(sel: np.ndarray, *, values: np.ndarray, steps: np.ndarray, walls: np.ndarray | None,
            label: str, ref: str, warnings: list[str]) -> Series | None:
    v = values[sel]
    finite = np.isfinite(v)
    if not finite.all():
        bad = int((~finite).sum())
        warnings.append(f"{ref}: dropped {bad} NaN/inf value{'s' if bad != 1 else ''} of {label!r}")
        sel, v = sel[finite], v[finite]
    if not len(sel):
        return None
    return Series(steps[sel], v, None if walls is None else walls[sel])


def _wide_series(metrics: dict[str, _Column], *, rows: np.ndarray, steps: np.ndarray,
                 walls: np.ndarray | None, ref: str, warnings: list[str]) -> dict[str, Series]:
    out: dict[str, Series] = {}
    for name, col in metrics.items():
        sel = rows[col.numeric[rows]]
        s = _series(sel, values=col.num, steps=steps, walls=walls, label=name, ref=ref,
                    warnings=warnings)
        if s is not None:
            out[name] = s
    return out


def _long_series(tags: _Column, values: _Column, *, rows: np.ndarray, steps: np.ndarray,
                 walls: np.ndarray | None, ref: str, warnings: list[str]) -> dict[str, Series]:
    import pandas as pd
    rows = rows[tags.present[rows] & values.numeric[rows]]
    labels = np.array([_cell_text(x) for x in tags.raw[rows]], dtype=object)
    codes, uniques = pd.factorize(labels)
    by_tag = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[by_tag], np.arange(len(uniques) + 1))
    out: dict[str, Series] = {}
    for i, tag in enumerate(uniques):
        sel = rows[by_tag[bounds[i]:bounds[i + 1]]]
        s = _series(sel, values=values.num, steps=steps, walls=walls, label=str(tag), ref=ref,
                    warnings=warnings)
        if s is not None:
            out[str(tag)] = s
    return out
