"""The few statistics every detector leans on, in one place.

KL, learning rates and losses are judged in log space (they are positive and their noise is
multiplicative), with a floor so a value of ~0 stays finite; noise is measured robustly (the median
absolute deviation, scaled to a Gaussian sigma), so one spike or a trend does not inflate it; points are
weighed with a Student-t density, so one outlier is never a verdict. No ``scipy.stats`` here: importing
it costs every CLI start most of a second.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .model import Series

MAD_TO_SIGMA = 1.4826
"""The MAD of Gaussian data times this is its standard deviation (1 / Phi^-1(3/4))."""

FIRST_DIFF_SCALE = float(np.sqrt(2.0))
"""A first difference of two points adds two noises: its sigma is sqrt(2) that of one point."""

SECOND_DIFF_SCALE = float(np.sqrt(6.0))
"""A second difference x[i+1] - 2 x[i] + x[i-1] has sigma sqrt(1 + 4 + 1) that of one point."""


def floored_log(x: np.ndarray | float, eps: float) -> np.ndarray:
    """log(max(x, 0) + eps): the log of a positive quantity that may touch zero (a KL right after the
    reference was snapshotted is exactly 0), ``eps`` being the level below which values count as zero."""
    return np.log(np.clip(x, 0.0, None) + eps)


SLIDING_MEDIAN_FILTER_MIN = 256
"""From this many points on, ``sliding_median`` uses scipy's rank filters (O(n log w) in C) instead of
numpy's partition of every window: 2-10x faster already at a thousand points, where a fleet's finding
detectors spent most of their judging time; below it numpy's fixed cost is the smaller."""


def sliding_median(x: np.ndarray, w: int) -> np.ndarray:
    """``np.median(sliding_window_view(x, w), axis=1)``: m[j] = median(x[j:j+w]), the very same numbers.

    A median of finite numbers picks the middle element (odd ``w``) or averages the two middle ones
    (even ``w``) exactly as numpy does, so long series go through ``scipy.ndimage`` rank filters,
    whose full windows sit at ``w // 2`` past each window's start."""
    x = np.asarray(x, dtype=np.float64)
    if 2 <= w <= SLIDING_MEDIAN_NETWORK_MAX and w <= len(x) and np.isfinite(x).all() and x.all():
        return _small_window_median(x, w)
    if len(x) < max(SLIDING_MEDIAN_FILTER_MIN, w) or w < 2 or not np.isfinite(x).all():
        from numpy.lib.stride_tricks import sliding_window_view

        return np.median(sliding_window_view(x, w), axis=1)
    from scipy.ndimage import rank_filter

    inner = slice(w // 2, w // 2 + len(x) - w + 1)
    if w % 2:
        return rank_filter(x, rank=w // 2, size=w, mode="nearest")[inner]
    lower = rank_filter(x, rank=w // 2 - 1, size=w, mode="nearest")[inner]
    upper = rank_filter(x, rank=w // 2, size=w, mode="nearest")[inner]
    return (lower + upper) / 2


SLIDING_MEDIAN_NETWORK_MAX = 4
"""Windows of up to this many points take their medians from elementwise minima and maxima of shifted
views (a sorting network: a handful of numpy steps, whatever the length), when every value is finite and
none is zero: equal nonzero floats are the same bits, so whichever of two ties is picked, the numbers are
numpy's (a window of 4 is the finding detectors' ``window``)."""


def _small_window_median(x: np.ndarray, w: int) -> np.ndarray:
    """``sliding_median`` for 2 <= ``w`` <= 4 by a sorting network over the ``w`` shifted views: the
    middle element (odd ``w``), or the two middle ones averaged as ``np.median`` averages them,
    ``(lower + upper) / 2`` (even ``w``)."""
    n = len(x) - w + 1
    views = [x[k:k + n] for k in range(w)]
    if w == 2:
        return (views[0] + views[1]) / 2
    lo, hi = np.minimum(views[0], views[1]), np.maximum(views[0], views[1])
    if w == 3:
        return np.maximum(lo, np.minimum(hi, views[2]))
    lo2, hi2 = np.minimum(views[2], views[3]), np.maximum(views[2], views[3])
    # of four values, the two middle ones are the larger of the two pairs' minima and the smaller of
    # their maxima
    return (np.maximum(lo, lo2) + np.minimum(hi, hi2)) / 2


def mad(x: np.ndarray) -> float:
    """The median absolute deviation around the median (0 for no points)."""
    x = np.asarray(x)
    return float(np.median(np.abs(x - np.median(x)))) if len(x) else 0.0


def robust_sigma(x: np.ndarray) -> float:
    """A Gaussian-equivalent standard deviation that one spike cannot inflate: ``MAD_TO_SIGMA`` x MAD."""
    return mad(x) * MAD_TO_SIGMA


def robust_sigma_about_zero(x: np.ndarray) -> float:
    """``robust_sigma`` for a quantity whose centre is known to be 0 (the differences of a smooth curve):
    ``MAD_TO_SIGMA`` x the median of |x|, so a steady trend in the differences counts as noise too."""
    return float(np.median(np.abs(x))) * MAD_TO_SIGMA


def diff_noise(x: np.ndarray) -> float:
    """The noise of one point from its step-to-step differences: robust to a trend (differencing
    removes it) and to spikes (the MAD ignores them)."""
    return robust_sigma(np.diff(x)) / FIRST_DIFF_SCALE


def theil_sen_slope(x: np.ndarray, y: np.ndarray) -> float:
    """The median of the pairwise slopes (0 with fewer than two distinct x): a line one outlier barely moves."""
    slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(len(y)) for j in range(i + 1, len(y)) if x[j] > x[i]]
    return float(np.median(slopes)) if slopes else 0.0


def t_logpdf(x: np.ndarray | float, dof: float, loc: np.ndarray | float, scale: np.ndarray | float) -> np.ndarray:
    """Student-t log density, as ``scipy.stats.t.logpdf``: heavy tails so one outlier is not a verdict."""
    from scipy.special import gammaln  # not at import: scipy loads only when something is judged

    z = (np.asarray(x) - loc) / scale
    return (gammaln((dof + 1) / 2) - gammaln(dof / 2) - 0.5 * np.log(dof * np.pi) - np.log(scale)
            - (dof + 1) / 2 * np.log1p(z * z / dof))


def last_per_step(s: Series) -> Series:
    """The series as a function of step, sorted by step, the latest logged value winning where a step
    was logged twice (a rewind re-logs steps; the last write is what the resumed process restored)."""
    rev_steps = s.steps[::-1]
    _, idx = np.unique(rev_steps, return_index=True)
    keep = len(s) - 1 - idx
    keep.sort()
    out = s.take(keep)
    return out.take(np.argsort(out.steps, kind="stable"))


def pooled_diff_noise(parts: Sequence[np.ndarray]) -> float:
    """``diff_noise`` pooled over the pieces of a run, never differencing across a boundary (a resume
    may jump): the first differences of each piece's finite values (pieces of three points or more),
    their robust sigma, scaled to one point. NaN when no piece is long enough."""
    d = [np.diff(p[np.isfinite(p)]) for p in parts if len(p) > 2]
    if not d:
        return float("nan")
    return robust_sigma(np.concatenate(d)) / FIRST_DIFF_SCALE
