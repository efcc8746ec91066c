"""The KL reference-reset detector: did the frozen reference get rebuilt from the resumed weights?

The bug's signature is mechanical. If the reference is snapshotted *after* the checkpoint is loaded,
policy and reference are equal at the first step after the resume, so the logged KL is about zero
there, and it then grows back the way it grew at the start of training. If the reference is the base
model, KL simply continues at its level. So at every boundary we weigh two hypotheses for the first
points after the resume, in log space (KL is positive and its noise is multiplicative):

- H0, *continues*: the points scatter around the level just before, with the run's own step-to-step
  noise (estimated robustly from the pre-resume window);
- H1, *reset*: the points follow the run's own opening growth curve restarted from zero (at a few
  time scales, since learning-rate warm-up makes the opening slower than a mid-run regrowth), or,
  where the run's opening is not in the logs, a ramp from zero.

Both use Student-t likelihoods (one outlier is not a verdict). The score is the posterior
probability of H1 (prior 1/2 by default). The verdict needs the drop to persist: two or more points
after the resume below half the level before. A resume before KL had grown, a run whose KL is zero
throughout, or too few points, are ``inconclusive`` rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, gammaln, logsumexp

from .model import Boundary, BoundaryVerdict, Series


@dataclass(frozen=True)
class ReferenceResetConfig:
    """Thresholds of the reference-reset detector (the dashboard exposes them)."""

    reset_score: float = 0.95
    """Posterior at or above which a boundary is a ``reference_reset``."""
    ok_score: float = 0.2
    """Posterior at or below which a boundary is ``ok``; between the two it is ``inconclusive``."""
    min_points_before: int = 5
    min_points_after: int = 2
    window_before: int = 20
    window_after: int = 6
    grown_fraction: float = 0.1
    """KL before the resume must reach this fraction of the run's typical KL to be judged."""
    zero_fraction: float = 0.01
    """Values below this fraction of the run's typical KL count as zero (the log-space floor)."""
    low_fraction: float = 0.5
    """A post-resume point is 'low' below this fraction of the level before."""
    min_low_points: int = 2
    prior: float = 0.5
    dof: float = 3.0
    noise_floor: float = 0.1
    """Smallest log-space noise assumed, so a very smooth KL does not make every wiggle significant."""


def typical_kl(values: np.ndarray) -> float:
    """The run's typical KL: the 90th percentile of its positive values (robust to one spike)."""
    v = values[np.isfinite(values) & (values > 0)]
    return float(np.percentile(v, 90)) if len(v) else 0.0


def t_logpdf(x: np.ndarray, dof: float, loc: np.ndarray | float, scale: float) -> np.ndarray:
    """Student-t log density (as scipy.stats.t.logpdf, without importing scipy.stats on every CLI start)."""
    z = (np.asarray(x) - loc) / scale
    return (gammaln((dof + 1) / 2) - gammaln(dof / 2) - 0.5 * np.log(dof * np.pi) - np.log(scale)
            - (dof + 1) / 2 * np.log1p(z * z / dof))


def _log(x: np.ndarray, eps: float) -> np.ndarray:
    return np.log(np.clip(x, 0.0, None) + eps)


def _noise(logs: np.ndarray, floor: float) -> float:
    if len(logs) < 3:
        return max(floor, 0.5)
    d = np.diff(logs)
    mad = float(np.median(np.abs(d - np.median(d)))) * 1.4826 / np.sqrt(2.0)
    return max(floor, mad)


def _templates(offsets: np.ndarray, level: float, start: Series | None) -> list[np.ndarray]:
    """H1's predicted KL at each post-resume step offset: regrowth from zero at several speeds.

    The run's own opening is the best template (as logged, and less its first value for a run whose
    reference differs from the initial policy); ramps cover runs whose opening is not in the logs.
    A ramp may have had one step to grow already: frameworks log the KL of the first step after
    the update on some setups.
    """
    temps: list[np.ndarray] = []
    if start is not None and len(start) >= 3:
        s_off = (start.steps - start.steps[0]).astype(float)
        s_val = np.clip(start.values, 0.0, None)
        for base in (s_val, np.clip(s_val - s_val[0], 0.0, None)):
            for speed in (0.5, 1.0, 2.0, 4.0):
                temps.append(np.interp(offsets * speed, s_off, base))
    for shift in (0.0, 1.0):
        for ramp in (4.0, 8.0, 16.0, 32.0, 64.0):  # reaching the old level after `ramp` steps
            temps.append(level * np.clip((offsets + shift) / ramp, 0.0, 1.0))
    return temps


def judge_boundary(
    boundary: Boundary,
    before: Series,
    after: Series,
    *,
    start: Series | None,
    scale: float,
    config: ReferenceResetConfig = ReferenceResetConfig(),
) -> BoundaryVerdict:
    """Judge one resume boundary from the KL just before and just after it.

    ``before`` is the KL of the piece that ends at the boundary, ``after`` of the piece that starts
    there; ``start`` the run's opening KL when the logs hold it; ``scale`` the run's typical KL.
    """
    pre_all = before.take(np.isfinite(before.values))
    post_all = after.take(np.isfinite(after.values))
    pre = pre_all.take(slice(-config.window_before, None))
    post = post_all.take(slice(0, config.window_after))
    kl_before = float(np.median(pre.values[-5:])) if len(pre) else None
    kl_after = float(post.values[0]) if len(post) else None
    win_b = (int(pre.steps[0]), int(pre.steps[-1])) if len(pre) else None
    win_a = (int(post.steps[0]), int(post.steps[-1])) if len(post) else None

    def verdict(v: str, score: float, why: str) -> BoundaryVerdict:
        return BoundaryVerdict(boundary, v, float(np.clip(score, 0.0, 1.0)), kl_before, kl_after, why, win_b, win_a)  # type: ignore[arg-type]

    at = f"at step {boundary.step}"
    if len(pre) < config.min_points_before:
        return verdict("inconclusive", 0.5, f"Only {len(pre)} KL point(s) before the resume {at}: too few to know its level.")
    if len(post) == 0:
        return verdict("inconclusive", 0.5, f"No KL logged after the resume {at} yet.")
    assert kl_before is not None and kl_after is not None
    if scale <= 0 or kl_before <= 0 or kl_before < config.grown_fraction * scale:
        return verdict("inconclusive", 0.5,
                       f"KL before the resume {at} ({kl_before:.3g}) had not grown above its opening level yet; "
                       "a reset cannot be told from a continuation this early.")
    if len(post) >= 3 and np.all(post.values == 0.0) and np.any(pre.values != 0.0):
        return verdict("inconclusive", 0.5,
                       f"KL is exactly 0 after the resume {at}: the KL penalty looks switched off, not reset. "
                       "Check the KL coefficient in the resumed config.")

    eps = config.zero_fraction * scale
    lpre, lpost = _log(pre.values, eps), _log(post.values, eps)
    sigma0 = _noise(lpre, config.noise_floor)
    mu0 = float(np.median(lpre[-5:]))
    sigma1 = max(sigma0, 0.5)
    offsets = (post.steps - boundary.step).astype(float)
    ll0 = float(np.sum(t_logpdf(lpost, config.dof, mu0, sigma0)))
    ll1s = [float(np.sum(t_logpdf(lpost, config.dof, _log(t, eps), sigma1)))
            for t in _templates(offsets, kl_before, start)]
    ll1 = float(logsumexp(ll1s) - np.log(len(ll1s)))
    prior_logit = float(np.log(config.prior / (1.0 - config.prior)))
    score = float(expit(ll1 - ll0 + prior_logit))

    low = int(np.sum(post.values < config.low_fraction * kl_before))
    ratio = kl_after / kl_before if kl_before else float("nan")
    if score >= config.reset_score:
        if len(post) < config.min_points_after or low < config.min_low_points:
            return verdict("inconclusive", score,
                           f"KL fell from {kl_before:.3g} to {kl_after:.3g} at the resume {at}, but only "
                           f"{low} point(s) after it stay low: wait for more steps before calling it a reset.")
        return verdict("reference_reset", score,
                       f"KL fell from {kl_before:.3g} to {kl_after:.3g} ({ratio:.1%} of its level) at the first step "
                       f"after the resume {at} and grows again from there: the reference policy was rebuilt from the "
                       "resumed weights. Load the reference from the base model, not the checkpoint.")
    if score <= config.ok_score:
        return verdict("ok", score,
                       f"KL continues at its level across the resume {at} ({kl_before:.3g} before, {kl_after:.3g} after).")
    return verdict("inconclusive", score,
                   f"KL moved from {kl_before:.3g} to {kl_after:.3g} at the resume {at}; neither a continuation "
                   "nor a reset explains it clearly.")
