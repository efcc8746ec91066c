"""Whole-run statistics kept up to date as a run's series grow, so a watcher's poll costs what is new.

A run read on poll after poll grows its series by appending (``model.Series.extended``): each array is
a view of a growth buffer whose filled part never changes (only the spare room past it is written).
That makes the facts of a prefix of a buffer permanent: the facts of ``buffer[start:stop]`` are those
of ``buffer[start:old_stop]`` updated with the new tail. The files of a run that did not change are as
permanent: the watcher's read cache keeps their arrays, read-only (``freeze``). This module keeps facts
per (tracked array, start of the view), beside the array and for as long as it lives: the watcher's read
cache holds the arrays of every training run it watches, so every training run keeps its statistics
between polls, and a poll updates them with the points logged since the last one.

Each fact is exact, never an approximation: the functions that use them (``model.logging_interval``,
``boundaries.find_cuts``, ``reference_reset`` on the run's KL) give byte for byte what they give
from the whole arrays, which is what they still compute for any other array (a plain scan's).

- ``StepFacts``: a step array's rewinds and repeats (where consecutive steps go back or stay), its
  lowest and highest step, and while it only goes up the histogram of its step gaps (gaps are
  integers, so the histogram gives the exact median: the logging interval).
- ``ClockFacts``: a clock's consecutive differences, sorted with where each is (the median positive
  one is the step time; those over a threshold are the clock gaps).
- ``ValueFacts``: a series' finite values: how many, the largest in size, and the positive ones
  sorted (their exact order statistics: the run's typical KL).

Sorted numbers are kept in a ``SortedBag`` (a large sorted array and a small recent one), so a poll moves
what is recent, not the run.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

_FACTS: dict[int, dict[tuple[str, int], Any]] = {}
"""Per tracked buffer (by id), its facts by (kind, start of the view)."""

F = TypeVar("F", "StepFacts", "ClockFacts", "ValueFacts", "RangeFacts")


def track(buffer: np.ndarray, *, carry: np.ndarray | None = None) -> None:
    """Keep facts for views of ``buffer`` (a growth buffer whose filled part never changes), until it is freed.
    ``carry``: the array ``buffer`` starts with a copy of (a series outgrowing its buffer), whose kept facts
    hold for ``buffer``'s start too: they are copied over, so growing into a new buffer costs a copy, not
    the whole run's statistics again."""
    key = id(buffer)
    _FACTS[key] = {}
    weakref.finalize(buffer, _FACTS.pop, key, None)
    if carry is None:
        return
    where = _view_of(carry)
    if where is None:
        return
    kept, start = where
    for (kind, at), facts in list(kept.items()):
        if at == start and facts.stop <= len(carry):
            _FACTS[key][(kind, 0)] = copy.deepcopy(facts)


def _view_of(a: np.ndarray) -> tuple[dict[tuple[str, int], Any], int] | None:
    """The facts kept for the tracked array ``a`` is (or is a contiguous view of), and where in it ``a`` starts."""
    owner = a if a.base is None else a.base
    if not isinstance(owner, np.ndarray) or a.ndim != 1 or (len(a) > 1 and a.strides[0] != a.itemsize):
        return None
    kept = _FACTS.get(id(owner))
    if kept is None or owner.dtype != a.dtype:
        return None
    start, extra = divmod(a.__array_interface__["data"][0] - owner.__array_interface__["data"][0], a.itemsize)
    return None if extra or start < 0 else (kept, start)


def freeze(a: np.ndarray) -> None:
    """Keep facts for ``a`` and its views from now on: a holder that keeps what it read between polls (the
    watcher's read cache) promises it never changes, and ``a`` and its memory's owner are made read-only so
    a write would fail loudly rather than leave stale facts. Growth buffers are tracked already (and stay
    writable past what they hold)."""
    owner = a if a.base is None else a.base
    if isinstance(owner, np.ndarray) and id(owner) not in _FACTS:
        a.flags.writeable = False  # the view itself too: one made before its owner was frozen stays writable
        owner.flags.writeable = False
        track(owner)
    elif a.base is not None and id(a.base) in _FACTS and not a.base.flags.writeable:
        a.flags.writeable = False  # another view of an owner frozen already


def kept() -> int:
    """How many facts are kept now, over every tracked buffer (what a poll can build on)."""
    return sum(len(facts) for facts in _FACTS.values())


def _facts_of(a: np.ndarray, kind: type[F]) -> F | None:
    """The facts of ``a``, a view of a tracked buffer, updated with what it holds past them; None for any
    other array (or a view that ends before facts already kept: an older, shorter series)."""
    where = _view_of(a)
    if where is None:
        return None
    kept, start = where
    facts = kept.get((kind.__name__, start))
    if facts is None:
        facts = kept[(kind.__name__, start)] = kind()
    if facts.stop > len(a):
        return None
    if facts.stop < len(a):
        facts.extend(a[facts.stop:], a[facts.stop - 1] if facts.stop else None)
    return facts


def _neighbour_diffs(tail: np.ndarray, last: Any, stop: int) -> tuple[np.ndarray, int]:
    """The differences of each new point from the one before it, and the view index of the first of them."""
    if last is None:
        return np.diff(tail), 1
    return np.diff(np.concatenate(([last], tail))), stop


class StepFacts:
    """A step array's rewinds, repeats, extent and (while it only goes up) gap histogram."""

    def __init__(self) -> None:
        self.stop = 0
        self.back: list[int] = []
        """View indices where the step goes back (below the one before)."""
        self.same: list[int] = []
        """View indices where the step equals the one before."""
        self.lo: int | None = None
        self.hi: int | None = None
        self.gaps: dict[int, int] | None = {}
        """Gap -> how many times, of the distinct steps in order; None once the steps went back."""

    def extend(self, tail: np.ndarray, last: Any) -> None:
        d, first = _neighbour_diffs(tail, last, self.stop)
        self.back.extend((np.nonzero(d < 0)[0] + first).tolist())
        self.same.extend((np.nonzero(d == 0)[0] + first).tolist())
        lo, hi = int(tail.min()), int(tail.max())
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
        if self.back:
            self.gaps = None
        elif self.gaps is not None:
            values, counts = np.unique(d[d != 0], return_counts=True)
            for g, c in zip(values.tolist(), counts.tolist()):
                self.gaps[g] = self.gaps.get(g, 0) + c
        self.stop += len(tail)


def step_facts(steps: np.ndarray) -> StepFacts | None:
    """The kept facts of a step array (None when it is not a view of a tracked array)."""
    return _facts_of(steps, StepFacts)


def median_of_counts(counts: Sequence[dict[int, int]]) -> float | None:
    """``np.median`` of the integers these histograms count together (None when they count none)."""
    pooled: dict[int, int] = {}
    for c in counts:
        for g, k in c.items():
            pooled[g] = pooled.get(g, 0) + k
    n = sum(pooled.values())
    if not n:
        return None
    keys = sorted(pooled)
    cum = np.cumsum([pooled[k] for k in keys])
    lo = keys[int(np.searchsorted(cum, (n - 1) // 2, side="right"))]
    hi = keys[int(np.searchsorted(cum, n // 2, side="right"))]
    return (float(lo) + float(hi)) / 2 if n % 2 == 0 else float(lo)


class SortedBag:
    """Numbers kept sorted as they come, each with a tag (an index), in two sorted arrays: a large one and a
    recent one new numbers are inserted into, merged into the large one once it holds a sixteenth of it. An
    insert moves the recent array only (a poll's cost does not grow with the run), and a merge, rare, moves
    both; order statistics and thresholds are read off the two arrays without merging them."""

    MERGE_SHARE = 16

    def __init__(self, *, tagged: bool = True) -> None:
        """``tagged=False``: numbers only (``tags_above`` unavailable), half the memory, for a bag only
        counted and ranked (a 1M-point watched run's positive KL values: 8 MB less)."""
        self.parts = [np.empty(0, np.float64), np.empty(0, np.float64)]
        self.tags: list[np.ndarray] | None = [np.empty(0, np.int64), np.empty(0, np.int64)] if tagged else None

    def add(self, values: np.ndarray, tags: np.ndarray | None = None) -> None:
        """Insert ``values`` (with their ``tags``, one each, when the bag is tagged)."""
        order = np.argsort(values, kind="stable")
        values = values[order]
        slots = np.searchsorted(self.parts[1], values, side="right")
        self.parts[1] = np.insert(self.parts[1], slots, values)
        if self.tags is not None:
            self.tags[1] = np.insert(self.tags[1], slots, np.asarray(tags)[order])
        if self.MERGE_SHARE * len(self.parts[1]) > len(self.parts[0]):
            slots = np.searchsorted(self.parts[0], self.parts[1], side="right")
            self.parts[0] = np.insert(self.parts[0], slots, self.parts[1])
            self.parts[1] = self.parts[1][:0]
            if self.tags is not None:
                self.tags[0] = np.insert(self.tags[0], slots, self.tags[1])
                self.tags[1] = self.tags[1][:0]

    def __len__(self) -> int:
        return len(self.parts[0]) + len(self.parts[1])

    def count_upto(self, x: float, *, side: str = "right") -> int:
        """How many numbers are at or below ``x`` (``side="left"``: below it); NaNs sort above every number."""
        return sum(int(np.searchsorted(p, x, side=side)) for p in self.parts)  # type: ignore[call-overload]

    def tags_above(self, x: float) -> np.ndarray:
        """The tags of the numbers above ``x`` (NaNs left out), in order of the tags."""
        if self.tags is None:
            raise TypeError("an untagged SortedBag keeps no tags")
        out = []
        for p, t in zip(self.parts, self.tags):
            k = int(np.searchsorted(p, x, side="right"))
            out.append(t[k:][~np.isnan(p[k:])])
        return np.sort(np.concatenate(out))


class ClockFacts:
    """A clock's consecutive differences, sorted (``SortedBag``), each tagged with the view index it ends at."""

    def __init__(self) -> None:
        self.stop = 0
        self.diffs = SortedBag()

    def extend(self, tail: np.ndarray, last: Any) -> None:
        d, first = _neighbour_diffs(tail, last, self.stop)
        if len(d):
            self.diffs.add(d, np.arange(first, first + len(d), dtype=np.int64))
        self.stop += len(tail)

    def median_positive(self) -> float:
        """``np.median`` of the differences above 0 (0.0 when none is): the step time."""
        below = self.diffs.count_upto(0.0)
        n = self.diffs.count_upto(np.nan, side="left") - below  # NaNs sort last
        if n <= 0:
            return 0.0
        parts = self.diffs.parts
        if n % 2:
            return kth_of_sorted(parts, below + n // 2)
        lo, hi = kth_of_sorted(parts, below + n // 2 - 1), kth_of_sorted(parts, below + n // 2)
        return float((np.float64(lo) + np.float64(hi)) / 2)

    def above(self, threshold: float) -> np.ndarray:
        """The view indices whose difference from the point before exceeds ``threshold``, in order."""
        return self.diffs.tags_above(threshold)


def clock_facts(wall: np.ndarray) -> ClockFacts | None:
    """The kept facts of a clock (None when it is not a view of a tracked array)."""
    return _facts_of(wall, ClockFacts)


class ValueFacts:
    """A series' finite values: their count, the largest in size, and the positive ones sorted."""

    def __init__(self) -> None:
        self.stop = 0
        self.finite = 0
        self.max_abs = 0.0
        self.positive = SortedBag(tagged=False)

    def extend(self, tail: np.ndarray, last: Any) -> None:
        v = tail[np.isfinite(tail)]
        self.finite += len(v)
        if len(v):
            self.max_abs = max(self.max_abs, float(np.max(np.abs(v))))
            p = v[v > 0]
            self.positive.add(p)
        self.stop += len(tail)


def value_facts(values: np.ndarray) -> ValueFacts | None:
    """The kept facts of a series' values (None when they are not a view of a tracked array)."""
    return _facts_of(values, ValueFacts)


class RangeFacts:
    """A float array's lowest and highest value, NaN when it holds one (as ``ndarray.min``/``max`` say)."""

    def __init__(self) -> None:
        self.stop = 0
        self.lo = np.float64(np.inf)
        self.hi = np.float64(-np.inf)

    def extend(self, tail: np.ndarray, last: Any) -> None:
        self.lo, self.hi = np.minimum(self.lo, tail.min()), np.maximum(self.hi, tail.max())
        self.stop += len(tail)


def value_range(a: np.ndarray) -> tuple[float, float]:
    """``(a.min(), a.max())`` of a non-empty float array, kept as a watched run grows."""
    facts = _facts_of(a, RangeFacts)
    if facts is not None:
        return float(facts.lo), float(facts.hi)
    return float(a.min()), float(a.max())


def kth_of_sorted(arrays: Sequence[np.ndarray], k: int) -> float:
    """The k-th smallest (from 0) of the values of these sorted arrays taken together, without merging them."""
    for a in arrays:
        lo, hi = 0, len(a) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            x = a[mid]
            less = sum(int(np.searchsorted(b, x, side="left")) for b in arrays)
            upto = sum(int(np.searchsorted(b, x, side="right")) for b in arrays)
            if upto <= k:
                lo = mid + 1
            elif less > k:
                hi = mid - 1
            else:
                return float(x)
    raise IndexError(f"k={k} is past the {sum(len(a) for a in arrays)} values")


def percentile_of_sorted(arrays: Sequence[np.ndarray], q: float) -> float:
    """``np.percentile`` (its default, linear method) of the values of these sorted arrays taken together:
    numpy's virtual index, neighbours and interpolation, on the two order statistics it would pick."""
    n = sum(len(a) for a in arrays)
    virtual = (n - 1) * float(np.true_divide(q, 100))
    if virtual >= n - 1:
        return kth_of_sorted(arrays, n - 1)
    below = int(np.floor(virtual)) if virtual >= 0 else 0
    a, b = np.float64(kth_of_sorted(arrays, below)), np.float64(kth_of_sorted(arrays, below + 1))
    t = float(np.float64(virtual) - np.float64(float(below)))
    diff = b - a
    return float(b - diff * (1 - t)) if t >= 0.5 else float(a + diff * t)


def all_facts(arrays: Sequence[np.ndarray], get: Callable[[np.ndarray], F | None]) -> list[F] | None:
    """The kept facts of every array, or None when one has none (the caller then computes from the arrays)."""
    out = []
    for a in arrays:
        f = get(a)
        if f is None:
            return None
        out.append(f)
    return out
