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
from .metrics import choose_kl_metric
from .model import Segment, cadence_of

# Config keys that legitimately change from one launch of a run to the next.
_PER_LAUNCH = re.compile(
    r"(resume|checkpoint|ckpt|output|_dir|dir$|path|time|date|_id$|^id$|host|node|slurm|port|wandb|"
    r"launch|restart|seed|pid|rank|world|device|cuda|run_name|logging|log_dir|save|load|model_name|"
    r"name_or_path|max_steps|num_train_epochs|total|exp_name|experiment|version|hub_|push_to_hub|"
    r"num_param)", re.I)  # a model's parameter count changes when an adapter is wrapped or merged on resume
# Only a suffix that says "launch" is one: a bare number numbers runs (run-0000 ... run-0099, seeds,
# versions), and stripping it would merge different training runs.
_LAUNCH_SUFFIX = re.compile(r"([-_.](resume|restart|retry|relaunch|cont|continued|part|launch|try|attempt)"
                            r"[-_.]?\d+|[-_.](resumed?|restarted))$", re.I)
# A folder per launch beside the last one: a launch counter (attempt2, exp_002, version_3), a date
# stamp (HF's runs/Dec01_13-05-59_host, 2026-12-01_13-05), or a launch word.
_LAUNCH_FOLDER = re.compile(r"^([A-Za-z]*[-_.]?)?\d+$|^[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}|"
                            r"^\d{4}-?\d{2}-?\d{2}([T_ -]?\d{2}[-:]?\d{2})?|"
                            r"(resume|restart|retry|relaunch|attempt|launch|try)", re.I)


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


def configs_agree(a: dict, b: dict) -> bool:
    """True unless the configs differ on keys that do not change between launches of one run.

    Strict: one key is enough to tell two runs apart (``sync_ref_model``, ``beta``, ``logging_steps``
    among TRL's ~230), while real relaunches differ only in per-launch keys (paths, names, ids, times).
    """
    fa, fb = flatten(a), flatten(b)
    common = [k for k in fa.keys() & fb.keys() if not _PER_LAUNCH.search(k)]
    return all(_same_value(fa[k], fb[k]) for k in common)


def _same_value(a: object, b: object) -> bool:
    """Equal as logged; a list is compared as a set (PEFT's ``target_modules`` is a set, serialized in
    a different order by every process)."""
    if isinstance(a, list) and isinstance(b, list):
        return sorted(map(str, a)) == sorted(map(str, b))
    return str(a) == str(b)


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
    starts, ends = [], []
    for n, s in seg.series.items():
        if s.wall_times is not None and len(s):
            starts.append(float(s.wall_times.min()))
            ends.append(float(s.wall_times.max()))
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


def _split_chain(segs: list[Segment], *, explicit: bool, shapes: dict[int, _Shape],
                 notes: dict[int, list[str]]) -> list[list[Segment]]:
    """Within one key, start a new training run where a piece starts over, overlaps or disagrees."""
    segs = sorted(segs, key=lambda x: _order_key(x, shapes[id(x)]))
    chains: list[list[Segment]] = []
    for seg in segs:
        sh = shapes[id(seg)]
        placed = False
        for chain in chains:
            if explicit:
                chain.append(seg)
                placed = True
                break
            last = chain[-1]
            run_first = min((shapes[id(x)].first for x in chain if shapes[id(x)].first is not None), default=None)
            l_start, l_end = _span(last)
            s_start, _ = _span(seg)
            # a W&B/MLflow run resumed in place keeps its id; event files share their folder's id
            new_run = seg.run_id != last.run_id or seg.kind == "tensorboard"
            overlaps = new_run and l_end is not None and s_start is not None and s_start < l_end - OVERLAP_SLACK_SECONDS
            # the run's own logging interval: a fresh run logs on its grid from its first step
            over = new_run and starts_over(sh.first, run_first, shapes[id(chain[0])].every)
            if overlaps or over or not configs_agree(last.config, seg.config):
                continue
            notes.setdefault(id(seg), []).append(
                f"{seg.ref} joined {last.ref}: same {_what(seg)}, its steps continue from {shapes[id(last)].last} "
                f"to {sh.first}" if sh.first is not None else f"{seg.ref} joined {last.ref}: same {_what(seg)}")
            chain.append(seg)
            placed = True
            break
        if not placed:
            chains.append([seg])
    return chains


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
    out: list[tuple[str, str, list[Segment]]] = []
    by_store: dict[tuple[str, str], dict[str, list[Segment]]] = {}
    checkpoints: list[Segment] = []
    unreadable: list[Segment] = []
    for seg in segments:
        if seg.error:
            unreadable.append(seg)
            continue
        if seg.kind == "checkpoints":
            checkpoints.append(seg)
            continue
        store = _store_key(seg)  # event files of one source are one store: their folders are the keys
        by_store.setdefault(store, {}).setdefault(_key(seg, config), []).append(seg)

    lineages: list[tuple[str, str, list[Segment]]] = []
    for (source, store), groups in by_store.items():
        for key, segs in groups.items():
            chains = _split_chain(segs, explicit=key.startswith(("map:", "by:")), shapes=shapes, notes=notes)
            base = f"{chains[0][0].kind}:{_store_label(source, store)}:{key.split(':', 1)[1]}"
            lineages.extend(_named_chains(base, key, chains, shapes=shapes))
    if not config.lineage_map and not config.group_by:
        lineages = _join_continuations(lineages, shapes=shapes, notes=notes)

    for seg in unreadable:
        owner = _error_owner(seg, lineages, config=config)
        if owner is None:
            out.append((f"{seg.kind}:{seg.ref}", seg.name or seg.ref, [seg]))
            continue
        owner[2].append(seg)
        notes.setdefault(id(seg), []).append(
            f"{seg.ref} could not be read; it is counted in this run as its {_what(seg)} "
            f"({seg.group or seg.run_id}) is this run's")

    for ck in checkpoints:
        targets = _checkpoint_owners(ck, lineages)
        for target in targets:
            target[2].append(ck)
        if not targets:
            lineages.append((f"checkpoints:{ck.ref}", ck.name or ck.ref, [ck]))
    return out + lineages


def _error_owner(seg: Segment, lineages: list[tuple[str, str, list[Segment]]], *,
                 config: StitchConfig) -> tuple[str, str, list[Segment]] | None:
    """The training run an unreadable segment belongs to, or None when that cannot be told.

    Its identity is what its path says (``sources.local.error_segment``): an explicit ``--lineage``
    glob matching its ref or run id decides first; else an event file belongs to the run whose event
    files share its run folder (a folder holding several training runs: the latest one started before
    the file was created), else to the only run in a launch folder beside it started before it; a
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
    return len(diff) == 1 and all(_LAUNCH_FOLDER.search(part) for part in diff[0])


def _closest(candidates: list[int], *, head: Segment, chains: dict[int, list[Segment]]) -> int | None:
    """The one candidate a piece continues: several runs may stop where it starts (a fleet of runs
    crashed at the same checkpoint), so kinship decides: the same folder, then a launch folder beside
    it, then the same store. A tie at the best rank leaves the piece alone."""
    def rank(j: int) -> int:
        parent = chains[j][-1]
        if _folder(parent) == _folder(head):
            return 3
        if _launch_siblings(_folder(parent), _folder(head)):
            return 2
        return 1 if _store_key(parent) == _store_key(head) else 0

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
                        notes: dict[int, list[str]]) -> list[tuple[str, str, list[Segment]]]:
    """Join a run that starts mid-way to the one it continues, whatever their names.

    A relaunch can get a fresh random name (``happy-sky-12``), no group, and a folder of its own
    beside the last launch's. If a piece begins at a later step, in the same store or a sibling launch
    folder, after another run ended there, with a config that agrees, and that run reached the step
    it resumes from (within one logging interval), it is that run's continuation. A piece that starts
    where a run started is a new run from scratch, never a continuation. Only a unique candidate is
    joined.

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

        def continues(j: int) -> bool:
            sj = spans[j]
            if None in (sj.first, sj.last, sj.end) or sj.end > sp.start:  # type: ignore[operator]
                return False
            return (not starts_over(sp.first, sj.first, sj.every)
                    and sj.first < sp.first <= sj.last + max(sj.every, sp.every))  # type: ignore[operator]

        candidates = [j for j in chains if j != i and j not in joined_into
                      and chains[j][0].kind == head.kind and sibling_stores(chains[j][0], head)
                      and continues(j) and configs_agree(chains[j][-1].config, head.config)]
        j = _closest(candidates, head=head, chains=chains)
        if j is not None:
            parent = chains[j][-1]
            where = ("in a launch folder beside it" if _launch_siblings(_folder(parent), _folder(head))
                     else "in the same store")
            notes.setdefault(id(head), []).append(
                f"{head.ref} joined {parent.ref}: its steps continue the run's (from {spans[j].last} to {sp.first}) "
                f"{where}, configs agree")
            chains[j].extend(chains[i])
            spans[j].absorb(sp)
            joined_into[i] = j
        elif len(candidates) > 1:
            notes.setdefault(id(head), []).append(
                f"{head.ref} continues the steps of {len(candidates)} runs: left apart (join it with --lineage)")
    return [(lid, name, chains[i]) for i, (lid, name, _) in enumerate(lineages) if i not in joined_into]


def _common_depth(a: str, b: str) -> int:
    pa, pb = PurePosixPath(a).parts, PurePosixPath(b).parts
    n = 0
    for x, y in zip(pa, pb):
        if x != y:
            break
        n += 1
    return n


def _checkpoint_owners(ck: Segment, lineages: list[tuple[str, str, list[Segment]]]) -> list[tuple[str, str, list[Segment]]]:
    """The training runs a checkpoint folder belongs to: the run logged nearest to it in the folder
    tree (``run/checkpoints/step_N`` beside ``run/events...``); else the runs of its name, one per
    tracker kind (one training logged to W&B, MLflow and TensorBoard at once has one set of
    checkpoints); else the only run of its source. Ambiguity leaves it alone rather than lending
    evidence to the wrong run."""
    same_source = [lin for lin in lineages if lin[2][0].source == ck.source and lin[2][0].kind != "checkpoints"]
    home = ck.ref  # the folder holding the checkpoint-N / step_N folders
    depths = [(max(_common_depth(home, str(PurePosixPath(s.ref).parent)) for s in lin[2]), i)
              for i, lin in enumerate(same_source)]
    if depths:
        best = max(d for d, _ in depths)
        winners = [i for d, i in depths if d == best]
        if best > 0 and len(winners) == 1:
            return [same_source[winners[0]]]
    if ck.name:
        named = [lin for lin in same_source if base_name(ck.name) in (base_name(lin[1]), lin[1])]
        kinds = [lin[2][0].kind for lin in named]
        if named and len(kinds) == len(set(kinds)):
            return named
    return [same_source[0]] if len(same_source) == 1 else []


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
