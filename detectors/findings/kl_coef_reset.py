"""Adaptive KL coefficient reset at a resume: the KL controller was re-created, not restored.

The bug (verl #2653): the adaptive KL controller's current value is not in the checkpoint, so the
resumed process starts it again at ``init_kl_coef``. The coefficient the run had adapted to, over
thousands of steps, is thrown away: the KL penalty jumps (usually up, since controllers mostly lower
it) and the policy is pulled back towards the reference until the controller re-adapts.

Why the statistic works: an adaptive controller moves the coefficient by a bounded multiplicative
factor per step (verl and TRL clip the proportional error), so the run's own largest step-to-step
change of log(coef) inside a piece bounds what a continuation can do. A jump at the resume many times
larger than that, landing on the run's opening value, is the controller starting over; a fixed
coefficient never moves and is never reported. A jump that does not land on the opening value is
reported as a warning (a changed config, or a partial restore).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ..model import Boundary, Finding, LineageResult, Series, logging_interval
from ..metrics import KL_COEF, MetricFamily
from ..stats import floored_log
from .base import (FindingDetector, fmt, judge_resumes, opening, piece_series, pooled_values,
                   restored_values, resumed_metric)


ZERO_FRACTION = 1e-6
"""A coefficient below this fraction of the run's largest counts as zero: the floor of its log, so a
coefficient annealed to 0 stays finite and its last steps do not look like huge jumps."""


@dataclass(frozen=True)
class KlCoefResetConfig:
    """Thresholds of the KL-coefficient-reset detector."""

    family: MetricFamily = KL_COEF
    """The KL-coefficient metric the detector reads."""
    min_points_before: int = 3
    """Points the coefficient needs before a resume for it to be judged there."""
    min_jump: float = 0.1
    """|log(coef after / coef before)| must reach this (about 10%) ..."""
    jump_factor: float = 4.0
    """... and this many times the largest step-to-step change the run makes inside a piece."""
    opening_tolerance: float = 0.02
    """The first value after the resume counts as the opening value within this log distance (2%),
    widened to the run's largest in-piece step change."""
    min_drift: float = 0.1
    """The coefficient must have drifted this far (log) from its opening value before the resume, or a
    reset cannot be told from a continuation."""


class KlCoefReset(FindingDetector[KlCoefResetConfig]):
    name = "kl_coef_reset"
    config_class = KlCoefResetConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        cfg = self.config
        lineage = result.lineage
        metric = resumed_metric(lineage, cfg.family)
        if metric is None:
            return []
        parts = piece_series(lineage, metric)
        present = [p for p in parts if p is not None]
        allv = pooled_values(parts)
        if len(allv) == 0 or np.all(allv <= 0):
            return []
        eps = ZERO_FRACTION * float(np.max(np.abs(allv)))
        steps_in_piece = [np.abs(np.diff(floored_log(p.values, eps))) for p in present if len(p) > 1]
        max_step = float(np.max(np.concatenate(steps_in_piece))) if steps_in_piece else 0.0
        if np.ptp(allv) == 0:
            return []  # a fixed coefficient that never changed: nothing was reset
        open_ = opening(lineage, metric, interval=logging_interval(parts))
        judge = partial(self._judge, metric=metric, open_=open_, eps=eps, max_step=max_step)
        return judge_resumes(lineage, metric, judge, min_before=cfg.min_points_before)

    def _judge(self, b: Boundary, hist: Series, after: Series, *, metric: str, open_: Series | None, eps: float,
               max_step: float) -> Finding | None:
        cfg = self.config
        before = float(restored_values(hist, b)[-1])
        first = float(after.values[0])
        jump = float(abs(floored_log(first, eps) - floored_log(before, eps)))
        threshold = max(cfg.min_jump, cfg.jump_factor * max_step)
        if jump < threshold:
            return None
        open_v = float(open_.values[0]) if open_ is not None else None
        to_open = False
        if open_v is not None:
            drift = float(abs(floored_log(before, eps) - floored_log(open_v, eps)))
            to_open = drift >= cfg.min_drift and float(abs(floored_log(first, eps) - floored_log(open_v, eps))) <= max(cfg.opening_tolerance, max_step)
        data = {"metric": metric, "coef_before": before, "coef_after": first, "coef_opening": open_v,
                "log_jump": jump, "largest_in_piece_step": max_step, "resumed_from_step": b.resumed_from_step}
        if to_open:
            msg = (f"The adaptive KL coefficient was reset at the resume at step {b.step}: {metric} went from "
                   f"{fmt(before)} back to its initial value {fmt(first)} (it never moves more than "
                   f"{max_step:.1%} per step on its own); save and restore the KL controller's value with the "
                   f"checkpoint (verl #2653).")
            return self.finding(step=b.step, severity="error", message=msg, data=data, metrics=[metric])
        msg = (f"The KL coefficient jumped at the resume at step {b.step}: {metric} went from {fmt(before)} to "
               f"{fmt(first)} (it never moves more than {max_step:.1%} per step on its own); check that the KL "
               f"controller's state and the kl_coef setting carried over.")
        return self.finding(step=b.step, severity="warning", message=msg, data=data, metrics=[metric])
