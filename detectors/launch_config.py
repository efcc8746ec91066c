"""What a relaunch of one training run changes in its logged config, and what it must not.

Frameworks log their whole config at every launch, and part of it changes by design: NeMo-RL's
``logger.log_dir`` is a new ``logs/exp_NNN`` per launch (``get_next_experiment_dir``), Hugging Face's
``logging_dir`` a ``runs/<date>_<host>``, W&B and MLflow folders and run ids, hosts, ports, times, the
resume path. A user who resumes by passing the checkpoint as the model moves the model path into the
earlier launch's checkpoint folder (trl #3179): that is a resume of the same run, and the reference
bug's own cause, not another run. Anything else that differs (the base model, the data, beta, the
loss) tells two training runs apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .declarations import flatten

# Config keys that change from one launch of a run to the next by design, matched as words of the
# flattened key (letters on neither side: ``date`` is not ``update``, ``port`` is not ``report_to``).
# Model keys are not among them: a model that changes is another run, unless it moved into the earlier
# launch's checkpoints (``model_move``).
PER_LAUNCH_KEY = re.compile(
    r"(?<![a-z])(resume\w*|checkpoint\w*|ckpt\w*|output\w*|\w*dirs?|\w*paths?|time|timestamp|date|datetime|"
    r"id|host|hostname|node|nodes|slurm\w*|port|wandb\w*|launch\w*|restart\w*|seed|pid|local_rank|global_rank|"
    r"rank|world\w*|devices?|cuda\w*|run_name|logging_dir|log_dir|save\w*|load_from\w*|max_steps|"
    r"max_num_steps|max_num_epochs|max_epochs|num_train_epochs|total\w*|exp_name|experiment\w*|version|"
    r"hub_\w*|push_to_hub|num_param\w*|report_to|(wandb|tensorboard|mlflow|swanlab)_enabled|monitor_gpus)(?![a-z])",
    re.I)  # parameter counts change when an adapter is merged; which trackers a launch reports to is its own
# Keys that hold a training setting even though a word in them is a per-launch one.
TRAINING_KEY = re.compile(r"(lora|adapter|batch_size|gradient_accumulation|load_in_|quantiz)", re.I)

# A folder per launch: a launch counter (attempt2, exp_002, version_3), a date stamp (HF's
# runs/Dec01_13-05-59_host, 2026-12-01_13-05), a Unix time (TensorBoard's add_hparams folder), or a
# launch word.
LAUNCH_FOLDER = re.compile(r"^([A-Za-z]*[-_.]?)?\d+$|^[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}|"
                           r"^\d{4}-?\d{2}-?\d{2}([T_ -]?\d{2}[-:]?\d{2})?|^\d{9,11}(\.\d+)?$|"
                           r"^([A-Za-z0-9]+[-_.])?(resumed?|restart(ed)?|retry|relaunch(ed)?|attempt|launch|try)"
                           r"([-_.]?\d+)?$", re.I)
"""A launch word names a launch folder only as the folder's whole name or its last word (``attempt2``,
``run-resume-3``): run names that merely contain one (``grpo-resume-buggy``, ``grpo-resume-correct``) are
two runs, not two launches."""

# The keys that name the weights a launch starts from (TRL/HF ``model_name_or_path`` and the model
# config's ``_name_or_path``, NeMo-RL ``policy.model_name`` and ``policy.tokenizer.name``, verl
# ``actor_rollout_ref.model.path``, OpenRLHF ``pretrain``).
MODEL_KEY = re.compile(r"(^|[./])(_?name_or_path|model_name(_or_path)?|pretrain(ed)?(_model)?(_name_or_path)?|"
                       r"base_model(_name_or_path)?|model_path|model\.(path|name)|tokenizer(_name)?(\.name)?)$", re.I)

# A checkpoint folder of the frameworks klwatch reads: HF/TRL checkpoint-N, NeMo-RL step_N, verl and
# SkyRL global_step_N, OpenRLHF/DeepSpeed global_stepN (and its --save_hf_ckpt global_stepN_hf), Megatron
# iter_NNNNNNN. At most 18 digits: a step, never a number too long to convert.
CHECKPOINT_FOLDER = re.compile(r"^(checkpoint-|step_|global_step_?|iter_)(\d{1,18})(_hf|_huggingface)?$")

# What a per-launch value looks like where it differs: a launch folder (exp_002, version_3, attempt2,
# resume-1), a date or time stamp (HF's runs/Dec01_13-05-59_host, 2026-12-01_13-05, TensorBoard's
# add_hparams time.time() folder), or a W&B run folder. Never a plain name or number: ``k1``/``k3``,
# ``float16``/``float32``, ``run-0001``/``run-0002`` are settings or runs.
LAUNCH_PART = re.compile(
    r"^([A-Za-z0-9]+[-_.])?(exp|version|attempt|launch|try|retry|restart|resume|relaunch)[-_.]?\d+$|"
    r"^[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}(_[\w.-]+)?$|"
    r"^\d{4}-?\d{2}-?\d{2}([T_ -]?\d{2}[-:]?\d{2}([-:]?\d{2}([.,]\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$|"
    r"^\d{9,11}(\.\d+)?$|^(offline-)?run-\d{8}_\d{6}-\w+$", re.I)
TIME_VALUE = re.compile(r"^\d{4}-?\d{2}-?\d{2}([T_ -]?\d{2}[-:]?\d{2}([-:]?\d{2}([.,]\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$|"
                        r"^\d{9,11}(\.\d+)?$")


@dataclass(frozen=True)
class ModelMove:
    """The later launch's weights come from the earlier launch's checkpoint folder."""

    key: str
    before: str
    after: str
    checkpoint_step: int
    of_earlier_launch: bool = True
    """The checkpoint lies in a folder the earlier launch's config names (its output or checkpoint
    folder); else only the step where the later launch resumes can tie the two together."""

    def describe(self) -> str:
        whose = "the earlier launch's checkpoint" if self.of_earlier_launch else "the checkpoint"
        return (f"its {self.key} moved from {short(self.before)} to {whose} {short(self.after)} (step "
                f"{self.checkpoint_step}): resumed with the checkpoint as the model, which also rebuilds a "
                "reference taken from the model")

    def fits(self, first: int | None, every: int) -> bool:
        """A launch whose first step follows this checkpoint's (within one logging interval)."""
        return self.of_earlier_launch or (first is not None and self.checkpoint_step < first <= self.checkpoint_step + max(1, every))


@dataclass(frozen=True)
class ConfigDiff:
    """How two launches' configs differ: keys that tell two runs apart, keys that change per launch,
    and a model that moved into the earlier launch's checkpoints."""

    splitting: tuple[tuple[str, str, str], ...] = ()
    per_launch: tuple[str, ...] = ()
    model_moves: tuple[ModelMove, ...] = ()
    launch_folders: tuple[str, ...] = ()
    """The per-launch keys whose two values differ only in a launch folder or a time."""
    shared: int = 0
    """How many keys both configs logged."""

    @property
    def agree(self) -> bool:
        return not self.splitting

    def kin(self, *, min_shared: int = 8) -> bool:
        """Positive evidence of two launches of one run: configs that say something (``min_shared`` keys
        logged by both), differing in launch folders and in nothing else, not even a checkpoint folder
        or a run name. An empty or sparse config is no evidence."""
        return (self.agree and bool(self.launch_folders) and len(self.per_launch) == len(self.launch_folders)
                and self.shared >= min_shared)

    def describe_split(self, limit: int = 3) -> str:
        """Words for a refusal: the first keys that differ, with both values."""
        shown = [f"{k} {short(a)} vs {short(b)}" for k, a, b in self.splitting[:limit]]
        more = f" and {len(self.splitting) - limit} more" if len(self.splitting) > limit else ""
        return "their configs differ in " + ", ".join(shown) + more


def compare_configs(earlier: dict, later: dict) -> ConfigDiff:
    """Compare the keys both launches logged (a key only one of them logged decides nothing)."""
    fa, fb = flatten(earlier), flatten(later)
    common = fa.keys() & fb.keys()
    splitting: list[tuple[str, str, str]] = []
    per_launch: list[str] = []
    moves: list[ModelMove] = []
    folders: list[str] = []
    for key in sorted(common):
        a, b = fa[key], fb[key]
        if same_value(a, b):
            continue
        if MODEL_KEY.search(key):
            move = _model_move(key, a, b, earlier_paths=path_values(fa))
            if move is not None:
                moves.append(move)
            elif not same_model(a, b):
                splitting.append((key, str(a), str(b)))
            continue
        if launch_valued(a, b):
            folders.append(key)
            per_launch.append(key)
        elif per_launch_key(key):
            per_launch.append(key)
        else:
            splitting.append((key, str(a), str(b)))
    return ConfigDiff(tuple(splitting), tuple(per_launch), tuple(moves), tuple(folders), len(common))


def configs_agree(a: dict, b: dict) -> bool:
    """True unless the configs differ on keys that do not change between launches of one run.

    Strict: one key is enough to tell two runs apart (``sync_ref_model``, ``beta``, ``logging_steps``
    among TRL's ~230), while real relaunches differ only in per-launch keys (paths, names, ids, times)
    and, when resumed with the checkpoint as the model, in the model path."""
    return compare_configs(a, b).agree


def model_move(earlier: dict, later: dict) -> ModelMove | None:
    """The first model key that moved into the earlier launch's checkpoints, or None."""
    moves = compare_configs(earlier, later).model_moves
    return moves[0] if moves else None


def same_value(a: object, b: object) -> bool:
    """Equal as logged; a list is compared as a set (PEFT's ``target_modules`` is a set, serialized in
    a different order by every process)."""
    if isinstance(a, list) and isinstance(b, list):
        return sorted(map(str, a)) == sorted(map(str, b))
    return str(a) == str(b)


def launch_valued(a: object, b: object) -> bool:
    """Two values that differ only where each names a launch: paths whose differing folders are launch
    folders or time stamps (``logs/exp_001`` vs ``logs/exp_002``), or two dates or times."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    pa, pb = path_parts(a), path_parts(b)
    if len(pa) != len(pb):
        return False
    if len(pa) < 2:
        return bool(TIME_VALUE.match(a.strip()) and TIME_VALUE.match(b.strip()))
    diff = [(x, y) for x, y in zip(pa, pb) if x != y]
    return bool(diff) and all(LAUNCH_PART.match(x) and LAUNCH_PART.match(y) for x, y in diff)


def per_launch_key(key: str) -> bool:
    """A key whose value changes from one launch of a run to the next by design."""
    return bool(PER_LAUNCH_KEY.search(key)) and not TRAINING_KEY.search(key)


def checkpoint_in(path: str) -> tuple[str, int] | None:
    """(the folder holding the checkpoint folders, step) when ``path`` lies in a checkpoint folder."""
    parts = path_parts(path)
    for i in range(len(parts) - 1, -1, -1):
        m = CHECKPOINT_FOLDER.match(parts[i])
        if m:
            return "/".join(parts[:i]), int(m.group(2))
    return None


def same_model(a: object, b: object) -> bool:
    """The same weights named two ways: a hub id and its local cache snapshot
    (``.../models--Qwen--Qwen2.5-0.5B/snapshots/<hash>``) or a local copy in a folder of its name
    (``/root/models/Qwen2.5-0.5B``), or one folder under two mounts (the same last two path parts)."""
    sa, sb = str(a), str(b)
    ia, ib = _model_identity(sa), _model_identity(sb)
    if ia is not None and ia == ib:
        return True
    for hub, local in ((sa, sb), (sb, sa)):
        if _hub_id(hub) and not _hub_id(local) and path_parts(local) and path_parts(local)[-1].lower() == path_parts(hub)[-1].lower():
            return True
    return False


def _model_identity(value: str) -> str | None:
    parts = path_parts(value)
    for part in parts:
        if part.startswith("models--"):
            return part[len("models--"):].replace("--", "/").lower()
    if len(parts) >= 2:
        return "/".join(parts[-2:]).lower()
    return None


def _hub_id(value: str) -> bool:
    """``org/name`` as the Hugging Face hub spells a model: two parts, not a path from a folder."""
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", value)) and not value.startswith(".")


def _model_move(key: str, before: object, after: object, *, earlier_paths: list[str]) -> ModelMove | None:
    """A model path that now lies in a checkpoint folder: of the earlier launch when its parent is a
    folder the earlier launch's config names (its output or checkpoint folder) or the one the earlier
    model path already lay in (a ratchet of resumes); any other checkpoint folder is a move the
    stitcher accepts only where the later launch resumes right after that checkpoint's step."""
    if not isinstance(after, str):
        return None
    found = checkpoint_in(after)
    if found is None:
        return None
    home, step = found
    owners = [*earlier_paths]
    earlier_ckpt = checkpoint_in(before) if isinstance(before, str) else None
    if earlier_ckpt is not None:
        owners.append(earlier_ckpt[0])
    return ModelMove(key, str(before), after, step, of_earlier_launch=bool(home) and any(same_folder(home, p) for p in owners))


def path_values(flat: dict[str, object]) -> list[str]:
    """The folders a config names (its output, checkpoint and log folders, among others)."""
    return [v for v in flat.values() if isinstance(v, str) and ("/" in v or "\\" in v) and len(v) < 4096]


def same_folder(a: str, b: str) -> bool:
    """One folder named from two working directories or two clones: the paths end alike, in both
    parts when either has that many (``results/grpo`` and ``/work/results/grpo``), else in the whole of
    the shorter one."""
    pa, pb = path_parts(a), path_parts(b)
    if not pa or not pb:
        return False
    k = 0
    while k < min(len(pa), len(pb)) and pa[-1 - k] == pb[-1 - k]:
        k += 1
    return k >= min(len(pa), len(pb), 2)


def path_parts(value: str) -> list[str]:
    """A path's folders, split at ``/`` and ``\\`` alike (a Windows path, or one written half each way)."""
    return [p for p in re.split(r"[/\\]+", value) if p not in ("", ".") and not re.fullmatch(r"[A-Za-z]:", p)]


def short(value: str, width: int = 60) -> str:
    return repr(value if len(value) <= width else value[: width - 1] + "…")
