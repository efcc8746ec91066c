"""What the dashboard shows, computed by the same pipeline the CLI uses, cached in layers.

Reading a source is the expensive step (seconds for a big fleet); stitching and judging its runs
cost a fraction of that. So each layer is cached on what it depends on: the read on the source spec
and a fingerprint of its files (sizes and mtimes, so a new event file or a growing log is read
again) or, for a remote tracker, a short time bucket; the source's runs, stitched and judged by
``pipeline.judge_reads``, also on the whole configuration (the metric choice and the thresholds: a
routine pause inside one tracker piece stays a boundary only where the thresholds judge the KL
reset, so even stitching depends on them). Moving a threshold slider therefore re-judges without
reading anything. The fleet is judged without the other resume-integrity detectors (``findings``,
several times the cost of the KL verdicts, and not part of the fleet table): the run view asks for
the open run's findings and the JSON export for everyone's, each run judged again by
``pipeline.judge_lineage`` with ``findings`` on. Nothing here decides a verdict: it calls
``klwatch.pipeline``.

What leaves this module for the page is safe to show: a source is named redacted (``redact_spec``) in
run keys and the fleet table, errors are scrubbed, and the JSON export is the report with every spec
redacted and every credential masked.
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

from klwatch.model import Lineage, LineageResult, ScanResult, SourceRead
from klwatch.pipeline import ScanConfig, judge_lineage, judge_reads, read_sources
from klwatch.redact import redact_spec, scrub
from klwatch.report import to_json
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
def scan_cached(spec: str, fp: str, judge_key: str, _config: ScanConfig) -> ScanResult:
    """One SOURCE stitched and judged by the pipeline (``judge_reads``): the training runs its
    ``#PATTERN`` keeps, and the read as the report shows it (a copy carrying the error when the
    pattern keeps none; the cached read itself is never touched)."""
    return judge_reads([read_cached(spec, fp)], config=_config)


@st.cache_resource(max_entries=256, show_spinner=False)
def run_cached(spec: str, fp: str, judge_key: str, position: int, _lineage: Lineage, _config: ScanConfig) -> LineageResult:
    """One run judged with everything (findings too): what the run view shows and the export holds.
    ``position`` is the run's place among its source's runs (the lineage judged is that one)."""
    return judge_lineage(_lineage, config=_config)


@st.cache_resource(max_entries=32, show_spinner=False)
def metric_names_cached(spec: str, fp: str) -> list[str]:
    """Every metric name the source logs (for the metric picker)."""
    read, _ = read_cached(spec, fp)
    return sorted({n for seg in read.segments for n in seg.series if not n.startswith("_")})


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
    reads: dict[str, SourceRead] = dataclasses.field(default_factory=dict)
    """Each SOURCE spec as given (in order) and what reading it gave."""

    @property
    def specs(self) -> list[str]:
        return list(self.reads)

    @property
    def runs(self) -> dict[str, LineageResult]:
        return dict(zip(self.keys, self.scan.results))

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.scan.results).most_common())


def load_fleet(specs: Sequence[str], *, config: ScanConfig, findings: bool = False, now: float | None = None) -> Fleet:
    """Read (cached), then stitch and judge (cached) every source; unreadable ones keep their error.

    Without ``findings`` only the KL verdicts are computed (the fleet view); with it, everything the
    CLI's report holds (the JSON export): each run of the fleet judged again with its findings.
    """
    fleet_config = dataclasses.replace(config, findings=False)
    key = config_key(fleet_config)
    fps: dict[str, str] = {}
    parts: list[ScanResult] = []
    source_of: list[str] = []
    reads: dict[str, SourceRead] = {}
    for spec in dict.fromkeys(specs):
        fp = fps[spec] = fingerprint(spec, now=now)
        parts.append(scan_cached(spec, fp, key, fleet_config))
        source_of.extend([spec] * len(parts[-1].results))
        if parts[-1].sources:
            reads[spec] = parts[-1].sources[0]
    scan = ScanResult(sources=[s for p in parts for s in p.sources], results=[r for p in parts for r in p.results])
    fleet = Fleet(scan=scan, keys=_unique_keys(scan.results, source_of), source_of=source_of, fingerprints=fps,
                  reads=reads)
    if findings and config.findings:
        fleet.scan = ScanResult(sources=scan.sources, results=[judged_run(fleet, k, config=config) for k in fleet.keys])
    return fleet


def _unique_keys(results: Sequence[LineageResult], source_of: Sequence[str]) -> list[str]:
    """The lineage id of each run, made unique across sources (``id@SOURCE``, the SOURCE redacted: a key
    goes in the URL; then primes)."""
    keys: list[str] = []
    seen: Counter[str] = Counter(r.lineage.id for r in results)
    for r, spec in zip(results, source_of):
        key = r.lineage.id if seen[r.lineage.id] == 1 else f"{r.lineage.id}@{redact_spec(spec)}"
        while key in keys:
            key += "'"
        keys.append(key)
    return keys


def judged_run(fleet: Fleet, key: str, *, config: ScanConfig) -> LineageResult:
    """The fleet's run ``key`` judged with its findings (cached per run and thresholds)."""
    i = fleet.keys.index(key)
    result, spec = fleet.scan.results[i], fleet.source_of[i]
    if not config.findings:
        return result
    position = fleet.source_of[:i].count(spec)
    return run_cached(spec, fleet.fingerprints[spec], config_key(config), position, result.lineage, config)


def clear_caches() -> None:
    """Forget every read (the Reload button): the next run reads every source again."""
    for fn in (read_cached, scan_cached, run_cached, metric_names_cached):
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
            "source": redact_spec(spec),  # hidden, but the whole frame goes to the browser
            "error": scrub(r.error or "", _with_credentials(fleet.specs)),
        })
    columns = ["key", "run", "status", "trackers", "segments", "resumes", "worst score", "KL before", "KL after",
               "at step", "last step", "metric", "source", "error"]
    df = pd.DataFrame(rows, columns=columns)
    for col in ("worst score", "KL before", "KL after"):
        df[col] = df[col].astype("float64")
    for col in ("at step", "last step"):
        df[col] = df[col].astype("Int64")
    return df


def _with_credentials(specs: Sequence[str]) -> list[str]:
    """The specs that carry something ``redact_spec`` hides: what ``scrub`` must also look for alone."""
    return [s for s in specs if redact_spec(s) != s]


def report_json(scan: ScanResult, *, secrets: Sequence[str] = ()) -> str:
    """The JSON report (``klwatch scan --format json``) as the page exports it: every source spec
    redacted and every credential (the sources', the environment's) masked wherever a message quotes it."""
    shown = dataclasses.replace(scan, sources=[dataclasses.replace(s, spec=redact_spec(s.spec)) for s in scan.sources])
    return scrub(to_json(shown), [*secrets, *_with_credentials([s.spec for s in scan.sources])])


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
