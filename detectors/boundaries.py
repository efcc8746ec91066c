"""Where a training run was restarted: cut segments into pieces and put a boundary between pieces.

A restart leaves marks that differ by framework and tracker: a new tracker run or event file, steps
that go back (a resume from an older checkpoint), a runtime counter that starts again, a wall-clock
gap far beyond the run's step time, a checkpoint at the step before. Between two tracker pieces every
mark found is kept as evidence. Inside one piece (a run re-attached in place) a cut needs strong
evidence, because a process that never restarted also pauses and repeats steps:

- strong: the steps go back, most series log a step again, or the runtime counter restarts;
- weak, never enough alone: a step logged twice (train and validation rows at one step, as PyTorch
  Lightning's CSV logger writes them), and a clock gap that is one of a family of similar pauses
  (evaluation or checkpoint saving every N steps);
- a single clock gap far beyond the step time, like no other in the run, is the one mark a re-attached
  run leaves when its steps continue seamlessly (an MLflow run resumed with ``MLFLOW_RUN_ID``): it
  cuts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import incremental
from .launch_config import model_move
from .model import Boundary, Evidence, Lineage, Segment, Series, logging_interval


RUNTIME_DROP_SECONDS = 1e-6
"""A logged runtime that goes back by more than this restarted its clock (a new process)."""


@dataclass(frozen=True)
class BoundaryConfig:
    """How big a clock gap must be to count as a restart."""

    gap_factor: float = 20.0
    """A gap counts when it exceeds this many times the run's median step interval ..."""
    min_gap_seconds: float = 0.5
    """... and at least this many seconds (sub-second jitter is never a restart)."""
    pause_family_ratio: float = 2.0
    """Gaps inside one piece within this factor of each other are one family of routine pauses
    (evaluation, checkpoint saving): no one of them is a restart by itself."""


@dataclass
class Piece:
    """A contiguous stretch of one segment between restarts."""

    series: dict[str, Series]
    segment_index: int
    cut_evidence: list[Evidence] = field(default_factory=list)
    """Evidence for a cut *before* this piece inside its own segment (empty for a segment's first piece)."""
    tentative: bool = False
    """The cut before this piece is a routine-looking pause: kept only if the KL there was reset."""


def _spine(series: dict[str, Series], prefer: str | None) -> Series | None:
    """The series whose steps and clock say where the process was: the KL, else the longest series
    whose steps never repeat (a key logged on both train and validation rows repeats every step)."""
    if prefer and prefer in series and len(series[prefer]) > 1:
        return series[prefer]
    candidates = [s for n, s in series.items() if not n.startswith("_") and len(s) > 1]
    if not candidates:
        return None
    monotone = [s for s in candidates if not _repeats(s.steps)]
    return max(monotone or candidates, key=len)


def _repeats(steps: np.ndarray) -> bool:
    """Whether a step is logged twice in a row."""
    facts = incremental.step_facts(steps)
    return bool(facts.same) if facts is not None else bool(np.any(np.diff(steps) == 0))


def _only_rises(steps: np.ndarray) -> bool:
    """Whether every step is above the one before."""
    facts = incremental.step_facts(steps)
    if facts is not None:
        return not facts.back and not facts.same
    return bool(np.all(steps[1:] > steps[:-1]))


def _median_interval(wall: np.ndarray) -> float:
    """The median clock step (of those above 0): the run's step time."""
    facts = incremental.clock_facts(wall)
    if facts is not None:
        return facts.median_positive()
    d = np.diff(wall)
    d = d[d > 0]
    return float(np.median(d)) if len(d) else 0.0


def relogged_steps(series: dict[str, Series]) -> set[int]:
    """Steps that most series log twice: a process re-logging them, not train and validation rows
    that share a step (those repeat in the keys both write, a minority)."""
    keyed = [s for n, s in series.items() if not n.startswith("_") and len(s) > 1]
    counts: dict[int, int] = {}
    for s in keyed:
        if _only_rises(s.steps):  # steps that only go up repeat none
            continue
        u, c = np.unique(s.steps, return_counts=True)
        for step in u[c > 1]:
            counts[int(step)] = counts.get(int(step), 0) + 1
    return {step for step, n in counts.items() if 2 * n > len(keyed)}


def find_cuts(spine: Series, runtime: Series | None, *, config: BoundaryConfig,
              relogged: set[int] | None = None, tentative: list[int] | None = None,
              one_process: bool = False) -> list[tuple[int, list[Evidence]]]:
    """Indices into ``spine`` where a new piece starts, with the evidence for each. ``relogged``:
    steps most series log twice (``relogged_steps``); a repeat there is a process logging again.
    ``tentative``, when given, also takes the routine-looking pauses (appended to it and returned as
    cuts): a restart re-attached to its tracker run between two checkpoints looks just like one, and
    only the KL can tell (``pipeline.settle_tentative``). ``one_process``: the log is one process's
    (a TensorBoard event file: every writer, so every launch, opens a new one), so a clock gap in it
    is a pause (a slow save, a stalled machine), never a restart by itself: tentative at most."""
    cuts: dict[int, list[Evidence]] = {}
    steps = spine.steps
    if len(steps) < 2:
        return []
    back, same = _rewinds_and_repeats(steps)
    for i in back:
        cuts.setdefault(int(i), []).append("step_rewind")
    for i in same:
        cuts.setdefault(int(i), []).append("duplicate_steps")
    for i in back:  # a rewind re-logs steps: the duplicates make it a duplicate_steps case too
        if "duplicate_steps" not in cuts[int(i)]:
            cuts[int(i)].append("duplicate_steps")
    pauses: set[int] = set()
    if spine.wall_times is not None and len(spine.wall_times) > 2:
        wall = spine.wall_times
        step_time = _median_interval(wall)
        threshold = max(config.min_gap_seconds, config.gap_factor * step_time)
        gaps, notable = _clock_gaps(wall, threshold), _clock_gaps(wall, threshold / config.pause_family_ratio)
        for i in gaps:
            cuts.setdefault(int(i), []).append("time_gap")
        # a gap's like may sit just under the threshold: compare with every pause of that size
        pauses = _pause_family(gaps, wall[gaps] - wall[gaps - 1], among=wall[notable] - wall[notable - 1],
                               ratio=config.pause_family_ratio)
    if runtime is not None and len(runtime) > 1 and spine.wall_times is not None and runtime.wall_times is not None:
        drops = np.nonzero(np.diff(runtime.values) < -RUNTIME_DROP_SECONDS)[0] + 1
        for j in drops:
            t = runtime.wall_times[j]
            i = int(np.searchsorted(spine.wall_times, t, side="left"))
            if 0 < i < len(steps):
                cuts.setdefault(i, []).append("runtime_reset")
    relogged = relogged or set()
    kept: list[tuple[int, list[Evidence]]] = []
    for i, ev in sorted(cuts.items()):
        if _strong_enough(ev, routine_pause=one_process or i in pauses, relogged=int(steps[i]) in relogged):
            kept.append((i, ev))
        elif tentative is not None and "time_gap" in ev:
            tentative.append(i)
            kept.append((i, ev))
    return kept


def _rewinds_and_repeats(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The indices where the steps go back, and where they repeat the one before."""
    facts = incremental.step_facts(steps)
    if facts is not None:
        return np.array(facts.back, np.int64), np.array(facts.same, np.int64)
    return np.nonzero(steps[1:] < steps[:-1])[0] + 1, np.nonzero(steps[1:] == steps[:-1])[0] + 1


def _clock_gaps(wall: np.ndarray, threshold: float) -> np.ndarray:
    """The indices whose clock is more than ``threshold`` past the point before, in order."""
    facts = incremental.clock_facts(wall)
    if facts is not None:
        return facts.above(threshold)
    return np.nonzero(np.diff(wall) > threshold)[0] + 1


def _strong_enough(evidence: list[Evidence], *, routine_pause: bool, relogged: bool) -> bool:
    """Whether marks inside one piece make a restart (see the module's docstring)."""
    if "step_rewind" in evidence or "runtime_reset" in evidence:
        return True
    if "duplicate_steps" in evidence and relogged:
        return True
    return "time_gap" in evidence and not routine_pause


def _pause_family(index: np.ndarray, lengths: np.ndarray, *, among: np.ndarray, ratio: float) -> set[int]:
    """Gaps that have a like among the run's pauses (``among`` includes them): two or more pauses of
    about the same length are the run's routine."""
    out: set[int] = set()
    for i, g in zip(index, lengths):
        like = np.sum((among >= g / ratio) & (among <= g * ratio))
        if like >= 2:
            out.add(int(i))
    return out


def _split_series(s: Series, cut_times: list[float] | None, n_cuts: int) -> list[Series]:
    """Cut one series at the same restarts as the spine: by clock when there is one, else at its own
    step discontinuities (the k-th rewind of this series is the k-th restart)."""
    if cut_times is not None and s.wall_times is not None:
        idx = [int(np.searchsorted(s.wall_times, t, side="left")) for t in cut_times]
    else:
        disc = list(np.nonzero(s.steps[1:] <= s.steps[:-1])[0] + 1)
        idx = [int(i) for i in disc[:n_cuts]]
        idx += [len(s)] * (n_cuts - len(idx))
    bounds = [0, *idx, len(s)]
    return [s.take(slice(a, max(a, b))) for a, b in zip(bounds[:-1], bounds[1:])]


def split_segment(segment: Segment, index: int, *, prefer: str | None, config: BoundaryConfig) -> list[Piece]:
    """Cut a segment where it was resumed in place (same tracker run, same event file)."""
    spine = _spine(segment.series, prefer)
    if spine is None:
        return [Piece(dict(segment.series), index)]
    maybe: list[int] = []
    cuts = find_cuts(spine, segment.series.get("_runtime"), config=config, relogged=relogged_steps(segment.series),
                     tentative=maybe, one_process=segment.kind == "tensorboard")
    if not cuts:
        return [Piece(dict(segment.series), index)]
    cut_times = None
    if spine.wall_times is not None:
        w = spine.wall_times
        cut_times = [float((w[i - 1] + w[i]) / 2) for i, _ in cuts]
    pieces = [Piece({}, index)] + [Piece({}, index, list(ev), tentative=i in maybe) for i, ev in cuts]
    for name, s in segment.series.items():
        if s is spine:
            parts = [s.take(slice(a, b)) for a, b in zip([0] + [i for i, _ in cuts], [i for i, _ in cuts] + [len(s)])]
        else:
            parts = _split_series(s, cut_times, len(cuts))
        for piece, part in zip(pieces, parts):
            if len(part):
                piece.series[name] = part
    return [p for p in pieces if p.series]


def _first_last(series: dict[str, Series], metric: str | None) -> tuple[int | None, int | None, float | None, float | None]:
    s = series.get(metric) if metric else None
    if s is None or not len(s):
        non_empty = [v for n, v in series.items() if len(v) and not n.startswith("_")]
        if not non_empty:
            return None, None, None, None
        first = min(int(v.steps[0]) for v in non_empty)
        last = max(int(v.steps[-1]) for v in non_empty)
        fw = [float(v.wall_times[0]) for v in non_empty if v.wall_times is not None]
        lw = [float(v.wall_times[-1]) for v in non_empty if v.wall_times is not None]
        return first, last, (min(fw) if fw else None), (max(lw) if lw else None)
    fw = float(s.wall_times[0]) if s.wall_times is not None else None
    lw = float(s.wall_times[-1]) if s.wall_times is not None else None
    return int(s.steps[0]), int(s.steps[-1]), fw, lw


def infer_boundaries(
    segments: list[Segment],
    pieces: list[Piece],
    *,
    metric: str | None,
    checkpoint_steps: list[int],
    declared_steps: list[int],
    config: BoundaryConfig,
    configs: dict[int, dict] | None = None,
) -> list[Boundary]:
    """One boundary between every two consecutive pieces, with all the evidence that supports it.
    ``configs`` gives a segment's config by ``id`` where it is logged beside it (``add_hparams``)."""
    configs = configs or {}
    boundaries: list[Boundary] = []
    ckpts = sorted(set(checkpoint_steps))
    all_wall = [p.series[metric].wall_times for p in pieces
                if metric in p.series and p.series[metric].wall_times is not None and len(p.series[metric]) > 1]
    step_time = float(np.median([_median_interval(w) for w in all_wall])) if all_wall else 0.0
    gap_threshold = max(config.min_gap_seconds, config.gap_factor * step_time)
    for k in range(1, len(pieces)):
        prev, cur = pieces[k - 1], pieces[k]
        first, _, first_wall, _ = _first_last(cur.series, metric)
        _, prev_last, _, prev_last_wall = _first_last(prev.series, metric)
        if first is None:
            continue
        evidence: list[Evidence] = list(cur.cut_evidence)
        if cur.segment_index != prev.segment_index:
            seg, pseg = segments[cur.segment_index], segments[prev.segment_index]
            if seg.kind == "tensorboard" and pseg.kind == "tensorboard":
                evidence.append("new_event_file")
            else:
                evidence.append("new_tracker_run")
            if prev_last is not None and first < prev_last:
                evidence += ["step_rewind", "duplicate_steps"]
            elif prev_last is not None and first == prev_last:
                evidence.append("duplicate_steps")
            if first_wall is not None and prev_last_wall is not None and first_wall - prev_last_wall > gap_threshold:
                evidence.append("time_gap")
            if model_move(configs.get(id(pseg), pseg.config), configs.get(id(seg), seg.config)) is not None:
                evidence.append("model_from_checkpoint")
            rt, prt = cur.series.get("_runtime"), prev.series.get("_runtime")
            if rt is not None and prt is not None and len(rt) and len(prt) and rt.values[0] < prt.values[-1]:
                evidence.append("runtime_reset")
        resumed_from: int | None = None
        reader_hint = segments[cur.segment_index].resumed_from_step if not cur.cut_evidence else None
        before = [c for c in ckpts if c < first]
        if reader_hint is not None:
            resumed_from = int(reader_hint)
        elif before and (prev_last is None or before[-1] <= prev_last):
            resumed_from = before[-1]
        if ckpts and resumed_from is not None and resumed_from in ckpts:
            evidence.append("checkpoint")
        if resumed_from is None and prev_last is not None and first <= prev_last + 1:
            resumed_from = first - 1  # frameworks log step N+1 first after resuming from checkpoint N
        if any(abs(d - first) <= 1 or (resumed_from is not None and d == resumed_from) for d in declared_steps):
            evidence.append("declared")
        boundaries.append(Boundary(step=first, resumed_from_step=resumed_from,
                                   evidence=list(dict.fromkeys(evidence)), piece_index=k,
                                   tentative=cur.tentative and "declared" not in evidence))
    for d in declared_steps:  # a restart the user declares where the logs show none
        if not any(abs(b.step - d) <= 1 for b in boundaries):
            _split_at_declared(pieces, boundaries, d)
    boundaries.sort(key=lambda b: b.piece_index)
    return boundaries


def _split_at_declared(pieces: list[Piece], boundaries: list[Boundary], step: int) -> None:
    """Cut the piece that spans a declared restart step, so it becomes a boundary of its own."""
    for k, p in enumerate(pieces):
        steps = [s.steps for s in p.series.values() if len(s)]
        if not steps:
            continue
        lo, hi = min(int(x.min()) for x in steps), max(int(x.max()) for x in steps)
        if lo < step <= hi:
            left = {n: s.take(s.steps < step) for n, s in p.series.items()}
            right = {n: s.take(s.steps >= step) for n, s in p.series.items()}
            pieces[k] = Piece({n: s for n, s in left.items() if len(s)}, p.segment_index, p.cut_evidence)
            pieces.insert(k + 1, Piece({n: s for n, s in right.items() if len(s)}, p.segment_index, ["declared"]))
            for b in boundaries:
                if b.piece_index > k:
                    b.piece_index += 1
            boundaries.append(Boundary(step=step, resumed_from_step=step - 1, evidence=["declared"], piece_index=k + 1))
            return


def named_reset_step(lineage: Lineage, b: Boundary) -> int | None:
    """The checkpoint step ``b`` resumed from when the logs name it, else None: a checkpoint folder at that
    step, or the step before the first one logged after the resume (the pieces logged every step up to it, or
    re-logged from it) where the tracker keeps every step the resumed process logs. A W&B run resumed under
    its own id drops the steps it already has, so there an older checkpoint could hide behind them; a table
    may be an export that dropped rows."""
    if b.resumed_from_step is None:
        return None
    if "checkpoint" in b.evidence:
        return int(b.resumed_from_step)
    if b.step != b.resumed_from_step + 1 or not 0 < b.piece_index < len(lineage.piece_segments):
        return None
    kl = lineage.kl_pieces() if lineage.kl_metric else []
    if kl and logging_interval([kl[b.piece_index - 1], kl[b.piece_index]]) != 1:
        return None  # logged every L > 1 steps: the first step logged after a resume is the next multiple of L
    ia, ib = lineage.piece_segments[b.piece_index], lineage.piece_segments[b.piece_index - 1]
    if not (0 <= ia < len(lineage.segments) and 0 <= ib < len(lineage.segments)):
        return None  # pieces without their tracker segments (a stream): nothing says what the tracker keeps
    after, before = lineage.segments[ia], lineage.segments[ib]
    if after.kind not in ("tensorboard", "mlflow", "wandb-offline", "wandb-api") or before.kind != after.kind:
        return None
    if after.kind.startswith("wandb") and (after.run_id is None or after.run_id == before.run_id):
        return None
    return int(b.resumed_from_step)
