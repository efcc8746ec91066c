"""The one path every face uses: sources -> segments -> lineages with boundaries -> verdicts.

The CLI, the CI hook, the watcher, ``compare`` and the dashboard all call ``scan`` (or its parts,
``read_sources``, ``judge_reads``, ``build_lineages`` and ``judge_lineage``); none of them
re-implements a step of it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from .boundaries import BoundaryConfig, infer_boundaries, split_segment
from .metrics import choose_kl_metric, declared_reference_resets, is_negated, step_axis_metric, to_framework_steps
from .model import Boundary, BoundaryVerdict, Finding, Lineage, LineageResult, Segment, Series, SourceError, SourceRead
from .reference_reset import ReferenceResetConfig, judge_boundary, typical_kl
from .sources import read_source, split_pattern
from .stitching import StitchConfig, stitch


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
    findings: bool = True
    """Run the other resume-integrity detectors (``detectors.findings``)."""


@dataclass
class ScanResult:
    sources: list[SourceRead]
    results: list[LineageResult]
    generated_at: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))

    @property
    def any_reset(self) -> bool:
        return any(r.status == "reference_reset" for r in self.results)

    @property
    def any_error(self) -> bool:
        return any(s.errors for s in self.sources) or any(r.status == "error" or r.error for r in self.results)

    @property
    def nothing_read(self) -> bool:
        return not any(not seg.error for s in self.sources for seg in s.segments)


def read_sources(specs: Sequence[str], *, progress: Callable[[str], None] | None = None,
                 read: Callable[[str], SourceRead] = read_source) -> list[tuple[SourceRead, str | None]]:
    """Read every SOURCE; each comes back with its ``#PATTERN`` (if any). ``read`` reads one SOURCE
    without its pattern (the watcher passes its cache's)."""
    out = []
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


def build_lineages(segments: list[Segment], *, config: ScanConfig) -> list[Lineage]:
    """Stitch segments into training runs, put them on one step axis, cut pieces, find boundaries."""
    lineages: list[Lineage] = []
    # the framework's global step continues across restarts where the tracker's restarts: stitch on it
    on_axis = []
    for s in segments:
        a = step_axis_metric(s) if not s.error else None
        on_axis.append(to_framework_steps(s, a) if a else s)
    for lid, name, segs in stitch(on_axis, config=config.stitch):
        data = [s for s in segs if s.kind != "checkpoints" and not s.error]
        ckpt_segs = [s for s in segs if s.kind == "checkpoints"]
        if not data:  # a checkpoint folder alone: its trainer_state log history is the data
            data = [s for s in ckpt_segs if s.series]
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
        # data segments first: piece_segments index into them
        lineage = Lineage(id=lid, name=name, segments=data + [s for s in segs if all(s is not d for d in data)],
                          config=merged_config, checkpoint_steps=checkpoint_steps, step_axis=axis)
        lineage.boundaries = infer_boundaries(data, pieces, metric=metric, checkpoint_steps=checkpoint_steps,
                                              declared_steps=list(config.declared_restarts) + list(config.intentional_resets),
                                              config=config.boundaries)
        lineage.pieces = [p.series for p in pieces]  # declared restarts may have cut a piece
        lineage.piece_segments = [p.segment_index for p in pieces]
        lineage.kl_metric = metric
        lineages.append(lineage)
    return lineages


def _kl(piece: dict[str, Series], metric: str) -> Series | None:
    s = piece.get(metric)
    if s is None or not len(s):
        return None
    if is_negated(metric):
        return Series(s.steps, -s.values, s.wall_times)
    return s


def judge_lineage(lineage: Lineage, *, config: ScanConfig) -> LineageResult:
    """Give a training run its status and every boundary its verdict."""
    errors = [s.error for s in lineage.segments if s.error]
    metric = lineage.kl_metric
    if errors and all(s.error for s in lineage.segments):
        return LineageResult(lineage, None, "error", error="; ".join(errors))
    if metric is None:
        names = [n for n in lineage.metric_names() if not n.startswith("_")]
        shown = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
        msg = (f"No reference-KL metric among the {len(names)} logged ({shown or 'none'}); "
               "name it with --metric." if not config.metrics else
               f"No logged metric matches --metric {' '.join(config.metrics)} (logged: {shown or 'none'}).")
        result = LineageResult(lineage, None, "no_kl_metric", findings=[Finding("kl_metric", None, "warning", msg)])
        _unjudged(result, lineage.boundaries, "No KL logged on both sides of this boundary.")
        # the other resume-integrity checks do not need a KL: run them all the same
        return _with_findings(result, config)
    kl_pieces = [_kl(p, metric) for p in lineage.pieces]
    allkl = np.concatenate([k.values for k in kl_pieces if k is not None]) if any(k is not None for k in kl_pieces) else np.empty(0)
    finite = allkl[np.isfinite(allkl)]
    result = LineageResult(lineage, metric, "ok")
    if len(finite) and np.all(np.abs(finite) < 1e-12):
        result.status = "kl_disabled"
        _unjudged(result, lineage.boundaries, f"{metric} is 0 for the whole run: the KL penalty is off, so there is no reference to reset.")
        return _with_findings(result, config)
    if len(finite) < config.reference_reset.min_points_before + 1:
        result.status = "insufficient_data"
        _unjudged(result, lineage.boundaries, f"Only {len(finite)} finite {metric} point(s) in the whole run: too few to judge.")
        return _with_findings(result, config)

    scale = typical_kl(finite)
    first = next((k for k in kl_pieces if k is not None), None)
    start = None
    if first is not None and len(first) >= 3 and (first.steps[0] <= 1 or first.values[0] < 0.05 * scale):
        start = first
    declared_key = declared_reference_resets(lineage.config)
    for b in lineage.boundaries:
        after = kl_pieces[b.piece_index]
        before = next((kl_pieces[j] for j in range(b.piece_index - 1, -1, -1) if kl_pieces[j] is not None), None)
        if after is None or before is None:
            _unjudged(result, [b], "No KL logged on both sides of this boundary.")
            continue
        v = judge_boundary(b, before, after, start=start, scale=scale, config=config.reference_reset)
        on_purpose = declared_key is not None or any(abs(s - b.step) <= 1 or s == b.resumed_from_step
                                                     for s in config.intentional_resets)
        if v.verdict == "reference_reset" and on_purpose:
            v.verdict = "intentional"
            why = (f"the run's config declares it ({declared_key})" if declared_key
                   else "it was declared with --intentional-reset")
            v.explanation = (f"KL fell from {v.kl_before:.3g} to {v.kl_after:.3g} at the resume at step {b.step}, "
                             f"a reference reset that is intentional: {why}.")
        result.verdicts.append(v)
    verdicts = {v.verdict for v in result.verdicts}
    if "reference_reset" in verdicts:
        result.status = "reference_reset"
    elif "intentional" in verdicts:
        result.status = "intentional"
    if errors:
        result.error = "; ".join(errors)
    return _with_findings(result, config)


def _unjudged(result: LineageResult, boundaries: list[Boundary], why: str) -> None:
    """Boundaries that cannot be judged are still reported, saying why."""
    for b in boundaries:
        result.verdicts.append(BoundaryVerdict(b, "inconclusive", 0.5, None, None, why))


def _with_findings(result: LineageResult, config: ScanConfig) -> LineageResult:
    if not config.findings:
        return result
    try:
        from .findings import run_findings
    except ImportError:
        return result
    try:
        result.findings.extend(run_findings(result))
    except Exception as exc:  # a finding detector's bug must not hide the verdict
        result.findings.append(Finding("findings", None, "warning", f"finding detectors failed: {type(exc).__name__}: {exc}"))
    return result


def judge_reads(reads: Sequence[tuple[SourceRead, str | None]], *, config: ScanConfig) -> list[LineageResult]:
    """Stitch each read into training runs and judge those its ``#PATTERN`` keeps; a pattern that
    keeps none is an error of that read, naming the SOURCE."""
    results: list[LineageResult] = []
    for read, pattern in reads:
        matched = 0
        for lineage in build_lineages(read.segments, config=config):
            if matches_pattern(pattern, lineage):
                matched += 1
                results.append(judge_lineage(lineage, config=config))
        if pattern and read.segments and not matched:
            read.errors.append(SourceError(read.spec, f"{read.spec}: no training run matches #{pattern}"))
    return results


def scan(specs: Sequence[str], *, config: ScanConfig = ScanConfig(),
         progress: Callable[[str], None] | None = None, read: Callable[[str], SourceRead] = read_source) -> ScanResult:
    """Read, stitch and judge: the whole of ``klwatch scan`` (and of each ``klwatch watch`` poll,
    which reads through its cache)."""
    reads = read_sources(specs, progress=progress, read=read)
    return ScanResult(sources=[r for r, _ in reads], results=judge_reads(reads, config=config))
