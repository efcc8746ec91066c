"""The framework's global step as the x axis: taken only when every value is a step klwatch can hold."""

from __future__ import annotations

import numpy as np

from klwatch.model import Segment, Series
from klwatch.step_axis import STEP_AXIS_METRICS, step_axis_metric, to_framework_steps


def _segment(global_steps: list[float]) -> Segment:
    steps = np.arange(len(global_steps))
    axis = STEP_AXIS_METRICS[0]
    return Segment(kind="wandb-offline", ref="r", source=".", series={
        axis: Series(steps, np.array(global_steps, dtype=float)),
        "kl": Series(steps, np.linspace(0.1, 0.5, len(global_steps)))})


def test_a_global_step_series_is_the_axis_and_maps_the_tracker_steps():
    seg = _segment([10.0, 11.0, 12.0])
    axis = step_axis_metric(seg)
    assert axis == STEP_AXIS_METRICS[0]
    assert to_framework_steps(seg, axis).series["kl"].steps.tolist() == [10, 11, 12]


def test_a_global_step_out_of_range_is_no_axis_and_never_becomes_another_number():
    """1e30 cast to int64 would be -9223372036854775808: the tracker's own step stays the axis."""
    for bad in (1e30, float("inf"), -1e20):
        assert step_axis_metric(_segment([10.0, 11.0, bad])) is None
