"""What a scan holds in memory, so that its peak does not grow with the fleet (issue 26, item 1).

A scan reads every piece of a fleet before it can stitch (a run's launches may lie in several folders,
or SOURCEs), but stitching reads little of each piece: its names, config, ids, clock and, of each
series, its length, its steps and the first, lowest and highest of its wall times. So a piece is kept
in two halves as soon as it is read:

- its **summary** (``summarize``): the Segment with every series replaced by a ``StepSummary`` (the
  steps run-length coded, three wall times, no values), a few hundred bytes whatever the run's length;
  stitching, the report's member extents and the ``nothing read`` test read only that, and give the
  same answers (``tests/test_fleet_memory.py`` checks stitching on both halves);
- its **series**, in a ``SegmentStore``: spilled to a private temporary folder (a scan), or held where
  they already are (reads a caller keeps in memory: the dashboard's, the watcher's).

Then, training run by training run, the pipeline takes its pieces back from the store, builds and judges
it, and keeps what the reports read (``keep_for_reports``): the verdicts, findings and notes, the
members' summaries, and the KL thinned for a chart on the step axis (``downsample``), whole for a run
with a reset (the CI summary draws its sparkline from it). The series of the other runs are not held any more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .downsample import minmax_indices
from .model import LineageResult, Segment, Series

CHART_POINTS = 32
"""Points kept of each piece's KL once a training run is judged and thinned (min/max buckets, so a
one-step drop survives; steps and values, no clock): a thumbnail, under a kilobyte a piece."""


class StepSummary:
    """One series as stitching reads it: its length, its steps (run-length coded: the first step, then
    each run of equal differences) and its wall times' first, lowest and highest values (none without a
    clock), packed in one bytes object. ``steps`` gives the very array back; ``wall_times`` an array
    whose ``[0]``, ``min()`` and ``max()`` are the series'. It has no values: what reads them needs the
    series itself."""

    __slots__ = ("_n", "_packed")

    def __init__(self, series: Series) -> None:
        steps, walls = series.steps, series.wall_times
        self._n = len(steps)
        clock = np.empty(0) if walls is None or not len(walls) else \
            np.array([walls[0], np.min(walls), np.max(walls)], dtype=np.float64)
        diffs = np.diff(steps)
        rle = np.empty(0, np.int64)
        if len(diffs):
            starts = np.concatenate(([0], np.flatnonzero(diffs[1:] != diffs[:-1]) + 1))
            counts = np.diff(np.concatenate((starts, [len(diffs)])))
            rle = np.stack([diffs[starts], counts]).astype(np.int64).ravel()
        head = np.array([steps[0] if len(steps) else 0, len(clock) + (walls is not None)], dtype=np.int64)
        self._packed = head.tobytes() + clock.tobytes() + rle.tobytes()

    def __len__(self) -> int:
        return self._n

    def _parts(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """(first step, clock flag: 0 none, 1 empty, 4 three values; the clock; the run-length pairs)."""
        first, flag = np.frombuffer(self._packed, dtype=np.int64, count=2)
        clock = np.frombuffer(self._packed, dtype=np.float64, count=max(0, int(flag) - 1), offset=16)
        rle = np.frombuffer(self._packed, dtype=np.int64, offset=16 + 8 * len(clock)).reshape(2, -1)
        return int(first), int(flag), clock, rle

    @property
    def steps(self) -> np.ndarray:
        if not self._n:
            return np.empty(0, np.int64)
        first, _, _, rle = self._parts()
        return np.concatenate(([first], first + np.cumsum(np.repeat(rle[0], rle[1])))).astype(np.int64)

    @property
    def wall_times(self) -> np.ndarray | None:
        _, flag, clock, _ = self._parts()
        return None if flag == 0 else clock.copy()

    def __getstate__(self) -> tuple[int, bytes]:
        return self._n, self._packed

    def __setstate__(self, state: tuple[int, bytes]) -> None:
        self._n, self._packed = state

    @classmethod
    def unpacked(cls, n: int, packed: bytes) -> StepSummary:
        out = cls.__new__(cls)
        out._n, out._packed = n, packed
        return out


SHARED_NAME_SETS = 4096
"""Distinct sets of series names whose tuple summaries share (a long-lived watcher meets new ones)."""


class SummarySeries(Mapping[str, StepSummary]):
    """A summary's series by name, all packed in one bytes object (a dict of StepSummaries costs a dozen
    objects a piece, and a fleet holds thousands of pieces); each ``StepSummary`` is made when asked for."""

    __slots__ = ("_names", "_lengths", "_packed")
    _shared_names: dict[tuple[str, ...], tuple[str, ...]] = {}

    def __init__(self, series: Mapping[str, Series]) -> None:
        names = tuple(sys.intern(n) for n in series)
        shared = self._shared_names.get(names)  # pieces of a fleet log the same names: one tuple for all
        if shared is None and len(self._shared_names) < SHARED_NAME_SETS:
            shared = self._shared_names[names] = names
        self._names = shared or names
        summaries = [StepSummary(s) for s in series.values()]
        sizes = [len(x._packed) for x in summaries]
        self._lengths = np.array([[x._n for x in summaries], sizes], dtype=np.int64).tobytes()
        self._packed = b"".join(x._packed for x in summaries)

    def __getitem__(self, name: str) -> StepSummary:
        try:
            k = self._names.index(name)
        except ValueError:
            raise KeyError(name) from None
        lengths = np.frombuffer(self._lengths, dtype=np.int64).reshape(2, -1)
        start = int(lengths[1, :k].sum())
        return StepSummary.unpacked(int(lengths[0, k]), self._packed[start:start + int(lengths[1, k])])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __getstate__(self) -> tuple[tuple[str, ...], bytes, bytes]:
        return self._names, self._lengths, self._packed

    def __setstate__(self, state: tuple[tuple[str, ...], bytes, bytes]) -> None:
        self._names, self._lengths, self._packed = state


def summarize(segment: Segment) -> Segment:
    """``segment`` with each series replaced by its ``StepSummary`` and without its reader's ``meta``
    (stitching never reads it; ``step_axis`` stays), everything else shared."""
    meta = {"step_axis": segment.meta["step_axis"]} if "step_axis" in segment.meta else NOTHING
    return dataclasses.replace(segment, series=SummarySeries(segment.series), meta=meta,  # type: ignore[arg-type]
                               config=segment.config or NOTHING, tags=segment.tags or NOTHING,
                               warnings=segment.warnings or (), checkpoint_steps=segment.checkpoint_steps or ())


class _Nothing(dict):  # type: ignore[type-arg]
    """An empty mapping that stays empty (a summary's empty config, tags or meta: one for all of them)."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a summary's mappings are read-only")

    __setitem__ = __delitem__ = __ior__ = update = setdefault = pop = popitem = clear = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return _Nothing, ()


NOTHING = _Nothing()


class SegmentStore:
    """Where the series of a scan's pieces wait between reading and judging, found by their summary.

    ``spilled()``: each piece pickled to a file in a private temporary folder (made at the first
    piece, removed with its files at the scan's end), read back when its training run is built;
    ``in_memory()``: the pieces themselves, for reads the caller holds anyway. Either way ``keep``
    gives the summaries to stitch on and ``take`` the pieces back."""

    def __init__(self, *, spill: bool) -> None:
        self.spill = spill
        self.directory: Path | None = None
        self._held: dict[int, Segment | int] = {}
        """By ``id`` of a summary: its piece, or the number of its file."""
        self._count = 0

    @classmethod
    def in_memory(cls) -> SegmentStore:
        return cls(spill=False)

    @classmethod
    @contextlib.contextmanager
    def spilled(cls) -> Any:
        """A store spilling to a temporary folder (0700), removed on leaving."""
        store = cls(spill=True)
        try:
            yield store
        finally:
            if store.directory is not None:
                shutil.rmtree(store.directory, ignore_errors=True)

    def keep(self, segments: Iterable[Segment]) -> list[Segment]:
        """The summaries of ``segments``, their series kept here until ``take``n. In memory a piece is its
        own summary: a summary saves memory only where the series go elsewhere, stitching reads the same of
        either, and a watcher's pieces keep their whole-run facts (``klwatch.incremental``) instead of a
        pass over every step at each poll."""
        out = []
        for seg in segments:
            summary = summarize(seg) if self.spill else seg
            self._held[id(summary)] = self._put(seg)
            out.append(summary)
        return out

    def _put(self, seg: Segment) -> Segment | int:
        if not self.spill:
            return seg
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="klwatch-scan-"))
        self._count += 1
        with open(self._path(self._count), "wb") as f:
            pickle.dump(seg, f, protocol=pickle.HIGHEST_PROTOCOL)
        return self._count

    def _path(self, number: int) -> Path:
        assert self.directory is not None
        return self.directory / f"{number}.pickle"

    def forget(self, summary: Segment) -> None:
        """Let go of a piece no training run will be built from again (its file stays till the end)."""
        self._held.pop(id(summary), None)

    def take(self, summary: Segment) -> Segment:
        """The piece ``summary`` was made from, whole (a spilled one read back: a copy, each time;
        a checkpoint folder may belong to several training runs)."""
        held = self._held[id(summary)]
        if isinstance(held, Segment):
            return held
        with open(self._path(held), "rb") as f:
            seg: Segment = pickle.load(f)  # noqa: S301 - our own private temporary folder
        return seg


def keep_for_reports(result: LineageResult, *, points: int = CHART_POINTS) -> LineageResult:
    """``result`` as a scan keeps it once judged: each piece holding only the KL, thinned to ``points``
    (whole in a run with a reset: the CI summary's sparkline reads it), and no members: the scan puts
    back the summaries its reads already hold (``pipeline.Planned.with_members``) rather than a pass over
    every step to make them again. Verdicts, findings, boundaries, notes and config are kept as they are."""
    lin = result.lineage
    whole = any(v.verdict == "reference_reset" for v in result.verdicts)
    pieces = []
    for piece in lin.pieces:
        kl = piece.get(lin.kl_metric) if lin.kl_metric else None
        if kl is None:
            pieces.append({})
            continue
        pieces.append({lin.kl_metric: kl if whole else _own(kl.take(minmax_indices(kl.values, max_points=points)))})
    lean = dataclasses.replace(lin, segments=[], pieces=pieces,
                               config=lin.config or NOTHING, checkpoint_steps=lin.checkpoint_steps or ())
    return dataclasses.replace(result, lineage=lean, findings=result.findings or ())


def _own(series: Series) -> Series:
    """``series`` on the step axis only (a thumbnail is drawn against the step), in arrays of its own, not
    views of bigger ones: what is kept holds only its points."""
    return Series(series.steps.copy(), series.values.copy())
