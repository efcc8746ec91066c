"""Optimizer state lost at a resume: the optimizer was re-created with fresh Adam moments.

The bug: the resumed process loads the weights but not the optimizer state (or a sharded optimizer
checkpoint silently fails to load), so Adam starts again with zero moments and step count 1. With bias
correction its first updates are about ``lr * sign(gradient)`` in every coordinate: ``m/sqrt(v)`` is
±1 when both moments hold one gradient. In a warm optimizer with noisy gradients ``|m/sqrt(v)|`` is far
below 1 (the momentum averages the noise away, ``sqrt(v)`` remembers its full size), so the first
steps after the resume move the policy much further than any step before. Training continues and
usually recovers, which is why this goes unnoticed.

Where it shows, most directly first: the size of the policy step, which PPO/GRPO frameworks log as
the approx-KL between the old (rollout) and the new policy (``actor/ppo_kl``, ``train/approxkl``,
``policy/approxkl_avg``) and the clip fraction (``actor/pg_clipfrac``, ``policy/clipfrac_avg``);
then, in a model where the big step overshoots, the grad norm and the loss.

Why the statistic works: a spike only means something against what the run does on its own. For
each series we measure how far the mean of the first points after the resume rises above the median
level just before, in standard errors built from the run's own robust step-to-step noise (log space
for a positive series, where noise is multiplicative). We compute the very same statistic at every
position *inside* the pieces, where there was no resume: the run's own null distribution of spikes
(noisy grad norms, warm-up, loss trends all land in it). A series spikes only when its rise is large
in absolute terms *and* larger than every rise the run produced without a resume.

The step-size series are judged on the first two points (fresh moments warm up within a few updates)
and, when the run logs its LR, the approx-KL is divided by LR² first: for a small step the KL between
old and new policy grows with the square of the step, so per unit of LR² it measures Adam's
normalised step ``m/sqrt(v)`` itself. That is what tells this bug from its neighbours: a restarted LR
schedule changes the LR, not the normalised step (and its warm-up makes the first steps *smaller*);
a reset KL coefficient or a rebuilt reference changes what the gradient points at, not how far Adam
moves. A clip fraction is not corrected (it is not a power of the step), so it counts only when the
logged LR did not rise at the resume.

Severity: ``error`` when two kinds of evidence agree (the step size, the grad norm, the loss), or when
the LR-corrected step size alone is clear (the LR ruled out); ``warning`` for one clear witness that
cannot rule out the LR; the loss alone accuses nothing, because a total loss includes the KL penalty,
which other resume bugs move by themselves (a KL coefficient reset multiplies it, a reference reset
zeroes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..model import Boundary, Finding, Lineage, LineageResult, Series
from ..metrics import GRAD_NORM, LOSS, LR, MetricFamily, find_metric
from ..stats import FIRST_DIFF_SCALE, floored_log, mad, pooled_diff_noise, sliding_median
from .base import (FindingDetector, around, before_after, fmt, history, piece_series, pooled_values,
                   restored_values)

APPROX_KL = MetricFamily(
    names=("actor/ppo_kl", "ppo_kl", "train/approxkl", "approxkl", "policy/approxkl_avg", "train/approx_kl",
           "approx_kl", "objective/approxkl", "policy/approx_kl", "train/ppo_kl"),
    leaf=r"(approx_?kl|ppo_kl)(_(mean|avg))?",
    exclude=r"(error|coef|ctl|target|ref|penalty)",
)
"""The KL between the rollout (old) policy and the updated one: how far one step moved the policy.
Not the reference KL (``kl_penalty``, ``kl_loss``), which measures the distance from the base model."""
CLIPFRAC = MetricFamily(
    names=("actor/pg_clipfrac", "pg_clipfrac", "train/clipfrac", "clipfrac", "policy/clipfrac_avg",
           "train/clip_fraction", "clip_fraction", "clip_ratio/region_mean", "train/clip_ratio/region_mean",
           "train/clip_ratio", "clip_ratio"),
    leaf=r"(pg_)?clip_?frac(tion)?(_(mean|avg))?",
    exclude=r"(vf|value|critic|lower|upper|low_|high_|dual)",
)
"""The fraction of tokens whose probability ratio left the trust region: large when a step was large."""

Kind = Literal["step", "gradient", "loss"]

MEDIAN_VARIANCE = np.pi / 2
"""A median of n Gaussian points has about pi/2 the variance of their mean: the standard error of a
rise measured from the median level before."""

LINEAR_NOISE_FLOOR = 1e-3
"""Smallest noise assumed on a linear scale, as a fraction of the series' MAD ..."""

MAD_FLOOR = 1e-12
"""... with the MAD taken as at least this, so a series mostly at one value keeps a positive floor."""

LR_LEVEL_POINTS = 3
"""The LR's level before a resume is the median of its last this many values up to the checkpoint."""

RATIO_FLOOR = 1e-9
"""The smallest "largest rise elsewhere" a spike is divided by when the strongest witness is chosen."""


@dataclass(frozen=True)
class OptimizerStateLostConfig:
    """Thresholds of the optimizer-state-lost detector."""

    families: tuple[MetricFamily, ...] = (GRAD_NORM, LOSS)
    """The gradient-side witnesses (the first grad-norm and loss series found)."""
    step_families: tuple[MetricFamily, ...] = (APPROX_KL, CLIPFRAC)
    """The step-size witnesses: how far each step moved the policy."""
    lr_family: MetricFamily = LR
    """The learning-rate metric: a step-size spike where the LR rose is no evidence."""
    lr_squared_families: tuple[MetricFamily, ...] = (APPROX_KL,)
    """Step-size series that grow with the square of the step: divided by LR² (where the LR is logged at
    the same steps) before they are judged."""
    correct_for_lr: bool = True
    """Divide the ``lr_squared_families`` by LR² (off: judge them as logged)."""
    window_before: int = 8
    """Points before a position whose median is the level a spike is measured from."""
    min_points_before: int = 4
    """Points a series needs before a resume for it to be judged there."""
    window_after: int = 5
    """A grad-norm or loss spike is the mean of this many points after the resume: fresh moments act at
    once and for several steps, and a mean is far less noisy than one point."""
    step_window_after: int = 2
    """A step-size spike is the mean of this many points: the first updates are the large ones (the
    bias-corrected moments hold several gradients again after a few updates)."""
    min_z: float = 3.0
    """A spike must reach this many standard errors above the level before ..."""
    null_margin: float = 1.2
    """... and this factor times the largest spike the run shows anywhere without a resume."""
    min_step_fold: float = 2.0
    """A step-size spike must also be this many times the level before (an unusually large step, not
    a significant wobble of a very steady series)."""
    alone_min_z: float = 4.0
    """One kind of evidence alone needs this many standard errors ..."""
    alone_margin: float = 1.5
    """... and this factor over the run's own largest rise: one witness must be clearer than two."""
    lr_rise_tolerance: float = 0.1
    """The logged LR "rose" at the resume when its mean over the first step-size points exceeds its
    level before by more than this fraction; a rise explains an uncorrected larger step."""
    min_null_positions: int = 10
    """Fewer in-piece positions than this: the run's own variation is unknown, nothing is reported."""
    noise_floor_log: float = 0.01
    """Smallest log-space noise assumed (1%) for a positive series."""


@dataclass(frozen=True)
class _Spike:
    metric: str
    kind: Kind
    z: float
    null_max: float
    level: float
    peak: float
    peak_step: int
    n_null: int
    fold: float | None
    """Mean after over level before (in LR-corrected units when ``lr_corrected``); None in linear space
    with a level of 0."""
    lr_corrected: bool = False


@dataclass(frozen=True)
class _Prepared:
    """One metric made ready for the statistic: per piece, its steps, raw values and transformed values
    (log, LR-corrected, or as logged)."""

    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]
    noise: float
    log_space: bool
    lr_corrected: bool


class OptimizerStateLost(FindingDetector[OptimizerStateLostConfig]):
    name = "optimizer_state_lost"
    config_class = OptimizerStateLostConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        cfg = self.config
        lineage = result.lineage
        if not lineage.boundaries:
            return []
        names = lineage.metric_names()
        loss = find_metric(names, family=LOSS)
        lr = find_metric(names, family=cfg.lr_family)
        squared = {find_metric(names, family=f) for f in cfg.lr_squared_families} - {None}
        watched: dict[str, Kind] = {}
        for fam in cfg.families:
            m = find_metric(names, family=fam)
            if m and m not in watched:
                watched[m] = "loss" if m == loss else "gradient"
        for fam in cfg.step_families:
            m = find_metric(names, family=fam)
            if m and m not in watched:
                watched[m] = "step"
        lr_rose = {b.piece_index: self._lr_rose(lineage, b, lr) for b in lineage.boundaries}
        per_boundary: dict[int, list[_Spike]] = {}
        for metric, kind in watched.items():
            correct = kind == "step" and metric in squared and cfg.correct_for_lr and lr is not None
            for piece_index, spike in self._spikes(lineage, metric, kind=kind, lr=lr if correct else None):
                if kind == "step" and not spike.lr_corrected and lr_rose.get(piece_index):
                    continue  # the LR itself rose here: a larger step is what it should do
                per_boundary.setdefault(piece_index, []).append(spike)
        out: list[Finding] = []
        for b in lineage.boundaries:
            spikes = per_boundary.get(b.piece_index, [])
            kinds = {s.kind for s in spikes}
            if not kinds or kinds == {"loss"}:
                continue  # the loss alone accuses nothing: see the module docstring
            if len(kinds) == 1:
                best = max(spikes, key=lambda s: s.z / max(s.null_max, RATIO_FLOOR))
                if best.z < cfg.alone_min_z or best.z < cfg.alone_margin * max(best.null_max, 0.0):
                    continue
                lr_ruled_out = best.kind == "step" and (best.lr_corrected or lr_rose[b.piece_index] is False)
                confident = lr_ruled_out
            else:
                confident = True
            out.append(self._finding(b, spikes, confident=confident, lr=lr, lr_rose=lr_rose[b.piece_index]))
        return out

    def _finding(self, b: Boundary, spikes: list[_Spike], *, confident: bool, lr: str | None, lr_rose: bool | None) -> Finding:
        parts = []
        for s in spikes:
            unit = " per unit of LR²" if s.lr_corrected else ""
            fold = f", {s.fold:.1f}× its level{unit}" if s.fold is not None and np.isfinite(s.fold) else ""
            parts.append(f"{s.metric} rose from {fmt(s.level)} to {fmt(s.peak)} at step {s.peak_step}{fold} "
                         f"(z = {s.z:.1f}; the largest rise anywhere else in the run is {s.null_max:.1f})")
        lead = "Optimizer state was lost" if confident else "Optimizer state may have been lost"
        why = ""
        if any(s.kind == "step" for s in spikes):
            why = " The policy took an unusually large step right after the resume, as fresh Adam moments make it do"
            if any(s.lr_corrected for s in spikes):
                why += f" ({lr} accounted for: not a restarted LR schedule)"
            elif lr is None:
                why += " (the LR is not logged: a jump of the LR would do this too)"
            elif lr_rose is False:
                why += f" ({lr} did not rise: not a restarted LR schedule)"
            why += "."
        msg = (f"{lead} at the resume at step {b.step}: {'; '.join(parts)}.{why} A re-created optimizer "
               f"(fresh Adam moments) does this, so check that the optimizer state is loaded from the checkpoint.")
        return self.finding(
            step=b.step, severity="error" if confident else "warning", message=msg,
            data={"spikes": [s.__dict__ for s in spikes], "resumed_from_step": b.resumed_from_step,
                  "lr_metric": lr, "lr_rose": lr_rose},
            metrics=[s.metric for s in spikes] + [lr])

    # ------------------------------------------------------------------------------ statistic

    def _prepare(self, lineage: Lineage, metric: str, *, kind: Kind, lr: str | None) -> _Prepared | None:
        cfg = self.config
        raw = piece_series(lineage, metric)
        allv = pooled_values(raw)
        if not len(allv):
            return None
        if np.all(allv == 0):
            return None  # nothing ever moved: no variation to judge a rise against
        positive = bool(np.all(allv > 0))
        # a step size at 0 now and then (a clip fraction with no token clipped) is judged as log(v + its
        # smallest positive value, one clipped token's worth): multiplicative noise, zeros kept
        log_space = positive or (kind == "step" and bool(np.all(allv >= 0)))
        offset = 0.0 if positive or not log_space else float(np.min(allv[allv > 0]))
        lrs = piece_series(lineage, lr) if lr is not None and log_space and offset == 0.0 else None
        if lrs is not None and any(q is None for p, q in zip(raw, lrs) if p is not None):
            lrs = None  # a piece without its LR: correct all pieces or none
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = []
        for k, p in enumerate(raw):
            if p is None:
                parts.append(None)
                continue
            steps, vals = p.steps, p.values
            tr = floored_log(vals, offset) if log_space else vals.copy()
            if lrs is not None:
                steps, vals, tr = _lr_corrected(p, lrs[k], tr)
            parts.append((steps, vals, tr) if len(steps) else None)
        trs = [q[2] for q in parts if q is not None]
        if not trs:
            return None
        noise = pooled_diff_noise(trs)
        if noise == 0.0 and kind == "step":  # most differences exactly 0 (mostly at 0): use their spread
            d = np.concatenate([np.diff(t) for t in trs if len(t) > 1] or [np.empty(0)])
            noise = float(np.std(d)) / FIRST_DIFF_SCALE if len(d) else float("nan")
        if not np.isfinite(noise) or (kind == "step" and noise == 0.0):
            return None
        floor = cfg.noise_floor_log if log_space else LINEAR_NOISE_FLOOR * (mad(allv) or MAD_FLOOR)
        return _Prepared(parts, max(noise, floor), log_space, lrs is not None)

    def _spikes(self, lineage: Lineage, metric: str, *, kind: Kind, lr: str | None) -> list[tuple[int, _Spike]]:
        cfg = self.config
        prep = self._prepare(lineage, metric, kind=kind, lr=lr)
        if prep is None:
            return []
        k_after = cfg.step_window_after if kind == "step" else cfg.window_after
        null = np.concatenate([self._null(q[2], prep.noise, k_after) for q in prep.parts if q is not None])
        if len(null) < cfg.min_null_positions:
            return []
        null_max = float(np.max(null))
        out = []
        for b in lineage.boundaries:
            k = b.piece_index
            before, after = around(prep.parts, k)
            if before is None or after is None or len(before[0]) < cfg.min_points_before:
                continue
            pre_tr, pre_raw = before[2][-cfg.window_before:], before[1][-cfg.window_before:]
            post_steps, post_raw, post_tr = (x[:k_after] for x in after)
            z = self._z(pre_tr, post_tr, prep.noise)
            if z is None or z < cfg.min_z or z < cfg.null_margin * max(null_max, 0.0):
                continue
            rise = float(np.mean(post_tr) - np.median(pre_tr))
            if prep.log_space:
                fold: float | None = float(np.exp(rise))
            else:
                lvl = float(np.median(pre_tr))
                fold = float(np.mean(post_tr) / lvl) if lvl > 0 else None
            if kind == "step" and fold is not None and fold < cfg.min_step_fold:
                continue
            j = int(np.argmax(post_raw))
            out.append((k, _Spike(metric, kind, float(z), null_max, float(np.median(pre_raw)), float(post_raw[j]),
                                  int(post_steps[j]), len(null), fold, prep.lr_corrected)))
        return out

    def _lr_rose(self, lineage: Lineage, b: Boundary, lr: str | None) -> bool | None:
        """Whether the logged LR rose at the resume (None: no LR logged around it)."""
        if lr is None:
            return None
        hist = history(lineage, b, lr)  # by step, so a rewind compares with the LR at the resumed step
        _, after = before_after(lineage, b, lr)
        if hist is None or after is None:
            return None
        level = float(np.median(restored_values(hist, b)[-LR_LEVEL_POINTS:]))
        first = float(np.mean(after.values[: self.config.step_window_after]))
        if level <= 0:
            return first > 0
        return first > (1.0 + self.config.lr_rise_tolerance) * level

    def _null(self, v: np.ndarray, noise: float, k: int) -> np.ndarray:
        """The statistic at every position inside one piece with full windows on both sides."""
        W = self.config.window_before
        if len(v) < W + k:
            return np.empty(0)
        pre = sliding_median(v, W)[: len(v) - W - k + 1]  # pre[j] = median(v[j:j+W])
        post = np.mean(sliding_window_view(v, k), axis=1)[W:]  # post[j] = mean(v[j+W:j+W+k])
        se = noise * np.sqrt(1.0 / k + MEDIAN_VARIANCE / W)
        return (post - pre) / se

    @staticmethod
    def _z(pre: np.ndarray, post: np.ndarray, noise: float) -> float | None:
        """Mean after minus median before, in standard errors of that difference (a median of n
        points has about pi/2 the variance of a mean)."""
        if len(pre) < 2 or len(post) < 1:
            return None
        se = noise * np.sqrt(1.0 / len(post) + MEDIAN_VARIANCE / len(pre))
        return float((np.mean(post) - np.median(pre)) / se)


def _lr_corrected(p: Series, lr: Series, log_values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log(approx-KL / LR²) at the steps where the piece logs both (a positive LR); the KL of a small step
    grows with its square, so this is the size of the optimizer's normalised step."""
    lr_at: dict[int, float] = {}
    for s, v in zip(lr.steps.tolist(), lr.values.tolist()):
        lr_at[s] = v  # a re-logged step: the latest value, as the rest of the piece
    keep = np.array([lr_at.get(s, 0.0) > 0 for s in p.steps.tolist()], dtype=bool)
    lrv = np.array([lr_at.get(s, 1.0) for s in p.steps.tolist()], dtype=float)
    return p.steps[keep], p.values[keep], (log_values - 2.0 * np.log(np.where(keep, lrv, 1.0)))[keep]
