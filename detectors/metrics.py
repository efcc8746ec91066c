"""What the frameworks call the quantities klwatch reads: the one home of metric names.

Frameworks name the KL to the reference differently (SPEC.md "Metrics"), and several log look-alikes
that are *not* a distance to the reference (PPO's policy-vs-old-policy KL, approx-KL early stopping,
generation KL errors): those never reset at a resume, so picking one would hide the bug. The other
families (learning rate, loss, grad norm, entropy, reward, KL coefficient, counters, ...) are matched the
same way, by exact name, then by that name under a prefix, then by a last path component; every detector
and the dashboard find their series through here.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .model import Segment

# Reference-KL names of the major frameworks, most specific first.
DEFAULT_KL_METRICS: tuple[str, ...] = (
    "train/kl_penalty",  # NeMo-RL
    "kl_penalty",
    "actor/kl_loss",  # verl (use_kl_loss)
    "actor/reward_kl_penalty",  # verl (KL in reward)
    "train/kl",  # TRL (W&B prefixes train/)
    "kl",  # TRL, OpenRLHF
    "objective/kl",  # TRL PPO/RLOO
    "critic/kl",
    "train/kl_loss",
    "train/kl_loss_avg",
    "ppo_actor/kl_rewards/avg",  # negated: logged as a reward term
)
NEGATED_KL_METRICS: frozenset[str] = frozenset({"ppo_actor/kl_rewards/avg"})

# Not a distance to the reference: never picked, even when a pattern matches.
EXCLUDED_KL_METRICS: tuple[str, ...] = (
    "gen_kl_error",
    "policy_kl_error",
    "ppo_kl",
    "approxkl",
    "approx_kl",
    "policy/approxkl_avg",
    "policykl",
)
_EXCLUDED_WORDS = re.compile(r"(ppo_kl|approx_?kl|policy_?kl|kl_error|kl_coef|kl_ctl|kl_target|kl_beta|"
                             r"kl_coeff|kl_weight|old_?kl|mismatch_kl|kl_old)", re.I)
# Fallback for names outside the list: a last path component that says KL to the reference.
_KL_LEAF = re.compile(r"^(ref_?)?kl(_(penalty|loss|div|divergence|mean|avg|ref|to_ref|reference))*"
                      r"(_(mean|avg))?$|^(mean|avg)_kl$|^reward_kl_penalty$", re.I)

# What klwatch's own resume guard logs from inside training (``klwatch.integrations``), read back by the
# ``training_guard`` finding; trackers may prefix them (``train/``).
GUARD_REFERENCE_MATCH = "klwatch/reference_match"
"""1 when a resumed launch's reference matches the fingerprint recorded at the first launch, 0 when not."""
GUARD_RESUME_RESET = "klwatch/resume_reset"
"""1 when the guard's KL judge calls the latest resume a reference reset, 0 otherwise."""
GUARD_RESUME_SCORE = "klwatch/resume_reset_score"
"""The guard's KL judge's posterior that the latest resume reset the reference."""

# Framework global-step metrics that win over the tracker's own step.
STEP_AXIS_METRICS: tuple[str, ...] = ("train/global_step", "training/global_step", "train/step")


def is_excluded(name: str) -> bool:
    """True for KL look-alikes that do not measure distance to the reference."""
    leaf = name.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    return name in EXCLUDED_KL_METRICS or leaf in EXCLUDED_KL_METRICS or bool(_EXCLUDED_WORDS.search(name))


def kl_candidates(names: Iterable[str], *, patterns: Sequence[str] | None = None) -> list[str]:
    """The logged names that are a reference KL, best first.

    With ``patterns`` (the user's ``--metric``, globs allowed) only those are considered, in the
    order given: a name given whole is taken as it is (the user knows their metric), a glob prefers the
    recognised names among its matches and leaves the look-alikes out (``_pattern_matches``).
    """
    return list(_kl_candidates(tuple(names), tuple(patterns) if patterns else None))


@functools.lru_cache(maxsize=1024)
def _kl_candidates(names: tuple[str, ...], patterns: tuple[str, ...] | None) -> tuple[str, ...]:
    """``kl_candidates``, kept per set of names: every piece of every run of a fleet asks it again for
    the same few names."""
    return tuple(_rank_kl_candidates(names, patterns=patterns))


def _rank_kl_candidates(names: Iterable[str], *, patterns: Sequence[str] | None = None) -> list[str]:
    names = [n for n in names if not n.startswith("_")]
    if patterns:
        found: list[str] = []
        for pat in patterns:
            found += [n for n in _pattern_matches(names, pat) if n not in found]
        return found
    nameset = set(names)
    ranked = [m for m in DEFAULT_KL_METRICS if m in nameset]
    # Same names under another prefix (``train/`` added by a logger, ``.`` nesting).
    for m in DEFAULT_KL_METRICS:
        for n in sorted(names):
            if n not in ranked and (n.endswith("/" + m) or n.endswith("." + m)) and not is_excluded(n):
                ranked.append(n)
    for n in sorted(names):
        leaf = re.split(r"[/.]", n)[-1]
        if n not in ranked and _KL_LEAF.match(leaf) and not is_excluded(n):
            ranked.append(n)
    return ranked


def _globbed(names: Iterable[str], pattern: str) -> list[str]:
    """The names a ``--metric`` glob matches, sorted."""
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def _pattern_matches(names: Sequence[str], pattern: str) -> list[str]:
    """What one ``--metric`` names, best first. A name given whole is the user's choice, look-alike or not; a
    glob prefers the recognised reference-KL names among what it matches (``_rank_kl_candidates``), then any
    other match, and leaves out the look-alikes (``is_excluded``: ``*kl*`` must not pick ``train/approxkl``)."""
    if pattern in names:
        return [pattern]
    matched = _globbed(names, pattern)
    ranked = _rank_kl_candidates(matched)
    return ranked + [n for n in matched if n not in ranked and not is_excluded(n)]


NO_MATCH = "No logged metric matches --metric"
"""How a training run's ``kl_metric`` finding begins when ``--metric`` named none of its series (the summary counts them)."""


def closest_names(names: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """The logged names closest to a ``--metric`` that matched nothing (a typo: ``train/kl_penalti``)."""
    import difflib

    names = [n for n in names if not n.startswith("_")]
    out: list[str] = []
    for pat in patterns:
        out += [n for n in difflib.get_close_matches(pat, names, n=2, cutoff=0.75) if n not in out]
    return out


def describe_match(names: Iterable[str], patterns: Sequence[str], *, chosen: str | None) -> str | None:
    """What ``--metric`` matched among a run's logged ``names``, in words, when there is something to say: a
    glob that matched more than one series, or look-alikes it left out. None otherwise."""
    names = [n for n in names if not n.startswith("_")]
    said = []
    for pat in patterns:
        if pat in names:
            continue
        matched = _globbed(names, pat)
        left_out = [n for n in matched if is_excluded(n)]
        if len(matched) > 1 or left_out:
            said.append(f"--metric {pat} matched {len(matched)} series ({', '.join(matched[:8])}"
                        f"{' ...' if len(matched) > 8 else ''})" +
                        (f", of which {', '.join(left_out[:8])} {'is a KL look-alike' if len(left_out) == 1 else 'are KL look-alikes'}"
                         " (not a distance to the reference: left out; name one whole to judge it)" if left_out else ""))
    if not said:
        return None
    return "; ".join(said) + (f"; judged {chosen}." if chosen else "; none of them judged.")


def is_negated(name: str) -> bool:
    return name in NEGATED_KL_METRICS or any(name.endswith("/" + m) for m in NEGATED_KL_METRICS)


def choose_kl_metric(segments: Sequence[Segment], *, patterns: Sequence[str] | None = None) -> str | None:
    """The KL metric of a training run: the best-ranked candidate, preferring one logged by most pieces."""
    names: dict[str, int] = {}
    for seg in segments:
        for n, s in seg.series.items():
            if len(s):
                names[n] = names.get(n, 0) + 1
    ranked = kl_candidates(names, patterns=patterns)
    if not ranked:
        return None
    most = max(names[n] for n in ranked)
    for n in ranked:
        if names[n] == most:
            return n
    return ranked[0]


# ------------------------------------------------------- the other quantities detectors read


@dataclass(frozen=True)
class MetricFamily:
    """How one quantity is named across frameworks: exact names (best first), then any name that ends
    in one of them after a ``/`` or ``.`` prefix, then a last path component matching ``leaf``."""

    names: tuple[str, ...]
    leaf: str | None = None
    exclude: str | None = None


def find_metrics(names: Sequence[str], *, family: MetricFamily) -> list[str]:
    """The logged names of a family, best first (bookkeeping ``_`` names never count)."""
    names = sorted(n for n in names if not n.startswith("_"))
    excl = re.compile(family.exclude, re.I) if family.exclude else None
    ok = [n for n in names if not (excl and excl.search(n))]
    found: list[str] = [m for m in family.names if m in ok]
    for m in family.names:
        for n in ok:
            if n not in found and (n.endswith("/" + m) or n.endswith("." + m)):
                found.append(n)
    if family.leaf:
        leaf = re.compile(family.leaf, re.I)
        for n in ok:
            if n not in found and leaf.fullmatch(re.split(r"[/.]", n)[-1]):
                found.append(n)
    return found


def find_metric(names: Sequence[str], *, family: MetricFamily) -> str | None:
    found = find_metrics(names, family=family)
    return found[0] if found else None


LR = MetricFamily(
    names=("lr", "train/lr", "actor/lr", "train/learning_rate", "learning_rate", "optim/lr",
           "optimizer/lr", "train/lr_0", "critic/lr"),
    leaf=r"((actor|critic|policy)_)?(lr|learning_rate|learning-rate|learningrate)([-_](pg|group)?_?\d+)?|lr-\w+",
)
GRAD_NORM = MetricFamily(
    names=("grad_norm", "train/grad_norm", "actor/grad_norm", "train/gradient_norm", "gradient_norm",
           "optim/grad_norm", "critic/grad_norm"),
    leaf=r"(global_|total_)?grad(ient)?_?norm(_(mean|avg|total))?",
)
LOSS = MetricFamily(
    names=("loss", "train/loss", "actor/pg_loss", "pg_loss", "actor/loss", "train/policy_loss",
           "policy_loss", "train/pg_loss", "loss/policy_avg"),
    leaf=r"(total_|policy_|pg_|actor_)?loss",
    exclude=r"(kl|entropy|value|vf|critic|aux|val/|eval)",
)
COUNTERS = MetricFamily(
    names=("consumed_samples", "train/consumed_samples", "epoch", "train/epoch", "total_steps",
           "train/total_steps", "consumed_tokens", "train/consumed_tokens", "train/num_samples"),
    leaf=r"consumed_(samples|tokens)|epoch|total_steps|samples_seen|num_samples_seen",
)
PROMPT_LENGTH = MetricFamily(
    names=("prompt_length", "train/prompt_length", "prompt_length/mean", "train/prompt_length/mean",
           "prompt_len", "train/prompt_len", "input_length", "num_prompt_tokens"),
    leaf=r"(mean_|avg_)?prompt_(length|len|tokens)(_(mean|avg))?",
    exclude=r"(max|min|clip)",
)
KL_COEF = MetricFamily(
    names=("actor/kl_coef", "critic/kl_coef", "kl_coef", "train/kl_coef", "objective/kl_coef",
           "kl_ctl", "train/kl_ctl", "kl_coeff", "train/kl_beta"),
    leaf=r"kl_(coef|coeff|ctl|ctrl|ctl_value|beta)",
)
ENTROPY = MetricFamily(
    names=("entropy", "train/entropy", "actor/entropy", "policy/entropy_avg", "objective/entropy", "actor/entropy_loss"),
    leaf=r"(mean_|avg_|policy_|actor_)?entropy(_(mean|avg|loss))?",
)
REWARD = MetricFamily(
    names=("reward", "train/reward", "rewards/mean", "train/rewards/mean", "critic/score/mean", "critic/rewards/mean",
           "env/reward_mean", "objective/scores"),
    leaf=r"(mean_|avg_)?(reward|score)s?(_(mean|avg))?",
    exclude=r"(kl|std|max|min)",
)

# The implicit rewards of DPO-style trainers, beta·(log π − log π_ref): exactly 0 for every sample when the
# reference equals the policy, so they show a rebuilt reference where no KL is logged (TRL DPOTrainer/KTO,
# NeMo-RL DPO, OpenRLHF DPO; shared/FRAMEWORKS.md "Preference trainers").
CHOSEN_REWARD = MetricFamily(
    names=("rewards/chosen", "train/rewards/chosen", "rewards_chosen_mean", "train/rewards_chosen_mean",
           "chosen_reward", "train/chosen_reward"),
    leaf=r"(rewards?_chosen(_mean)?|chosen_rewards?(_mean)?)",
)
REJECTED_REWARD = MetricFamily(
    names=("rewards/rejected", "train/rewards/rejected", "rewards_rejected_mean", "train/rewards_rejected_mean",
           "reject_reward", "train/reject_reward"),
    leaf=r"(rewards?_reject(ed)?(_mean)?|reject(ed)?_rewards?(_mean)?)",
)
REWARD_MARGIN = MetricFamily(
    names=("rewards/margins", "train/rewards/margins", "reward_margin", "train/reward_margin"),
    leaf=r"(rewards?_margins?(_mean)?|margins?)",
)
PREFERENCE_ACCURACY = MetricFamily(
    names=("rewards/accuracies", "train/rewards/accuracies", "train/accuracy", "accuracy", "train/acc", "acc"),
    exclude=r"(val|eval|test|token)",
)
PREFERENCE_LOSS = MetricFamily(names=("preference_loss", "train/preference_loss"), leaf=r"preference_loss")

# The policy's own log-probs of the chosen and rejected answers, logged beside the rewards (TRL DPOTrainer): with
# beta they give the reference's log-probs, log pi_ref = log pi - reward / beta (klwatch.reference_logps).
CHOSEN_LOGPS = MetricFamily(names=("logps/chosen", "train/logps/chosen"), exclude=r"(val|eval|test|ref)")
REJECTED_LOGPS = MetricFamily(names=("logps/rejected", "train/logps/rejected"), exclude=r"(val|eval|test|ref)")

PREFERENCE_FAMILIES: dict[str, MetricFamily] = {
    "chosen": CHOSEN_REWARD, "rejected": REJECTED_REWARD, "margin": REWARD_MARGIN,
    "accuracy": PREFERENCE_ACCURACY, "loss": PREFERENCE_LOSS}


def preference_metrics(names: Sequence[str]) -> dict[str, str]:
    """A preference trainer's implicit-reward series by quantity (``chosen``, ``rejected``, ``margin``,
    ``accuracy``, ``loss``); empty unless both chosen and rejected rewards, or their margin, are logged
    (an ``accuracy`` alone is any classifier's)."""
    found = {q: m for q, fam in PREFERENCE_FAMILIES.items() if (m := find_metric(names, family=fam))}
    if not (("chosen" in found and "rejected" in found) or "margin" in found):
        return {}
    return found
