"""The shared statistics added for the finding detectors (``klwatch.stats``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klwatch.stats import FIRST_DIFF_SCALE, diff_noise, pooled_diff_noise, robust_sigma, robust_sigma_about_zero


def test_pooled_diff_noise_never_differences_across_a_piece_boundary():
    a = np.array([0.0, 1.0, 0.0])
    b = np.array([50.0, 51.0, 50.0])  # a level jump between the pieces
    assert pooled_diff_noise([a, b]) == pytest.approx(1.4826 / FIRST_DIFF_SCALE)  # differences +-1 only
    assert diff_noise(np.concatenate([a, b])) == pytest.approx(2 * 1.4826 / FIRST_DIFF_SCALE)  # the jump counts


def test_pooled_diff_noise_is_the_robust_sigma_of_first_differences_of_one_point():
    x = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 5.0])  # differences 1, -1, 1, -1, 5: MAD around 1 is 2
    assert pooled_diff_noise([x]) == pytest.approx(2.0 * 1.4826 / FIRST_DIFF_SCALE)


def test_pooled_diff_noise_skips_non_finite_values_and_pieces_of_two_points():
    x = np.array([0.0, 1.0, np.nan, 0.0, 1.0, 0.0])
    short = np.array([0.0, 100.0])
    assert pooled_diff_noise([x, short]) == pytest.approx(pooled_diff_noise([np.array([0.0, 1.0, 0.0, 1.0, 0.0])]))


def test_pooled_diff_noise_is_nan_without_a_piece_of_three_points():
    assert np.isnan(pooled_diff_noise([]))
    assert np.isnan(pooled_diff_noise([np.array([1.0, 2.0])]))


def test_robust_sigma_about_zero_measures_spread_around_zero_not_around_the_median():
    x = np.array([1.0, 1.0, 1.0, 1.0, -1.0])
    assert robust_sigma(x) == pytest.approx(0.0)  # around its median (1) most points do not deviate
    assert robust_sigma_about_zero(x) == pytest.approx(1.4826)


def test_robust_sigma_about_zero_ignores_one_spike():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 0.5, 2000)
    x[7] = 1e6
    assert robust_sigma_about_zero(x) == pytest.approx(0.5, rel=0.1)


@settings(max_examples=60, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(n=st.integers(1, 9000), w=st.integers(1, 40), seed=st.integers(0, 2**31), ties=st.booleans())
def test_sliding_median_is_numpys_median_of_every_window(n: int, w: int, seed: int, ties: bool) -> None:
    """Long series go through scipy's rank filters: the very same numbers as numpy's median per window."""
    from numpy.lib.stride_tricks import sliding_window_view

    from klwatch.stats import sliding_median

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, n).astype(float) if ties else rng.standard_cauchy(n)
    if w > n:
        return
    np.testing.assert_array_equal(sliding_median(x, w), np.median(sliding_window_view(x, w), axis=1))


def _bits(a: np.ndarray) -> bytes:
    """The exact float64 bits of an array (so 0.0 and -0.0 differ, unlike ``==``)."""
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()


_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=300, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(x=st.one_of(
    st.lists(_FLOATS, min_size=1, max_size=400),  # any finite floats (zeros of both signs included)
    st.lists(st.sampled_from([-2.5, -1.0, 1.0, 3.0, 7.25]), min_size=1, max_size=400),  # many ties, no zero
    st.lists(st.sampled_from([-1.0, -0.0, 0.0, 1.0, 2.0]), min_size=1, max_size=400),  # ties and signed zeros
    st.lists(st.one_of(_FLOATS, st.just(float("nan")), st.just(float("inf"))), min_size=1, max_size=50)),
    w=st.integers(1, 6))
def test_sliding_median_of_small_windows_is_bit_for_bit_numpys(x: list[float], w: int) -> None:
    """Windows of 2-4 points go through a sorting network (minima and maxima of shifted views): the very
    same bits as numpy's median of every window, for ties, signed zeros, NaN and inf (those last three
    take the general path) and every length, including the rank filters' range (256 points on)."""
    from numpy.lib.stride_tricks import sliding_window_view

    from klwatch.stats import sliding_median

    arr = np.array(x, dtype=np.float64)
    if w > len(arr):
        return
    with np.errstate(invalid="ignore"):
        expected = np.median(sliding_window_view(arr, w), axis=1)
    assert _bits(sliding_median(arr, w)) == _bits(expected)


@settings(max_examples=60, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(n=st.integers(4, 9000), seed=st.integers(0, 2**31), kind=st.sampled_from(["cauchy", "ties", "log"]))
def test_sliding_median_of_four_is_bit_for_bit_numpys_on_long_series(n: int, seed: int, kind: str) -> None:
    """The finding detectors' window (4) on series as long as a fleet's runs: the network gives numpy's
    bits where the rank filters were used before."""
    from numpy.lib.stride_tricks import sliding_window_view

    from klwatch.stats import floored_log, sliding_median

    rng = np.random.default_rng(seed)
    if kind == "cauchy":
        x = rng.standard_cauchy(n)
    elif kind == "ties":
        x = rng.integers(1, 6, n).astype(float) / 7
    else:
        x = floored_log(np.where(rng.random(n) < 0.05, 0.0, rng.gamma(2.0, 0.01, n)), 1e-4)
    assert _bits(sliding_median(x, 4)) == _bits(np.median(sliding_window_view(x, 4), axis=1))
