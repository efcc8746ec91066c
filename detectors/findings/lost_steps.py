"""Lost steps around a resume: training work thrown away, or steps the tracker holds no data for.

A restart rarely lands exactly where the previous process stopped, and what happens to the steps in
between depends on the tracker:

- *rewind*: the process that crashed had logged up to step H, training resumed from an older
  checkpoint C < H, so steps C+1..H were trained twice. The first attempt's work is lost, and
  TensorBoard and MLflow hold both versions of those steps (the core cuts them into two pieces).
- *dropped*: the same, on a tracker that refuses steps below its current step (a resumed W&B run):
  the re-trained steps C+1..H never reach the tracker, which shows the crashed process's values for
  them, so the curve there is not the run that continued. Needs C, which a checkpoint folder gives.
- *gap*: the first step logged after the resume is more than one logging interval past the last
  step logged before, with no checkpoint explaining it: no process's data for those steps reached the
  tracker (an unflushed writer at the crash, a resume from a later checkpoint than the logs show).

The statistic is plain step arithmetic on the lineage's pieces: the highest step reached before the
boundary, the first step after it, the checkpoint resumed from when known, and the run's own logging
cadence (so a run that logs every N steps is not a run that loses N-1 of every N). Rewinds and dropped
steps are the normal cost of resuming from an older checkpoint (``info``); a gap means data is missing
from the tracker (``warning``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..model import Boundary, Finding, Lineage, LineageResult, extent_of, logging_interval
from .base import FindingDetector, Severity, around


@dataclass(frozen=True)
class LostStepsConfig:
    """Thresholds of the lost-steps detector."""

    gap_intervals: float = 1.5
    """A gap counts when the first step after the resume is more than this many logging intervals past
    the last step before it (one interval is the normal next point)."""




_MESSAGES = {
    "rewind": ("Steps {lo}-{hi} were trained twice around the resume at step {step}: the previous process had "
               "reached step {high} and training resumed from {origin}, so {n} steps of work were lost and the "
               "tracker holds both versions of them; checkpoint more often to lose less."),
    "dropped": ("Steps {lo}-{hi} were trained again after the resume from checkpoint {c}, but the tracker kept the "
                "crashed process's values for them (it drops steps below its current step), so its curve over "
                "those {n} steps is not the run that continued."),
    "gap": ("The tracker holds no data for steps {lo}-{hi} around the resume at step {step}: the last step logged "
            "before it is {high} and the first after it {first}, while the run logs every {interval} step(s); "
            "flush the logger before checkpointing, or check which checkpoint the run resumed from."),
}
"""What each kind of lost steps means and what to do about it."""

_SEVERITY: dict[str, Severity] = {"rewind": "info", "dropped": "info", "gap": "warning"}
"""Rewinds and dropped steps are the normal cost of resuming from an older checkpoint; a gap is data
missing from the tracker."""


class LostSteps(FindingDetector[LostStepsConfig]):
    name = "lost_steps"
    config_class = LostStepsConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        lineage = result.lineage
        if not lineage.boundaries:
            return []
        interval = self._interval(lineage)
        prefer = (lineage.kl_metric,) if lineage.kl_metric else ()
        # each piece's training, not the earliest or latest point of any key: setup keys at step 0 and
        # summaries at the end are not training steps
        extents = [extent_of(p, prefer=prefer) for p in lineage.pieces]
        spans = [(int(e[0]), int(e[1])) if e[0] is not None else None for e in extents]  # type: ignore[arg-type]
        out: list[Finding] = []
        for b in lineage.boundaries:
            prev, cur = around(spans, b.piece_index)
            if prev is None or cur is None:
                continue
            f = self._judge(b, trained=prev, first=cur[0], interval=interval)
            if f is not None:  # the steps were read off the KL's (else the training series')
                out.append(replace(f, metrics=prefer))
        return out

    def _judge(self, b: Boundary, *, trained: tuple[int, int], first: int, interval: int) -> Finding | None:
        """The steps lost at one resume, given the previous piece's first and last training step and the
        first step logged after the resume."""
        start, high = trained
        c = b.resumed_from_step
        if first <= high and high - min(first, c + 1 if c is not None else first) + 1 > high - start + 1:
            return None  # more "lost" than the previous piece trained: two runs, not one resumed
        if first <= high:
            kind, lo, hi = "rewind", (first if c is None or c + 1 > first else c + 1), high
        elif c is not None and c < high:
            kind, lo, hi = "dropped", c + 1, high
        elif first - high > self.config.gap_intervals * interval:
            kind, lo, hi = "gap", high + 1, first - 1
        else:
            return None
        n = hi - lo + 1
        origin = "checkpoint " + str(c) if c is not None else "an earlier step"
        message = _MESSAGES[kind].format(lo=lo, hi=hi, n=n, step=b.step, high=high, first=first, c=c,
                                         origin=origin, interval=interval)
        return self.finding(step=b.step, severity=_SEVERITY[kind], message=message,
                            data={"last_logged_before": high, "first_logged_after": first, "resumed_from_step": c,
                                  "logging_interval": interval, "kind": kind, "first_lost": lo, "last_lost": hi,
                                  "steps_lost": n})

    @staticmethod
    def _interval(lineage: Lineage) -> int:
        name = lineage.kl_metric
        if name is None:
            counts: dict[str, int] = {}
            for p in lineage.pieces:
                for n, s in p.items():
                    if not n.startswith("_"):
                        counts[n] = counts.get(n, 0) + len(s)
            name = max(counts, key=lambda n: counts[n]) if counts else None
        if name is None:
            return 1
        return logging_interval([p.get(name) for p in lineage.pieces])
