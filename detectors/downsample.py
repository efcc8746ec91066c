"""Thin a long series for drawing without ever hiding the point that matters.

A browser cannot draw a million points, but random or stride sampling can drop the one step where
the KL fell to zero, which is the whole reason to look. Min/max bucketing keeps, for each run of
consecutive points, its lowest and its highest value (plus the very first and last point), so a
one-step spike or drop survives any amount of thinning. Buckets are cut by position in logged order,
not by step, so a rewind (steps going back) stays visible.
"""

from __future__ import annotations

import math

import numpy as np


def minmax_indices(values: np.ndarray, *, max_points: int) -> np.ndarray:
    """Indices (ascending, in logged order) of at most ``max_points`` points to draw.

    Every point is kept when the series is short enough. Otherwise the series is cut into equal
    buckets of consecutive points and each bucket keeps the index of its minimum and its maximum;
    the first and last points are always kept. NaNs are never chosen over a number in their bucket.
    """
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, not {max_points}")
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    budget = (max_points - 2) // 2  # two points per bucket, plus first and last
    size = math.ceil(n / budget)
    buckets = math.ceil(n / size)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = values
    grid = padded.reshape(buckets, size)
    nan = np.isnan(grid)
    lows = np.argmin(np.where(nan, np.inf, grid), axis=1)
    highs = np.argmax(np.where(nan, -np.inf, grid), axis=1)
    offsets = np.arange(buckets, dtype=np.int64) * size
    keep = np.concatenate(([0, n - 1], offsets + lows, offsets + highs))
    keep = keep[keep < n]
    return np.unique(keep)
