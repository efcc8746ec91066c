"""The run model's own rules: a run's cadence, where a piece of log's training starts, the KL signed
once, what a scan could not read."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch import model
from klwatch.model import (Lineage, LineageResult, ScanResult, Segment, Series, SourceError, SourceRead, cadence_of,
                           extent_of, logging_interval, steps_between)


def _s(steps, values=None) -> Series:
    steps = np.asarray(steps)
    return Series(steps, np.ones(len(steps)) if values is None else values)


def test_the_logging_interval_is_the_median_step_gap_within_each_series_never_across_two():
    assert logging_interval([_s([10, 20, 30, 40])]) == 10
    # a restart from step 95 to 31 is not a gap: each stretch is differenced on its own
    assert logging_interval([_s([10, 20, 30, 95]), _s([31, 41, 51])]) == 10
    assert logging_interval([_s([5]), None]) == 1
    assert logging_interval([_s([3, 3, 3, 6, 9])]) == 3  # a re-logged step is one point


def test_the_cadence_of_a_piece_is_its_kls_else_that_of_the_series_that_carry_the_training():
    piece = {"kl": _s([2, 4, 6, 8]), "loss": _s(np.arange(1, 9)), "timing/setup": _s([0])}
    assert cadence_of(piece, prefer=("kl",)) == 2
    assert cadence_of(piece) == 1


def test_a_piece_starts_where_its_kl_starts_not_at_a_setup_key_logged_at_step_0():
    piece = {"train/kl": _s(np.arange(101, 201)), "timing/setup/total": _s([0])}
    assert extent_of(piece, prefer=("train/kl",)) == (101, 200)
    assert extent_of({"loss": _s(np.arange(101, 201)), "timing/setup/total": _s([0])}) == (101, 200)


def test_kl_pieces_flip_a_kl_logged_negated_once_and_mark_pieces_without_it():
    lin = Lineage(id="r", name="r", segments=[], pieces=[{"k": _s([1, 2], np.array([-0.1, -0.2]))}, {"loss": _s([3])}],
                  kl_metric="k", kl_negated=True)
    first, second = lin.kl_pieces()
    assert np.allclose(first.values, [0.1, 0.2]) and second is None
    assert np.allclose(lin.pieces[0]["k"].values, [-0.1, -0.2])  # the logged series is left as logged


def test_what_a_scan_could_not_read_lists_sources_then_named_runs():
    seg = Segment(kind="table", ref="a.csv", source="x")
    bad = LineageResult(Lineage(id="r", name="grpo", segments=[seg]), None, "error", error="a.csv: truncated")
    result = ScanResult(sources=[SourceRead(spec="x", errors=[SourceError("x", "x/b.db: not a store")])], results=[bad])
    assert result.unreadable == ["x/b.db: not a store", "grpo: a.csv: truncated"]
    assert result.any_error and not result.any_reset


@pytest.mark.parametrize("mapped_from", [None, 0])  # 0: every growth buffer mapped memory of its own
def test_extended_series_grow_in_place_without_changing_any_earlier_series(mapped_from, monkeypatch) -> None:
    if mapped_from is not None:
        monkeypatch.setattr(model, "MAPPED_ROOM", mapped_from)
    a = Series(np.arange(3), np.arange(3) * 1.0, np.arange(3) * 10.0)
    b = a.extended(Series(np.array([3, 4]), np.array([3.0, 4.0]), np.array([30.0, 40.0])))
    c = b.extended(Series(np.array([5]), np.array([5.0]), np.array([50.0])))
    assert c.steps.base is b.steps.base  # the second growth wrote into the spare room
    again = b.extended(Series(np.array([9]), np.array([9.0]), np.array([90.0])))  # b is no longer the tip
    assert again.steps.base is not c.steps.base
    np.testing.assert_array_equal(c.steps, [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(again.steps, [0, 1, 2, 3, 4, 9])
    np.testing.assert_array_equal(b.values, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(c.wall_times, [0, 10, 20, 30, 40, 50])
    np.testing.assert_array_equal(a.steps, [0, 1, 2])


def test_a_large_growth_buffer_is_a_memory_map_whose_spare_room_is_not_written() -> None:
    """Past ``MAPPED_ROOM`` a series grows in an anonymous map of its own: pages untouched take no memory
    whatever the heap holds (a watcher of 1M-step runs held a third more without it)."""
    n = model.MAPPED_ROOM // 8
    big = Series(np.arange(n), np.ones(n)).extended(Series(np.array([n]), np.ones(1)))
    buffer = big.steps.base
    assert not buffer.flags.owndata and isinstance(buffer.base, memoryview)  # numpy's view of the map
    small = Series(np.arange(3), np.ones(3)).extended(Series(np.array([3]), np.ones(1)))
    assert small.steps.base.flags.owndata  # small ones from numpy's allocator
    np.testing.assert_array_equal(big.steps[-2:], [n - 1, n])


def test_extended_series_pickle_without_their_spare_room() -> None:
    import pickle

    s = Series(np.arange(2), np.ones(2)).extended(Series(np.array([2]), np.array([1.0])))
    back = pickle.loads(pickle.dumps(s))
    assert "_growth" not in back.__dict__
    np.testing.assert_array_equal(back.steps, [0, 1, 2])
    assert len(pickle.dumps(s)) < 2000


def test_checkpoint_steps_between_two_logs_spread_over_the_gap_both_ends_included():
    assert steps_between(40, 49, 3) == [40, 44, 49]  # round(44.5) -> 44: numpy rounds half to even
    assert steps_between(40, 41, 3) == [40, 41]  # never more steps than the gap holds
    assert steps_between(40, 40, 3) == [40] and steps_between(40, 39, 3) == [40]
