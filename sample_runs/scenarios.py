"""The sample scenarios: which launches a training run is made of, and which fault each plants.

Why a table: the manifest, the README and the tests all read the same definitions, so a scenario's
declared behaviour and what the generator did cannot drift apart. Crash and checkpoint steps scale
with ``--steps`` so a short test run keeps the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .grpo import LostState, Order


@dataclass(frozen=True)
class Launch:
    """One process: resume from ``resume_from`` (None: fresh start), stop after ``stop_after``
    (None: run to the end; otherwise a crash), with the given reference ordering and lost state."""

    resume_from: int | None
    stop_after: int | None
    order: Order = "fixed"
    lose: tuple[LostState, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    launches: tuple[Launch, ...]
    overrides: dict[str, Any] = field(default_factory=dict)
    """Config settings the scenario declares (logged with the run's config)."""
    faults: tuple[str, ...] = ()
    """Issue-6 faults planted at every resume of this scenario."""
    core: bool = False
    """A core reference-reset scenario: written in both layouts of W&B and MLflow."""
    tb_writer: str = "tensorboardX"


def _resumes(points: list[int], *, order: Order, lose: tuple[LostState, ...] = ()) -> tuple[Launch, ...]:
    """Crash right after each checkpoint in ``points`` and resume from it."""
    out = [Launch(resume_from=None, stop_after=points[0] if points else None)]
    for i, p in enumerate(points):
        nxt = points[i + 1] if i + 1 < len(points) else None
        out.append(Launch(resume_from=p, stop_after=nxt, order=order, lose=lose))
    return tuple(out)


def build(*, steps: int) -> dict[str, Scenario]:
    """All scenarios for a base run of ``steps`` steps.

    At ``steps=60`` the points are the canonical ones: checkpoints every 20, crash after 40 and
    resume from it; rewind: crash after 47, resume from 40; ratchet: 80 steps, resumes at 20, 40,
    60. Other values scale these (the committed samples use 40 to stay under the size cap).
    """
    period = max(2, round(steps / 3))  # 20 of 60
    crash = 2 * period  # 40 of 60
    rewind_crash = min(steps - 2, crash + max(1, round(steps * 7 / 60)))  # 47 of 60
    ratchet_steps = round(steps * 4 / 3)  # 80 of 60
    ratchet_period = max(2, round(ratchet_steps / 4))  # 20 of 80
    ratchet_points = [ratchet_period, 2 * ratchet_period, 3 * ratchet_period]
    early = 3
    reset_interval = max(2, round(steps * 5 / 12))  # 25 of 60: resets at 25, 50 and at the resume (40)

    base = {"total_steps": steps, "save_period": period, "keep_last": 2}  # NeMo-RL's keep_top_k
    scenarios = [
        Scenario("continuous", "one process, no restart: the control run for `klwatch compare`",
                 (Launch(None, None),), base, core=True),
        Scenario("resume-fixed", f"crash after step {crash}, resume from its checkpoint; reference "
                 "snapshotted from the base weights before loading (correct)",
                 _resumes([crash], order="fixed"), base, core=True, tb_writer="tensorboard"),
        Scenario("resume-buggy", f"crash after step {crash}, resume from its checkpoint; reference "
                 "snapshotted after loading (NeMo-RL DTensorPolicyWorkerV2 order): KL falls to ~0",
                 _resumes([crash], order="buggy"), base, core=True),
        Scenario("ratchet-buggy", f"three crashes and buggy resumes (steps {ratchet_points}): the KL "
                 "anchor ratchets forward at every restart",
                 _resumes(ratchet_points, order="buggy"),
                 {**base, "total_steps": ratchet_steps, "save_period": ratchet_period}, core=True,
                 tb_writer="tensorboard"),
        Scenario("rewind-fixed", f"checkpoints every {period}, crash after step {rewind_crash}, "
                 f"resume from {crash}: steps {crash + 1}-{rewind_crash} are logged twice; correct reference",
                 (Launch(None, rewind_crash), Launch(crash, None, order="fixed")), base, core=True),
        Scenario("rewind-buggy", "as rewind-fixed, with the buggy reference order",
                 (Launch(None, rewind_crash), Launch(crash, None, order="buggy")), base, core=True,
                 tb_writer="tensorboard"),
        Scenario("kl-off", f"KL penalty off (kl_coef 0, KL logged as exactly 0), buggy resume at {crash}",
                 _resumes([crash], order="buggy"), {**base, "kl_coef": 0.0}, core=True),
        Scenario("intentional-reset", f"the config declares reference_reset_interval={reset_interval} and "
                 f"reference_reset_on_resume: the reference is re-snapshotted every {reset_interval} steps and at "
                 f"the resume (step {crash})",
                 _resumes([crash], order="fixed"),
                 {**base, "reference_reset_interval": reset_interval, "reference_reset_on_resume": True},
                 core=True, tb_writer="tensorboard"),
        Scenario("early-resume-buggy", f"buggy resume at step {early}, before the KL has grown: "
                 "nothing to judge yet",
                 _resumes([early], order="buggy"), {**base, "save_period": early}),
        Scenario("lr-restart", "correct reference, but the LR scheduler is re-created at the resume: "
                 "the LR jumps back to its warm-up value",
                 _resumes([crash], order="fixed", lose=("scheduler",)), base,
                 faults=("lr_schedule_restart",), tb_writer="tensorboard"),
        Scenario("optimizer-reset", "correct reference, but fresh Adam moments at the resume: the first "
                 "updates are ~lr*sign(g), so the policy's step (approx-KL old vs new) jumps about tenfold "
                 "while grad norm and loss barely move",
                 _resumes([crash], order="fixed", lose=("optimizer",)), base,
                 faults=("optimizer_state_lost",)),
        Scenario("data-restart", "correct reference, but the data sampler's position is not restored: "
                 "consumed_samples goes back, the opening prompts repeat",
                 _resumes([crash], order="fixed", lose=("sampler",)), base,
                 faults=("data_order_restart",), tb_writer="tensorboard"),
        Scenario("kl-coef-reset", "correct reference, adaptive KL controller re-created at the resume: "
                 "kl_coef jumps back to its initial value (verl #2653)",
                 _resumes([crash], order="fixed", lose=("kl_controller",)), {**base, "kl_ctrl": "adaptive"},
                 faults=("kl_coef_reset",)),
    ]
    return {s.name: s for s in scenarios}
