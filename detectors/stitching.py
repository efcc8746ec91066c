"""Group tracker runs, folders and event files into lineages: one per training run.

Frameworks start a new W&B run, MLflow run or event file at every restart (NeMo-RL, verl, OpenRLHF,
TRL by default), so one training run is many tracker pieces. Pieces belong together when they come
from the same store and share a group or a name (launch suffixes aside), their configs agree on the
keys that do not change per launch, they do not run at the same time, and each later piece resumes
rather than starts over (a piece that begins at the run's very first step is a new training run, not a
resume: stitching it would fake a reset at step 0).
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .declarations import flatten
from .incremental import value_range
from .launch_config import LAUNCH_FOLDER, ConfigDiff, compare_configs, path_parts, path_values, same_folder, short
from .metrics import choose_kl_metric
from .model import Segment, cadence_of

# Only a suffix that says "launch" is one: a bare number numbers runs (run-0000 ... run-0099, seeds,
# versions), and stripping it would merge different training runs.
_LAUNCH_SUFFIX = re.compile(r"([-_.](resume|restart|retry|relaunch|cont|continued|part|launch|try|attempt)"
                            r"[-_.]?\d+|[-_.](resumed?|restarted))$", re.I)


OVERLAP_SLACK_SECONDS = 1e-6
"""Two tracker runs overlap in time (two processes at once, never one resumed) by more than this."""


@dataclass(frozen=True)
class StitchConfig:
    """Overrides: group by a config/tag key, or an explicit mapping of lineage name -> member globs."""

    group_by: str | None = None
    lineage_map: dict[str, list[str]] | None = None


def load_lineage_file(path: str) -> dict[str, list[str]]:
    """``--lineage FILE``: JSON ``{"lineage name": ["ref or run-id glob", ...]}``."""
    text = Path(path).read_text()
    data = json.loads(text)
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise ValueError(f"{path}: expected a JSON object mapping lineage names to lists of globs")
    return {str(k): [str(x) for x in v] for k, v in data.items()}


def base_name(name: str) -> str:
    """``grpo-7b-resume-2`` -> ``grpo-7b``: what a framework appends per launch is not the run's name."""
    prev = None
    while prev != name:
        prev = name
        name = _LAUNCH_SUFFIX.sub("", name)
    return name or prev or ""


def _key(seg: Segment, config: StitchConfig) -> str:
    if config.lineage_map:
        for lname, globs in config.lineage_map.items():
            for g in globs:
                for candidate in (seg.ref, seg.run_id or "", seg.name or ""):
                    if candidate and fnmatch.fnmatchcase(candidate, g):
                        return f"map:{lname}"
    if config.group_by:
        flat = {**flatten(seg.config), **seg.tags}
        if config.group_by in flat:
            return f"by:{flat[config.group_by]}"
    if seg.kind == "tensorboard":
        # a folder per launch (NeMo-RL logs/exp_001, exp_002; HF runs/<date>_<host>) is joined later,
        # by the step axis continuing, not by its name
        folder = seg.group or seg.run_id or seg.ref
        return "dir:" + "/".join(base_name(part) or part for part in PurePosixPath(folder).parts)
    if seg.group:
        return f"group:{seg.group}"
    if seg.name:
        return f"name:{base_name(seg.name)}"
    return f"run:{seg.run_id or seg.ref}"


def _span(seg: Segment) -> tuple[float | None, float | None]:
    """When a piece's clock starts and ends (a watched run's kept as it grows: ``klwatch.incremental``)."""
    starts, ends = [], []
    for n, s in seg.series.items():
        if s.wall_times is not None and len(s):
            lo, hi = value_range(s.wall_times)
            starts.append(lo)
            ends.append(hi)
    if not starts:
        return seg.start_time, None
    return min(starts), max(ends)


@dataclass(frozen=True)
class _Shape:
    """Where a piece's training starts and ends on the step axis, and how often it logs."""

    first: int | None
    last: int | None
    every: int


def _shape(seg: Segment, prefer: tuple[str, ...]) -> _Shape:
    first, last = seg.extent(prefer)
    return _Shape(first, last, cadence_of(seg.series, prefer=prefer))


def _order_key(seg: Segment, shape: _Shape) -> tuple[float, int]:
    start = seg.first_wall_time()
    return (start if start is not None else float("inf"), shape.first if shape.first is not None else 0)


def starts_over(first: int | None, run_first: int | None, every: int) -> bool:
    """A piece whose training starts where the run's did is a new run from scratch, not a resume: no
    checkpoint lies behind the run's first step. "Where" allows for a first step of 0 or 1 and for the
    logging interval (a resume from the first checkpoint of a run logging every 5 steps shows first at
    the checkpoint + 5)."""
    return first is not None and run_first is not None and first <= run_first + max(1, every - 1)


MAX_REFUSALS_SAID = 3
"""Refusals said in full per piece; the rest are counted by reason (a sweep of hundreds of same-named
runs would otherwise say hundreds of sentences per run)."""


def _split_chain(segs: list[Segment], *, explicit: bool, shapes: dict[int, _Shape],
                 notes: dict[int, list[str]], configs: dict[int, dict]) -> list[list[Segment]]:
    """Within one key, start a new training run where a piece starts over, overlaps or disagrees;
    every join and every refusal is noted on the piece, in words."""
    segs = sorted(segs, key=lambda x: _order_key(x, shapes[id(x)]))
    chains: list[list[Segment]] = []
    for seg in segs:
        refused: list[tuple[str, str]] = []
        for chain in chains:
            if explicit:
                chain.append(seg)
                break
            why, diff = _refusal(seg, chain, shapes=shapes, configs=configs)
            if why is not None:
                refused.append((why[0], f"{seg.ref} was not joined to {chain[-1].ref} (same {_what(seg)}): {why[1]}"))
                continue
            sh, last = shapes[id(seg)], chain[-1]
            steps = f", its steps continue from {shapes[id(last)].last} to {sh.first}" if sh.first is not None else ""
            notes.setdefault(id(seg), []).append(
                f"{seg.ref} joined {last.ref}: same {_what(seg)}{steps}{_diff_words(diff)}")
            chain.append(seg)
            break
        else:
            chains.append([seg])
            notes.setdefault(id(seg), []).extend(_said(refused, what=_what(seg)))
    return chains


def _said(refused: list[tuple[str, str]], *, what: str) -> list[str]:
    """The first refusals in full, the rest counted by reason."""
    out = [text for _, text in refused[:MAX_REFUSALS_SAID]]
    rest: dict[str, int] = {}
    for reason, _ in refused[MAX_REFUSALS_SAID:]:
        rest[reason] = rest.get(reason, 0) + 1
    if rest:
        out.append(f"{sum(rest.values())} more runs of the same {what} were not joined either: " +
                   ", ".join(f"{n} {reason}" for reason, n in rest.items()))
    return out


def _refusal(seg: Segment, chain: list[Segment], *, shapes: dict[int, _Shape],
             configs: dict[int, dict]) -> tuple[tuple[str, str] | None, ConfigDiff | None]:
    """Why ``seg`` cannot continue ``chain`` ((a short reason, the sentence), None when it can), and how
    their configs differ (compared only once the cheap checks pass)."""
    last, sh = chain[-1], shapes[id(seg)]
    # a W&B/MLflow run resumed in place keeps its id; event files share their folder's id
    new_run = seg.run_id != last.run_id or seg.kind == "tensorboard"
    _, l_end = _span(last)
    s_start, _ = _span(seg)
    if new_run and l_end is not None and s_start is not None and s_start < l_end - OVERLAP_SLACK_SECONDS:
        return ("ran at the same time", "the two ran at the same time (two processes, not one resumed)"), None
    run_first = min((shapes[id(x)].first for x in chain if shapes[id(x)].first is not None), default=None)
    # the run's own logging interval: a fresh run logs on its grid from its first step
    if new_run and starts_over(sh.first, run_first, shapes[id(chain[0])].every):
        return ("started over", f"it starts over at step {sh.first}, where the run started ({run_first}): a new run "
                "from scratch, no checkpoint lies behind that step"), None
    diff = compare_configs(configs.get(id(last), last.config), configs.get(id(seg), seg.config))
    if not diff.agree:
        return ("configs differ", diff.describe_split()), diff
    unfit = _unfit_move(diff, sh.first, shapes[id(chain[0])].every)
    return (("model moved elsewhere", unfit) if unfit else None), diff


def _diff_words(diff: ConfigDiff | None) -> str:
    """What the configs of a join differ in, for its note: the per-launch keys, a model moved into
    the earlier launch's checkpoints."""
    if diff is None:
        return ""
    words = ""
    if diff.per_launch:
        keys = ", ".join(diff.per_launch[:4]) + (f" and {len(diff.per_launch) - 4} more" if len(diff.per_launch) > 4 else "")
        words += f"; configs agree but for keys that change at every launch ({keys})"
    for move in diff.model_moves:
        words += f"; {move.describe()}"
    return words


def _unfit_move(diff: ConfigDiff, first: int | None, every: int) -> str | None:
    """Why a model moved into a checkpoint folder no config of the earlier launch names does not tie
    the two launches together: the later one does not resume right after that checkpoint's step."""
    for move in diff.model_moves:
        if not move.fits(first, every):
            return (f"its {move.key} moved to a checkpoint of step {move.checkpoint_step} ({short(move.after)}) that "
                    f"neither the earlier launch's config names nor its first step {first} follows")
    return None


def _what(seg: Segment) -> str:
    if seg.kind == "tensorboard":
        return "folder"
    if seg.group:
        return f"group {seg.group!r}"
    if seg.name:
        return f"name {seg.name!r}"
    return "run id"


def stitch(segments: list[Segment], *, config: StitchConfig = StitchConfig(), metrics: tuple[str, ...] = (),
           notes: dict[int, list[str]] | None = None) -> list[tuple[str, str, list[Segment]]]:
    """Group segments into training runs: a list of (lineage id, name, segments in start order).

    An error segment (a file or run that could not be read) joins the training run its identity
    names (``_error_owner``: its event file's run folder, its tracker run id), so the run is reported
    with its unreadable part; one whose run cannot be told stays alone, reported with its error.
    Checkpoint folders join the training run of the same name in the same source, or the only one
    there. ``metrics`` are the ``--metric`` patterns (the KL decides where a piece starts); ``notes``,
    when given, receives the reason for every join, keyed by ``id()`` of the segment joined.
    """
    notes = {} if notes is None else notes
    shapes = {id(seg): _shape(seg, _prefer(seg, metrics)) for seg in segments if not seg.error}
    data, checkpoints, unreadable, sidecars = _sort_segments(segments)
    configs = effective_configs([*data, *(s for s in segments if id(s) in sidecars)], owners=sidecars)
    lineages: list[tuple[str, str, list[Segment]]] = []
    for (source, store), groups in _by_store(data, config).items():
        for key, segs in groups.items():
            chains = _split_chain(segs, explicit=key.startswith(("map:", "by:")), shapes=shapes, notes=notes,
                                  configs=configs)
            base = f"{chains[0][0].kind}:{_store_label(source, store)}:{key.split(':', 1)[1]}"
            lineages.extend(_named_chains(base, key, chains, shapes=shapes))
    if not config.lineage_map and not config.group_by:
        lineages = _join_continuations(lineages, shapes=shapes, notes=notes, configs=configs)
    _attach_sidecars(sidecars, segments, lineages, notes=notes)
    out = _attach_unreadable(unreadable, lineages, config=config, notes=notes)
    named = _folders_named(lineages, configs) if checkpoints else {}
    for ck in checkpoints:
        targets = _checkpoint_owners(ck, lineages, named=named, notes=notes)
        for target in targets:
            target[2].append(ck)
        if not targets:
            lineages.append((f"checkpoints:{ck.ref}", ck.name or ck.ref, [ck]))
    return out + lineages


def _sort_segments(segments: list[Segment]) -> tuple[list[Segment], list[Segment], list[Segment], dict[int, Segment]]:
    """(tracker pieces, checkpoint folders, unreadable pieces, each hparams sidecar -> its event file)."""
    data, checkpoints, unreadable = [], [], []
    for seg in segments:
        (unreadable if seg.error else checkpoints if seg.kind == "checkpoints" else data).append(seg)
    owners = sidecar_owners(data)
    return [s for s in data if id(s) not in owners], checkpoints, unreadable, owners


_HPARAMS_FOLDER = re.compile(r"^\d{9,11}\.\d+$")


def sidecar_owners(segments: list[Segment]) -> dict[int, Segment]:
    """Each hyperparameters sidecar (by ``id``) with the event file it describes. PyTorch's
    ``SummaryWriter.add_hparams`` writes the hyperparameters into ``<log_dir>/<time.time()>/`` (NeMo-RL's
    TensorBoard logger logs its whole config that way at every launch): an event file with a config and no
    points, in a folder named by the time, inside a folder of logged event files. It describes the event
    file of that folder started last before it (a folder reused by several launches holds one per launch)."""
    by_folder: dict[str, list[Segment]] = {}
    for s in segments:
        if s.kind == "tensorboard" and _has_points(s):
            by_folder.setdefault(_folder(s), []).append(s)
    owners: dict[int, Segment] = {}
    for car in segments:
        folder = PurePosixPath(_folder(car))
        if car.kind != "tensorboard" or not car.config or _has_points(car) or not _HPARAMS_FOLDER.match(folder.name):
            continue
        events = sorted(by_folder.get(str(folder.parent), []), key=lambda e: e.first_wall_time() or 0.0)
        if events:
            when = car.start_time or 0.0
            started = [e for e in events if (e.first_wall_time() or 0.0) <= when + 1.0]
            owners[id(car)] = started[-1] if started else events[0]
    return owners


def _has_points(seg: Segment) -> bool:
    return any(len(s) for s in seg.series.values())


def effective_configs(segments: list[Segment], *, owners: dict[int, Segment] | None = None) -> dict[int, dict]:
    """Each piece's config (by ``id``): the hyperparameters written beside it by ``add_hparams``, and its
    own over them. Stitching compares launches by these, and boundaries read a model moved into a
    checkpoint from them. ``owners``: ``sidecar_owners(segments)`` when the caller has it already."""
    owners = sidecar_owners(segments) if owners is None else owners
    beside: dict[int, dict] = {}
    for car in sorted((s for s in segments if id(s) in owners), key=lambda c: c.start_time or 0.0):
        beside.setdefault(id(owners[id(car)]), {}).update(car.config)
    return {id(s): {**beside.get(id(s), {}), **s.config} for s in segments if id(s) not in owners}


def _by_store(data: list[Segment], config: StitchConfig) -> dict[tuple[str, str], dict[str, list[Segment]]]:
    """Pieces by store, then by key: event files of one source are one store, their folders the keys."""
    by_store: dict[tuple[str, str], dict[str, list[Segment]]] = {}
    for seg in data:
        by_store.setdefault(_store_key(seg), {}).setdefault(_key(seg, config), []).append(seg)
    return by_store


def _attach_sidecars(sidecars: dict[int, Segment], segments: list[Segment],
                     lineages: list[tuple[str, str, list[Segment]]], *,
                     notes: dict[int, list[str]]) -> None:
    """A hyperparameters sidecar is a member of the run its event file belongs to."""
    for car in (s for s in segments if id(s) in sidecars):
        event = sidecars[id(car)]
        owner = next(lin for lin in lineages if any(m is event for m in lin[2]))
        owner[2].append(car)
        notes.setdefault(id(car), []).append(
            f"{car.ref} holds the hyperparameters written beside {event.ref} (add_hparams): it is this run's "
            "config, not a run of its own")


def _attach_unreadable(unreadable: list[Segment], lineages: list[tuple[str, str, list[Segment]]], *,
                       config: StitchConfig, notes: dict[int, list[str]]) -> list[tuple[str, str, list[Segment]]]:
    """Each unreadable piece joins the run its identity names, or stays alone with its error."""
    alone: list[tuple[str, str, list[Segment]]] = []
    for seg in unreadable:
        owner = _error_owner(seg, lineages, config=config)
        if owner is None:
            alone.append((f"{seg.kind}:{seg.ref}", seg.name or seg.ref, [seg]))
            continue
        owner[2].append(seg)
        notes.setdefault(id(seg), []).append(
            f"{seg.ref} could not be read; it is counted in this run as its {_what(seg)} "
            f"({seg.group or seg.run_id}) is this run's")
    return alone


def _error_owner(seg: Segment, lineages: list[tuple[str, str, list[Segment]]], *,
                 config: StitchConfig) -> tuple[str, str, list[Segment]] | None:
    """The training run an unreadable segment belongs to, or None when that cannot be told.

    Its identity is what its path says (``sources.local.error_segment``): an explicit ``--lineage``
    glob matching its ref or run id decides first; else an event file belongs to the run whose event
    files share its run folder (the only one there, even when the file is older than every file read, as
    a run's unreadable first launch is; of several training runs, the latest one started before the file
    was created), else to the only run in a launch folder beside it started before it; a
    tracker run to the run holding a piece with its run id in the same or a sibling store. Never a
    guess between two runs."""
    if config.lineage_map:
        key = _key(seg, config)
        mapped = [lin for lin in lineages if key.startswith("map:") and any(
            m.kind == seg.kind and m.source == seg.source and _key(m, config) == key for m in lin[2])]
        return mapped[0] if len(mapped) == 1 else None
    same_kind = [lin for lin in lineages if any(m.kind == seg.kind and m.source == seg.source for m in lin[2])]
    if seg.kind == "tensorboard":
        if seg.group is None:
            return None
        here = [lin for lin in same_kind if any(m.kind == "tensorboard" and _folder(m) == seg.group for m in lin[2])]
        beside = [lin for lin in same_kind if any(m.kind == "tensorboard" and _launch_siblings(_folder(m), seg.group)
                                                  for m in lin[2])]
        for candidates, alone in ((here, False), (beside, True)):
            if len(candidates) == 1 and not alone:
                return candidates[0]  # the one run of its folder: its file whenever it was made (its first launch's too)
            started = _started_before(candidates, seg.start_time)
            if len(started) == 1 or (started and not alone):
                return started[-1]
        return None
    if seg.run_id is None:
        return None
    owners = [lin for lin in same_kind if any(m.run_id == seg.run_id and m.kind == seg.kind and sibling_stores(m, seg)
                                              for m in lin[2])]
    return owners[0] if len(owners) == 1 else None


def _started_before(lineages: list[tuple[str, str, list[Segment]]],
                    when: float | None) -> list[tuple[str, str, list[Segment]]]:
    """The runs started at or before ``when`` (all of them when it is unknown), earliest first."""
    def start(lin: tuple[str, str, list[Segment]]) -> float:
        times = [t for t in (m.first_wall_time() for m in lin[2]) if t is not None]
        return min(times, default=float("-inf"))

    ordered = sorted(lineages, key=start)
    return ordered if when is None else [lin for lin in ordered if start(lin) <= when + 1.0]


def _named_chains(base: str, key: str, chains: list[list[Segment]], *,
                  shapes: dict[int, _Shape]) -> list[tuple[str, str, list[Segment]]]:
    """(id, name, chain) for the training runs that share one key.

    An id must never change once given (an alert is keyed on it, a dashboard link names it), so it
    comes from the chain itself, not from how many siblings it has: the eldest chain (earliest start,
    then first step, then ref) keeps the key alone, exactly as a run with no sibling has it; every
    other chain is the key plus its first member's own identity. A same-named run that appears later
    is younger, so it gets an id of its own and the existing one keeps its id. The name is for people:
    ``#2``, ``#3`` in the order the runs started."""
    order = sorted(range(len(chains)), key=lambda i: (_order_key(chains[i][0], shapes[id(chains[i][0])]), chains[i][0].ref))
    named: dict[int, tuple[str, str, list[Segment]]] = {}
    used = {base}
    for rank, i in enumerate(order):
        chain, lid, name = chains[i], base, _lineage_name(key, chains[i])
        if rank:
            lid = f"{base}#{_identity(chain[0])}"
            lid = lid if lid not in used else f"{lid}#{chain[0].ref}"
            name += f" #{rank + 1}"
        used.add(lid)
        named[i] = (lid, name, chain)
    return [named[i] for i in range(len(chains))]  # in the order stitching found them


def _identity(seg: Segment) -> str:
    """What names one tracker piece for good: its event file (the folder is already in the key), else
    its tracker run id, else its ref."""
    if seg.kind == "tensorboard":
        return PurePosixPath(seg.ref).name or seg.ref
    return seg.run_id or seg.ref


def _prefer(seg: Segment, metrics: tuple[str, ...]) -> tuple[str, ...]:
    kl = choose_kl_metric([seg], patterns=metrics or None)
    return (kl,) if kl else ()


def _store_key(seg: Segment) -> tuple[str, str]:
    """Which store a segment belongs to for stitching: event files of one source are one store."""
    return seg.source, seg.source if seg.kind == "tensorboard" else (seg.store or seg.source)


@dataclass
class _ChainSpan:
    """Step and clock extent of a chain, kept up to date as chains are joined (no re-scanning)."""

    first: int | None
    last: int | None
    start: float | None
    end: float | None
    every: int

    @classmethod
    def of(cls, chain: list[Segment], shapes: dict[int, _Shape]) -> "_ChainSpan":
        steps = [(shapes[id(s)].first, shapes[id(s)].last) for s in chain if shapes[id(s)].first is not None]
        clock = [_span(s) for s in chain]
        starts = [a for a, _ in clock if a is not None]
        ends = [b for _, b in clock if b is not None]
        return cls(min((a for a, _ in steps), default=None), max((b for _, b in steps), default=None),  # type: ignore[type-var]
                   min(starts, default=None), max(ends, default=None), max(shapes[id(s)].every for s in chain))

    def absorb(self, other: "_ChainSpan") -> None:
        def lo(a, b):  # type: ignore[no-untyped-def]
            return b if a is None else a if b is None else min(a, b)

        def hi(a, b):  # type: ignore[no-untyped-def]
            return b if a is None else a if b is None else max(a, b)

        self.first, self.last = lo(self.first, other.first), hi(self.last, other.last)
        self.start, self.end = lo(self.start, other.start), hi(self.end, other.end)
        self.every = max(self.every, other.every)


def _store_path(seg: Segment) -> str:
    return (seg.store or seg.source).partition("#")[0]


def _folder(seg: Segment) -> str:
    """Where a piece was written: an event file's run folder, else its store."""
    if seg.kind == "tensorboard":
        return seg.group or seg.run_id or str(PurePosixPath(seg.ref).parent)
    return _store_path(seg)


def _launch_siblings(a: str, b: str) -> bool:
    """Paths that differ in one folder, named like a launch on both sides."""
    pa, pb = PurePosixPath(a).parts, PurePosixPath(b).parts
    if len(pa) != len(pb):
        return False
    diff = [(x, y) for x, y in zip(pa, pb) if x != y]
    return len(diff) == 1 and all(LAUNCH_FOLDER.search(part) for part in diff[0])


def _closest(candidates: list[int], *, head: Segment, chains: dict[int, list[Segment]],
             diffs: dict[int, ConfigDiff]) -> int | None:
    """The one candidate a piece continues: several runs may stop where it starts (a fleet of runs
    crashed at the same checkpoint), so kinship decides: the same folder, then a launch folder beside
    it, then the same store; among those, the one run whose config differs from the piece's in nothing
    but its launch folders (NeMo-RL puts every run's launches side by side in ``logs/exp_NNN``: the
    checkpoint folder and the run's name then tell whose launch it is; an empty or sparse config is no
    such evidence). A tie at the best rank leaves the piece alone."""
    def rank(j: int) -> tuple[int, int]:
        parent = chains[j][-1]
        if _folder(parent) == _folder(head):
            near = 3
        elif _launch_siblings(_folder(parent), _folder(head)):
            near = 2
        else:
            near = 1 if _store_key(parent) == _store_key(head) else 0
        return near, int(diffs[j].kin())

    if not candidates:
        return None
    ranks = {j: rank(j) for j in candidates}
    best = max(ranks.values())
    top = [j for j, r in ranks.items() if r == best]
    return top[0] if len(top) == 1 else None


def sibling_stores(a: Segment, b: Segment) -> bool:
    """Two stores that are launch folders side by side (``attempt1/wandb``, ``attempt2/wandb``;
    ``logs/exp_001``, ``logs/exp_002``): paths that differ in one folder, named like a launch on
    both sides. Being siblings only makes two pieces candidates for a join; the steps decide."""
    if _store_key(a) == _store_key(b):
        return True
    if a.source != b.source or (a.store or "").partition("#")[2] != (b.store or "").partition("#")[2]:
        return False
    return _launch_siblings(_store_path(a), _store_path(b))


def _join_continuations(lineages: list[tuple[str, str, list[Segment]]], *, shapes: dict[int, _Shape],
                        notes: dict[int, list[str]], configs: dict[int, dict]) -> list[tuple[str, str, list[Segment]]]:
    """Join a run that starts mid-way to the one it continues, whatever their names.

    A relaunch can get a fresh random name (``happy-sky-12``), no group, and a folder of its own
    beside the last launch's. If a piece begins at a later step, in the same store or a sibling launch
    folder, after another run ended there, with a config that agrees, and that run reached the step
    it resumes from (within one logging interval), it is that run's continuation. A piece that starts
    where a run started is a new run from scratch, never a continuation. Only a unique candidate is
    joined; a run whose steps fit but whose config differs is left apart, and the note says why.

    Chains are taken in start order, so a continuation of a continuation finds its parent already
    joined: one pass, with each chain's extent computed once.
    """
    spans = [_ChainSpan.of(chain, shapes) for _, _, chain in lineages]
    order = sorted(range(len(lineages)), key=lambda i: (spans[i].start is None, spans[i].start or 0.0))
    joined_into: dict[int, int] = {}
    chains = {i: list(lineages[i][2]) for i in range(len(lineages))}
    for i in order:
        sp = spans[i]
        if sp.first is None or sp.start is None:
            continue
        head = chains[i][0]
        fits = [j for j in chains if j != i and j not in joined_into and chains[j][0].kind == head.kind
                and sibling_stores(chains[j][0], head) and _continues(spans[j], sp)]
        diffs = {j: compare_configs(configs.get(id(chains[j][-1]), chains[j][-1].config),
                                    configs.get(id(head), head.config)) for j in fits}
        why = {j: diffs[j].describe_split() if not diffs[j].agree else
               _unfit_move(diffs[j], sp.first, max(spans[j].every, sp.every)) for j in fits}
        for j in fits:
            said = f"{head.ref} was not joined to {chains[j][-1].ref}"
            if why[j] is not None and not any(n.startswith(said) for n in notes.get(id(head), [])):
                notes.setdefault(id(head), []).append(
                    f"{said} although its steps continue that run's (from {spans[j].last} to {sp.first}): {why[j]}")
        candidates = [j for j in fits if why[j] is None]
        j = _closest(candidates, head=head, chains=chains, diffs=diffs)
        if j is not None:
            parent = chains[j][-1]
            where = ("in a launch folder beside it" if _launch_siblings(_folder(parent), _folder(head))
                     else "in the same store")
            notes.setdefault(id(head), []).append(
                f"{head.ref} joined {parent.ref}: its steps continue the run's (from {spans[j].last} to {sp.first}) "
                f"{where}{_diff_words(diffs[j]) or ', configs agree'}")
            chains[j].extend(chains[i])
            spans[j].absorb(sp)
            joined_into[i] = j
        elif len(candidates) > 1:
            notes.setdefault(id(head), []).append(
                f"{head.ref} continues the steps of {len(candidates)} runs: left apart (join it with --lineage)")
    return [(lid, name, chains[i]) for i, (lid, name, _) in enumerate(lineages) if i not in joined_into]


def _continues(sj: "_ChainSpan", sp: "_ChainSpan") -> bool:
    """A chain ``sp`` that starts after ``sj`` ended, from a step ``sj`` reached (within one logging
    interval), and not where ``sj`` started."""
    if None in (sj.first, sj.last, sj.end) or sj.end > sp.start:  # type: ignore[operator]
        return False
    return (not starts_over(sp.first, sj.first, max(sj.every, sp.every))
            and sj.first < sp.first <= sj.last + max(sj.every, sp.every))  # type: ignore[operator]


def _common_depth(a: str, b: str) -> int:
    pa, pb = PurePosixPath(a).parts, PurePosixPath(b).parts
    n = 0
    for x, y in zip(pa, pb):
        if x != y:
            break
        n += 1
    return n


def _checkpoint_owners(ck: Segment, lineages: list[tuple[str, str, list[Segment]]], *,
                       named: dict[str, list[tuple[int, str]]],
                       notes: dict[int, list[str]]) -> list[tuple[str, str, list[Segment]]]:
    """The training runs a checkpoint folder belongs to: the runs whose config names it as their
    checkpoint or output folder (NeMo-RL ``checkpointing.checkpoint_dir``, HF ``output_dir``, verl
    ``trainer.default_local_dir``), one per tracker kind, so ``logs/`` and ``results/`` side by side
    pair up; else the run logged nearest to it in the folder tree (``run/checkpoints/step_N`` beside
    ``run/events...``); else the runs of its name, one per tracker kind (one training logged to W&B,
    MLflow and TensorBoard at once has one set of checkpoints); else the only run of its source.
    Ambiguity leaves it alone rather than lending evidence to the wrong run."""
    same_source = [lin for lin in lineages if lin[2][0].source == ck.source and lin[2][0].kind != "checkpoints"]
    rules = ((lambda: _named_by_config(ck, lineages, same_source, named), "its config names that folder"),
             (lambda: _nearest_in_tree(ck, same_source), "it lies nearest to it"),
             (lambda: _of_its_name(ck, same_source), "it has the checkpoints' run name"),
             (lambda: [same_source[0]] if len(same_source) == 1 else [], "it is the only run there"))
    for rule, why in rules:
        owners = rule()
        if owners:
            notes.setdefault(id(ck), []).append(f"the checkpoints in {ck.ref or ck.source} belong to this run: {why}")
            return owners
    return []


def _one_per_kind(lineages: list[tuple[str, str, list[Segment]]]) -> list[tuple[str, str, list[Segment]]]:
    kinds = [lin[2][0].kind for lin in lineages]
    return lineages if lineages and len(kinds) == len(set(kinds)) else []


def _folders_named(lineages: list[tuple[str, str, list[Segment]]],
                   configs: dict[int, dict]) -> dict[str, list[tuple[int, str]]]:
    """Every folder a run's config names, by its last part: (index of the run, the path). Built once,
    so pairing checkpoint folders with runs costs a look-up each, not a walk of every config."""
    index: dict[str, list[tuple[int, str]]] = {}
    for i, (_, _, members) in enumerate(lineages):
        for m in members:
            for path in path_values(flatten(configs.get(id(m), m.config))):
                parts = path_parts(path)
                if parts:
                    index.setdefault(parts[-1], []).append((i, path))
    return index


def _named_by_config(ck: Segment, lineages: list[tuple[str, str, list[Segment]]],
                     same_source: list[tuple[str, str, list[Segment]]],
                     named: dict[str, list[tuple[int, str]]]) -> list[tuple[str, str, list[Segment]]]:
    where = str(Path(ck.source) / ck.ref) if ck.ref not in ("", ".") else ck.source
    parts = path_parts(where)
    hits = {i for i, path in named.get(parts[-1], []) if same_folder(path, where)} if parts else set()
    return _one_per_kind([lin for i, lin in enumerate(lineages) if i in hits and any(lin is x for x in same_source)])


def _of_its_name(ck: Segment, runs: list[tuple[str, str, list[Segment]]]) -> list[tuple[str, str, list[Segment]]]:
    if not ck.name:
        return []
    return _one_per_kind([lin for lin in runs if base_name(ck.name) in (base_name(lin[1]), lin[1])])


def _nearest_in_tree(ck: Segment, runs: list[tuple[str, str, list[Segment]]]) -> list[tuple[str, str, list[Segment]]]:
    depths = [(max(_common_depth(ck.ref, str(PurePosixPath(s.ref).parent)) for s in lin[2]), i)
              for i, lin in enumerate(runs)]
    if not depths:
        return []
    best = max(d for d, _ in depths)
    winners = [i for d, i in depths if d == best]
    return [runs[winners[0]]] if best > 0 and len(winners) == 1 else []


def _lineage_name(key: str, chain: list[Segment]) -> str:
    kind, _, rest = key.partition(":")
    if kind == "name":
        return rest
    first = chain[0]
    if kind == "dir":
        return first.group or rest
    return first.group or first.name or rest


def _store_label(source: str, store: str) -> str:
    """A short, stable name for a store: relative to the source when it lies inside it."""
    path, sep, exp = store.partition("#")
    try:
        src = Path(source).expanduser().resolve()
        p = Path(path).resolve()
        rel = p.relative_to(src if src.is_dir() else src.parent)
        label = str(rel) if str(rel) != "." else src.name
    except (ValueError, OSError):
        label = path
    return label + (sep + exp if sep else "")
