"""Where the resume guard goes in a verl run (a documentation example: verl's workers need GPUs here).

verl builds the reference in ``ActorRolloutRefWorker.init_model`` from ``actor_rollout_ref.model.path``
(``self.ref = self.ref_worker_cls(...); self.ref.reset()``). Pointing ``model.path`` at a checkpoint's
``global_step_N/actor/huggingface`` to resume rebuilds the reference from the resumed weights. The
driver (``RayPPOTrainer._load_checkpoint``) knows the step from ``latest_checkpointed_iteration.txt``.
The functions below are what to paste; ``tests/integrations/test_examples.py`` runs them on stand-ins.

1. In ``init_model``, after ``self.ref.reset()``, each rank hashes its own shards (no collective):

    shards, _ = self.ref.engine.get_per_tensor_param_shard()
    self.klwatch_guard = guard_ref_worker(((name, shard) for name, shard, _spec in shards),
                                          checkpoint_root=self.config.trainer.default_local_dir (from the trainer),
                                          rank=torch.distributed.get_rank(), model_path=self.config.model.path)

2. In ``RayPPOTrainer.fit``: once, after ``self._load_checkpoint()``,

    self.kl_guard = trainer_kl_guard(self.config.trainer.default_local_dir,
                                     config=OmegaConf.to_container(self.config, resolve=True))

   and at each step, after ``logger.log(data=metrics, step=self.global_steps)``,

    self.kl_guard.update(self.global_steps, metrics["actor/kl_loss"])
    if self.kl_guard.should_stop: break
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from klwatch.integrations import ResumeGuard


def latest_step(checkpoint_root: str | Path) -> int:
    """The step verl resumes from (``resume_mode=auto``): ``latest_checkpointed_iteration.txt``; 0 when fresh."""
    tracker = Path(checkpoint_root) / "latest_checkpointed_iteration.txt"
    try:
        return int(tracker.read_text().strip())
    except (OSError, ValueError):
        return 0


def guard_ref_worker(shards: Iterable[tuple[str, Any]], *, checkpoint_root: str | Path, rank: int, model_path: str,
                     on_reset: str = "raise") -> ResumeGuard:
    """Record (first launch) or check (resume) this rank's reference shards."""
    guard = ResumeGuard(record=Path(checkpoint_root) / f"klwatch_reference.rank{rank}.json", on_reset=on_reset,
                        judge_kl=False)
    guard.start(list(shards), step=latest_step(checkpoint_root), source=model_path)
    return guard


def trainer_kl_guard(checkpoint_root: str | Path, *, config: dict, on_reset: str = "stop") -> ResumeGuard:
    """The KL judge in the driver, keeping its points beside the checkpoints; ``config`` is the run's config (a
    declared reference update is never a reset)."""
    guard = ResumeGuard(record=Path(checkpoint_root) / "klwatch_reference.json", on_reset=on_reset, config=config,
                        check_reference=False, keep_history=True)
    guard.start(None, step=latest_step(checkpoint_root))
    return guard
