"""Optimizer state lost at a resume: the optimizer was re-created with fresh Adam moments.

The bug: the resumed process loads the weights but not the optimizer state (or a sharded optimizer
checkpoint silently fails to load), so Adam starts again with zero moments and step count 1. With bias
correction its first updates are about ``lr * sign(gradient)`` in every coordinate, far larger than the
well-scaled steps of a warm optimizer, and the grad norm and the loss spike in the first steps after
the resume. Training continues and usually recovers, which is why this goes unnoticed.

Why the statistic works: a spike only means something against what the run does on its own. For each
of the grad-norm and loss series we measure how far the mean of the first few points after the resume
rises above the median level just before, in standard errors built from the run's own robust
step-to-step noise (log space for a positive series, where noise is multiplicative). We compute the very same statistic at every position *inside*
the pieces, where there was no resume: the run's own null distribution of spikes (noisy grad norms,
warm-up, loss trends all land in it). A boundary is reported only when its spike is large in absolute
terms *and* larger than every spike the run produced without a resume. The grad norm must spike;
the loss only corroborates (``error`` when both spike, ``warning`` for a clearer grad-norm spike alone), because
a total loss includes the KL penalty, which other resume bugs move by themselves (a KL coefficient
reset multiplies it, a reference reset zeroes it), so a loss spike alone cannot accuse the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..model import Boundary, Finding, LineageResult
from .base import (GRAD_NORM, LOSS, FindingDetector, MetricFamily, before_after, find_metric, fmt,
                   piece_series, pooled_diff_noise)


@dataclass(frozen=True)
class OptimizerStateLostConfig:
    """Thresholds of the optimizer-state-lost detector."""

    families: tuple[MetricFamily, ...] = (GRAD_NORM, LOSS)
    window_before: int = 8
    """Points before a position whose median is the level a spike is measured from."""
    min_points_before: int = 4
    window_after: int = 5
    """The spike is the mean of this many points after the resume: fresh moments act at once and for
    several steps, and a mean is far less noisy than one point."""
    min_z: float = 3.0
    """A spike must reach this many standard errors above the level before ..."""
    null_margin: float = 1.2
    """... and this factor times the largest spike the run shows anywhere without a resume."""
    alone_min_z: float = 4.0
    """A grad-norm spike with no loss spike beside it needs this many standard errors ..."""
    alone_margin: float = 1.5
    """... and this factor over the run's own largest rise: one witness must be clearer than two."""
    min_null_positions: int = 10
    """Fewer in-piece positions than this: the run's own variation is unknown, nothing is reported."""
    noise_floor_log: float = 0.01
    """Smallest log-space noise assumed (1%) for a positive series."""


@dataclass(frozen=True)
class _Spike:
    metric: str
    z: float
    null_max: float
    level: float
    peak: float
    peak_step: int
    n_null: int


class OptimizerStateLost(FindingDetector[OptimizerStateLostConfig]):
    name = "optimizer_state_lost"
    config_class = OptimizerStateLostConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        lineage = result.lineage
        if not lineage.boundaries:
            return []
        names = lineage.metric_names()
        metrics = [m for m in (find_metric(names, family=f) for f in self.config.families) if m]
        loss = find_metric(names, family=LOSS)
        per_boundary: dict[int, list[_Spike]] = {}
        for metric in dict.fromkeys(metrics):
            for b, spike in self._spikes(lineage, metric):
                per_boundary.setdefault(b.piece_index, []).append(spike)
        out: list[Finding] = []
        for b in lineage.boundaries:
            spikes = per_boundary.get(b.piece_index, [])
            if not spikes or all(s.metric == loss for s in spikes):
                continue  # the loss alone accuses nothing: see the module docstring
            if len(spikes) == 1 and (spikes[0].z < self.config.alone_min_z
                                     or spikes[0].z < self.config.alone_margin * spikes[0].null_max):
                continue
            confident = len(spikes) >= 2
            parts = "; ".join(f"{s.metric} rose from {fmt(s.level)} to {fmt(s.peak)} at step {s.peak_step} "
                              f"(z = {s.z:.1f}; the largest rise anywhere else in the run is {s.null_max:.1f})"
                              for s in spikes)
            lead = "Optimizer state was lost" if confident else "Optimizer state may have been lost"
            msg = (f"{lead} at the resume at step {b.step}: {parts}; a re-created optimizer (fresh Adam moments) "
                   f"does this, so check that the optimizer state is loaded from the checkpoint.")
            out.append(self.finding(
                step=b.step, severity="error" if confident else "warning", message=msg,
                data={"spikes": [s.__dict__ for s in spikes], "resumed_from_step": b.resumed_from_step}))
        return out

    def _spikes(self, lineage, metric: str) -> list[tuple[Boundary, _Spike]]:
        cfg = self.config
        parts = piece_series(lineage, metric)
        present = [p for p in parts if p is not None]
        if not present:
            return []
        allv = np.concatenate([p.values for p in present])
        positive = bool(np.all(allv > 0))
        tr = (lambda v: np.log(v)) if positive else (lambda v: v)  # noqa: E731
        noise = pooled_diff_noise([tr(p.values) for p in present])
        floor = cfg.noise_floor_log if positive else 1e-3 * float(np.median(np.abs(allv - np.median(allv))) or 1e-12)
        if not np.isfinite(noise):
            return []
        noise = max(noise, floor)
        null = np.concatenate([self._null(tr(p.values), noise) for p in present])
        if len(null) < cfg.min_null_positions:
            return []
        null_max = float(np.max(null))
        out = []
        for b in lineage.boundaries:
            before, after = before_after(lineage, b, metric)
            if before is None or after is None or len(before) < cfg.min_points_before:
                continue
            pre = before.values[-cfg.window_before:]
            post = after.take(slice(0, cfg.window_after))
            z = self._z(tr(pre), tr(post.values), noise)
            if z is None or z < cfg.min_z or z < cfg.null_margin * null_max:
                continue
            j = int(np.argmax(post.values))
            out.append((b, _Spike(metric, float(z), null_max, float(np.median(pre)), float(post.values[j]),
                                  int(post.steps[j]), len(null))))
        return out

    def _null(self, v: np.ndarray, noise: float) -> np.ndarray:
        """The statistic at every position inside one piece with full windows on both sides."""
        W, k = self.config.window_before, self.config.window_after
        if len(v) < W + k:
            return np.empty(0)
        pre = np.median(sliding_window_view(v, W), axis=1)[: len(v) - W - k + 1]  # pre[j] = median(v[j:j+W])
        post = np.mean(sliding_window_view(v, k), axis=1)[W:]  # post[j] = mean(v[j+W:j+W+k])
        se = noise * np.sqrt(1.0 / k + (np.pi / 2) / W)
        return (post - pre) / se

    @staticmethod
    def _z(pre: np.ndarray, post: np.ndarray, noise: float) -> float | None:
        """Mean after minus median before, in standard errors of that difference (a median of n
        points has about pi/2 the variance of a mean)."""
        if len(pre) < 2 or len(post) < 1:
            return None
        se = noise * np.sqrt(1.0 / len(post) + (np.pi / 2) / len(pre))
        return float((np.mean(post) - np.median(pre)) / se)

