"""Min/max downsampling: thinning a series for the browser never hides a drop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klwatch.downsample import minmax_indices


def test_short_series_keeps_every_point() -> None:
    values = np.array([3.0, 1.0, 2.0, 5.0])
    assert minmax_indices(values, max_points=4).tolist() == [0, 1, 2, 3]


def test_long_series_is_cut_to_the_budget_and_keeps_both_ends() -> None:
    values = np.sin(np.arange(100_000) / 50.0)
    idx = minmax_indices(values, max_points=2_000)
    assert len(idx) <= 2_000
    assert len(idx) > 1_000  # the budget is used, not wasted
    assert idx[0] == 0 and idx[-1] == len(values) - 1
    assert np.all(np.diff(idx) > 0)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=50, max_value=20_000),
    where=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    max_points=st.integers(min_value=4, max_value=3_000),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
)
def test_a_one_step_drop_to_zero_is_always_kept(n: int, where: float, max_points: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = 0.05 + 0.01 * rng.random(n)
    drop = int(where * n)
    values[drop] = 0.0
    idx = minmax_indices(values, max_points=max_points)
    assert drop in idx
    assert len(idx) <= max_points


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.just(float("nan"))),
                    min_size=1, max_size=400),
    max_points=st.integers(min_value=4, max_value=100),
)
def test_every_bucket_keeps_its_min_and_max(values: list[float], max_points: int) -> None:
    arr = np.array(values, dtype=np.float64)
    idx = minmax_indices(arr, max_points=max_points)
    assert len(idx) <= max_points
    assert np.all(np.diff(idx) > 0) and idx[0] == 0 and idx[-1] == len(arr) - 1
    kept = arr[idx]
    finite = arr[~np.isnan(arr)]
    if len(finite):  # the global extremes are in some bucket, so they are drawn
        assert np.nanmin(kept) == finite.min()
        assert np.nanmax(kept) == finite.max()


def test_rewound_steps_stay_in_logged_order() -> None:
    # A resume from an older checkpoint logs steps 0..599 then 400..999: thinning must not sort them.
    steps = np.concatenate([np.arange(600), np.arange(400, 1000)])
    values = np.where(np.arange(len(steps)) == 600, 0.0, 1.0)
    idx = minmax_indices(values, max_points=100)
    assert 600 in idx
    kept_steps = steps[idx]
    assert np.any(np.diff(kept_steps) < 0), "the rewind disappeared"


def test_too_small_a_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        minmax_indices(np.zeros(10), max_points=3)
