"""Two Segments hold the same data: what a resumed or cached read must give, compared with a cold one."""

from __future__ import annotations

import dataclasses

import numpy as np

from klwatch.model import Segment


def assert_same_segment(got: Segment, want: Segment) -> None:
    """Every field equal; series compared array by array (NaN equal to NaN), in the same key order."""
    assert list(got.series) == list(want.series), "series keys or their order differ"
    for name, w in want.series.items():
        g = got.series[name]
        np.testing.assert_array_equal(g.steps, w.steps, err_msg=f"steps of {name}")
        np.testing.assert_array_equal(g.values, w.values, err_msg=f"values of {name}")
        assert (g.wall_times is None) == (w.wall_times is None), f"wall times of {name}"
        if w.wall_times is not None:
            np.testing.assert_array_equal(g.wall_times, w.wall_times, err_msg=f"wall times of {name}")
    for f in dataclasses.fields(Segment):
        if f.name != "series":
            assert getattr(got, f.name) == getattr(want, f.name), f"{f.name} differs"
