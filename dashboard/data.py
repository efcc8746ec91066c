"""What the dashboard shows, computed by the same pipeline the CLI uses, cached in layers.

Reading a source is the expensive step (seconds for a big fleet); stitching and judging its runs
cost a fraction of that. So each layer is cached on what it depends on: the read on the source spec
and a fingerprint of its files (sizes and mtimes, so a new event file or a growing log is read
again) or, for a remote tracker, a short time bucket; the source's runs, stitched and judged by
``pipeline.judge_reads``, also on the whole configuration (the metric choice and the thresholds: a
routine pause inside one tracker piece stays a boundary only where the thresholds judge the KL
reset, so even stitching depends on them). Moving a threshold slider therefore re-judges without
reading anything. The fleet is judged first without the other resume-integrity detectors
(``findings``, several times the cost of the KL verdicts), so the table shows at once; each source's
runs are then judged again by ``pipeline.judge_lineage`` with ``findings`` on in a background thread
(``findings_job``, cached like the rest), and the table gains its finding badges and the shown status
``ok, with findings`` when that is done. The run view takes the open run's findings from that job, or
judges the one run itself when the job is not done yet. Nothing here decides a verdict or a finding:
it calls ``klwatch.pipeline`` (and ``klwatch.comparison`` for a control run).

A page's cost is bounded whatever the fleet: a run is opened by itself only within ``POINT_BUDGET``
points, figures are drawn within a point cap per panel (``charts.PANEL_POINTS``) and cached
(``figure_cached``). What the page derives from the whole fleet (the table, the runs' names in the
pickers, the fleet picture) is cached too, per fleet (``Fleet.identity``: its sources' fingerprints
and the configuration) and findings in: every click reruns the page, and at 1,000 runs deriving them
again would cost more than the click.

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
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from klwatch.comparison import Comparison, compare_runs
from klwatch.dashboard.charts import env_count
from klwatch.dashboard.safety import plain
from klwatch.model import Finding, Lineage, LineageResult, ScanResult, SourceRead
from klwatch.pipeline import ScanConfig, judge_lineage, judge_reads, read_sources
from klwatch.redact import redact_spec, scrub
from klwatch.reference_reset import ReferenceResetConfig
from klwatch.report import to_json
from klwatch.sources import split_pattern
from klwatch.sources.local import SKIP_DIRS

REMOTE_PREFIXES = ("wandb://", "mlflow://", "mlflow+http://", "mlflow+https://")
REMOTE_TTL_SECONDS = 60.0
"""A remote run can grow at any time and has no cheap fingerprint: re-read it at most this often."""
MAX_FINGERPRINT_ENTRIES = 20_000
"""Stat at most this many files; past it, the folder mtimes alone stand for the tree."""
FLAGGED = "reference_reset"
OK_WITH_FINDINGS = "ok, with findings"
"""A display status only (the JSON report's ``status`` stays ``ok``): the KL verdict is fine, but
another resume-integrity detector reported a warning or an error."""
FINDING_SEVERITIES = ("error", "warning")
"""Findings that turn a shown ``ok`` into ``ok, with findings`` (``info`` ones are listed, not raised)."""


POINT_BUDGET = env_count("KLWATCH_DASHBOARD_POINT_BUDGET", 200_000, least=4)
"""A run is opened by itself (the first flagged one) only when its pieces hold at most this many
points: a wrongly stitched lineage of a whole fleet must never be what a page load pays for."""


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


_FINDINGS_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="klwatch-findings")


def _judge_all(lineages: list[Lineage], config: ScanConfig) -> list[LineageResult]:
    return [judge_lineage(lin, config=config) for lin in lineages]


@st.cache_resource(max_entries=32, show_spinner=False)
def findings_job(spec: str, fp: str, judge_key: str, _lineages: tuple[Lineage, ...],
                 _config: ScanConfig) -> Future[list[LineageResult]]:
    """Every run of one SOURCE judged with its findings, in a background thread: the fleet table shows
    at once and gains its finding badges when this is done (started once per read and configuration)."""
    return _FINDINGS_POOL.submit(_judge_all, list(_lineages), _config)


@st.cache_resource(max_entries=24, show_spinner=False)
def figure_cached(key: str, fp: str, judge_key: str, view_key: str, *, _result: LineageResult, _view: dict[str, Any],
                  _control: LineageResult | None = None, _comparison: Comparison | None = None) -> go.Figure:
    """The run view's figure, built once per run, read, thresholds and view options (``view_key``
    spells ``_view``, which holds the control run's key and the step compared from): a click
    elsewhere on the page redraws it without rebuilding it."""
    from klwatch.dashboard import charts

    view = {k: v for k, v in _view.items() if k not in ("control", "compare_from")}
    return charts.run_figure(_result, **view, findings=_result.findings, control=_control, comparison=_comparison,
                             status=shown_status(_result))


@st.cache_resource(max_entries=64, show_spinner=False)
def comparison_cached(control_key: str, resumed_key: str, resume_step: int, judge_key: str, *,
                      _control: LineageResult, _resumed: LineageResult) -> Comparison:
    """``klwatch compare``'s statistic (the core's ``compare_runs``) of two runs of the fleet."""
    return compare_runs(_control, _resumed, resume_step=resume_step)


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
    judge_key: str = ""
    """The configuration the runs were stitched and judged with (``config_key``)."""

    @property
    def identity(self) -> str:
        """What this fleet was made from (its SOURCEs, their fingerprints, the configuration): the cache
        key of what the page derives from it, so a rerun on an unchanged fleet derives nothing again."""
        return repr((list(self.fingerprints.items()), self.judge_key))

    @property
    def specs(self) -> list[str]:
        return list(self.reads)

    @property
    def runs(self) -> dict[str, LineageResult]:
        return dict(zip(self.keys, self.scan.results))

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.scan.results).most_common())


def fingerprints(specs: Sequence[str], *, now: float | None = None) -> dict[str, str]:
    """Each SOURCE's fingerprint, taken once for a whole page (a walk of a 1,000-run tree costs tens of
    milliseconds: the metric picker and the fleet share one)."""
    return {spec: fingerprint(spec, now=now) for spec in dict.fromkeys(specs)}


def load_fleet(specs: Sequence[str], *, config: ScanConfig, findings: bool = False, now: float | None = None,
               fps: dict[str, str] | None = None) -> Fleet:
    """Read (cached), then stitch and judge (cached) every source; unreadable ones keep their error.

    Without ``findings`` only the KL verdicts are computed (the fleet view); with it, everything the
    CLI's report holds (the JSON export): each run of the fleet judged again with its findings.
    ``fps`` are the SOURCEs' fingerprints when the page took them already (``fingerprints``).
    """
    fleet_config = dataclasses.replace(config, findings=False)
    key = config_key(fleet_config)
    fps = {spec: (fps or {}).get(spec) or fingerprint(spec, now=now) for spec in dict.fromkeys(specs)}
    parts: list[ScanResult] = []
    source_of: list[str] = []
    reads: dict[str, SourceRead] = {}
    for spec, fp in fps.items():
        parts.append(scan_cached(spec, fp, key, fleet_config))
        source_of.extend([spec] * len(parts[-1].results))
        if parts[-1].sources:
            reads[spec] = parts[-1].sources[0]
    scan = ScanResult(sources=[s for p in parts for s in p.sources], results=[r for p in parts for r in p.results])
    fleet = Fleet(scan=scan, keys=_unique_keys(scan.results, source_of), source_of=source_of, fingerprints=fps,
                  reads=reads, judge_key=key)
    if findings and config.findings:
        fleet.scan = ScanResult(sources=scan.sources, results=[judged_run(fleet, k, config=config) for k in fleet.keys])
        fleet.judge_key = config_key(config)  # another fleet than the KL-only one: derived views must not mix
    return fleet


def _unique_keys(results: Sequence[LineageResult], source_of: Sequence[str]) -> list[str]:
    """The lineage id of each run, made unique across sources (``id@SOURCE``, the SOURCE redacted: a key
    goes in the URL; then primes)."""
    keys: dict[str, None] = {}  # ordered, and a set to look in (a list made every page of 1,000 runs quadratic)
    seen: Counter[str] = Counter(r.lineage.id for r in results)
    for r, spec in zip(results, source_of):
        key = r.lineage.id if seen[r.lineage.id] == 1 else f"{r.lineage.id}@{redact_spec(spec)}"
        while key in keys:
            key += "'"
        keys[key] = None
    return list(keys)


def judged_run(fleet: Fleet, key: str, *, config: ScanConfig) -> LineageResult:
    """The fleet's run ``key`` judged with its findings (the background job's when it is done, else
    judged now and cached per run and thresholds)."""
    i = fleet.keys.index(key)
    result, spec = fleet.scan.results[i], fleet.source_of[i]
    if not config.findings:
        return result
    position = fleet.source_of[:i].count(spec)
    job = _jobs_started.get((spec, fleet.fingerprints[spec], config_key(config)))
    if job is not None and job.done() and job.exception() is None:
        return job.result()[position]
    return run_cached(spec, fleet.fingerprints[spec], config_key(config), position, result.lineage, config)


_jobs_started: dict[tuple[str, str, str], Future[list[LineageResult]]] = {}
"""The findings jobs this process started (what ``judged_run`` looks at without starting one)."""


def fleet_findings(fleet: Fleet, *, config: ScanConfig, wait: float = 0.0) -> tuple[dict[str, list[Finding]], bool]:
    """Every run's findings that are ready (by run key), and whether some are still being computed.

    Starts the background job of each source that has none (``findings_job``), waits at most ``wait``
    seconds for them, and never blocks longer: the page shows what is there and asks again. Jobs still
    queued for another configuration (a slider moved since) are dropped, so moving a slider five times
    does not queue five fleets' worth of work before the one shown.
    """
    if not config.findings:
        return {}, False
    key = config_key(config)
    jobs: dict[str, Future[list[LineageResult]]] = {}
    for spec in fleet.specs:
        lineages = tuple(r.lineage for r, s in zip(fleet.scan.results, fleet.source_of) if s == spec)
        if not lineages:
            continue
        fp = fleet.fingerprints[spec]
        job = findings_job(spec, fp, key, lineages, config)
        if job.cancelled():  # queued for a configuration left behind, then dropped: queue it again
            findings_job.clear(spec, fp, key, lineages, config)
            job = findings_job(spec, fp, key, lineages, config)
        jobs[spec] = _jobs_started[(spec, fp, key)] = job
    current = set(jobs.values())
    for started, job in list(_jobs_started.items()):  # a slider moved on: drop what still waits for the old one
        if job not in current and job.cancel():
            del _jobs_started[started]
    if wait > 0 and jobs:
        wait_futures(list(jobs.values()), timeout=wait)
    out: dict[str, list[Finding]] = {}
    pending = False
    for spec, job in jobs.items():
        if not job.done():
            pending = True
            continue
        if job.exception() is not None:
            continue
        judged = iter(job.result())
        for run_key, s in zip(fleet.keys, fleet.source_of):
            if s == spec:
                out[run_key] = next(judged).findings
    return out, pending


def raises_status(findings: Sequence[Finding] | None) -> bool:
    return any(f.severity in FINDING_SEVERITIES for f in findings or ())


def shown_status(result: LineageResult, findings: Sequence[Finding] | None = None) -> str:
    """The status the page shows: the run's own, except ``ok`` with a warning or an error finding,
    shown ``ok, with findings`` (a display status: the report's ``status`` field is not changed)."""
    findings = result.findings if findings is None else findings
    return OK_WITH_FINDINGS if result.status == "ok" and raises_status(findings) else result.status


def finding_metrics(finding: Finding, lineage: Lineage) -> list[str]:
    """The series a finding looked at (its detector's ``Finding.metrics``) that the run logs, in the
    detector's order; none when it names none (the finding is then marked on the KL's panel)."""
    logged = set(lineage.metric_names())
    return [n for n in dict.fromkeys(finding.metrics) if n in logged]


IMPLAUSIBLE_RESUMES = 12
"""More resumes than this in one training run is more likely a stitching mistake than a real run."""


def implausible(lin: Lineage) -> list[str]:
    """What makes a stitched run unlikely to be one training run: dozens of resumes, or tracker
    pieces whose configs differ (the core's ``configs_agree``, as stitching compares them)."""
    from klwatch.launch_config import configs_agree

    out = []
    if len(lin.boundaries) > IMPLAUSIBLE_RESUMES:
        out.append(f"{len(lin.boundaries)} resumes in one run")
    configs = [s.config for s in lin.segments if s.config]
    differing = sum(1 for a, b in zip(configs, configs[1:]) if not configs_agree(a, b))
    if differing:
        out.append(f"its tracker pieces logged different configs ({differing} join(s) between differing configs)")
    return out


def lineage_points(lin: Lineage) -> int:
    """Every point of every series in the run's pieces: what opening it could cost at most."""
    return sum(len(s) for p in lin.pieces for s in p.values())


def auto_open(fleet: Fleet, *, findings: dict[str, list[Finding]], budget: int = POINT_BUDGET) -> str | None:
    """The run a page opens by itself: the first flagged one, else the first with findings, else the
    first, among those within the point budget; None when none is (a person opens one by choice)."""
    runs = list(zip(fleet.keys, fleet.scan.results))
    small = [(k, r) for k, r in runs if lineage_points(r.lineage) <= budget]
    for wanted in (lambda k, r: r.status == FLAGGED, lambda k, r: raises_status(findings.get(k)), lambda k, r: True):
        hit = next((k for k, r in small if wanted(k, r)), None)
        if hit is not None:
            return hit
    return None


def clear_caches() -> None:
    """Forget every read (the Reload button): the next run reads every source again."""
    for fn in (read_cached, scan_cached, run_cached, metric_names_cached, findings_job, figure_cached, _table_cached,
               _labels_cached, _names_cached, _choices_cached, _picture_cached):
        fn.clear()
    _jobs_started.clear()


INCOMPLETE_MARK = "⚠ incomplete"
"""What the fleet table's ``incomplete`` column says of a run judged on part of its logs."""


def incomplete_reasons(result: LineageResult) -> list[str]:
    """Why a run the page shows was judged on part of its logs: the core's ``LineageResult.incomplete``
    (a file that could not be read, or was read only up to damage or a cut-off end). None for a run
    with nothing read at all: its status, ``error``, says so already."""
    return [] if result.status == "error" else list(result.incomplete)


def _incomplete_cell(result: LineageResult) -> str:
    """The fleet table's ``incomplete`` cell: the mark and how many files, or empty when whole."""
    reasons = incomplete_reasons(result)
    if not reasons:
        return ""
    return f"{INCOMPLETE_MARK} ({len(reasons)} file{'s' if len(reasons) != 1 else ''})"


def _last_step(lin: Lineage) -> int | None:
    lasts = [seg.step_range()[1] for seg in lin.segments]
    lasts = [x for x in lasts if x is not None]
    return max(lasts) if lasts else None


def fleet_table(fleet: Fleet, findings: dict[str, list[Finding]] | None = None) -> pd.DataFrame:
    """One row per training run: what the fleet table shows (and sorts, and filters). ``findings`` (by
    run key, as far as they are computed) give the shown status and the finding badges; a run whose
    findings are not in yet shows its own status and ``None`` badges."""
    findings = findings or {}
    labels = run_labels_cached(fleet)
    rows = []
    for key, spec, r in zip(fleet.keys, fleet.source_of, fleet.scan.results):
        lin = r.lineage
        worst = r.worst()
        found = findings.get(key)
        rows.append({
            "key": key,
            "run": labels[key],
            "status": shown_status(r, found or []),
            "incomplete": _incomplete_cell(r),
            "why incomplete": scrub("; ".join(incomplete_reasons(r)), _with_credentials(fleet.specs)),
            "findings": None if found is None else list(dict.fromkeys(f.detector for f in found)),
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
    columns = ["key", "run", "status", "incomplete", "why incomplete", "findings", "trackers", "segments", "resumes", "worst score", "KL before", "KL after",
               "at step", "last step", "metric", "source", "error"]
    df = pd.DataFrame(rows, columns=columns)
    for col in ("worst score", "KL before", "KL after"):
        df[col] = df[col].astype("float64")
    for col in ("at step", "last step"):
        df[col] = df[col].astype("Int64")
    return df


def _findings_key(findings: dict[str, list[Finding]]) -> str:
    """Which runs' findings are in: a source's job gives all its runs' at once and never changes them
    for one fleet, so this names the findings' content for that fleet."""
    return hashlib.blake2b("\n".join(sorted(findings)).encode(), digest_size=16).hexdigest()


@st.cache_resource(max_entries=16, show_spinner=False)
def _table_cached(fleet_id: str, findings_id: str, *, _fleet: Fleet, _findings: dict[str, list[Finding]]) -> pd.DataFrame:
    return fleet_table(_fleet, _findings)


def fleet_table_cached(fleet: Fleet, findings: dict[str, list[Finding]]) -> pd.DataFrame:
    """``fleet_table`` once per fleet and per findings in (every click reruns the page: a 1,000-run
    table costs a fifth of a second to build). Shared between sessions: never modify it in place."""
    return _table_cached(fleet.identity, _findings_key(findings), _fleet=fleet, _findings=findings)


@st.cache_resource(max_entries=16, show_spinner=False)
def _labels_cached(fleet_id: str, *, _fleet: Fleet) -> dict[str, str]:
    return run_labels(_fleet)


def run_labels_cached(fleet: Fleet) -> dict[str, str]:
    """``run_labels`` once per fleet (the table, the run picker and the control picker each name every run)."""
    return _labels_cached(fleet.identity, _fleet=fleet)


@st.cache_resource(max_entries=16, show_spinner=False)
def _names_cached(fleet_id: str, secrets: tuple[str, ...], *, _fleet: Fleet) -> dict[str, str]:
    return {k: plain(scrub(name, list(secrets))) for k, name in run_labels_cached(_fleet).items()}


def run_names_cached(fleet: Fleet, *, secrets: Sequence[str]) -> dict[str, str]:
    """Each run as the control picker lists it: its label on one line, every credential masked; once
    per fleet, not once per option on every click (a 1,000-run picker)."""
    return _names_cached(fleet.identity, tuple(secrets), _fleet=fleet)


@st.cache_resource(max_entries=16, show_spinner=False)
def _choices_cached(fleet_id: str, findings_id: str, secrets: tuple[str, ...], *, _fleet: Fleet,
                    _findings: dict[str, list[Finding]]) -> dict[str, str]:
    labels = run_labels_cached(_fleet)
    return {k: plain(scrub(f"{labels[k]} ({shown_status(r, _findings.get(k, []))})", list(secrets)))
            for k, r in zip(_fleet.keys, _fleet.scan.results)}


def run_choices_cached(fleet: Fleet, findings: dict[str, list[Finding]], *, secrets: Sequence[str]) -> dict[str, str]:
    """Each run as the run picker lists it: its label and shown status on one line, every credential
    masked; once per fleet and findings in."""
    return _choices_cached(fleet.identity, _findings_key(findings), tuple(secrets), _fleet=fleet, _findings=findings)


@st.cache_resource(max_entries=16, show_spinner=False)
def _picture_cached(fleet_id: str, *, _fleet: Fleet, _thresholds: ReferenceResetConfig) -> go.Figure | None:
    from klwatch.dashboard import charts

    points = boundary_points(_fleet)
    return None if points.empty else charts.fleet_figure(points, thresholds=_thresholds)


def fleet_picture_cached(fleet: Fleet, *, thresholds: ReferenceResetConfig) -> go.Figure | None:
    """The fleet picture (``charts.fleet_figure`` of ``boundary_points``) once per fleet, None when no
    run has a judged boundary. The thresholds it draws are the ones the fleet was judged with, so the
    fleet's identity names them."""
    return _picture_cached(fleet.identity, _fleet=fleet, _thresholds=thresholds)


def run_labels(fleet: Fleet) -> dict[str, str]:
    """Each run as the page names it: its name, and where two runs share one, the trackers and the
    SOURCE (redacted) too, so a W&B and an MLflow run of one name can be told apart."""
    names = Counter(r.lineage.name for r in fleet.scan.results)
    out: dict[str, str] = {}
    for key, spec, r in zip(fleet.keys, fleet.source_of, fleet.scan.results):
        name = r.lineage.name
        if names[name] > 1:
            trackers = ", ".join(dict.fromkeys(s.kind for s in r.lineage.segments)) or "no tracker"
            name = f"{name} · {trackers} · {_store_label(spec, r.lineage)}"
        out[key] = name
    seen: Counter[str] = Counter(out.values())
    for key, r in zip(fleet.keys, fleet.scan.results):
        if seen[out[key]] > 1:  # same name, trackers and source: the lineage id tells them apart
            out[key] = f"{out[key]} · {r.lineage.id}"
    return out


def _store_label(spec: str, lin: Lineage) -> str:
    """Where a run was read: its store (an MLflow database and experiment, a W&B folder, a server)
    relative to the SOURCE folder when under it, else the SOURCE; redacted either way."""
    store = next((s.store for s in lin.segments if s.store), None)
    base = split_pattern(spec)[0]
    if store and not is_remote(store) and not is_remote(base) and "://" not in store:
        path, _, experiment = store.partition("#")
        try:
            rel = str(Path(path).resolve().relative_to(Path(base).expanduser().resolve()))
        except (ValueError, OSError):
            rel = Path(path).name
        return f"{rel}#{experiment}" if experiment else rel
    return redact_spec(store or spec)


def tracker_link(lin: Lineage) -> tuple[str, str] | None:
    """(label, URL) of the run's own page in its tracker when a segment knows it: the W&B run URL
    (the client's, or wandb.ai/ENTITY/PROJECT/runs/ID from an offline run's meta), or the MLflow UI
    of a server source. Only http(s) URLs, without userinfo; None when no segment knows one."""
    from urllib.parse import quote, urlsplit

    from klwatch.redact import without_userinfo

    for seg in reversed(lin.segments):  # the latest launch: the page a person looks at now
        url = None
        meta = seg.meta or {}
        if seg.kind == "wandb-api" and isinstance(meta.get("url"), str):
            url, label = meta["url"], "W&B run"
        elif seg.kind == "wandb-offline" and meta.get("entity") and meta.get("project") and seg.run_id:
            url = "https://wandb.ai/" + "/".join(quote(str(x), safe="") for x in (meta["entity"], meta["project"]))
            url += f"/runs/{quote(str(seg.run_id), safe='')}"
            label = "W&B run"
        elif seg.kind == "mlflow" and seg.store and seg.store.startswith(("http://", "https://")) \
                and meta.get("experiment_id") and seg.run_id:
            base = seg.store.split("#", 1)[0].rstrip("/")
            url = f"{base}/#/experiments/{quote(str(meta['experiment_id']), safe='')}/runs/{quote(str(seg.run_id), safe='')}"
            label = "MLflow run"
        if url is None:
            continue
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.netloc and not any(c in url for c in " <>\"\'`\n\r\t"):
            return label, without_userinfo(url)
    return None


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
