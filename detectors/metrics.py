"""Which logged series is the reference KL, and which is the framework's step axis.

Frameworks name the KL to the reference differently (SPEC.md "Metrics"), and several log look-alikes
that are *not* a distance to the reference (PPO's policy-vs-old-policy KL, approx-KL early stopping,
generation KL errors): those never reset at a resume, so picking one would hide the bug.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

import numpy as np

from .model import Segment, Series

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

# Framework global-step metrics that win over the tracker's own step.
STEP_AXIS_METRICS: tuple[str, ...] = ("train/global_step", "training/global_step", "train/step")


def is_excluded(name: str) -> bool:
    """True for KL look-alikes that do not measure distance to the reference."""
    leaf = name.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    return name in EXCLUDED_KL_METRICS or leaf in EXCLUDED_KL_METRICS or bool(_EXCLUDED_WORDS.search(name))


def kl_candidates(names: Iterable[str], *, patterns: Sequence[str] | None = None) -> list[str]:
    """The logged names that are a reference KL, best first.

    With ``patterns`` (the user's ``--metric``, globs allowed) only those are considered, in the
    order given, and the exclusions do not apply: the user knows their metric.
    """
    names = [n for n in names if not n.startswith("_")]
    if patterns:
        found: list[str] = []
        for pat in patterns:
            for n in sorted(names):
                if (n == pat or fnmatch.fnmatchcase(n, pat)) and n not in found:
                    found.append(n)
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


def step_axis_metric(segment: Segment) -> str | None:
    for m in STEP_AXIS_METRICS:
        s = segment.series.get(m)
        if s is not None and len(s) and np.all(np.isfinite(s.values)):
            return m
    return None


def to_framework_steps(segment: Segment, axis: str) -> Segment:
    """Re-express every series of a segment on the framework's global step.

    Trackers count their own steps (W&B ``_step`` restarts with every new run); the framework's
    global step continues across restarts, which is what stitching and the report need. A row whose
    tracker step has no global step logged takes the last global step logged before it.
    """
    gs = segment.series[axis]
    order = np.argsort(gs.steps, kind="stable")
    tracker_steps = gs.steps[order]
    global_steps = np.round(gs.values[order]).astype(np.int64)
    new_series: dict[str, Series] = {}
    for name, s in segment.series.items():
        idx = np.searchsorted(tracker_steps, s.steps, side="right") - 1
        keep = idx >= 0
        mapped = global_steps[np.clip(idx, 0, None)]
        new_series[name] = Series(mapped[keep], s.values[keep],
                                  None if s.wall_times is None else s.wall_times[keep])
    out = Segment(**{**segment.__dict__, "series": new_series})
    out.meta = {**segment.meta, "step_axis": axis}
    return out


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in config.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out
