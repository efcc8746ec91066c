"""The shared statistics added for the finding detectors (``klwatch.stats``)."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.stats import FIRST_DIFF_SCALE, diff_noise, pooled_diff_noise


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
