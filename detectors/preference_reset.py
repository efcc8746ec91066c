"""The preference-reference detector: a reset reference in DPO-style training, which logs no KL.

DPO, IPO and their kin (TRL ``DPOTrainer``, NeMo-RL DPO, OpenRLHF DPO) hold the same frozen reference as
RL trainers and rebuild it the same wrong way on a resume, but log no KL. The reference shows in the
implicit rewards ``beta * (log pi - log pi_ref)`` of the chosen and rejected answers: exactly 0 when the
reference equals the policy. So the margin between them (logged, or chosen minus rejected) is this
family's distance to the reference: it grows from 0 as training pulls the policy away, continues across
a healthy resume, and after a reference rebuilt from the resumed weights falls to 0 at the first step and
regrows like the run's opening. The margin is judged by the KL detector's statistic (same regrowth
templates, sparse-logging windows, early-resume rules, snapshot mark and declared syncs: TRL's DPO
``sync_ref_model`` is intentional at its steps); a reset must also take the chosen and rejected rewards
to ~0 (a margin that dips while both stay put is not a reference equal to the policy). The loss at its
reference-equals-policy value (ln 2 for sigmoid, 1/(4 beta^2) for IPO, 1 for hinge) and an accuracy of 0
are named when the logs show them. LoRA (reference = base with the adapter off), precomputed reference
log-probs and label smoothing change nothing here: each still logs rewards of 0 against a reference equal
to the policy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .detector import Detector
from .declarations import config_number, reference_schedules
from .metrics import (CHOSEN_LOGPS, CHOSEN_REWARD, LOSS, REJECTED_LOGPS, REJECTED_REWARD, REWARD_MARGIN, find_metric,
                      preference_metrics)
from .model import Boundary, BoundaryVerdict, Lineage, LineageResult, Series
from .reference_logps import ReferenceLogpsConfig, ReferenceShift, reference_shift
from .reference_reset import ROLLED_UP, ReferenceResetConfig, ReferenceResetDetector, StreamingReferenceReset, roll_up

DERIVED_MARGIN = "klwatch/implicit_reward_margin"
"""The margin klwatch derives as chosen minus rejected when a trainer logs only the two (NeMo-RL)."""


@dataclass(frozen=True)
class PreferenceResetConfig(ReferenceResetConfig):
    """The KL statistic's thresholds, read on the margin, plus what a collapse of the rewards needs."""

    collapse_fraction: float = 0.5
    """At a reset the chosen and rejected rewards each fall under this share of their level before."""
    window_collapse_slack: float = 1.5
    """Logged every L > 1 steps, a first point after a reset is the mean of a regrowth's first window, not 0: each
    reward then falls with the margin, under this many times the margin's own share of its level (or
    ``collapse_fraction``, whichever is more)."""
    informative_fraction: float = 0.25
    """A reward whose level before is under this share of the margin's is near 0 anyway: not read."""
    loss_tolerance: float = 0.002
    """A loss within this relative distance of its reference-equals-policy value is named as such (the value is
    exact at equality; a noisy loss passes near it by chance at a looser tolerance)."""
    equal_tolerance: float = 1e-3
    """Chosen and rejected rewards both under this share of their level before, at the first step after the
    checkpoint, are the rewards of a policy equal to its reference (exactly 0 in float arithmetic)."""
    equal_clear_points: int = 5
    """... where the run's rewards had left 0: none of this many last points before under 10x that."""
    reference_logps: ReferenceLogpsConfig = field(default_factory=ReferenceLogpsConfig)
    """How the reference's own log-probs are read where the policy's are logged (``klwatch.reference_logps``)."""


def judged_quantity(metric: str | None) -> str:
    """What a verdict's ``kl_before``/``kl_after`` measure, in words for a line: the KL, or for a preference
    trainer the implicit-reward margin the preference detector judged."""
    if metric and (metric == DERIVED_MARGIN or find_metric([metric], family=REWARD_MARGIN)):
        return "margin"
    return "KL"


def equal_policy_loss(config: Mapping[str, object]) -> tuple[float, str] | None:
    """The loss a DPO-style trainer logs when policy and reference are equal, for the loss its config
    declares (TRL ``loss_type``, default sigmoid; label smoothing leaves it), with its formula; None for
    a loss without a fixed value there or a mix of losses."""
    kind = config.get("loss_type", "sigmoid")
    if isinstance(kind, (list, tuple)):
        kind = kind[0] if len(kind) == 1 else None
    beta = config.get("beta", 0.1)
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or not beta > 0:
        return None
    fixed = {"sigmoid": (math.log(2), "ln 2"), "robust": (math.log(2), "ln 2"), "hinge": (1.0, "1"),
             "ipo": (1.0 / (4.0 * float(beta) ** 2), "1/(4 beta^2)")}
    return fixed.get(kind) if isinstance(kind, str) else None


def margin_of(piece: Mapping[str, Series], names: Mapping[str, str]) -> Series | None:
    """The implicit-reward margin of one piece: as logged, else chosen minus rejected on their shared steps."""
    if "margin" in names and names["margin"] in piece:
        return piece[names["margin"]]
    chosen, rejected = piece.get(names.get("chosen", "")), piece.get(names.get("rejected", ""))
    if chosen is None or rejected is None:
        return None
    common, ci, ri = np.intersect1d(chosen.steps, rejected.steps, assume_unique=False, return_indices=True)
    if not len(common):
        return None
    order = np.argsort(ci, kind="stable")  # keep the logged order
    wt = None if chosen.wall_times is None else chosen.wall_times[ci[order]]
    return Series(common[order], chosen.values[ci[order]] - rejected.values[ri[order]], wt)


def _reworded(text: str) -> str:
    """The statistic's sentences, about the margin instead of a KL."""
    text = re.sub(r"\bKL\b", "implicit-reward margin", text)
    return text[:1].upper() + text[1:]


class PreferenceResetDetector(Detector[PreferenceResetConfig]):
    """Was a DPO-style trainer's reference rebuilt from the resumed weights? Judged on its implicit rewards.

    ``judge(lineage)`` as ``ReferenceResetDetector.judge`` for a run that logs chosen/rejected rewards or
    their margin; ``stream()`` the same judgement fed as the run logs (a training callback)."""

    name = "preference_reset"
    config_class = PreferenceResetConfig

    def __init__(self, *, config: PreferenceResetConfig | None = None, intentional_resets: Sequence[int] = ()) -> None:
        super().__init__(config=config)
        self.intentional_resets = tuple(intentional_resets)

    @staticmethod
    def applies(lineage: Lineage) -> bool:
        """Whether the run logs the implicit rewards this detector reads."""
        return bool(preference_metrics(lineage.metric_names()))

    def with_margin(self, lineage: Lineage) -> Lineage:
        """The run with its margin as the judged series (derived where not logged)."""
        names = preference_metrics(lineage.metric_names())
        metric = names.get("margin") or DERIVED_MARGIN
        pieces = []
        for piece in lineage.pieces:
            m = margin_of(piece, names)
            pieces.append({**piece, metric: m} if m is not None and metric not in piece else piece)
        return replace(lineage, pieces=pieces, kl_metric=metric, kl_negated=False)

    def judge(self, lineage: Lineage) -> LineageResult:
        names = preference_metrics(lineage.metric_names())
        derived = self.with_margin(lineage)
        result = self._statistic().judge(derived)
        if result.status == "kl_disabled":
            result.status = "insufficient_data"
            why = f"{derived.kl_metric} is 0 for the whole run: the implicit rewards never moved, nothing to judge."
            result.verdicts = [replace(v, explanation=why) for v in result.verdicts]
            return result
        result.verdicts = [self._checked(v, derived, names) for v in result.verdicts]
        result.status = _status_after(result)
        return result

    def confirms_reset(self, lineage: Lineage, boundary: Boundary) -> bool:
        """Whether the rewards say the reference was reset at ``boundary`` (how a pause earns its boundary). A
        pause has no restart evidence, and a small-batch margin is noisy enough to fall and rise across one by
        chance: only the equal-policy rewards (chosen and rejected both at 0 at the first step after it) do."""
        if not self.applies(lineage):
            return False
        names = preference_metrics(lineage.metric_names())
        return self._equal_policy_rewards(self.with_margin(lineage), names, boundary) is not None

    def _statistic(self) -> ReferenceResetDetector:
        return ReferenceResetDetector(config=self.config, intentional_resets=self.intentional_resets)

    def _checked(self, v: BoundaryVerdict, lineage: Lineage, names: Mapping[str, str]) -> BoundaryVerdict:
        """The statistic's verdict in the margin's words; a reset also needs the rewards to have collapsed."""
        v = replace(v, explanation=_reworded(v.explanation))
        if v.verdict in ("inconclusive", "reference_reset") and (shift := self._reference_shift(lineage, v.boundary)):
            return self._read_shift(v, shift, lineage, names)
        if v.verdict == "inconclusive" and (why := self._equal_policy_rewards(lineage, names, v.boundary)):
            return replace(v, verdict="reference_reset", score=max(v.score, self.config.reset_score), explanation=(
                f"{why}: the reference policy was rebuilt from the resumed weights. Load the reference from the "
                f"base model, not the checkpoint. {self._equal_policy_marks(lineage, names, v.boundary)}".strip()))
        if v.verdict == "inconclusive" and v.score >= self.config.reset_score and \
                (why := self._loss_back_at_equal_policy(lineage, names, v.boundary)):
            v = replace(v, verdict="reference_reset", explanation=(
                f"{why}: the reference policy was rebuilt from the resumed weights. Load the reference from the "
                "base model, not the checkpoint."))
        if v.verdict != "reference_reset":
            return v
        if (off := self._rewards_off_the_floor(lineage, names, v.boundary)) is not None:
            return replace(v, verdict="inconclusive", explanation=(
                f"The implicit-reward margin fell at the resume at step {v.boundary.step}, but {off}: a reference rebuilt "
                "from the resumed weights gives exactly 0 there, so the fall is the margin's noise, not a reset."))
        collapsed, why = self._collapsed(lineage, names, v.boundary)
        if not collapsed:
            return replace(v, verdict="inconclusive", explanation=(
                f"The implicit-reward margin fell at the resume at step {v.boundary.step}, but {why}: a reference "
                "equal to the policy takes both to 0, so this is not a reset's mark."))
        marks = self._equal_policy_marks(lineage, names, v.boundary)
        return replace(v, explanation=f"{v.explanation} {marks}".strip())

    def _reference_shift(self, lineage: Lineage, b: Boundary) -> ReferenceShift | None:
        """What the reference's own log-probs (``klwatch.reference_logps``) say at ``b``: read where the run logs
        the policy's log-probs beside the rewards, all its launches declare one beta, and no reference sync is
        declared (a sync moves them on purpose)."""
        if self.intentional_resets or reference_schedules(lineage.config):
            return None
        betas = {config_number(c, leaf="beta") for c in [lineage.config, *(g.config for g in lineage.segments)] if c}
        betas.discard(None)
        if len(betas) != 1:
            return None
        names = lineage.metric_names()
        logps, rewards = {}, {}
        for answer, logp_family, reward_family in (("chosen", CHOSEN_LOGPS, CHOSEN_REWARD),
                                                   ("rejected", REJECTED_LOGPS, REJECTED_REWARD)):
            lp = _sides(lineage, find_metric(names, family=logp_family) or "", b)
            rw = _sides(lineage, find_metric(names, family=reward_family) or "", b)
            if lp is not None and rw is not None:
                logps[answer], rewards[answer] = lp, rw
        return reference_shift(logps, rewards, beta=betas.pop(), config=self.config.reference_logps)

    def _read_shift(self, v: BoundaryVerdict, shift: ReferenceShift, lineage: Lineage,
                    names: Mapping[str, str]) -> BoundaryVerdict:
        """The verdict the reference's log-probs give: a rebuilt reference is a reset whatever the margin's
        statistic left open; a kept one is ``ok`` where it was undecided and overrules a margin's fall."""
        at, said = f"at step {v.boundary.step}", shift.describe()
        if shift.reading == "rebuilt":
            marks = self._equal_policy_marks(lineage, names, v.boundary)
            return replace(v, verdict="reference_reset", score=max(v.score, self.config.reset_score), explanation=(
                f"At the resume {at} {said}: the reference policy was rebuilt from the resumed weights. Load the "
                f"reference from the base model, not the checkpoint. {marks}".strip()))
        if v.verdict == "reference_reset":
            return replace(v, verdict="inconclusive", explanation=(
                f"The implicit-reward margin fell at the resume {at}, but {said}: the reference was not rebuilt, "
                "so the fall is the margin's noise."))
        return replace(v, verdict="ok", score=min(v.score, self.config.ok_score), explanation=(
            f"At the resume {at} {said}: the reference was kept, and the implicit-reward margin carries on "
            f"({v.kl_before:.3g} before, {v.kl_after:.3g} after)."))

    def _collapsed(self, lineage: Lineage, names: Mapping[str, str], b: Boundary) -> tuple[bool, str]:
        """Whether chosen and rejected rewards both fell to ~0 at ``b`` (each read only where its level
        before is far enough from 0 to tell); logged every L > 1 steps, whether they fell with the margin."""
        margin = _sides(lineage, lineage.kl_metric or "", b)
        if margin is None:
            return True, ""
        m_level = _level(margin[0])
        allowed = self.config.collapse_fraction
        if not _every_step(*margin) and m_level > 0:  # window means: the rewards regrow with the margin, from 0
            fell_to = abs(float(margin[1].values[0])) / m_level
            allowed = min(1.0, max(allowed, self.config.window_collapse_slack * fell_to))  # never a reward that rose
        for q in ("chosen", "rejected"):
            sides = _sides(lineage, names.get(q, ""), b)
            if sides is None:
                continue
            level, first = _level(sides[0]), abs(float(sides[1].values[0]))
            if level >= self.config.informative_fraction * m_level and first > allowed * level:
                return False, f"the {q} reward stayed at {sides[1].values[0]:.3g} (from {level:.3g} before)"
        return True, ""

    def _equal_policy_rewards(self, lineage: Lineage, names: Mapping[str, str], b: Boundary) -> str | None:
        """The preference family's snapshot mark: at the first step after the checkpoint, chosen and rejected
        rewards both at 0 (two quantities, each exactly 0 only when policy and reference are equal) where the
        run's had left 0, and moving again after it (not a trainer whose rewards stay at 0). None otherwise."""
        sides = [_sides(lineage, names.get(q, ""), b) for q in ("chosen", "rejected")]
        if any(s is None for s in sides):
            return None
        (c_pre, c_post), (r_pre, r_post) = sides  # type: ignore[misc]
        reset = b.resumed_from_step if b.resumed_from_step is not None else int(c_pre.steps[-1])
        if int(c_post.steps[0]) != reset + 1 or int(r_post.steps[0]) != reset + 1 or min(len(c_post), len(r_post)) < 3 \
                or not _every_step(c_pre, c_post):
            return None
        k = self.config.equal_clear_points
        size = np.abs(c_pre.values[-k:]) + np.abs(r_pre.values[-k:]) if len(c_pre) == len(r_pre) else None
        level = _level(c_pre) + _level(r_pre)
        tol = max(1e-9, self.config.equal_tolerance * level)
        if size is None or len(size) < 3 or np.any(size <= 10 * tol):
            return None
        first = abs(float(c_post.values[0])) + abs(float(r_post.values[0]))
        later = np.abs(c_post.values[1:3]) + np.abs(r_post.values[1:3])
        if first > tol or np.any(later <= tol):
            return None
        return (f"At step {reset + 1}, the first after the checkpoint of step {reset}, the chosen and rejected rewards "
                f"were {c_post.values[0]:.3g} and {r_post.values[0]:.3g} (|sum| {level:.3g} before), the rewards of a "
                "policy equal to its reference, and they move again from there")

    def _rewards_off_the_floor(self, lineage: Lineage, names: Mapping[str, str], b: Boundary) -> str | None:
        """What rules a reset out where the logs show the first step after the checkpoint: the rewards are computed
        before that step's update, so a reference equal to the policy gives chosen and rejected exactly 0 there
        (every micro-batch of an accumulated step too). Rewards clearly off 0 at that step: said; else None."""
        sides = [_sides(lineage, names.get(q, ""), b) for q in ("chosen", "rejected")]
        if any(s is None for s in sides):
            return None
        (c_pre, c_post), (r_pre, r_post) = sides  # type: ignore[misc]
        reset = b.resumed_from_step if b.resumed_from_step is not None else int(c_pre.steps[-1])
        if int(c_post.steps[0]) != reset + 1 or int(r_post.steps[0]) != reset + 1 or not _every_step(c_pre, c_post):
            return None  # a window mean (N-step logging) is not the first step's value
        level = _level(c_pre) + _level(r_pre)
        first = abs(float(c_post.values[0])) + abs(float(r_post.values[0]))
        if level <= 0 or first <= 10 * max(1e-9, self.config.equal_tolerance * level):
            return None
        return (f"at step {reset + 1}, the first after the checkpoint, the chosen and rejected rewards were "
                f"{c_post.values[0]:.3g} and {r_post.values[0]:.3g}, not 0")

    def _loss_back_at_equal_policy(self, lineage: Lineage, names: Mapping[str, str], b: Boundary) -> str | None:
        """The loss's corroboration of a margin the statistic finds fallen (score past the reset threshold) but
        too noisy to show its regrowth (small batches, window means): over the first ``window_after`` points the
        margin stays under ``low_fraction`` of its level and the loss sits nearer its equal-policy value (ln 2
        for sigmoid) than its level before, where a healthy resume carries both on. None otherwise."""
        expected = equal_policy_loss(lineage.config)
        loss_name = names.get("loss") or find_metric(lineage.metric_names(), family=LOSS)
        margin, loss = _sides(lineage, lineage.kl_metric or "", b), _sides(lineage, loss_name or "", b)
        if expected is None or margin is None or loss is None:
            return None
        n = self.config.window_after
        if len(margin[1]) < n or len(loss[1]) < n:
            return None
        m_level, m_after = float(np.median(margin[0].values[-8:])), margin[1].values[:n]
        l_level, l_after = float(np.median(loss[0].values[-8:])), float(np.median(loss[1].values[:n]))
        if m_level <= 0 or np.any(m_after >= self.config.low_fraction * m_level):
            return None
        if abs(expected[0] - l_level) < 1e-9 or (l_after - l_level) / (expected[0] - l_level) < 0.5:
            return None
        return (f"The implicit-reward margin fell from {m_level:.3g} to {m_after[0]:.3g} at the resume at step {b.step} and "
                f"stayed low, and the loss went back from {l_level:.3g} to {l_after:.3g}, toward {expected[0]:.4g} = "
                f"{expected[1]}, its value when the policy equals its reference")

    def _equal_policy_marks(self, lineage: Lineage, names: Mapping[str, str], b: Boundary) -> str:
        """The loss and accuracy at the first step after the resume, named when they are the values a policy
        equal to its reference gives."""
        said = []
        loss_name = names.get("loss") or find_metric(lineage.metric_names(), family=LOSS)
        expected = equal_policy_loss(lineage.config)
        loss = _sides(lineage, loss_name or "", b)
        if expected is not None and loss is not None:
            value = float(loss[1].values[0])
            if abs(value - expected[0]) <= self.config.loss_tolerance * expected[0]:
                said.append(f"the loss was {value:.4g} = {expected[1]}")
        acc = _sides(lineage, names.get("accuracy", ""), b)
        if acc is not None and float(acc[1].values[0]) == 0.0:
            said.append("the preference accuracy 0")
        if not said:
            return ""
        return f"At that step {' and '.join(said)}: the values of a policy equal to its reference."

    def stream(self, *, name: str = "run", config: dict | None = None) -> "StreamingPreferenceReset":
        """The same judgement fed one logged step at a time (see ``StreamingPreferenceReset``)."""
        return StreamingPreferenceReset(detector=self, name=name, config=config)


def _status_after(result: LineageResult) -> str:
    """The run's status once verdicts were checked: a reset no verdict keeps any more is none."""
    return roll_up(result.verdicts) if result.status in ROLLED_UP else result.status


def _every_step(before: Series, after: Series) -> bool:
    """Whether both sides are logged every step (a boundary's ``resumed_from_step`` may be a guess of first - 1)."""
    return len(before) >= 2 and len(after) >= 2 and int(before.steps[-1]) - int(before.steps[-2]) == 1 and \
        int(after.steps[1]) - int(after.steps[0]) == 1


def _level(s: Series) -> float:
    return float(np.median(np.abs(s.values[-8:])))


def _sides(lineage: Lineage, metric: str, b: Boundary) -> tuple[Series, Series] | None:
    """A metric's finite points in the nearest piece before ``b`` that logs it and in the piece after."""
    def finite(p: Mapping[str, Series]) -> Series | None:
        s = p.get(metric)
        s = s.take(np.isfinite(s.values)) if s is not None else None
        return s if s is not None and len(s) else None

    if not metric or b.piece_index >= len(lineage.pieces):
        return None
    after = finite(lineage.pieces[b.piece_index])
    before = next((s for j in range(b.piece_index - 1, -1, -1) if (s := finite(lineage.pieces[j])) is not None), None)
    return (before, after) if before is not None and after is not None else None


class StreamingPreferenceReset(StreamingReferenceReset):
    """The preference check fed as the run logs (river-style): ``update(step, metrics)`` with the step's
    logged metrics (a TRL ``logs`` dict), ``resume(resumed_from_step=...)`` at a restart. The verdict of a
    resume comes with the point that completes its window, as ``klwatch scan`` gives it."""

    def __init__(self, *, detector: PreferenceResetDetector, name: str = "run", config: dict | None = None) -> None:
        super().__init__(detector=detector, name=name, config=config)  # type: ignore[arg-type]
        self._names: dict[str, str] = {}
        self._rows: list[list[dict[str, float]]] = [[]]

    def resume(self, *, resumed_from_step: int | None = None) -> BoundaryVerdict | None:
        pending = super().resume(resumed_from_step=resumed_from_step)
        if len(self._rows) < len(self._steps):
            self._rows.append([])
        return pending

    def update(self, step: int, metrics: Mapping[str, float]) -> BoundaryVerdict | None:  # type: ignore[override]
        """One logged step's metrics; None when they hold no implicit rewards."""
        if not self._names:
            numbers = [k for k, v in metrics.items() if isinstance(v, (int, float))]
            self._names = preference_metrics(numbers)
            if self._names and "loss" not in self._names and (loss := find_metric(numbers, family=LOSS)):
                self._names["loss"] = loss
        row = {q: float(metrics[n]) for q, n in self._names.items() if isinstance(metrics.get(n), (int, float))}
        margin = row.get("margin", row["chosen"] - row["rejected"] if {"chosen", "rejected"} <= row.keys() else None)
        if margin is None:
            return None
        self._rows[-1].append(row)
        return super().update(step, float(margin))

    def lineage(self) -> Lineage:
        """What has been fed, as the lineage a scan of the same logs builds (the logged names kept)."""
        kept = [k for k, s in enumerate(self._steps) if s]
        base = super().lineage()
        for piece, k in zip(base.pieces, kept):
            steps = np.array(self._steps[k])
            piece.clear()
            for q, n in self._names.items():
                piece[n] = Series(steps, np.array([row.get(q, np.nan) for row in self._rows[k]], dtype=float))
        base.kl_metric = None
        return base
