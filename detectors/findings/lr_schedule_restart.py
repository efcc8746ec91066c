"""Learning-rate schedule restarted at a resume: the scheduler was re-created instead of restored.

The bug: the resumed process builds a fresh LR scheduler (its step count at 0) and forgets to load
the scheduler state from the checkpoint, so the LR goes back through warm-up and the whole decay
starts again. Training continues without an error; the logged LR shows it.

Why the statistic works: an LR schedule is a deterministic function of the scheduler's step. After a
correct resume, the LR at step s is what the run's own schedule gives at s: the value logged before
at that step (a rewind) or the continuation of the curve just before the boundary. After a restarted
scheduler, the LR at the k-th step after the resume is the run's *opening* LR at its k-th step. We
compare the two predictions for the first points after the resume in log space with Student-t
likelihoods (LR is positive, its errors relative); a schedule is smooth, so the noise is the run's own
step-to-step jitter of log LR with a small floor. A schedule that legitimately returns to its opening
value (cosine with restarts, cyclic) is recognised two ways: the config declares it, or the run's LR
does it *inside* a piece where there was no resume; then nothing is reported. A constant LR gives two
equal predictions and so no finding (a restarted constant schedule changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.special import expit, logsumexp

from ..model import Boundary, Finding, LineageResult, Series, logging_interval
from ..declarations import config_mentions
from ..metrics import LR, MetricFamily
from ..stats import SECOND_DIFF_SCALE, floored_log, robust_sigma_about_zero, t_logpdf
from .base import (FindingDetector, fmt, judge_resumes, opening, piece_series, pooled_values,
                   resumed_metric)


ZERO_FRACTION = 1e-3
"""An LR below this fraction of the run's largest counts as zero: the floor of its log, so a warm-up
from 0 or a decay to 0 stays finite in log space."""

SCALE_FLOOR = 1e-30
"""The smallest LR scale taken, so the floor stays positive for an LR logged as 0 throughout."""

TREND_POINTS = 3
"""The schedule's continuation is the line through its last this many points: a schedule is smooth,
so locally linear, and few points keep a decay's curvature out of the slope."""


@dataclass(frozen=True)
class LrScheduleRestartConfig:
    """Thresholds of the LR-schedule-restart detector."""

    family: MetricFamily = LR
    """The learning-rate metric the detector reads."""
    window_after: int = 5
    """How many points after the resume are compared with the two predictions."""
    min_points_before: int = 3
    """Points the LR needs before a resume for it to be judged there."""
    noise_floor: float = 0.02
    """Smallest log-space noise assumed (2%): a schedule is smooth, but logging rounds."""
    dof: float = 3.0
    """Degrees of freedom of the Student-t likelihoods: heavy tails, so one odd point is no verdict."""
    min_jump: float = 0.2
    """|log(LR after / continued LR)| must reach this (about 22%) at the first point after the resume."""
    fit_tolerance: float = 0.1
    """For an ``error``, the restarted-schedule prediction must match the logged LR this well (median
    |log error|); a looser match (below ``loose_tolerance``) gives a ``warning``."""
    loose_tolerance: float = 0.35
    """A restarted-schedule prediction further off than this (median |log error|) gives no finding."""
    error_score: float = 0.99
    """The restarted schedule's posterior probability over the continued one for an ``error`` ..."""
    warning_score: float = 0.9
    """... and for a ``warning``."""
    min_points_error: int = 2
    """Points after the resume an ``error`` needs: one point alone gives at most a ``warning``."""
    declared_key: str = r"(sched|schedule|lr)"
    """A config key matching this (regex) with a value matching ``declared_value`` declares a schedule
    that restarts on its own: nothing is reported."""
    declared_value: str = r"(restart|cycl|sgdr|warm_?restart|cosine_with_restarts|triangular|one_?cycle_?repeat)"
    """The values (regex) that declare such a schedule under a ``declared_key``."""


class LrScheduleRestart(FindingDetector[LrScheduleRestartConfig]):
    name = "lr_schedule_restart"
    config_class = LrScheduleRestartConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        cfg = self.config
        lineage = result.lineage
        metric = resumed_metric(lineage, cfg.family)
        if metric is None:
            return []
        declared = config_mentions(lineage.config, key=cfg.declared_key, value=cfg.declared_value)
        if declared:
            return []
        parts = piece_series(lineage, metric)
        interval = logging_interval(parts)
        open_ = opening(lineage, metric, interval=interval)
        if open_ is None or len(open_) < 2:
            return []  # the run's opening is not in the logs: a restart has nothing to be compared with
        scale = max(float(np.nanmax(np.abs(pooled_values(parts)))), SCALE_FLOOR)
        eps = ZERO_FRACTION * scale
        noise = _noise([floored_log(p.values, eps) for p in parts if p is not None], cfg.noise_floor)
        if _restarts_on_its_own(parts, eps=eps, cfg=cfg):
            return []
        judge = partial(self._judge, metric=metric, open_=open_, eps=eps, noise=noise, interval=interval)
        return judge_resumes(lineage, metric, judge, min_before=cfg.min_points_before)

    def _judge(self, b: Boundary, hist: Series, after: Series, *, metric: str, open_: Series, eps: float,
               noise: float, interval: int) -> Finding | None:
        cfg = self.config
        post = after.take(slice(0, cfg.window_after))
        pred0 = _continue(hist, post.steps)
        start = b.resumed_from_step + 1 if b.resumed_from_step is not None else b.step
        offsets = post.steps - start
        lpost = floored_log(post.values, eps)
        r0 = lpost - floored_log(pred0, eps)
        best_r1, ll1s = None, []
        for shift in (-interval, 0, interval):
            pred1 = np.interp(offsets + shift, open_.steps - open_.steps[0], open_.values)
            r1 = lpost - floored_log(pred1, eps)
            ll1s.append(float(np.sum(t_logpdf(r1, cfg.dof, 0.0, noise))))
            if best_r1 is None or np.median(np.abs(r1)) < np.median(np.abs(best_r1)):
                best_r1 = r1
        ll0 = float(np.sum(t_logpdf(r0, cfg.dof, 0.0, noise)))
        ll1 = float(logsumexp(ll1s) - np.log(len(ll1s)))
        score = float(expit(ll1 - ll0))
        jump = float(abs(r0[0]))
        fit = float(np.median(np.abs(best_r1)))
        if jump < cfg.min_jump or score < cfg.warning_score or fit > cfg.loose_tolerance:
            return None
        confident = score >= cfg.error_score and len(post) >= cfg.min_points_error and fit <= cfg.fit_tolerance
        last = min(start - 1, int(hist.steps[-1]))  # the step the run resumed from, as far as the logs go
        lr_before = float(np.interp(last, hist.steps, hist.values))
        lr_after = float(post.values[0])
        expected = float(pred0[0])
        msg = (f"The learning rate restarted its schedule at the resume at step {b.step}: it was {fmt(lr_before)} "
               f"before and {fmt(lr_after)} after, where continuing the schedule gives {fmt(expected)} and where the "
               f"run's opening LR was {fmt(float(open_.values[0]))}; restore the LR scheduler state from the checkpoint "
               f"when resuming.")
        if not confident:
            msg = msg.replace("restarted its schedule", "looks to have restarted its schedule")
        return self.finding(
            step=b.step, severity="error" if confident else "warning", message=msg,
            data={"metric": metric, "lr_before": lr_before, "lr_after": lr_after, "lr_expected": expected,
                  "lr_opening": float(open_.values[0]), "score": score, "log_jump": jump, "opening_fit": fit,
                  "noise": noise, "points_after": len(post), "resumed_from_step": b.resumed_from_step},
            metrics=[metric])


def _noise(logs: list[np.ndarray], floor: float) -> float:
    """Jitter of log LR around its local trend (second differences, whose centre is 0 for a smooth
    schedule), pooled over pieces, never under ``floor``."""
    dd = [np.diff(x, n=2) for x in logs if len(x) > 3]
    if not dd:
        return floor
    return max(floor, robust_sigma_about_zero(np.concatenate(dd)) / SECOND_DIFF_SCALE)


def _continue(hist: Series, steps: np.ndarray) -> np.ndarray:
    """The LR the run's schedule gives at ``steps``: the logged value where the run already passed
    that step (a rewind), else the curve just before extended linearly (clipped at zero)."""
    hs, hv = hist.steps.astype(float), hist.values
    out = np.interp(steps.astype(float), hs, hv)
    beyond = steps > hs[-1]
    if np.any(beyond):
        tail = slice(-TREND_POINTS, None)
        if len(hs) >= 2:
            slope = float(np.polyfit(hs[tail], hv[tail], 1)[0]) if len(hs) >= TREND_POINTS else float((hv[-1] - hv[-2]) / max(hs[-1] - hs[-2], 1))
        else:
            slope = 0.0
        out[beyond] = np.clip(hv[-1] + slope * (steps[beyond] - hs[-1]), 0.0, None)
    return out


def _restarts_on_its_own(parts: list[Series | None], *, eps: float, cfg: LrScheduleRestartConfig) -> bool:
    """True when, inside a piece (no resume there), the LR jumps *up* well above the continuation of
    its last few points: a schedule with restarts of its own (hard cosine restarts, cyclic), where a
    jump at a resume proves nothing. Decays, step decays and linear warm-up never jump up."""
    for p in parts:
        if p is None or len(p) < TREND_POINTS + 1:
            continue
        n = TREND_POINTS
        st = sliding_window_view(p.steps.astype(float), n)[:-1]  # the n points before point j = n..len-1
        va = sliding_window_view(p.values, n)[:-1]
        sm, vm = st.mean(axis=1, keepdims=True), va.mean(axis=1, keepdims=True)
        var = ((st - sm) ** 2).sum(axis=1)
        slope = np.where(var > 0, ((st - sm) * (va - vm)).sum(axis=1) / np.where(var > 0, var, 1.0), 0.0)
        pred = np.clip(va[:, -1] + slope * (p.steps[n:] - st[:, -1]), 0.0, None)  # as ``_continue`` does
        if np.any(floored_log(p.values[n:], eps) - floored_log(pred, eps) > cfg.min_jump):
            return True
    return False
