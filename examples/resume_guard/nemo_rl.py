"""Where the resume guard goes in a NeMo-RL run (a documentation example: NeMo-RL needs GPUs here).

NeMo-RL's ``DTensorPolicyWorkerV2`` keeps its reference as a CPU copy of the policy's weights, taken
in ``__init__`` right after the weights are loaded:

    self.reference_model_state_dict = setup_reference_model_state(self.model)

On a resume those weights were the checkpoint's (NeMo-RL #2955): the reference reset. Two calls catch it
(the functions below are what to paste; ``tests/integrations/test_examples.py`` runs them on stand-ins).

1. In the worker, right after that line (every rank hashes its own shards into its own record):

    self.klwatch_guard = guard_worker_reference(
        self.reference_model_state_dict, weights_path=weights_path,
        checkpoint_dir=config["checkpointing"]["checkpoint_dir"] (from the master config),
        rank=torch.distributed.get_rank(), model_name=config["model_name"])

2. In ``grpo_train``, for the KL the workers cannot see, after each step's metrics are gathered:

    kl_guard = kl_guard or driver_kl_guard(master_config["checkpointing"]["checkpoint_dir"], step=...)
    if kl_guard.update(total_steps, metrics["kl_penalty"]) and kl_guard.should_stop: break
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from klwatch.integrations import ResumeGuard


def resumed_step(weights_path: str | None) -> int:
    """The step a NeMo-RL launch goes on from: its checkpoints are ``.../step_N/policy/weights``; 0 when fresh."""
    found = re.search(r"step_(\d+)", str(weights_path or ""))
    return int(found.group(1)) if found else 0


def guard_worker_reference(reference_state_dict: Any, *, weights_path: str | None, checkpoint_dir: str | Path,
                           rank: int, model_name: str, on_reset: str = "raise") -> ResumeGuard:
    """Record (first launch) or check (resume) this rank's reference shards; raises on a rebuilt reference."""
    guard = ResumeGuard(record=Path(checkpoint_dir) / f"klwatch_reference.rank{rank}.json", on_reset=on_reset,
                        judge_kl=False)
    guard.start(reference_state_dict, step=resumed_step(weights_path), source=model_name)
    return guard


def driver_kl_guard(checkpoint_dir: str | Path, *, step: int, on_reset: str = "stop") -> ResumeGuard:
    """The KL judge in the driver: it keeps the KL points it sees beside the checkpoints, so a resumed launch
    judges its first points against them."""
    guard = ResumeGuard(record=Path(checkpoint_dir) / "klwatch_reference.json", on_reset=on_reset,
                        check_reference=False, keep_history=True)
    guard.start(None, step=step)
    return guard
