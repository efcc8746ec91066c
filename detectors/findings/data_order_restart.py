"""Data order restarted at a resume: the sampler's position was not restored.

The bug: the resumed process rebuilds the data loader from the start of the dataset (the sampler
state is not in the checkpoint, or ``ignore_data_skip``-style options skip the fast-forward), so the
model sees the opening prompts again and never the ones it had not reached. Nothing fails; the logs
show it two ways, and this detector reads both:

- *counters that should continue go back.* ``consumed_samples``, ``epoch`` and the like are a
  deterministic function of the step. After a correct resume the first value equals what the run had
  logged at that step (a rewind) or the continuation at the counter's own per-step rate; after a
  restart it is back near the run's opening value. Counters that legitimately fall inside a piece
  (per-epoch counters) are left out, since going back is what they do.
- *batch statistics repeat the run's opening.* A per-step statistic fixed by *which* prompts are in
  the batch (mean prompt length) repeats, value for value, the run's opening sequence when the data
  order restarted. A chance match of several consecutive values is rare, and the run says how rare:
  the same distance is computed at every position inside the pieces (the run's own null); a run whose
  data legitimately repeats (fixed order, every epoch) matches there too and is not reported. Reward
  is not used: it depends on the policy, which has moved on, so it does not repeat even when the
  prompts do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import Boundary, Finding, Lineage, LineageResult, Series, logging_interval
from ..metrics import COUNTERS, PROMPT_LENGTH, MetricFamily, find_metric, find_metrics
from ..stats import robust_sigma
from .base import FindingDetector, before_after, fmt, history, opening, piece_series, pooled_values


ROUNDING = 1e-9
"""A counter's change within this fraction of its largest value is rounding: neither a rise nor a fall."""

SCALE_FLOOR = 1e-12
"""The smallest counter scale taken, so the rounding tolerance of an all-zero counter stays positive."""

OPENING_SEPARATION = 2.0
"""A counter that went back lands "on the run's opening" only when the continuation is more than this
many slacks away from the opening value, so the two landings can be told apart."""


@dataclass(frozen=True)
class DataOrderRestartConfig:
    """Thresholds of the data-order-restart detector."""

    counters: MetricFamily = COUNTERS
    """Counters that should continue across a resume (consumed samples, epoch, ...)."""
    batch_statistics: tuple[MetricFamily, ...] = (PROMPT_LENGTH,)
    """Per-step statistics fixed by which prompts are in the batch: they repeat the opening when the
    data order restarted."""
    slack_steps: float = 1.5
    """A counter may differ from its continuation by this many logging intervals' worth of increments
    (off-by-one logging, a partial batch) ..."""
    relative_slack: float = 0.01
    """... or by this fraction of its value, or by its own smallest increment, whichever is larger."""
    repeat_window: int = 6
    """How many points after the resume are compared with the run's opening."""
    min_repeat_points: int = 4
    """Points a repeat needs: fewer match the opening by chance too often."""
    repeat_tolerance: float = 0.05
    """Mean |after - opening| below this fraction of the statistic's spread counts as a repeat."""
    null_margin: float = 4.0
    """The closest the run comes to its opening elsewhere must be this many tolerances away."""


@dataclass(frozen=True)
class _CounterBack:
    metric: str
    before: float
    expected: float
    after: float
    opening: float | None
    to_start: bool


@dataclass(frozen=True)
class _Repeat:
    metric: str
    distance: float
    null_min: float
    points: int
    values: list[float]


class DataOrderRestart(FindingDetector[DataOrderRestartConfig]):
    name = "data_order_restart"
    config_class = DataOrderRestartConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        lineage = result.lineage
        if not lineage.boundaries:
            return []
        names = lineage.metric_names()
        counters = [c for c in find_metrics(names, family=self.config.counters) if c != lineage.step_axis]
        batch = [m for m in (find_metric(names, family=f) for f in self.config.batch_statistics) if m]
        counter_ok = {m: self._counter_usable(lineage, m) for m in counters}
        out: list[Finding] = []
        for b in lineage.boundaries:
            backs = [c for m in counters if counter_ok[m] and (c := self._counter_back(lineage, b, m))]
            continued = [m for m in counters if counter_ok[m] and not any(c.metric == m for c in backs)
                         and before_after(lineage, b, m)[1] is not None]
            repeats = [r for m in batch if (r := self._repeat(lineage, b, m))]
            if not backs and not repeats:
                continue
            out.append(self._finding(b, backs, repeats, continued))
        return out

    def _finding(self, b: Boundary, backs: list[_CounterBack], repeats: list[_Repeat],
                 continued: list[str]) -> Finding:
        to_start = [c for c in backs if c.to_start]
        confident = bool(to_start) or (bool(repeats) and not continued)
        bits = []
        for c in backs:
            where = "back to the run's opening value" if c.to_start else "backwards"
            bits.append(f"{c.metric} went {where}: {fmt(c.after)} after the resume where continuing gives "
                        f"{fmt(c.expected)}")
        for r in repeats:
            bits.append(f"{r.metric} repeats {r.points} values of the run's opening ("
                        + ", ".join(fmt(v) for v in r.values) + ")")
        lead = "The data order restarted" if confident else "The data order may have restarted"
        msg = f"{lead} at the resume at step {b.step}: " + "; ".join(bits)
        if continued and repeats and not backs:
            msg += f" (though {', '.join(continued)} continued, so it may be an epoch that repeats the order)"
        msg += ("; restore the data sampler's position (or skip the consumed batches) when resuming, or the "
                "model re-trains on the opening prompts.")
        return self.finding(step=b.step, severity="error" if confident else "warning", message=msg,
                            data={"counters": [c.__dict__ for c in backs], "repeats": [r.__dict__ for r in repeats],
                                  "counters_continued": continued, "resumed_from_step": b.resumed_from_step},
                            metrics=[c.metric for c in backs] + [r.metric for r in repeats])

    # ------------------------------------------------------------------------------ counters

    def _counter_usable(self, lineage: Lineage, metric: str) -> bool:
        """A counter that increases and never falls inside a piece (else it is per-epoch or noise)."""
        parts = [p for p in piece_series(lineage, metric) if p is not None and len(p) > 1]
        if not parts:
            return False
        rises = falls = 0
        for p in parts:
            order = np.argsort(p.steps, kind="stable")
            d = np.diff(p.values[order])
            scale = max(float(np.max(np.abs(p.values))), SCALE_FLOOR)
            falls += int(np.sum(d < -ROUNDING * scale))
            rises += int(np.sum(d > ROUNDING * scale))
        return falls == 0 and rises > 0

    def _rate(self, lineage: Lineage, metric: str) -> tuple[float, float]:
        """The counter's mean increase per step inside the pieces, and its quantum: the smallest
        increase it makes (1 for an integer epoch, which stands still between epochs)."""
        rise = span = 0.0
        steps_up: list[np.ndarray] = []
        for p in piece_series(lineage, metric):
            if p is None or len(p) < 2:
                continue
            order = np.argsort(p.steps, kind="stable")
            ds, dv = np.diff(p.steps[order]), np.diff(p.values[order])
            ok = ds > 0
            rise += float(np.sum(dv[ok]))
            span += float(np.sum(ds[ok]))
            steps_up.append(dv[ok & (dv > 0)])
        up = np.concatenate(steps_up) if steps_up else np.empty(0)
        return (rise / span if span > 0 else 0.0), (float(np.min(up)) if len(up) else 0.0)

    def _counter_back(self, lineage: Lineage, b: Boundary, metric: str) -> _CounterBack | None:
        cfg = self.config
        hist = history(lineage, b, metric)
        _, after = before_after(lineage, b, metric)
        if hist is None or after is None or len(hist) < 2:
            return None
        rate, quantum = self._rate(lineage, metric)
        if rate <= 0:
            return None
        interval = logging_interval(piece_series(lineage, metric))
        s0, v0 = int(after.steps[0]), float(after.values[0])
        hs, hv = hist.steps, hist.values
        if s0 <= hs[-1]:
            expected = float(np.interp(s0, hs, hv))
        else:
            expected = float(hv[-1] + rate * (s0 - hs[-1]))
        slack = max(cfg.slack_steps * rate * interval, cfg.relative_slack * abs(expected), quantum)
        if v0 >= expected - slack:
            return None
        open_ = opening(lineage, metric, interval=interval)
        open_v = None
        if open_ is not None:
            at = _restarted_position(open_, b, s0)
            open_v = float(np.interp(at, open_.steps, open_.values)) if at <= open_.steps[-1] else None
        to_start = open_v is not None and abs(v0 - open_v) <= slack and abs(expected - open_v) > OPENING_SEPARATION * slack
        return _CounterBack(metric, float(hv[-1]), expected, v0, open_v, bool(to_start))

    # ------------------------------------------------------------------------- batch repeats

    def _repeat(self, lineage: Lineage, b: Boundary, metric: str) -> _Repeat | None:
        cfg = self.config
        parts = piece_series(lineage, metric)
        open_ = opening(lineage, metric, interval=logging_interval(parts))
        _, after = before_after(lineage, b, metric)
        if open_ is None or after is None or len(open_) < cfg.min_repeat_points:
            return None
        if b.piece_index == 0 or parts[0] is None:
            return None
        at = open_.steps >= _restarted_position(open_, b, int(after.steps[0]))
        ref = open_.values[at][: cfg.repeat_window]
        allv = pooled_values(parts)
        spread = robust_sigma(allv)
        if spread <= 0:
            spread = float(np.std(allv))
        if spread <= 0:
            return None  # a constant statistic repeats trivially

        def dist(x: np.ndarray) -> float | None:
            n = min(len(ref), len(x))
            if n < cfg.min_repeat_points:
                return None
            return float(np.mean(np.abs(x[:n] - ref[:n])) / spread)

        d_b = dist(after.values)
        if d_b is None or d_b > cfg.repeat_tolerance:
            return None
        null = [d for k, p in enumerate(parts) if p is not None
                for i in range(1, len(p)) if (d := dist(p.values[i:])) is not None]
        null_min = float(min(null)) if null else float("inf")
        if not null or null_min < cfg.null_margin * cfg.repeat_tolerance:
            return None  # the run comes back to its opening sequence on its own
        n = min(len(ref), len(after))
        return _Repeat(metric, d_b, null_min, n, [float(v) for v in after.values[:n]])


def _restarted_position(open_: Series, b: Boundary, step: int) -> int:
    """The step of the run's opening a data order started over at the resume would have reached when
    the resumed process logs ``step`` (counted from the checkpoint it resumed from, when known)."""
    offset = step - (b.resumed_from_step + 1) if b.resumed_from_step is not None else 0
    return open_.steps[0] + max(offset, 0)
