"""The facts a watched run keeps as it grows (``klwatch.incremental``) give exactly what the whole arrays
give: the logging interval, the cuts and clock gaps, the step extent and the run's typical KL.

A series grown with ``Series.extended`` (as the watcher's reads grow it) is compared, after every growth,
with a plain copy of itself, which the same functions judge from the whole arrays. The claim is identity
(the watcher's report must equal a scan's byte for byte), so the comparisons are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from klwatch import incremental
from klwatch.boundaries import BoundaryConfig, find_cuts, relogged_steps
from klwatch.model import Series, extent_of, logging_interval
from klwatch.reference_reset import _kl_summary


def _plain(s: Series) -> Series:
    """The same points in arrays of their own (no growth buffer: judged from the whole arrays)."""
    return Series(s.steps.copy(), s.values.copy(), None if s.wall_times is None else s.wall_times.copy())


def _chunk(rng: np.random.Generator, at: int, clock: float, n: int, *, rewinds: bool) -> Series:
    """``n`` logged points from step ``at``: gaps of 1-3 steps, now and then a repeat (or a rewind), a
    clock with now and then a pause; KL values with zeros, negatives and NaNs among them."""
    gaps = rng.choice([0, 1, 1, 1, 2, 3], size=n)
    if rewinds and rng.random() < 0.3:
        gaps[rng.integers(n)] = -int(rng.integers(1, 20))
    steps = at + np.cumsum(gaps)
    pauses = np.where(rng.random(n) < 0.05, rng.choice([5.0, 40.0, 300.0], size=n), 0.0)
    walls = clock + np.cumsum(rng.uniform(0.5, 1.5, n) + pauses)
    values = np.round(rng.gamma(2.0, 0.01, n), 4)
    values[rng.random(n) < 0.05] = np.nan
    values[rng.random(n) < 0.05] = 0.0
    values[rng.random(n) < 0.02] *= -1
    return Series(steps, values, walls)


def _grown(seed: int, chunks: list[int], *, rewinds: bool):
    """A series grown chunk by chunk as a watched file's is, yielded after every growth."""
    rng = np.random.default_rng(seed)
    s = _chunk(rng, 1, 1.7e9, chunks[0], rewinds=False)
    yield s
    for n in chunks[1:]:
        s = s.extended(_chunk(rng, int(s.steps[-1]) + 1, float(s.wall_times[-1]), n, rewinds=rewinds))
        yield s


@given(seed=st.integers(0, 2 ** 32 - 1), chunks=st.lists(st.integers(1, 300), min_size=2, max_size=8),
       rewinds=st.booleans())
def test_a_grown_series_is_judged_exactly_as_a_copy_of_it(seed: int, chunks: list[int], rewinds: bool) -> None:
    config = BoundaryConfig()
    for k, s in enumerate(_grown(seed, chunks, rewinds=rewinds)):
        plain = _plain(s)
        assert k == 0 or incremental.value_facts(s.values) is not None  # grown: judged from the kept facts
        assert logging_interval([s]) == logging_interval([plain])
        assert extent_of({"kl": s}, prefer=("kl",)) == extent_of({"kl": plain}, prefer=("kl",))
        assert find_cuts(s, None, config=config, tentative=[]) == find_cuts(plain, None, config=config, tentative=[])
        assert relogged_steps({"a": s, "b": s}) == relogged_steps({"a": plain, "b": plain})
        assert _kl_summary([s]) == _kl_summary([plain])
        assert incremental.value_range(s.wall_times) == (plain.wall_times.min(), plain.wall_times.max())
        assert np.array_equal(incremental.value_range(s.values), (plain.values.min(), plain.values.max()), equal_nan=True)


@given(seed=st.integers(0, 2 ** 32 - 1), chunks=st.lists(st.integers(1, 200), min_size=3, max_size=6))
def test_the_later_piece_of_a_grown_series_and_its_earlier_pieces_are_summed_up_exactly(seed: int,
                                                                                          chunks: list[int]) -> None:
    earlier = _plain(next(_grown(seed + 1, [150], rewinds=False)))
    for s in _grown(seed, chunks, rewinds=False):
        cut = len(s) // 3  # a piece that starts inside the buffer, as a resume in place cuts one
        later = s.take(slice(cut, len(s)))
        pieces = [earlier, later, None]
        assert _kl_summary(pieces) == _kl_summary([earlier, _plain(later), None])
        assert logging_interval([earlier, later]) == logging_interval([earlier, _plain(later)])


def test_series_grown_in_mapped_buffers_are_judged_exactly_as_copies_of_them(monkeypatch) -> None:
    """Large growth buffers are memory maps (``model.MAPPED_ROOM``): facts are kept for them as for any."""
    from klwatch import model

    monkeypatch.setattr(model, "MAPPED_ROOM", 0)  # every buffer mapped, however small
    test_a_grown_series_is_judged_exactly_as_a_copy_of_it()
    test_the_later_piece_of_a_grown_series_and_its_earlier_pieces_are_summed_up_exactly()


def test_facts_are_kept_only_for_growth_buffers_and_only_forward() -> None:
    plain = Series(np.arange(5), np.ones(5))
    assert incremental.step_facts(plain.steps) is None  # a plain scan's arrays: judged whole
    short = Series(np.arange(3), np.ones(3)).extended(Series(np.array([3, 4]), np.ones(2)))
    longer = short.extended(Series(np.array([5, 6]), np.ones(2)))
    facts = incremental.step_facts(longer.steps)
    assert facts is not None and (facts.lo, facts.hi) == (0, 6)
    assert incremental.step_facts(short.steps) is None  # an older, shorter view of the same buffer


@given(values=st.lists(st.integers(-5, 40), min_size=1, max_size=60), parts=st.integers(1, 4),
       q=st.sampled_from([0, 10, 50, 90, 99, 100]))
def test_the_percentile_of_sorted_parts_is_numpys_percentile_of_them_together(values: list[int], parts: int,
                                                                              q: int) -> None:
    x = np.array(values, np.float64) / 7.0
    split = np.array_split(x, parts)
    assert incremental.percentile_of_sorted([np.sort(p) for p in split if len(p)], q) == \
        pytest.approx(float(np.percentile(x, q)), rel=1e-12, abs=1e-15)


@given(gaps=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=30), min_size=1, max_size=3))
def test_the_median_of_histograms_is_numpys_median_of_what_they_count(gaps: list[list[int]]) -> None:
    counts = [dict(zip(*np.unique(g, return_counts=True))) for g in gaps]
    assert incremental.median_of_counts(counts) == float(np.median(np.concatenate(gaps)))


@given(batches=st.lists(st.lists(st.integers(-20, 60), min_size=1, max_size=40), min_size=1, max_size=30),
       threshold=st.integers(-20, 60))
def test_a_sorted_bag_answers_as_the_sorted_whole_of_what_was_added(batches: list[list[int]], threshold: int) -> None:
    bag, added, tags = incremental.SortedBag(), [], []
    for batch in batches:  # whole numbers with NaNs (the counts and order are what is checked)
        values = np.array([np.nan if v == 13 else v for v in batch], np.float64)
        bag.add(values, np.arange(len(added), len(added) + len(values)))
        added.extend(values.tolist())
        tags.extend(range(len(tags), len(tags) + len(values)))
    whole = np.array(added)
    assert len(bag) == len(whole)
    assert bag.count_upto(threshold) == int(np.sum(whole <= threshold))
    assert bag.tags_above(threshold).tolist() == np.nonzero(whole > threshold)[0].tolist()
    finite = np.sort(whole[~np.isnan(whole)])
    for k in range(len(finite)):
        assert incremental.kth_of_sorted(bag.parts, k) == finite[k]


@given(batches=st.lists(st.lists(st.integers(-20, 60), min_size=1, max_size=40), min_size=1, max_size=30))
def test_an_untagged_sorted_bag_keeps_the_same_numbers_as_a_tagged_one(batches: list[list[int]]) -> None:
    tagged, untagged = incremental.SortedBag(), incremental.SortedBag(tagged=False)
    for batch in batches:
        values = np.array(batch, np.float64)
        tagged.add(values, np.arange(len(values)))
        untagged.add(values)
    assert [p.tolist() for p in untagged.parts] == [p.tolist() for p in tagged.parts]
    assert untagged.tags is None
    with pytest.raises(TypeError):
        untagged.tags_above(0)
