"""The scan cache: what reading each input file gave, kept in the user's cache folder between scans.

A fleet is mostly unchanged from one scan to the next, and growing runs only grow. So:

- **per unit** (an event file, a W&B run folder, a table, a store; ``klwatch.sources.local.Unit``),
  the Segments its reader gave are kept, their series columnar (Arrow IPC files, LZ4), the rest as
  JSON, keyed by the unit's kind, path and SOURCE, and checked against the fingerprint of its files
  (size, mtime, a hash of the first and the last 4 KiB). Unchanged: served from the cache. An
  event file or a ``.wandb`` log that grew with the bytes it had unchanged: read on from the last
  whole record the cache had (``klwatch.sources.resume``), not from its start. Anything else:
  read again.
- **per scan**: when no input of a scan changed (same SOURCEs, same settings, same files, same
  klwatch code), the whole ScanResult of the last such scan is reused, so a re-scan of an unchanged
  fleet costs a look at its files and no read, stitch or judgement.
- **per scan, as its reports read it** (``report_memo``, what ``klwatch scan`` asks first): what
  the reports of the last scan with the same SOURCEs, options and klwatch code read
  (``klwatch.report.scan_view``, as JSON), served while every file and folder under its SOURCEs is
  as it was before that scan (``fleet_state``, standard library only): a re-scan of an unchanged
  fleet as a process then loads no numpy, reader or judge.

The cache lives in the user's cache folder (platformdirs; ``KLWATCH_CACHE_DIR`` or ``--cache-dir``
to move it), never in a run folder, made private (0700) and not used when another user could
write to it (entries are trusted data: a scan result is a pickle). It is bounded in size: after a
scan, least recently used entries go until it fits (``--cache-size``). ``--no-cache`` reads
everything afresh and writes nothing. Remote SOURCEs (``wandb://``, ``mlflow://``) are never cached:
nothing tells cheaply whether a server's run changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence, Sized
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .source_names import REMOTE_PREFIXES, SKIP_DIRS, is_input_name, split_pattern

if TYPE_CHECKING:  # imported where used: a re-scan served whole from the memo loads neither numpy nor a reader
    import numpy as np

    from .model import ScanResult, Segment
    from .report import ScanView
    from .sources.local import Unit, UnitRead
    from .sources.resume import Resume

FORMAT = 1
"""Bumped when what an entry holds changes: older entries are then misses, and pruned in time."""
HASH_WINDOW = 4096
"""Bytes hashed at each end of a file (a page): a file rewritten in place with its size and mtime
kept (a copy with ``cp -p``, a clock that did not move) still shows in its first or last bytes.
These few bytes per file are not charged to ``--max-read-bytes``, which bounds what a SOURCE's
contents cost; the look is bounded by the number of files, which the time bound bounds."""
DEFAULT_MAX_BYTES = 2 << 30
MEMO_WALK_SECONDS = 10.0
"""A tree whose state takes longer to take than this gets no per-scan memo (the walk would eat what it saves)."""
PRUNE_TO = 0.8
"""When over its bound, the cache is pruned to this share of it, so the next scans do not prune again."""


class CacheUnusable(Exception):
    """The cache folder cannot be used (not creatable, or writable by another user): the scan goes on
    without it, saying why."""


def default_cache_dir() -> Path:
    """``KLWATCH_CACHE_DIR``, else the platform's user cache folder for klwatch."""
    env = os.environ.get("KLWATCH_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("klwatch", appauthor=False))


def parse_size(text: str) -> int:
    """``500MB``, ``2GiB``, ``1.5G``, ``0``, a number of bytes -> bytes (units are powers of 1024)."""
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    number = s[:-1] if scale > 1 else s
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 500MB, 2GB)") from None
    if not 0 <= value < 1 << 60:
        raise ValueError(f"not a size: {text!r} (e.g. 500MB, 2GB)")
    return int(value * scale)


# -- fingerprints -------------------------------------------------------------------------------


def file_identity(path: Path, *, upto: int | None = None) -> dict[str, Any]:
    """Size, mtime and hashes of the first and the last ``HASH_WINDOW`` bytes of a file (of its first
    ``upto`` bytes, when given: to tell whether a grown file still begins with what was cached)."""
    from .sources.limits import Budget, read_regular

    st = os.stat(path)
    size = st.st_size if upto is None else min(upto, st.st_size)
    free = Budget()
    head = read_regular(path, start=0, length=min(size, HASH_WINDOW), budget=free)
    tail = head if size <= HASH_WINDOW else read_regular(path, start=size - HASH_WINDOW, length=HASH_WINDOW,
                                                         budget=free)
    return {"size": size, "mtime_ns": st.st_mtime_ns, "head": _digest(head), "tail": _digest(tail)}


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _stat(p: Path) -> list[int]:
    try:
        st = p.stat()
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return [-1, -1]


def checkpoint_entries(path: Path) -> list[tuple[Path, tuple[str, ...]]]:
    """What a checkpoint parent's reader looks at, in order: each checkpoint folder ``(name,)`` and the
    files at its top ``(name, file)``, never the weights deeper down."""
    from .sources.local import CHECKPOINT_DIR

    out: list[tuple[Path, tuple[str, ...]]] = []
    for d in sorted(path.iterdir()):
        if d.is_dir() and CHECKPOINT_DIR.match(d.name):
            out.append((d, (d.name,)))
            with contextlib.suppress(OSError):
                out.extend((f, (d.name, f.name)) for f in sorted(d.iterdir()) if f.is_file())
    return out


def unit_fingerprint(unit: Unit) -> dict[str, Any]:
    """What must be unchanged for a unit's cached read to stand: its file's identity; for a W&B run
    folder, its ``.wandb`` logs' (the reader reads nothing else); for folders read whole (an mlruns
    tree, checkpoints), the size and mtime of every file in them."""
    path = unit.path
    if unit.kind in ("tensorboard", "table") or (unit.kind == "mlflow" and path.is_file()):
        out: dict[str, Any] = {"file": file_identity(path)}
        if unit.kind == "mlflow":  # a live SQLite store may hold recent rows in its write-ahead log
            out["wal"] = _stat(path.with_name(path.name + "-wal"))
        return out
    if unit.kind == "wandb-offline":
        logs = {}
        for p in sorted(path.iterdir()):
            if p.suffix == ".wandb":
                logs[p.name] = file_identity(p) if p.is_file() else {"kind": "not a file"}
        return {"logs": logs}
    from .sources.limits import walk

    listing: list[Any] = []
    if unit.kind == "checkpoints":
        return {"listing": [[*names, _stat(p)] for p, names in checkpoint_entries(path)]}
    for dirpath, _, filenames in walk(path):
        for f in filenames:
            p = Path(dirpath) / f
            listing.append([str(p.relative_to(path)), _stat(p)])
    return {"listing": sorted(listing)}


def log_anchor(resume: Resume) -> dict[str, Any] | None:
    """The identity of the bytes a resumable read took (its log up to ``resume.offset``), taken right
    after the read: the next read may go on from there only while those bytes are unchanged."""
    try:
        return file_identity(Path(resume.file), upto=resume.offset)
    except OSError:
        return None


def can_read_on(old: dict[str, Any], new: dict[str, Any], *, log: Path, anchor: dict[str, Any] | None) -> bool:
    """The unit changed only by its resumable ``log`` growing, with the bytes read before (``anchor``)
    unchanged: same first and last 4 KiB up to where the read stopped."""
    if anchor is None:
        return False
    if "file" in old and "file" in new:
        rest_old = {k: v for k, v in old.items() if k != "file"}
        rest_new = {k: v for k, v in new.items() if k != "file"}
    elif "logs" in old and "logs" in new and old["logs"].keys() == new["logs"].keys() and log.name in old["logs"]:
        rest_old = {k: v for k, v in old["logs"].items() if k != log.name}
        rest_new = {k: v for k, v in new["logs"].items() if k != log.name}
    else:
        return False
    if rest_old != rest_new:
        return False
    try:
        now = file_identity(log, upto=anchor["size"])
    except OSError:
        return False
    return now["size"] == anchor["size"] and now["head"] == anchor["head"] and now["tail"] == anchor["tail"]


# -- segments as JSON and Arrow -----------------------------------------------------------------

def _segment_fields() -> list[str]:
    from .model import Segment

    return [f.name for f in dataclasses.fields(Segment) if f.name != "series"]


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all through: what survives a JSON round trip unchanged."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _through_json(data: Any) -> Any | None:
    """``data`` as it comes back from JSON; None when JSON would change it (a tuple, a non-string key,
    a NaN, a date from a YAML config): what holds such a value is not cached."""
    try:
        back = json.loads(json.dumps(data, allow_nan=False))
    except (TypeError, ValueError):
        return None
    return back if _same(back, data) else None


def _plain(seg: Segment) -> dict[str, Any] | None:
    """A Segment's fields other than its series, as JSON data (``_through_json``)."""
    return _through_json({name: getattr(seg, name) for name in _segment_fields()})


def _columns(segments: Sequence[Segment]) -> tuple[list[list[Any]], dict[str, np.ndarray]]:
    """Every series of the segments, in order: their (segment, name, points, has clock) and the
    concatenated steps, values and wall times."""
    import numpy as np

    index: list[list[Any]] = []
    steps, values, walls = [], [], []
    for k, seg in enumerate(segments):
        for name, ser in seg.series.items():
            index.append([k, name, len(ser), ser.wall_times is not None])
            steps.append(ser.steps)
            values.append(ser.values)
            walls.append(ser.wall_times if ser.wall_times is not None else np.full(len(ser), np.nan))
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.empty(0, dt))  # noqa: E731
    return index, {"step": cat(steps, np.int64), "value": cat(values, np.float64), "wall": cat(walls, np.float64)}


def _series_from(index: list[list[Any]], cols: dict[str, np.ndarray], count: int) -> list[dict[str, Any]]:
    from .model import Series

    out: list[dict[str, Series]] = [{} for _ in range(count)]
    at = 0
    for k, name, n, has_wall in index:
        sl = slice(at, at + n)
        out[k][name] = Series(cols["step"][sl], cols["value"][sl], cols["wall"][sl] if has_wall else None)
        at += n
    return out


# -- the cache ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScanCache:
    """A scan cache in ``directory``, kept under ``max_bytes``. Picklable: worker processes read
    through it too (entries are written atomically, so processes sharing it never see half of one)."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def open(cls, directory: Path | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ScanCache:
        """The cache at ``directory`` (default: ``default_cache_dir()``), created private; raises
        ``CacheUnusable`` saying why it cannot be used."""
        d = Path(directory).expanduser() if directory is not None else default_cache_dir()
        try:
            private_mkdir(d)
            st = d.stat()
        except OSError as exc:
            raise CacheUnusable(f"cache folder {d}: {exc.strerror or exc}") from None
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise CacheUnusable(f"cache folder {d} belongs to another user")
        if st.st_mode & 0o022:
            raise CacheUnusable(f"cache folder {d} is writable by other users (chmod 700 it)")
        return cls(d.resolve(), max_bytes)

    # -- per unit

    def read_unit(self, unit: Unit, *, root: Path, spec: str) -> UnitRead:
        """``klwatch.sources.local.read_unit``, through the cache (the ``ReadUnit`` signature)."""
        from .sources.local import read_unit

        key = _key("unit", unit.kind, str(unit.path.resolve()), str(root), spec)
        try:
            fingerprint = unit_fingerprint(unit)
        except OSError:
            return read_unit(unit, root=root, spec=spec)  # the reader names what is wrong
        entry = self._load_entry(key)
        if entry is not None and entry["fingerprint"] == fingerprint:
            self._touch(key)
            return entry["read"]
        since = None
        if entry is not None and entry["resume"] is not None and can_read_on(
                entry["fingerprint"], fingerprint, log=Path(entry["resume"].file), anchor=entry["resume_meta"]["anchor"]):
            since = entry["resume"]
        got, resume = read_unit_since(unit, root=root, spec=spec, since=since)
        self._store_entry(key, fingerprint=fingerprint, got=got, resume=resume)
        return got

    def will_read(self, unit: Unit, *, root: Path, spec: str) -> bool:
        """Whether ``read_unit`` would read this unit (changed, grown or never cached) rather than serve
        it whole from the cache: what a process pool is worth starting for."""
        key = _key("unit", unit.kind, str(unit.path.resolve()), str(root), spec)
        meta_path, _ = self._unit_paths(key)
        try:
            fingerprint = json.loads(meta_path.read_text(encoding="utf-8")).get("fingerprint")
            return fingerprint != unit_fingerprint(unit)
        except (OSError, ValueError, AttributeError):
            return True

    def _load_entry(self, key: str) -> dict[str, Any] | None:
        """A unit's entry (its read rebuilt, fingerprint, resume point), or None when absent or not
        readable (a damaged entry is a miss, and removed)."""
        from .model import Segment
        from .sources.local import UnitRead
        from .sources.resume import Resume

        meta_path, cols_path = self._unit_paths(key)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("format") != FORMAT:
                return None
            cols = _read_columns(cols_path)
            series = _series_from(meta["index"], cols, len(meta["segments"]) + 1)
            segments = [Segment(**fields, series=series[k]) for k, fields in enumerate(meta["segments"])]
            read = UnitRead(segments, list(meta["warnings"]), skipped=meta["skipped"])
            resume = None
            if meta.get("resume"):
                r = meta["resume"]
                base = segments[r["segment"]]
                rseries = series[-1] if r["own_series"] else base.series
                resume = Resume(file=r["file"], offset=r["offset"], state=r["state"],
                                segment=Segment(**r["fields"], series=dict(rseries)))
            return {"fingerprint": meta["fingerprint"], "read": read, "resume": resume,
                    "resume_meta": meta.get("resume")}
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a damaged or foreign entry is a miss, never an error
            for p in (meta_path, cols_path):
                with contextlib.suppress(OSError):
                    p.unlink()
            return None

    def _store_entry(self, key: str, *, fingerprint: dict[str, Any], got: UnitRead, resume: Resume | None) -> None:
        """Keep a unit's read (nothing when part of it would not come back the same from JSON)."""
        fields = [_plain(s) for s in got.segments]
        if any(f is None for f in fields):
            return
        segments = list(got.segments)
        resume_meta = None
        rfields = _plain(resume.segment) if resume is not None and len(got.segments) == 1 else None
        if resume is not None and rfields is not None and _through_json(resume.state) is not None:
            base = got.segments[0]  # a resumable reader gives one Segment per log
            own = list(resume.segment.series) != list(base.series) or any(
                resume.segment.series[n] is not base.series[n] for n in base.series)
            if own:  # kept after the unit's segments, as segment number len(got.segments)
                segments.append(resume.segment)
            resume_meta = {"file": resume.file, "offset": resume.offset, "state": resume.state,
                           "fields": rfields, "segment": 0, "own_series": own, "anchor": log_anchor(resume)}
        index, cols = _columns(segments)
        meta = {"format": FORMAT, "fingerprint": fingerprint, "segments": fields, "index": index,
                "warnings": list(got.warnings), "skipped": got.skipped, "resume": resume_meta}
        meta_path, cols_path = self._unit_paths(key)
        try:
            private_mkdir(meta_path.parent)
            _write_columns(cols_path, cols)
            atomic_write(meta_path, json.dumps(meta, allow_nan=False).encode("utf-8"))
        except (OSError, ValueError, TypeError):
            return  # a full disk or an odd value costs the cache, never the scan

    def _unit_paths(self, key: str) -> tuple[Path, Path]:
        d = self.directory / "units" / key[:2]
        return d / f"{key}.json", d / f"{key}.arrow"

    def _touch(self, key: str) -> None:
        """Mark an entry used now (least recently used entries are pruned first)."""
        for p in self._unit_paths(key):
            with contextlib.suppress(OSError):
                os.utime(p)

    # -- per training run

    def judge_through(self, lineages: Iterable[Any], *, config: Any, judge: Any) -> Iterator[Any]:
        """Each training run's judgement, in order: kept from a run judged before with the very same data
        (everything its lineage holds, the settings, klwatch's code), else ``judge``d (the others
        handed to it as one stream, so a pool still judges them in parallel) and kept. After 1% of a
        fleet's files grew, 1% of its runs are judged again. Runs are taken one at a time, so a scan
        that builds each when asked holds only those waiting for their judgement."""
        waiting: deque[tuple[str | None, Any]] = deque()

        def misses() -> Iterator[Any]:
            for lin in lineages:
                key = self._lineage_key(lin, config)
                hit = self._load_pickle("judged", key) if key is not None else None
                waiting.append((key, hit))
                if hit is None:
                    yield lin

        expected = len(lineages) if isinstance(lineages, Sized) else getattr(lineages, "expected", None)
        judged = iter(judge(_Counted(misses(), expected)))
        while True:
            result = next(judged, None)
            while waiting and waiting[0][1] is not None:
                yield waiting.popleft()[1]
            if result is None:
                return
            key, _ = waiting.popleft()
            if key is not None and result.status != "error" and not result.error:
                self._store_pickle("judged", key, result)
            yield result

    @staticmethod
    def _lineage_key(lineage: Any, config: Any) -> str | None:
        """A digest of everything judging a training run reads: its lineage (segments, series, pieces,
        boundaries), the settings and the code; None when it holds something without a canonical form."""
        digest = hashlib.blake2b(digest_size=20)
        try:
            _feed(digest, lineage)
        except _NoCanonicalForm:
            return None
        digest.update(_settings_text(config).encode("utf-8", "surrogatepass"))
        digest.update(_code_version().encode())
        return digest.hexdigest()

    def _load_pickle(self, kind: str, key: str) -> Any:
        """An entry pickled into this private cache, or None (absent, damaged, or not ours alone)."""
        import pickle

        path = self.directory / kind / key[:2] / f"{key}.pickle"
        try:
            st = path.stat()
            if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o022:
                return None  # not ours alone: never unpickled
            with open(path, "rb") as f:
                got = pickle.load(f)  # noqa: S301 - our own private cache folder, checked above
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a damaged entry is a miss
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return got

    def _store_pickle(self, kind: str, key: str, value: Any) -> None:
        import pickle

        path = self.directory / kind / key[:2] / f"{key}.pickle"
        try:
            private_mkdir(path.parent)
            atomic_write(path, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, pickle.PicklingError, TypeError, AttributeError, RecursionError):
            return

    # -- per scan

    def scan_key(self, specs: Sequence[str], config: Any) -> str | None:
        """A key that changes with anything a scan's result depends on: the SOURCEs and settings, every
        input file (found as the scan finds them, fingerprinted), klwatch's code; None when a SOURCE
        is remote or cannot be looked at (such a scan is never reused)."""
        from .sources.limits import Budget, reading
        from .sources.local import discover

        parts: list[Any] = [FORMAT, _code_version(), _settings_text(config), list(specs)]
        with reading(Budget(config.limits, what="the scan cache")):
            for spec in specs:
                base, _ = split_pattern(spec)
                if base.startswith(REMOTE_PREFIXES):
                    return None
                root = Path(base).expanduser()
                if not root.exists():
                    return None
                try:
                    warnings: list[str] = []
                    units, errors = discover(root, spec=base, warnings=warnings)
                    parts.append([str(root.resolve()), warnings, [e.message for e in errors]])
                    parts.extend([u.kind, str(u.path), unit_fingerprint(u)] for u in units)
                except Exception:  # noqa: BLE001 - whatever stops the look stops the reuse, not the scan
                    return None
        return _key("scan", json.dumps(parts, sort_keys=True, default=str))

    def load_scan(self, key: str) -> ScanResult | None:
        """The result of the last scan with this key (dated now), or None."""
        from .model import ScanResult

        result = self._load_pickle("scans", key)
        if not isinstance(result, ScanResult):
            return None
        result.generated_at = _now()
        return result

    def store_scan(self, key: str, result: ScanResult) -> None:
        self._store_pickle("scans", key, result)

    # -- per scan, as its reports need it

    def report_memo(self, specs: Sequence[str], settings: str, *, max_seconds: float) -> ReportMemo | None:
        """The memo of what ``klwatch scan`` reports for these SOURCEs and ``settings`` (a text that
        changes with every option that can change a scan's result), or None when it cannot be kept (a
        remote or missing SOURCE, a tree not looked at within ``max_seconds``).

        Taken before the scan: the state of every SOURCE's tree (``fleet_state``), klwatch's code and
        the settings. Served only while all of them are what they were when it was stored, so no read,
        stitch or judgement is done and nothing but this module and ``klwatch.report`` is loaded."""
        state = fleet_state(specs, deadline=time.monotonic() + min(max_seconds, MEMO_WALK_SECONDS))
        if state is None:
            return None
        places = [os.path.realpath(Path(split_pattern(s)[0]).expanduser()) for s in specs]
        key = _key("report", str(FORMAT), _code_version(), settings, json.dumps([list(specs), places]))
        return ReportMemo(self, key, state)

    # -- size

    def size(self) -> int:
        return sum(p.stat().st_size for p in self._entries())

    def prune(self) -> int:
        """Remove least recently used entries until the cache fits ``max_bytes`` (to ``PRUNE_TO`` of
        it); returns the bytes removed."""
        files = []
        for p in self._entries():
            with contextlib.suppress(OSError):
                st = p.stat()
                files.append((st.st_mtime_ns, st.st_size, p))
        total = sum(s for _, s, _ in files)
        if total <= self.max_bytes:
            return 0
        goal, removed = int(self.max_bytes * PRUNE_TO), 0
        for _, size, p in sorted(files, key=lambda f: (f[0], str(f[2]))):
            if total - removed <= goal:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                removed += size
        return removed

    def _entries(self) -> list[Path]:
        from .sources.limits import walk

        out: list[Path] = []
        for sub in ("units", "judged", "scans", "reports"):
            for dirpath, _, filenames in walk(self.directory / sub) if (self.directory / sub).is_dir() else []:
                out.extend(Path(dirpath) / f for f in filenames if not f.startswith(".tmp"))
        return out


@dataclasses.dataclass(frozen=True)
class ReportMemo:
    """One scan's memo entry (``ScanCache.report_memo``): its key and the state of the fleet taken
    before the scan; ``load`` the reports' view of the last scan made in that very state, ``store``
    this one's."""

    cache: ScanCache
    key: str
    state: str

    @property
    def path(self) -> Path:
        return self.cache.directory / "reports" / self.key[:2] / f"{self.key}.json"

    def load(self) -> ScanView | None:
        """The last such scan as its reports read it (``klwatch.report.ScanView``, dated now), or None."""
        from .report import VIEW_FORMAT, ScanView

        try:
            entry = json.loads(self.path.read_bytes())
            if entry.get("format") != FORMAT or entry.get("state") != self.state \
                    or entry["view"].get("format") != VIEW_FORMAT:
                return None
            view = ScanView.from_data(entry["view"], generated_at=_now())
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a damaged entry is a miss, and removed
            with contextlib.suppress(OSError):
                self.path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path)
        return view

    def store(self, result: ScanResult) -> None:
        """Keep what the reports read of ``result``, the scan made from the state this memo took (never
        one with an unreadable part: a time bound passed once need not pass again)."""
        from .report import scan_view, view_json

        if result.any_error:
            return
        view = view_json(scan_view(result))
        if view is None:
            return
        entry = '{"format": %d, "state": %s, "view": %s}' % (FORMAT, json.dumps(self.state), view)
        try:
            private_mkdir(self.path.parent)
            atomic_write(self.path, entry.encode("utf-8", "surrogatepass"))
        except OSError:
            return


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _TooLong(Exception):
    """A tree not looked at within its time: no memo for that scan."""


def fleet_state(specs: Sequence[str], *, deadline: float) -> str | None:
    """A digest of everything a scan of local SOURCEs can depend on: for each SOURCE, its real path
    and, for every file and folder under it (symlinked folders not followed, as the readers do), its
    name, type, permissions, size, mtime, ctime and inode; a symlink's target and what it points to;
    for files named like an input, a hash of their first and last 4 KiB. More than discovery and the
    units' fingerprints look at (a file no reader opens, or the inside of a W&B run folder, changes it
    too): a re-scan reuses a memo only when none of it changed. None for a remote or missing SOURCE,
    or a tree not walked by ``deadline``. Needs nothing but the standard library."""
    h = hashlib.blake2b(digest_size=20)
    try:
        for spec in specs:
            base, _ = split_pattern(spec)
            if base.startswith(REMOTE_PREFIXES):
                return None
            root = Path(base).expanduser()
            try:
                st, lst = os.stat(root), os.lstat(root)
            except OSError:
                return None
            h.update(_text("source", spec, os.path.realpath(root)))
            _feed_entry(h, "", str(root), lst)
            if stat.S_ISDIR(st.st_mode):
                _feed_tree(h, root, deadline)
    except _TooLong:
        return None
    return h.hexdigest()


def _feed_tree(h: Any, root: Path, deadline: float) -> None:
    stack = [("", str(root))]
    while stack:
        if time.monotonic() > deadline:
            raise _TooLong
        rel, top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            h.update(_text("unlistable", rel, exc.errno))
            continue
        h.update(_text("folder", rel, len(entries)))
        subdirs = []
        for e in entries:
            name = f"{rel}/{e.name}" if rel else e.name
            try:
                st = e.stat(follow_symlinks=False)
            except OSError as exc:
                h.update(_text("unstatable", name, exc.errno))
                continue
            _feed_entry(h, name, e.path, st)
            if stat.S_ISDIR(st.st_mode) and e.name not in SKIP_DIRS:  # discovery never looks inside those
                subdirs.append((name, e.path))
        stack.extend(reversed(subdirs))


def _feed_entry(h: Any, name: str, path: str, st: os.stat_result) -> None:
    """One file, folder or symlink (``st`` its lstat) of a fleet's state (``path`` as text: a fleet has
    thousands, and a Path made for each was a tenth of a memo's re-scan)."""
    h.update(_text("entry", name, *_stat_fields(st)))
    if stat.S_ISLNK(st.st_mode):
        try:
            h.update(_text("link", os.readlink(path)))
            st = os.stat(path)
        except OSError as exc:
            h.update(_text("dangling", exc.errno))
            return
        h.update(_text("target", *_stat_fields(st)))
    if stat.S_ISREG(st.st_mode) and is_input_name(os.path.basename(path)):
        h.update(_text("ends", _head_and_tail(path)))


def _stat_fields(st: os.stat_result) -> tuple[int, ...]:
    return st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def _head_and_tail(path: str) -> str:
    """A hash of a regular file's first and last ``HASH_WINDOW`` bytes, or why they cannot be read
    (opened without blocking, and only when still a regular file: a FIFO swapped in is never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return f"unreadable {exc.errno}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        head = os.read(fd, HASH_WINDOW)
        tail = b""
        if st.st_size > HASH_WINDOW:
            os.lseek(fd, st.st_size - HASH_WINDOW, os.SEEK_SET)
            tail = os.read(fd, HASH_WINDOW)
        return f"{_digest(head)}:{_digest(tail)}"
    except OSError as exc:
        return f"unreadable {exc.errno}"
    finally:
        os.close(fd)


def _text(*parts: Any) -> bytes:
    return (repr(parts) + "\n").encode("utf-8", "surrogatepass")


def read_unit_since(unit: Unit, *, root: Path, spec: str, since: Resume | None) -> tuple[UnitRead, Resume | None]:
    """``read_unit``, or for a log that can be read on, reading on from ``since`` (the whole file when
    None); with the Resume a later read can go on from (None for a unit that is read whole)."""
    from .sources.local import read_unit

    resumable = _resumable_reader(unit.kind)
    if resumable is None:
        return read_unit(unit, root=root, spec=spec), None
    kept: list[Resume | None] = [None]

    def reader(path: Path, *, ref: str, source: str) -> list[Segment]:
        segs, kept[0] = resumable(path, ref=ref, source=source, since=since)
        return segs

    got = read_unit(dataclasses.replace(unit, reader=reader), root=root, spec=spec)
    return got, (kept[0] if not any(s.error for s in got.segments) else None)


class _Counted:
    """An iterable with the ``expected`` count of the one it was taken from (what a pool is sized by)."""

    def __init__(self, items: Iterator[Any], expected: int | None) -> None:
        self.items, self.expected = items, expected

    def __iter__(self) -> Iterator[Any]:
        return self.items


class _NoCanonicalForm(Exception):
    """A value whose content cannot be fed to a digest the same way every time."""


def _feed(h: Any, obj: Any, depth: int = 0) -> None:
    """Feed a value's content to a digest, canonically: equal content, equal bytes, however the value's
    objects are shared (a pickle of the same data differs with what it shares, so it cannot key)."""
    import numpy as np

    _feed_into(h, obj, depth, np)


def _feed_into(h: Any, obj: Any, depth: int, np: Any) -> None:
    if depth > 200:
        raise _NoCanonicalForm("too deep")
    tag = type(obj).__name__.encode()
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(b"%s:%s;" % (tag, repr(obj).encode("utf-8", "surrogatepass")))
    elif isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise _NoCanonicalForm("object array")
        h.update(b"nd:%s:%s;" % (obj.dtype.str.encode(), repr(obj.shape).encode()))
        h.update(np.ascontiguousarray(obj).data)
    elif isinstance(obj, np.generic):
        h.update(b"np:%s:%s;" % (obj.dtype.str.encode(), obj.tobytes()))
    elif isinstance(obj, (list, tuple)):
        h.update(b"%s[%d;" % (tag, len(obj)))
        for x in obj:
            _feed_into(h, x, depth + 1, np)
    elif isinstance(obj, dict):
        h.update(b"dict{%d;" % len(obj))
        for k, v in obj.items():
            _feed_into(h, k, depth + 1, np)
            _feed_into(h, v, depth + 1, np)
    elif dataclasses.is_dataclass(obj):
        h.update(b"dc:%s.%s;" % (type(obj).__module__.encode(), tag))
        for f in dataclasses.fields(obj):
            h.update(f.name.encode() + b"=")
            _feed_into(h, getattr(obj, f.name), depth + 1, np)
    else:
        raise _NoCanonicalForm(type(obj).__name__)


def _settings_text(config: Any) -> str:
    """The scan settings as text for a key, without where the work runs (``--jobs``, ``--dask``),
    which never changes what a scan finds."""
    if hasattr(config, "execution"):
        config = dataclasses.replace(config, execution=type(config.execution)())
    return repr(config)


def _resumable_reader(kind: str) -> Any:
    """The reader that can go on from a Resume, for the units of this kind (None: read whole)."""
    if kind == "tensorboard":
        from .sources.tensorboard import read_tensorboard_file_since

        return read_tensorboard_file_since
    if kind == "wandb-offline":
        from .sources import wandb_log

        return getattr(wandb_log, "read_wandb_run_dir_since", None)
    return None


def _key(*parts: str) -> str:
    return hashlib.blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()


_CODE: list[str] = []


def _code_version() -> str:
    """Changes whenever klwatch's code does (any module's size or mtime), so a new version never
    serves a result the old one computed."""
    if not _CODE:
        package = Path(__file__).resolve().parent
        stats = [f"{p.relative_to(package)}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
                 for p in sorted(package.rglob("*.py"))]
        _CODE.append(_key(sys.version, *stats))
    return _CODE[0]


def private_mkdir(path: Path) -> None:
    """Create ``path`` and each missing parent private (0700): ``mkdir(parents=True, mode=...)`` gives the
    parents the umask's 0755, so sub-folders of the cache would be listable by every user."""
    missing = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made meanwhile by another process


def atomic_write(path: Path, data: bytes) -> None:
    """Write beside the final name, then rename: a reader never sees half a file (a cache entry, the
    resume guard's record), and a crash mid-write leaves the old one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_columns(path: Path, cols: dict[str, np.ndarray]) -> None:
    import pyarrow as pa
    import pyarrow.feather as feather

    table = pa.table({name: pa.array(arr) for name, arr in cols.items()})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp")
    os.close(fd)
    try:
        feather.write_feather(table, tmp, compression="lz4")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read_columns(path: Path) -> dict[str, np.ndarray]:
    import pyarrow.feather as feather

    table = feather.read_table(path, memory_map=False)
    return {name: table.column(name).to_numpy() for name in ("step", "value", "wall")}
