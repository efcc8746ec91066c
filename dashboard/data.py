"""What the dashboard shows, computed by the same pipeline the CLI uses, cached in three layers.

Reading a source is the expensive step (seconds for a big fleet); building lineages is cheaper and
judging them cheaper still. So each layer is cached on what it depends on: the read on the source
spec and a fingerprint of its files (sizes and mtimes, so a new event file or a growing log is read
again) or, for a remote tracker, a short time bucket; lineages also on the metric choice; verdicts
also on the detector thresholds. Moving a threshold slider therefore re-judges in milliseconds
without reading anything. The fleet is judged without the other resume-integrity detectors (``findings``,
several times the cost of the KL verdicts, and not part of the fleet table): the run view asks for the
open run's findings and the JSON export for everyone's, both through the same pipeline call with
``findings`` on. Nothing here decides a verdict: it calls ``klwatch.pipeline``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from klwatch.model import Lineage, LineageResult, ScanResult, SourceError, SourceRead
from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage, matches_pattern, read_sources
from klwatch.sources import split_pattern
from klwatch.sources.local import SKIP_DIRS

REMOTE_PREFIXES = ("wandb://", "mlflow://", "mlflow+http://", "mlflow+https://")
REMOTE_TTL_SECONDS = 60.0
"""A remote run can grow at any time and has no cheap fingerprint: re-read it at most this often."""
MAX_FINGERPRINT_ENTRIES = 20_000
"""Stat at most this many files; past it, the folder mtimes alone stand for the tree."""
FLAGGED = "reference_reset"


def default_sources() -> list[str]:
    """``sample_runs/`` of the repository the dashboard ships in, else of the working directory."""
    here = Path(__file__).resolve().parent.parent / "sample_runs"
    if here.is_dir():
        return [str(here)]
    return [str(Path.cwd() / "sample_runs")]


def is_remote(spec: str) -> bool:
    return spec.startswith(REMOTE_PREFIXES)


def fingerprint(spec: str, *, now: float | None = None) -> str:
    """What must change for a source to be read again: its files' sizes and mtimes, or the clock."""
    base, _ = split_pattern(spec)
    if is_remote(base):
        now = time.time() if now is None else now
        return f"ttl:{int(now // REMOTE_TTL_SECONDS)}"
    root = Path(base).expanduser()
    h = hashlib.blake2b(digest_size=16)
    try:
        st_root = root.stat()
    except OSError as exc:
        return f"missing:{exc.errno}"
    h.update(f"{st_root.st_size}:{st_root.st_mtime_ns}".encode())
    if root.is_dir():
        entries = 0
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(n for n in dirnames if n not in SKIP_DIRS)
            for name in sorted(filenames):
                entries += 1
                if entries > MAX_FINGERPRINT_ENTRIES:
                    break
                try:
                    s = os.stat(os.path.join(dirpath, name))
                except OSError:
                    continue
                h.update(f"{dirpath}/{name}:{s.st_size}:{s.st_mtime_ns}\n".encode())
            if entries > MAX_FINGERPRINT_ENTRIES:
                try:
                    h.update(f"{dirpath}:{os.stat(dirpath).st_mtime_ns}\n".encode())
                except OSError:
                    pass
    return h.hexdigest()


def config_key(config: object) -> str:
    """A cache key for a frozen config dataclass (its repr lists every field)."""
    return repr(config)


@st.cache_resource(max_entries=32, show_spinner=False)
def read_cached(spec: str, fp: str) -> tuple[SourceRead, str | None]:
    """Read one SOURCE once per fingerprint; the objects are shared and never mutated."""
    ((read, pattern),) = read_sources([spec])
    return read, pattern


@st.cache_resource(max_entries=64, show_spinner=False)
def lineages_cached(spec: str, fp: str, build_key: str, _config: ScanConfig) -> list[Lineage]:
    """The source's training runs (after its ``#PATTERN``); depends on the metric choice, not the thresholds."""
    read, pattern = read_cached(spec, fp)
    return [lin for lin in build_lineages(read.segments, config=_config) if matches_pattern(pattern, lin)]


@st.cache_resource(max_entries=64, show_spinner=False)
def results_cached(spec: str, fp: str, build_key: str, judge_key: str, _config: ScanConfig) -> list[LineageResult]:
    """Every run of the source judged with the given thresholds."""
    return [judge_lineage(lin, config=_config) for lin in lineages_cached(spec, fp, build_key, _config)]


@st.cache_resource(max_entries=256, show_spinner=False)
def run_cached(spec: str, fp: str, build_key: str, judge_key: str, lineage_id: str, _config: ScanConfig) -> LineageResult | None:
    """One run judged with everything (findings too): what the run view shows."""
    for lin in lineages_cached(spec, fp, build_key, _config):
        if lin.id == lineage_id:
            return judge_lineage(lin, config=_config)
    return None


@st.cache_resource(max_entries=32, show_spinner=False)
def metric_names_cached(spec: str, fp: str) -> list[str]:
    """Every metric name the source logs (for the metric picker)."""
    read, _ = read_cached(spec, fp)
    return sorted({n for seg in read.segments for n in seg.series if not n.startswith("_")})


def build_key(config: ScanConfig) -> str:
    """The part of the configuration that shapes lineages (everything but the detector thresholds)."""
    return config_key(dataclasses.replace(config, reference_reset=None))


@dataclass
class Fleet:
    """Every source read and every training run judged, with a stable key per run for the URL."""

    scan: ScanResult
    keys: list[str]
    """One per ``scan.results`` entry: the lineage id, made unique across sources."""
    source_of: list[str]
    """The SOURCE spec each result came from."""
    fingerprints: dict[str, str] = dataclasses.field(default_factory=dict)
    """The fingerprint each source was read at (so a run view asks the cache for the same read)."""

    @property
    def runs(self) -> dict[str, LineageResult]:
        return dict(zip(self.keys, self.scan.results))

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.scan.results).most_common())


def load_fleet(specs: Sequence[str], *, config: ScanConfig, findings: bool = False, now: float | None = None) -> Fleet:
    """Read (cached), stitch (cached) and judge (cached) every source; unreadable ones keep their error.

    Without ``findings`` only the KL verdicts are computed (the fleet view); with it, everything the
    CLI's report holds (the JSON export).
    """
    config = dataclasses.replace(config, findings=findings and config.findings)
    bkey, jkey = build_key(config), config_key(config)
    fps: dict[str, str] = {}
    sources: list[SourceRead] = []
    results: list[LineageResult] = []
    source_of: list[str] = []
    for spec in dict.fromkeys(specs):
        fp = fps[spec] = fingerprint(spec, now=now)
        read, pattern = read_cached(spec, fp)
        judged = results_cached(spec, fp, bkey, jkey, config)
        if pattern and read.segments and not judged:  # a copy: the cached read stays as read
            read = dataclasses.replace(read, errors=read.errors + [
                SourceError(spec, f"{spec}: no training run matches #{pattern}")])
        sources.append(read)
        results.extend(judged)
        source_of.extend([spec] * len(judged))
    keys: list[str] = []
    seen: Counter[str] = Counter(r.lineage.id for r in results)
    for r, spec in zip(results, source_of):
        key = r.lineage.id if seen[r.lineage.id] == 1 else f"{r.lineage.id}@{spec}"
        while key in keys:
            key += "'"
        keys.append(key)
    return Fleet(scan=ScanResult(sources=sources, results=results), keys=keys, source_of=source_of, fingerprints=fps)


def judged_run(fleet: Fleet, key: str, *, config: ScanConfig) -> LineageResult:
    """The fleet's run ``key`` judged with its findings (cached per run and thresholds)."""
    i = fleet.keys.index(key)
    result, spec = fleet.scan.results[i], fleet.source_of[i]
    if not config.findings:
        return result
    full = run_cached(spec, fleet.fingerprints[spec], build_key(config), config_key(config), result.lineage.id, config)
    return full if full is not None else result


def clear_caches() -> None:
    """Forget every read (the Reload button): the next run reads every source again."""
    for fn in (read_cached, lineages_cached, results_cached, run_cached, metric_names_cached):
        fn.clear()


def _last_step(lin: Lineage) -> int | None:
    lasts = [seg.step_range()[1] for seg in lin.segments]
    lasts = [x for x in lasts if x is not None]
    return max(lasts) if lasts else None


def fleet_table(fleet: Fleet) -> pd.DataFrame:
    """One row per training run: what the fleet table shows (and sorts, and filters)."""
    rows = []
    for key, spec, r in zip(fleet.keys, fleet.source_of, fleet.scan.results):
        lin = r.lineage
        worst = r.worst()
        rows.append({
            "key": key,
            "run": lin.name,
            "status": r.status,
            "trackers": ", ".join(dict.fromkeys(s.kind for s in lin.segments)),
            "segments": len(lin.segments),
            "resumes": len(lin.boundaries),
            "worst score": None if worst is None else round(worst.score, 3),
            "KL before": None if worst is None else worst.kl_before,
            "KL after": None if worst is None else worst.kl_after,
            "at step": None if worst is None else worst.boundary.step,
            "last step": _last_step(lin),
            "metric": r.metric or "",
            "source": spec,
            "error": r.error or "",
        })
    columns = ["key", "run", "status", "trackers", "segments", "resumes", "worst score", "KL before", "KL after",
               "at step", "last step", "metric", "source", "error"]
    df = pd.DataFrame(rows, columns=columns)
    for col in ("worst score", "KL before", "KL after"):
        df[col] = df[col].astype("float64")
    for col in ("at step", "last step"):
        df[col] = df[col].astype("Int64")
    return df


def boundary_points(fleet: Fleet) -> pd.DataFrame:
    """Every judged boundary of every run: the fleet picture's points (KL after/before vs score)."""
    rows = []
    for key, r in zip(fleet.keys, fleet.scan.results):
        for v in r.verdicts:
            ratio = None
            if v.kl_before is not None and v.kl_after is not None and v.kl_before > 0:
                ratio = v.kl_after / v.kl_before
            rows.append({"key": key, "run": r.lineage.name, "step": v.boundary.step, "verdict": v.verdict,
                         "score": v.score, "kl_before": v.kl_before, "kl_after": v.kl_after, "ratio": ratio})
    return pd.DataFrame(rows, columns=["key", "run", "step", "verdict", "score", "kl_before", "kl_after", "ratio"])
