"""The one path every face uses: sources -> segments -> lineages with boundaries -> verdicts.

The CLI, the CI hook, the watcher, ``compare`` and the dashboard all call ``scan`` (or its parts,
``read_sources``, ``judge_reads``, ``build_lineages`` and ``judge_lineage``); none of them
re-implements a step of it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from .boundaries import BoundaryConfig, Piece, infer_boundaries, split_segment
from .fleet_memory import SegmentStore, keep_for_reports
from .metrics import choose_kl_metric, is_negated
from .model import Finding, Lineage, LineageResult, ScanResult, Segment, Series, SourceRead, cadence_of, extent_of
from .parallel import Execution, is_remote, read_one
from .preference_reset import PreferenceResetConfig, PreferenceResetDetector
from .reference_reset import ReferenceResetConfig, ReferenceResetDetector
from .sources import read_source, split_pattern
from .sources.limits import ReadLimits
from .sources.local import ReadUnit, Unit, UnitRead
from .sources.pool import pooling
from .step_axis import step_axis_metric, to_framework_steps
from .stitching import StitchConfig, effective_configs, starts_over, stitch


@dataclass(frozen=True)
class ScanConfig:
    """Everything a scan can be told; kept apart from the computation (one object, passed down)."""

    metrics: tuple[str, ...] = ()
    """``--metric`` names or globs; empty for the recognised reference-KL names."""
    intentional_resets: tuple[int, ...] = ()
    """``--intentional-reset STEP``: resets the user declares on purpose."""
    declared_restarts: tuple[int, ...] = ()
    """``--restart STEP``: restarts the logs do not show."""
    stitch: StitchConfig = field(default_factory=StitchConfig)
    boundaries: BoundaryConfig = field(default_factory=BoundaryConfig)
    reference_reset: ReferenceResetConfig = field(default_factory=ReferenceResetConfig)
    preference_reset: PreferenceResetConfig | None = None
    """The preference detector's thresholds; None: the same as ``reference_reset``'s (``--reset-score``
    and the dashboard's sliders move both)."""
    limits: ReadLimits = field(default_factory=ReadLimits)
    """Bytes and wall time reading one SOURCE may cost (``--max-read-bytes``, ``--max-read-seconds``)."""
    findings: bool = True
    """Run the other resume-integrity detectors (``klwatch.findings``)."""
    finding_configs: tuple[tuple[str, object], ...] = ()
    """``(detector name, its config)`` pairs for the finding detectors (e.g.
    ``("lr_schedule_restart", LrScheduleRestartConfig(min_jump=0.3))``); the others keep their defaults."""
    execution: Execution = field(default_factory=Execution)
    """Where the work runs (``--jobs``, ``--dask``): never what it finds. This process by default;
    the command line uses every core."""
    chart_points: int | None = None
    """Keep of each judged training run only what the reports read (verdicts, findings, its members'
    summaries, its KL thinned to this many points per piece: ``fleet_memory.keep_for_reports``), and
    hold the pieces read on disk until their run is built: a scan's memory then stays flat in the
    fleet's size (the command line's setting). None keeps every series of every run, for callers that
    look into the lineages (``compare``, the dashboard, Python code re-judging them)."""

    def __post_init__(self) -> None:
        if self.finding_configs:  # a typo must not leave a detector silently at its defaults
            from .findings import DETECTORS

            unknown = [name for name, _ in self.finding_configs if name not in DETECTORS]
            if unknown:
                raise ValueError(f"unknown finding detector(s) in finding_configs: {', '.join(unknown)} "
                                 f"(known: {', '.join(DETECTORS)})")

    def reset_detector(self) -> ReferenceResetDetector:
        """The reference-reset detector this scan judges with."""
        return ReferenceResetDetector(config=self.reference_reset, intentional_resets=self.intentional_resets,
                                      metrics=self.metrics)

    def detector_for(self, lineage: Lineage) -> ReferenceResetDetector | PreferenceResetDetector:
        """The detector that judges ``lineage``: the KL one, or for a run that logs no KL but a preference
        trainer's implicit rewards (DPO and kin), the preference one (unless ``--metric`` names a series)."""
        if lineage.kl_metric is None and not self.metrics and PreferenceResetDetector.applies(lineage):
            config = self.preference_reset or PreferenceResetConfig(**vars(self.reference_reset))
            return PreferenceResetDetector(config=config, intentional_resets=self.intentional_resets)
        return self.reset_detector()


def read_sources(specs: Sequence[str], *, progress: Callable[[str], None] | None = None,
                 read: Callable[[str], SourceRead] = read_source) -> list[tuple[SourceRead, str | None]]:
    """Read every SOURCE; each comes back with its ``#PATTERN`` (if any). ``read`` reads one SOURCE
    without its pattern (the watcher passes its cache's)."""
    out = []
    with pooling(specs):  # the local SOURCEs are read as one fleet (``sources.pool``)
        for spec in specs:
            base, pattern = split_pattern(spec)
            if progress:
                progress(spec)
            read_one = read(base)
            read_one.spec = spec
            out.append((read_one, pattern))
    return out


def matches_pattern(pattern: str | None, lineage: Lineage) -> bool:
    """SOURCE#PATTERN: a training run matches by its name, id, or any member run's id or name."""
    if not pattern:
        return True
    names = [lineage.name, lineage.id] + [s.run_id or "" for s in lineage.segments] + [s.name or "" for s in lineage.segments]
    return any(n and fnmatch.fnmatchcase(n, pattern) for n in names)


def on_step_axis(segment: Segment) -> Segment:
    """``segment`` on the framework's global step where it logs one: that step continues across
    restarts where the tracker's restarts, so stitching and boundaries work on it."""
    axis = step_axis_metric(segment) if not segment.error else None
    return to_framework_steps(segment, axis) if axis else segment


def keep_pieces(store: SegmentStore, segments: Sequence[Segment]) -> list[Segment]:
    """Put each piece, on its step axis, in ``store``: the summaries to stitch on (``fleet_memory``)."""
    return store.keep(on_step_axis(s) for s in segments)


@dataclass
class Stitched:
    """One group of pieces stitching made a training run of (their summaries), and why."""

    id: str
    name: str
    segments: list[Segment]
    notes: list[str]


def stitch_summaries(summaries: list[Segment], *, config: ScanConfig) -> list[Stitched]:
    """Stitch pieces into training runs from their summaries (all stitching reads of a piece)."""
    notes: dict[int, list[str]] = {}
    groups = stitch(summaries, config=config.stitch, metrics=tuple(config.metrics), notes=notes)
    return [Stitched(lid, name, segs, [n for s in segs for n in notes.get(id(s), [])]) for lid, name, segs in groups]


def build_lineages(segments: list[Segment], *, config: ScanConfig) -> list[Lineage]:
    """Stitch segments into training runs, put them on one step axis, cut pieces, find boundaries."""
    store = SegmentStore.in_memory()
    return [lin for group in stitch_summaries(keep_pieces(store, segments), config=config)
            for lin in lineages_of(group, [store.take(s) for s in group.segments], config=config)]


def lineages_of(group: Stitched, segs: list[Segment], *, config: ScanConfig) -> list[Lineage]:
    """The training run(s) of one stitched group, given its pieces whole (``segs``, in the group's
    order): pieces cut, boundaries found, a from-scratch re-run in the same tracker piece apart."""
    lid, name = group.id, group.name
    order = member_order(segs)
    data = [segs[i] for i in _data_indices(segs)]
    ckpt_segs = [s for s in segs if s.kind == "checkpoints"]
    axes = [s.meta.get("step_axis") for s in data if s.meta.get("step_axis")]
    axis = axes[0] if axes else None
    metric = choose_kl_metric(data, patterns=config.metrics or None)
    checkpoint_steps = sorted({c for s in ckpt_segs for c in s.checkpoint_steps})
    pieces = []
    for i, s in enumerate(data):
        pieces.extend(split_segment(s, i, prefer=metric, config=config.boundaries))
    merged_config: dict = {}
    for s in data or segs:
        merged_config.update(s.config)
    runs = _from_scratch_runs(pieces, metric=metric, checkpoint_steps=checkpoint_steps)
    lineages = []
    for k, run_pieces in enumerate(runs):
        # data segments first: piece_segments index into them
        lineage = Lineage(id=lid if k == 0 else f"{lid}#run{k + 1}", name=name if k == 0 else f"{name} (run {k + 1})",
                          segments=[segs[i] for i in order],
                          config=merged_config, checkpoint_steps=checkpoint_steps, step_axis=axis,
                          notes=list(group.notes))
        if len(runs) > 1:
            first = extent_of(run_pieces[0].series, prefer=(metric,) if metric else ())[0]
            lineage.notes.append(
                f"run {k + 1} of {len(runs)} logged into the same tracker piece: " +
                ("the steps go back to the first step with no checkpoint behind them, so a new run from scratch "
                 f"starts at step {first}" if k else "later rows start the run again from scratch"))
        lineage.boundaries = infer_boundaries(data, run_pieces, metric=metric, checkpoint_steps=checkpoint_steps,
                                              declared_steps=list(config.declared_restarts) + list(config.intentional_resets),
                                              config=config.boundaries, configs=effective_configs(data))
        lineage.pieces = [p.series for p in run_pieces]  # declared restarts may have cut a piece
        lineage.piece_segments = [p.segment_index for p in run_pieces]
        lineage.kl_metric = metric
        lineage.kl_negated = metric is not None and is_negated(metric)
        settle_tentative(lineage, config=config)
        lineages.append(lineage)
    return lineages


def _data_indices(segs: Sequence[Segment]) -> list[int]:
    """Which pieces of a stitched group hold its training data: the tracker pieces read, or for a
    checkpoint folder alone, its trainer_state log history."""
    data = [i for i, s in enumerate(segs) if s.kind != "checkpoints" and not s.error]
    return data or [i for i, s in enumerate(segs) if s.kind == "checkpoints" and s.series]


def member_order(segs: Sequence[Segment]) -> list[int]:
    """The order of a training run's ``segments`` as indices into its stitched group: its data pieces
    first (``piece_segments`` index into them), then the others. The same on summaries as on the
    pieces whole, so a kept result's members can be the summaries the scan read."""
    data = _data_indices(segs)
    return data + [i for i in range(len(segs)) if i not in data]


def _from_scratch_runs(pieces: list[Piece], *, metric: str | None, checkpoint_steps: list[int]) -> list[list[Piece]]:
    """Split a run's pieces where its steps go back to its first step inside one tracker piece (a table
    or a tracker run that a from-scratch re-run was appended to): no checkpoint lies behind the first
    step, so that is a new training run, not a resume. Across tracker pieces stitching decides."""
    prefer = (metric,) if metric else ()
    runs: list[list[Piece]] = []
    run_first: int | None = None
    for p in pieces:
        first = extent_of(p.series, prefer=prefer)[0]
        rewound_in_place = "step_rewind" in p.cut_evidence
        every = cadence_of(runs[-1][0].series, prefer=prefer) if runs else 1
        if runs and rewound_in_place and starts_over(first, run_first, every) and \
                not any(first is not None and c < first for c in checkpoint_steps):
            runs.append([p])
            run_first = first
            continue
        if not runs:
            runs.append([p])
            run_first = first
        else:
            runs[-1].append(p)
    return runs or [[]]


def settle_tentative(lineage: Lineage, *, config: ScanConfig) -> None:
    """Keep a tentative boundary (a pause like the run's routine ones, inside one tracker piece) only
    where the KL says the reference was reset there; elsewhere join its two pieces back and note it.

    A run re-attached to its tracker run (``MLFLOW_RUN_ID``) between two checkpoints shows nothing but
    such a pause; evaluation and checkpoint saving show the same. A KL that collapses to ~0 and
    regrows at the pause is the rebuilt reference whatever caused the pause; a KL that goes on is not
    worth a boundary.
    """
    detector = config.detector_for(lineage)
    for b in sorted([b for b in lineage.boundaries if b.tentative], key=lambda b: -b.piece_index):
        if detector.confirms_reset(lineage, b):
            b.tentative = False
            lineage.notes.append(f"a pause before step {b.step} inside one tracker piece is taken as a restart: "
                                 "the KL collapses there and regrows")
            continue
        k = b.piece_index
        merged = dict(lineage.pieces[k - 1])
        for name, ser in lineage.pieces[k].items():
            merged[name] = Series.concat([merged[name], ser]) if name in merged else ser
        lineage.pieces[k - 1:k + 1] = [merged]
        del lineage.piece_segments[k]
        lineage.boundaries.remove(b)
        for other in lineage.boundaries:
            if other.piece_index > k:
                other.piece_index -= 1


def judge_lineage(lineage: Lineage, *, config: ScanConfig) -> LineageResult:
    """Give a training run its status and every boundary its verdict (the reference-reset detector),
    then the other resume-integrity detectors' findings (they do not need a KL)."""
    result = config.detector_for(lineage).judge(lineage)
    if result.status == "error" or not config.findings:
        return result
    from .findings import run_findings  # the finding detectors load only when a scan runs them

    try:
        result.findings.extend(run_findings(result, configs=dict(config.finding_configs)))
    except Exception as exc:  # a finding detector's bug must not hide the verdict
        result.findings.append(Finding("findings", None, "warning", f"finding detectors failed: {type(exc).__name__}: {exc}"))
    return result


def judge_kept(lineage: Lineage, *, config: ScanConfig) -> LineageResult:
    """``judge_lineage``, then what the scan keeps of it: all of it, or with ``config.chart_points``
    what the reports read (``fleet_memory.keep_for_reports``)."""
    result = judge_lineage(lineage, config=config)
    return result if config.chart_points is None else keep_for_reports(result, points=config.chart_points)


Judge = Callable[[Iterable[Lineage]], Iterable[LineageResult]]
"""Judges training runs handed over one at a time, giving their results in the same order."""


def judge_reads(reads: Sequence[tuple[SourceRead, str | None]], *, config: ScanConfig,
                judge: Judge | None = None, store: SegmentStore | None = None) -> ScanResult:
    """Stitch each read into training runs and judge those its ``#PATTERN`` keeps; a pattern that
    keeps none is said on that SOURCE in the result. The local SOURCEs read as one fleet
    (``sources.pool``) are stitched together, their runs where the first of them stands.

    Stitching works on the pieces' summaries; then each training run is built from its pieces, taken
    from ``store``, judged and kept (``judge_kept``) before the next is built, so only the runs being
    judged are held whole. Without ``store`` the reads hold the pieces themselves and are left as they
    were (the dashboard and the watcher cache them). ``judge`` judges the runs in order (``judge_each``
    by default; ``klwatch.parallel`` hands them to workers, the scan cache serves those judged before)."""
    if store is None:
        store = SegmentStore.in_memory()
        summaries = [keep_pieces(store, read.segments) for read, _ in reads]
    else:
        summaries = [read.segments for read, _ in reads]
    plan = Planned(reads, summaries, config=config, store=store)
    results = [plan.with_members(r) for r in (judge or functools.partial(judge_each, config=config))(plan)]
    return ScanResult(sources=plan.sources(), results=results)


class Planned:
    """A scan's training runs, stitched from the reads' summaries and built one at a time as they are
    judged (an iterable of Lineages; ``expected`` of them at least, to size a pool by)."""

    def __init__(self, reads: Sequence[tuple[SourceRead, str | None]], summaries: list[list[Segment]], *,
                 config: ScanConfig, store: SegmentStore) -> None:
        self.reads, self.config, self.store = reads, config, store
        self.groups: list[tuple[Stitched, int | None]] = []
        pooled: list[Segment] = []
        pooled_at: int | None = None
        for i, ((read, _), segs) in enumerate(zip(reads, summaries)):
            if read.pooled_under is not None:
                pooled.extend(segs)  # read from the pool's parent: stitched as one fleet, below
                pooled_at = len(self.groups) if pooled_at is None else pooled_at
                continue
            self.groups.extend((g, i) for g in stitch_summaries(segs, config=config))
        if pooled_at is not None:
            in_order = _in_source_order(stitch_summaries(pooled, config=config), pooled)
            self.groups[pooled_at:pooled_at] = [(g, None) for g in in_order]
        self._uses = Counter(id(s) for group, _ in self.groups for s in group.segments)
        """How many groups each summary is in (a checkpoint folder can serve several runs)."""
        self.names: dict[int, list[str]] = {i: [] for i in range(len(reads))}
        self.matched: set[int] = set()
        self._members: deque[list[Segment]] = deque()

    @property
    def expected(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Iterator[Lineage]:
        for k, (group, i) in enumerate(self.groups):
            self.groups[k] = (None, i)  # type: ignore[assignment]  # built: its summaries live on in the runs
            pattern = self.reads[i][1] if i is not None else None
            for lin in lineages_of(group, self._take(group), config=self.config):
                if pattern:  # what to say when the pattern keeps none
                    self.names[i].append(lin.name)  # type: ignore[index]
                if matches_pattern(pattern, lin):
                    self.matched.add(i if i is not None else -1)
                    self._members.append([group.segments[k] for k in member_order(group.segments)])
                    yield lin

    def _take(self, group: Stitched) -> list[Segment]:
        """The group's pieces whole, from the store; one no other group needs is let go of there."""
        pieces = [self.store.take(s) for s in group.segments]
        for s in group.segments:
            self._uses[id(s)] -= 1
            if not self._uses[id(s)]:
                del self._uses[id(s)]
                self.store.forget(s)
        return pieces

    def with_members(self, result: LineageResult) -> LineageResult:
        """A judged run (they come back in the order handed out) as the scan keeps it: with
        ``chart_points``, its members are the very summaries its SOURCE's read holds (one copy each)."""
        members = self._members.popleft()
        if self.config.chart_points is None:
            return result
        return replace(result, lineage=replace(result.lineage, segments=members))

    def sources(self) -> list[SourceRead]:
        """The reads, each ``#PATTERN`` that kept none of its SOURCE's runs said on it (once iterated)."""
        out = []
        for i, (read, pattern) in enumerate(self.reads):
            if read.pooled_under is None and pattern and read.segments and i not in self.matched:
                read = replace(read, unmatched=_unmatched(read.spec, pattern, self.names[i]))
            out.append(read)
        return out


def _in_source_order(groups: list[Stitched], segments: list[Segment]) -> list[Stitched]:
    """A pool's training runs in the order of the SOURCEs given (by the earliest piece of each), as separate
    SOURCEs list theirs; stitching's own order within one SOURCE."""
    where: dict[tuple[str, str], int] = {}
    for i, s in enumerate(segments):
        where.setdefault((s.kind, s.ref), i)
    last = len(segments)
    return sorted(groups, key=lambda g: min((where.get((s.kind, s.ref), last) for s in g.segments), default=last))


def _unmatched(spec: str, pattern: str, names: Sequence[str]) -> str:
    """What to say of a ``#PATTERN`` that kept none of a SOURCE's training runs: the ones there, so the user
    can name one (at most 20 of them listed)."""
    names = sorted(set(names))
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return (f"{spec}: no training run matches #{pattern} (a glob on the run's name or id; runs there: "
            f"{shown or 'none'})")


def scan(specs: Sequence[str], *, config: ScanConfig = ScanConfig(),
         progress: Callable[[str], None] | None = None, read: Callable[[str], SourceRead] | None = None,
         read_unit: ReadUnit | None = None, judge_cache: JudgeCache | None = None) -> ScanResult:
    """Read, stitch and judge: the whole of ``klwatch scan`` (and of each ``klwatch watch`` poll,
    which reads through its cache). Each SOURCE is read within ``config.limits``.

    ``read`` reads one whole SOURCE (the watcher's cache), in this process; otherwise local SOURCEs
    are read unit by unit with ``read_unit`` (default ``sources.local.read_unit``; it must pickle
    when ``config.execution`` hands units to worker processes or a Dask cluster). ``judge_cache`` (the
    scan cache) gives back the judgement of a training run judged before with the very same data,
    and judges only the others. With ``config.chart_points`` the pieces read wait on disk until their
    training run is built (``fleet_memory``), so memory stays flat in the fleet's size."""
    if not config.execution.in_process:
        from .parallel import scan_on_workers

        return scan_on_workers(specs, config=config, progress=progress, read=read, read_unit=read_unit,
                               judge_cache=judge_cache)
    judge: Judge = functools.partial(judge_each, config=config)
    if judge_cache is not None:
        judge = functools.partial(judge_cache.judge_through, config=config, judge=judge)
    if read is None and config.chart_points is None:
        read = functools.partial(read_one, limits=config.limits, read_unit=read_unit) if read_unit is not None \
            else functools.partial(read_source, limits=config.limits)
    if read is not None:
        return judge_reads(read_sources(specs, progress=progress, read=read), config=config, judge=judge)
    with SegmentStore.spilled() as store:
        kept = functools.partial(read_kept, limits=config.limits, read_unit=read_unit, store=store)
        return judge_reads(read_sources(specs, progress=progress, read=kept), config=config, judge=judge,
                           store=store)


def scan_store(config: ScanConfig) -> contextlib.AbstractContextManager[SegmentStore | None]:
    """Where a scan's pieces wait for their run to be built when only what the reports read is kept
    (``chart_points``): on disk. None otherwise: the reads keep their pieces, as the result does."""
    return SegmentStore.spilled() if config.chart_points is not None else contextlib.nullcontext(None)


def read_kept(spec: str, *, limits: ReadLimits, read_unit: ReadUnit | None, store: SegmentStore) -> SourceRead:
    """One SOURCE read in this process, each piece put in ``store`` as soon as read (a local SOURCE unit by
    unit), its read holding the summaries."""
    from .sources.local import read_unit as plain_read_unit

    got = read_one(spec, limits=limits, read_unit=KeptUnits(read_unit or plain_read_unit, store))
    if is_remote(spec):
        got.segments = keep_pieces(store, got.segments)
    return got


@dataclass(frozen=True)
class KeptUnits:
    """A ``ReadUnit`` whose Segments go to ``store`` as soon as read, their summaries given back."""

    read_unit: ReadUnit
    store: SegmentStore

    def __call__(self, unit: Unit, *, root: Path, spec: str) -> UnitRead:
        got = self.read_unit(unit, root=root, spec=spec)
        return replace(got, segments=keep_pieces(self.store, got.segments))


def judge_each(lineages: Iterable[Lineage], *, config: ScanConfig) -> Iterator[LineageResult]:
    """``judge_kept`` on each training run, in order, in this process."""
    for lin in lineages:
        yield judge_kept(lin, config=config)


class JudgeCache(Protocol):
    """Judgements kept between scans (``klwatch.scan_cache.ScanCache``)."""

    def judge_through(self, lineages: Iterable[Lineage], *, config: ScanConfig,
                      judge: Judge) -> Iterable[LineageResult]: ...
