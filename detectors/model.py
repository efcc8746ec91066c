"""The run model every part of klwatch shares.

Data flows one way: a source reader yields ``Segment``s (one per process, tracker run or event
file); stitching groups them into a ``Lineage`` (one training run) and infers its ``Boundary``s;
detectors turn each boundary into a ``BoundaryVerdict``; reports render a ``LineageResult``.
Nothing downstream reaches back into a reader.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np

from . import incremental

SegmentKind = Literal["wandb-offline", "wandb-api", "mlflow", "tensorboard", "table", "checkpoints"]
Evidence = Literal[
    "new_tracker_run",
    "new_event_file",
    "step_rewind",
    "duplicate_steps",
    "time_gap",
    "runtime_reset",
    "checkpoint",
    "declared",
    "model_from_checkpoint",
    "starts_past_first_step",
]
Verdict = Literal["reference_reset", "ok", "intentional", "inconclusive"]
Status = Literal[
    "reference_reset", "ok", "intentional", "inconclusive", "no_kl_metric", "kl_disabled", "insufficient_data", "error"
]


MAX_STEP = 2 ** 53
"""The largest step magnitude klwatch takes: past it a float step is no longer a whole number it can hold, and
an int64 cast of something larger wraps to another number (1e30 became -9223372036854775808)."""


def steps_out_of_range(values: np.ndarray) -> np.ndarray:
    """Which of these step values (floats or ints) are not finite whole-number steps klwatch can hold."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return ~(np.abs(v) <= MAX_STEP)


@dataclass
class Series:
    """One logged scalar, in the order it was logged (not sorted: a rewind shows as steps going back).

    ``wall_times`` are seconds since the epoch, or None when the source has no clock.
    """

    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.steps = np.asarray(self.steps, dtype=np.int64)
        self.values = np.asarray(self.values, dtype=np.float64)
        if self.wall_times is not None:
            self.wall_times = np.asarray(self.wall_times, dtype=np.float64)
            if len(self.wall_times) != len(self.steps):
                raise ValueError("wall_times and steps differ in length")
        if len(self.values) != len(self.steps):
            raise ValueError("values and steps differ in length")

    def __len__(self) -> int:
        return len(self.steps)

    def take(self, index: np.ndarray | slice) -> "Series":
        """A sub-series (index array or slice), keeping the clock when there is one."""
        wt = None if self.wall_times is None else self.wall_times[index]
        return Series(self.steps[index], self.values[index], wt)

    def extended(self, more: "Series") -> "Series":
        """This series followed by ``more``, in time proportional to ``more`` (amortised): a file read
        on poll after poll grows its series without copying all of it each time.

        The result's arrays are views of buffers with room to spare, filled to its length; only the
        series that ends where its buffers are filled may write into their spare room (any other,
        e.g. an older one extended a second time, copies), so no series ever sees its points change."""
        if (self.wall_times is None) != (more.wall_times is None) or not len(more):
            return Series.concat([self, more]) if len(more) else self
        n, k = len(self), len(more)
        g: _Growth | None = self.__dict__.get("_growth")
        if g is None or g.filled != n or n + k > len(g.steps) or self.steps.base is not g.steps \
                or self.values.base is not g.values or (g.walls is not None and self.wall_times.base is not g.walls):
            cap = max(2 * (n + k), 1024)
            g = _Growth(_room(cap, np.int64), _room(cap, np.float64),
                        None if self.wall_times is None else _room(cap, np.float64), n)
            for old, buffer in ((self.steps, g.steps), (self.values, g.values), (self.wall_times, g.walls)):
                if buffer is not None:  # their filled parts never change: facts of them last (and move on)
                    incremental.track(buffer, carry=old)
            g.steps[:n], g.values[:n] = self.steps, self.values
            if g.walls is not None:
                g.walls[:n] = self.wall_times
        g.steps[n:n + k], g.values[n:n + k] = more.steps, more.values
        if g.walls is not None:
            g.walls[n:n + k] = more.wall_times
        g.filled = n + k
        out = Series(g.steps[:n + k], g.values[:n + k], None if g.walls is None else g.walls[:n + k])
        out.__dict__["_growth"] = g
        return out

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its spare room (a scan result is cached as a pickle)."""
        return {k: v for k, v in self.__dict__.items() if k != "_growth"}

    @staticmethod
    def concat(parts: list["Series"]) -> "Series":
        if not parts:
            return Series(np.empty(0, np.int64), np.empty(0))
        wt = None
        if all(p.wall_times is not None for p in parts):
            wt = np.concatenate([p.wall_times for p in parts])  # type: ignore[misc]
        return Series(
            np.concatenate([p.steps for p in parts]), np.concatenate([p.values for p in parts]), wt
        )


MAPPED_ROOM = 1 << 20
"""Growth buffers of this many bytes or more are mapped memory of their own (``_room``)."""


def _room(n: int, dtype: Any) -> np.ndarray:
    """An uninitialised array of ``n`` items. A large one is an anonymous memory map, whose pages take memory
    only once written: a buffer's spare half costs nothing until the series grows into it. (From the heap,
    which a run's first whole read leaves large and free, it may be resident at once: a watcher of 1M-step
    runs held ~205 MiB a run instead of ~140.) Views of it have it as their base, as with ``np.empty``."""
    size = n * np.dtype(dtype).itemsize
    if size < MAPPED_ROOM:
        return np.empty(n, dtype)
    return np.frombuffer(mmap.mmap(-1, size), dtype=dtype)


@dataclass
class _Growth:
    """The buffers behind series grown by ``Series.extended``, and how far they are filled."""

    steps: np.ndarray
    values: np.ndarray
    walls: np.ndarray | None
    filled: int


@dataclass(eq=False)  # identity: two processes may log identical data and still be two segments
class Segment:
    """What one process logged: one W&B run folder, one MLflow run, one event file, one table part.

    ``ref`` is the path relative to the SOURCE the user gave, or the tracker's run id. ``run_id``
    is the tracker's own id (a resumed W&B run reuses it across processes); ``name`` and ``group``
    are what the tracker shows a person. ``series`` maps metric names (nested keys joined with
    ``.``, as logged) to their series on the tracker's step axis. ``checkpoint_steps`` is filled by
    checkpoint-folder readers (kind ``checkpoints``) and holds the steps at which a resumable
    checkpoint exists. ``start_time`` is when the process started (seconds since the epoch).
    """

    kind: SegmentKind
    ref: str
    source: str
    run_id: str | None = None
    name: str | None = None
    group: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    series: dict[str, Series] = field(default_factory=dict)
    start_time: float | None = None
    checkpoint_steps: list[int] = field(default_factory=list)
    resumed_from_step: int | None = None
    """Set by a reader that knows the step this process resumed from (e.g. W&B ``branch_point``)."""
    store: str | None = None
    """Which store the segment came from (a path or server); segments of different stores are
    never stitched together."""
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def step_range(self) -> tuple[int | None, int | None]:
        steps = [s.steps for s in self.series.values() if len(s)]
        if not steps:
            if self.checkpoint_steps:
                return min(self.checkpoint_steps), max(self.checkpoint_steps)
            return None, None
        bounds = [step_bounds(x) for x in steps]
        return min(lo for lo, _ in bounds), max(hi for _, hi in bounds)

    def extent(self, prefer: tuple[str, ...] = ()) -> tuple[int | None, int | None]:
        """Where this process's training starts and ends on the step axis (``extent_of``)."""
        first, last = extent_of(self.series, prefer=prefer)
        return (first, last) if first is not None else self.step_range()

    def first_wall_time(self) -> float | None:
        times = [s.wall_times[0] for s in self.series.values() if s.wall_times is not None and len(s)]
        if times:
            return float(min(times))
        return self.start_time


BULK_MIN_POINTS, BULK_MIN_SHARE = 3, 0.1
"""A series carries the training when it has at least this many points and this share of the longest's."""


def _bulk(series: dict[str, Series]) -> list[Series]:
    """The series that carry the training: logged at many steps, not one-shot setup or summary keys."""
    keys = [s for n, s in series.items() if not n.startswith("_") and len(s)]
    if not keys:
        return []
    longest = max(len(s) for s in keys)
    return [s for s in keys if len(s) >= max(BULK_MIN_POINTS, BULK_MIN_SHARE * longest)] or keys


def extent_of(series: dict[str, Series], *, prefer: tuple[str, ...] = ()) -> tuple[int | None, int | None]:
    """First and last step of the training a piece of log holds: the KL's own (the first of ``prefer``
    logged at two steps or more), else where most series start and end.

    Not the earliest point of any key: frameworks log setup timings at step 0 in every launch
    (NeMo-RL ``timing/setup/*``) and summaries at the end, which would make each resumed launch look
    like a fresh start.
    """
    for name in prefer:
        s = series.get(name)
        if s is not None and len(s) >= 2:
            return step_bounds(s.steps)
    bulk = _bulk(series)
    if not bulk:
        return None, None
    bounds = [step_bounds(s.steps) for s in bulk]
    return int(np.median([lo for lo, _ in bounds])), int(np.median([hi for _, hi in bounds]))


def step_bounds(steps: np.ndarray) -> tuple[int, int]:
    """The lowest and highest of a non-empty step array (kept as a watched run grows: ``klwatch.incremental``)."""
    facts = incremental.step_facts(steps)
    if facts is not None and facts.lo is not None and facts.hi is not None:
        return facts.lo, facts.hi
    return int(steps.min()), int(steps.max())


def logging_interval(series: Iterable[Series | None]) -> int:
    """Steps between two logged points (trainers log every ``logging_steps``, 1 for every step): the
    median step difference within each series, pooled over them (never differencing across two series,
    e.g. across a restart); 1 when no series has two steps. The one definition of a run's cadence."""
    kept = [s for s in series if s is not None and len(s) >= 2]
    facts = incremental.all_facts([s.steps for s in kept], incremental.step_facts)
    if facts is not None and all(f.gaps is not None for f in facts):  # a watched run: its gaps kept as it grew
        median = incremental.median_of_counts([f.gaps for f in facts])  # type: ignore[misc]
        return max(1, int(round(median))) if median is not None else 1
    diffs = [_distinct_step_gaps(s.steps) for s in kept]
    d = np.concatenate(diffs) if diffs else np.empty(0, np.int64)
    return max(1, int(round(float(np.median(d))))) if len(d) else 1


def steps_between(lo: int, hi: int, points: int) -> list[int]:
    """Up to ``points`` steps spread evenly from ``lo`` to ``hi`` (both included; ``[lo]`` when ``hi <= lo``): where a
    checkpoint may lie between the last log before a resume and the step before the first after it, when no
    checkpoint folder names it (a ``save_steps`` that is not a multiple of ``logging_steps``)."""
    if hi <= lo:
        return [lo]
    n = max(1, min(points, hi - lo + 1))
    return sorted({int(round(x)) for x in np.linspace(lo, hi, n)})


def _distinct_step_gaps(steps: np.ndarray) -> np.ndarray:
    """``np.diff(np.unique(steps))`` without a hash table: steps come sorted (or nearly), so a sort
    check and dropping repeats costs one pass (numpy's hash-based unique was most of a long run's
    judging time)."""
    ordered = steps if len(steps) < 2 or bool(np.all(steps[1:] >= steps[:-1])) else np.sort(steps)
    gaps = np.diff(ordered)
    return gaps[gaps != 0]


def cadence_of(series: dict[str, Series], *, prefer: tuple[str, ...] = ()) -> int:
    """The logging interval of a piece of log: its KL's (the first of ``prefer`` logged at two steps or
    more), else that of the series carrying the training."""
    chosen = [series[n] for n in prefer if n in series and len(series[n]) >= 2][:1] or _bulk(series)
    return logging_interval(chosen)


def plain_data(obj: Any, *, text: Callable[[str], str] = str) -> Any:
    """``obj`` as plain JSON data: numpy scalars and arrays as Python numbers and lists, tuples as
    lists, keys as strings, a non-finite float as None (JSON has no NaN), every string through
    ``text``. What a finding's data and every JSON face are made of."""
    if isinstance(obj, str):
        return text(obj)
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {text(str(k)): plain_data(v, text=text) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_data(v, text=text) for v in obj]
    return obj


@dataclass
class SourceError:
    """A source, file or run that could not be read; the rest of the work goes on."""

    spec: str
    message: str
    ref: str | None = None


@dataclass
class SourceRead:
    """What reading one SOURCE gave: its segments, the kinds found, and what failed."""

    spec: str
    segments: list[Segment] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unmatched: str | None = None
    """Set when the SOURCE's ``#PATTERN`` kept no training run: what to say (the runs there named). Bad
    usage (exit 2), not a read failure."""
    pooled_under: str | None = None
    """The common parent this local SOURCE was read from with the others of its invocation (``sources.pool``):
    its runs are stitched with theirs. None when it was read on its own."""


@dataclass
class Boundary:
    """A resume point inside a lineage: the first step logged after a restart."""

    step: int
    resumed_from_step: int | None
    evidence: list[Evidence]
    piece_index: int
    """Index into ``Lineage.pieces`` of the first piece after the boundary."""
    tentative: bool = False
    """Marks too weak to be a restart by themselves (a pause like the run's routine ones, inside one
    tracker piece): the boundary stands only if the KL there is judged a reference reset."""


@dataclass
class Lineage:
    """One training run across its restarts.

    ``segments`` are the tracker pieces as read, in start order; ``pieces`` are the contiguous
    stretches between restarts (a segment resumed in place is cut where its steps rewind or its clock
    jumps), each a dict metric -> Series; ``boundaries`` sit between consecutive pieces.
    """

    id: str
    name: str
    segments: list[Segment]
    pieces: list[dict[str, Series]] = field(default_factory=list)
    piece_segments: list[int] = field(default_factory=list)
    """For each piece, the index of the segment it came from."""
    boundaries: list[Boundary] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    checkpoint_steps: list[int] = field(default_factory=list)
    step_axis: str | None = None
    """The framework global-step metric used as x axis, or None for the tracker's step."""
    kl_metric: str | None = None
    """The reference-KL series chosen for this run, or None when none is logged."""
    kl_negated: bool = False
    """The KL metric is logged negated (as a reward term): ``kl_pieces`` flips it back."""
    notes: list[str] = field(default_factory=list)
    """Why its pieces are one run: every join of tracker pieces and every cut, in words."""

    def metric_names(self) -> list[str]:
        names: set[str] = set()
        for piece in self.pieces:
            names.update(piece)
        return sorted(names)

    def series(self, metric: str) -> Series:
        """The metric over the whole lineage, pieces in order (steps may repeat after a rewind)."""
        return Series.concat([p[metric] for p in self.pieces if metric in p])

    def kl_pieces(self) -> list[Series | None]:
        """The reference KL in every piece, signed as a distance (a KL logged negated is flipped
        back); None where a piece logs none. Every detector and face reads the KL through here."""
        out: list[Series | None] = []
        for piece in self.pieces:
            s = piece.get(self.kl_metric) if self.kl_metric else None
            if s is None or not len(s):
                out.append(None)
            else:
                out.append(Series(s.steps, -s.values, s.wall_times) if self.kl_negated else s)
        return out


@dataclass
class BoundaryVerdict:
    """A detector's judgement of one boundary, in the report's terms."""

    boundary: Boundary
    verdict: Verdict
    score: float
    kl_before: float | None
    kl_after: float | None
    explanation: str
    window_before: tuple[int, int] | None = None
    """First and last step of the KL window compared before the boundary (for the dashboard)."""
    window_after: tuple[int, int] | None = None


@dataclass
class Finding:
    """What another resume-integrity detector reports (SPEC: ``findings``)."""

    detector: str
    step: int | None
    severity: Literal["error", "warning", "info"]
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    """The series the detector looked at to find this (as the run logs them, the most telling first):
    what a face draws beside the finding, so it need not know each detector's ``data`` keys."""


DAMAGE_WARNING = re.compile(
    r"truncated event file|truncated last line|is cut short|cut short at the start|ends in \d+ zero bytes|"
    r"corrupt record at byte|corrupt stretches skipped|never finished; dropped|without a first chunk; skipped|"
    r"could not be decoded; skipped|this metric is left out|damaged event file|damaged stretches")
"""A reader's warning that it read a file only in part: up to a cut-off end (a crash mid-write), past
a corrupt stretch it skipped, or without a record or metric file it could not decode. The readers'
own words (TensorBoard, W&B ``.wandb`` logs, tables, MLflow file stores); one place to extend."""


def is_damage_warning(warning: str) -> bool:
    """Whether a reader's warning says that part of a file was lost to damage or a cut-off end
    (dropped NaNs, an ignored config and the like are the logs as written, not damage)."""
    return DAMAGE_WARNING.search(warning) is not None


def incomplete_reasons(lineage: "Lineage") -> list[str]:
    """Why a training run is incomplete, one reason per file: a member that could not be read
    (``unreadable: <its error, naming it>``), or read only in part (``read in part: <file>: <the
    reader's warning>``). Empty when every member was read whole. The one definition every face uses."""
    out: list[str] = []
    for seg in lineage.segments:
        if seg.error:
            out.append(f"unreadable: {seg.error}")
        for w in seg.warnings:
            if is_damage_warning(w):
                out.append(f"read in part: {w if w.startswith(seg.ref) else f'{seg.ref}: {w}'}")
    return list(dict.fromkeys(out))


@dataclass
class LineageResult:
    """Everything klwatch concluded about one training run."""

    lineage: Lineage
    metric: str | None
    status: Status
    verdicts: list[BoundaryVerdict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    incomplete: list[str] = field(default_factory=list)
    """Why the run was judged on part of its logs (``incomplete_reasons``): a member that could not be
    read, or one read only up to damage or a cut-off end, each naming the file. Empty when whole.
    Derived from the lineage when not given, so every result built from a lineage carries it."""

    def __post_init__(self) -> None:
        if not self.incomplete:
            self.incomplete = incomplete_reasons(self.lineage)

    def worst(self) -> BoundaryVerdict | None:
        if not self.verdicts:
            return None
        return max(self.verdicts, key=lambda v: v.score)


@dataclass
class ScanResult:
    """A whole scan: every SOURCE as read and every training run as judged."""

    sources: list[SourceRead]
    results: list[LineageResult]
    generated_at: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))

    @property
    def any_reset(self) -> bool:
        return any(r.status == "reference_reset" for r in self.results)

    @property
    def any_error(self) -> bool:
        return any(s.errors for s in self.sources) or any(r.status == "error" or r.error for r in self.results)

    @property
    def nothing_read(self) -> bool:
        return not any(not seg.error for s in self.sources for seg in s.segments)

    @property
    def unmatched(self) -> list[str]:
        """Every SOURCE's ``#PATTERN`` that kept no training run, said with the runs that are there."""
        return [s.unmatched for s in self.sources if s.unmatched]

    @property
    def unreadable(self) -> list[str]:
        """What could not be read, one message each: every SOURCE's errors, then every training run
        with an unreadable part (named)."""
        return [e.message for s in self.sources for e in s.errors] + \
               [r.error if r.error.startswith(r.lineage.name) else f"{r.lineage.name}: {r.error}"
                for r in self.results if r.error]  # a run named by its one file: the file said once
