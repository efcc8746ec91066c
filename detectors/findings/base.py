"""What every resume-integrity detector shares: the base class and the run's series around a boundary
(metric names live in ``klwatch.metrics``, statistics in ``klwatch.stats``).

A detector is configured once, every parameter an explicit keyword in a frozen config dataclass
(ruptures-style: ``LrScheduleRestart(config=LrScheduleRestartConfig(min_jump=0.3))``), then run on
each judged lineage with ``detect(result)``. Configuration is kept apart from computation so the
dashboard can expose the thresholds and tests can pin them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

from ..detector import Detector
from ..metrics import MetricFamily, find_metric
from ..model import Boundary, Finding, Lineage, LineageResult, Series, plain_data
from ..stats import last_per_step

Severity = Literal["error", "warning", "info"]
C = TypeVar("C")
T = TypeVar("T")


class FindingDetector(Detector[C], ABC):
    """One resume-integrity detector: a ``klwatch.detector.Detector`` that adds findings to a judged
    run. Subclasses set ``name`` and ``config_class`` and implement ``detect``; a detector never raises
    on odd data (it returns no finding instead)."""

    @abstractmethod
    def detect(self, result: LineageResult) -> list[Finding]:
        """Every finding of this detector on one judged training run."""

    def finding(self, *, step: int | None, severity: Severity, message: str, data: dict[str, Any],
                metrics: Iterable[str | None] = ()) -> Finding:
        """A finding of this detector; ``metrics`` are the series it looked at (``Finding.metrics``:
        what a face draws beside it), each named once, in order."""
        return Finding(detector=self.name, step=step, severity=severity, message=message,
                       data={k: plain_data(v) for k, v in data.items()},
                       metrics=tuple(dict.fromkeys(m for m in metrics if m)))


# ------------------------------------------------------------------------------ series access


def finite(s: Series | None) -> Series | None:
    if s is None:
        return None
    s = s.take(np.isfinite(s.values))
    return s if len(s) else None


def piece_series(lineage: Lineage, name: str) -> list[Series | None]:
    """The series of one metric in every piece (None where a piece does not log it)."""
    return [finite(p.get(name)) for p in lineage.pieces]


def pooled_values(parts: Sequence[Series | None]) -> np.ndarray:
    """Every value of a metric over the pieces that log it (empty when none does)."""
    present = [p.values for p in parts if p is not None]
    return np.concatenate(present) if present else np.empty(0)


def before_after(lineage: Lineage, boundary: Boundary, name: str) -> tuple[Series | None, Series | None]:
    """The metric in the nearest earlier piece that logs it, and in the piece the boundary starts."""
    return around(piece_series(lineage, name), boundary.piece_index)


def around(parts: Sequence[T | None], k: int) -> tuple[T | None, T | None]:
    """Per-piece data either side of the boundary that starts piece ``k``: the nearest earlier piece's
    that is there, and piece ``k``'s (None where there is none)."""
    after = parts[k] if k < len(parts) else None
    before = next((parts[j] for j in range(k - 1, -1, -1) if parts[j] is not None), None)
    return before, after


def resumed_metric(lineage: Lineage, family: MetricFamily) -> str | None:
    """The run's metric of ``family`` when the run has a resume to judge it at, else None."""
    metric = find_metric(lineage.metric_names(), family=family)
    return metric if lineage.boundaries else None


def history(lineage: Lineage, boundary: Boundary, name: str) -> Series | None:
    """The metric as a function of step over every piece before the boundary, sorted by step, the
    latest logged value winning where a rewind re-logged a step (what the resumed process restored)."""
    parts = [p for p in piece_series(lineage, name)[: boundary.piece_index] if p is not None]
    if not parts:
        return None
    return last_per_step(Series.concat(parts))


def restored_values(hist: Series, boundary: Boundary) -> np.ndarray:
    """The ``history`` values up to the checkpoint the run resumed from: what the resumed process
    should continue from (all of them when that step is unknown or nothing was logged up to it)."""
    upto = boundary.resumed_from_step if boundary.resumed_from_step is not None else int(hist.steps[-1])
    known = hist.values[hist.steps <= upto]
    return known if len(known) else hist.values


def resumes_with_history(lineage: Lineage, name: str, *,
                         min_before: int) -> Iterator[tuple[Boundary, Series, Series]]:
    """Each resume at which the metric can be judged, with its ``history`` before the resume and its
    values in the piece the resume starts: those where both exist and the history has at least
    ``min_before`` points (too few say nothing about how the run would have continued)."""
    for b in lineage.boundaries:
        hist = history(lineage, b, name)
        _, after = before_after(lineage, b, name)
        if hist is not None and after is not None and len(hist) >= min_before:
            yield b, hist, after


def judge_resumes(lineage: Lineage, name: str, judge: Callable[[Boundary, Series, Series], Finding | None], *,
                  min_before: int) -> list[Finding]:
    """``judge(boundary, history, after)`` at each resume where the metric can be judged
    (``resumes_with_history``): the findings it returns, in boundary order."""
    out: list[Finding] = []
    for b, hist, after in resumes_with_history(lineage, name, min_before=min_before):
        f = judge(b, hist, after)
        if f is not None:
            out.append(f)
    return out


def opening(lineage: Lineage, name: str, *, interval: int) -> Series | None:
    """The metric at the run's very start, when the logs hold it: the first piece, if it begins within
    one logging interval of step 0 or 1."""
    if not lineage.pieces:
        return None
    first = finite(lineage.pieces[0].get(name))
    if first is None or first.steps[0] > max(1, interval):
        return None
    return first


def fmt(x: float | None) -> str:
    """Numbers in messages: three significant digits."""
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:.3g}"
