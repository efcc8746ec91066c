"""The TrainerCallback that puts TRL's training loop into NeMo-RL's step order.

Per step N (NeMo-RL's ``total_steps + 1`` == TRL's ``global_step`` after the optimizer step), as grpo_train /
dpo_train order it: train -> validation (at ``val_period`` steps) -> checkpoint (every ``save_period`` steps and
at the last step) -> ``train/*`` then ``timing/train/*`` through NeMo-RL's ``Logger.log_metrics``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from sample_runs.nemo_rl_corpus import bridge


class NemoBridge(TrainerCallback):
    def __init__(self, launch) -> None:
        self.L = launch
        info = launch.info
        self.total_valid_tokens = float(info.get("total_valid_tokens", 0))
        self.consumed_samples = int(info.get("consumed_samples", 0))
        self.step_started = time.perf_counter()
        self.step_toks = 0.0
        self.ckpt_seconds: float | None = None
        self.val_metrics: dict[str, float] | None = None

    # --- token counters: GRPO counts in the trainer state (restored on resume), DPO in the trainer (per process)
    def _tokens_seen(self, state) -> float:
        if self.L.algo == "grpo":
            return float(state.num_input_tokens_seen)
        return float(getattr(self.L.trainer, "_total_train_tokens", 0))

    def on_train_begin(self, args, state, control, **kw):
        """The resume weights are loaded by now: the moment #2955's worker builds its reference."""
        self.prev_tokens = self._tokens_seen(state)
        trainer = self.L.trainer
        policy = trainer.accelerator.unwrap_model(trainer.model)
        if self.L.spec["reference"] == "snapshot" and self.L.last:
            trainer.ref_model.load_state_dict(policy.state_dict())
        self.L.result.update(reference_check(self.L, policy))

    def on_step_begin(self, args, state, control, **kw):
        self.step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        step = state.global_step
        now = self._tokens_seen(state)
        self.step_toks, self.prev_tokens = now - self.prev_tokens, now
        self.total_valid_tokens += self.step_toks
        self.consumed_samples += int(self.L.config.grpo["num_prompts_per_step"] if self.L.algo == "grpo"
                                     else self.L.config.policy["train_global_batch_size"])
        self.val_metrics = self._maybe_validate(step)
        self.ckpt_seconds = None
        ck = self.L.config.checkpointing
        if ck["enabled"] and (step % int(ck["save_period"]) == 0 or step >= int(self.L.section["max_num_steps"])):
            t0 = time.perf_counter()
            save_checkpoint(self.L, step, self.training_info(step))
            self.ckpt_seconds = time.perf_counter() - t0

    def _maybe_validate(self, step: int) -> dict[str, float] | None:
        """grpo_train validates every ``val_period`` steps (and at the end with ``val_at_end``); dpo_train's
        periodic validation is handled the same way (the shipped val_period 25 is past these short runs)."""
        sec = self.L.section
        last = step >= int(sec["max_num_steps"])
        if not ((int(sec["val_period"]) > 0 and step % int(sec["val_period"]) == 0) or (sec["val_at_end"] and last)):
            return None
        if self.L.algo == "dpo":
            self.L.validate_dpo(step)
            return {f"validation-default_{k}": v for k, v in self.L.result["validation"][-1].items() if k != "step"}
        from sample_runs.nemo_rl_corpus.training import grpo_validate

        t0 = time.perf_counter()
        val = grpo_validate(self.L.trainer, self.L.tokenizer, min(int(sec["max_val_samples"]), 32),
                            int(self.L.config.policy["generation"]["max_new_tokens"]))
        took = time.perf_counter() - t0
        self.L.log({"total_validation_time": took}, step, "timing/validation")
        self.L.log(val, step, "validation")
        self.L.result["validation"].append({"step": step, **val})
        return val

    def training_info(self, step: int) -> dict[str, Any]:
        """``vars(grpo_save_state)`` / ``vars(dpo_save_state)`` as grpo.py / dpo.py fill them before a save."""
        metric = self.L.config.checkpointing["metric_name"]
        if self.L.algo == "grpo":
            info: dict[str, Any] = {"consumed_samples": self.consumed_samples, "current_step": step,
                                    "current_epoch": 0, "total_steps": step,
                                    "total_valid_tokens": self.total_valid_tokens}
            if self.val_metrics is not None:
                info["val_reward"] = self.val_metrics["accuracy"]
            info["sampler_name"] = None
        else:
            steps_per_epoch = len(self.L.trainer.get_train_dataloader())
            info = {"epoch": 0, "step": step % steps_per_epoch, "total_steps": step,
                    "consumed_samples": self.consumed_samples, "total_valid_tokens": self.total_valid_tokens}
            info.update(self.val_metrics or {})
        if metric and self.val_metrics is not None and metric.startswith("val:"):
            info[metric] = self.val_metrics.get(metric.split(":", 1)[1])
        return info

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        if "loss" not in logs or "train_runtime" in logs or any(k.startswith("eval_") for k in logs):
            return
        step, L = state.global_step, self.L
        took = time.perf_counter() - self.step_started
        if L.algo == "grpo":
            metrics = bridge.grpo_train_metrics(logs, step, L.spec["config"], self.step_toks)
        else:
            metrics = bridge.dpo_train_metrics(logs, L.spec["config"], self.step_toks)
        L.log(metrics, step, "train")
        L.log(bridge.timing_metrics(took, self.ckpt_seconds, self.step_toks), step, "timing/train",
              step_finished=L.algo == "grpo")  # grpo.py commits the W&B step here; dpo.py passes no step_finished
        keep = ("kl_penalty", "reward", "loss", "lr") if L.algo == "grpo" else (
            "rewards_chosen_mean", "rewards_rejected_mean", "accuracy", "loss", "lr")
        L.result["logged"].append({"step": step, "time": time.time(), **{k: metrics[k] for k in keep}})
        if L.spec.get("crash_after") == step:
            L.crash()


def save_checkpoint(L, step: int, info: dict[str, Any]) -> None:
    """NeMo-RL's ``init_tmp_checkpoint`` (training_info.json + config.yaml), the policy saved inside
    ``tmp_step_N/policy/{weights,optimizer,tokenizer}``, then ``begin_finalization`` (tmp_step_N -> step_N)."""
    path = Path(L.checkpointer.init_tmp_checkpoint(step, info, L.config))
    trainer = L.trainer
    trainer.save_model(str(path / "policy" / "weights"))
    opt = path / "policy" / "optimizer"
    opt.mkdir(parents=True, exist_ok=True)
    trainer._save_optimizer_and_scheduler(str(opt))
    trainer._save_rng_state(str(opt))
    trainer.state.save_to_json(str(opt / "trainer_state.json"))
    L.tokenizer.save_pretrained(str(path / "policy" / "tokenizer"))
    L.checkpointer.begin_finalization(path)
    if L.algo == "grpo":  # grpo.py's _write_latest_checkpoint_status (not importable: see nemo.py)
        status = Path(L.checkpointer.checkpoint_dir) / "latest_checkpoint_status.json"
        data = json.loads(status.read_text()) if status.exists() else {}
        data.update(last_successful_ckpt_save_completion=time.time(), last_checkpoint_step=step)
        status.write_text(json.dumps(data))
    L.result["checkpoints_saved"].append(step)


def reference_check(L, policy) -> dict[str, Any]:
    """Compare the frozen reference, weight for weight, with the base model and with the resumed checkpoint."""
    from transformers import AutoModelForCausalLM

    ref_sd = L.trainer.ref_model.state_dict()
    base_sd = AutoModelForCausalLM.from_pretrained(L.config.policy["model_name"]).state_dict()
    check: dict[str, Any] = {"max_abs_diff_to_base": max_abs(ref_sd, base_sd)}
    if L.last:
        ckpt_sd = AutoModelForCausalLM.from_pretrained(str(L.weights_path)).state_dict()
        check["max_abs_diff_to_checkpoint"] = max_abs(ref_sd, ckpt_sd)
        check["policy_max_abs_diff_to_checkpoint"] = max_abs(policy.state_dict(), ckpt_sd)
    if check["max_abs_diff_to_base"] == 0.0:
        frm = "base"
    elif check.get("max_abs_diff_to_checkpoint") == 0.0:
        frm = "checkpoint"
    else:
        frm = "other"
    check["ref_name_or_path"] = os.path.relpath(str(L.trainer.ref_model.config._name_or_path))
    return {"reference_from": frm, "reference_check": check}


def max_abs(a: dict, b: dict) -> float:
    diffs = [float((a[k].float() - b[k].float()).abs().max()) for k in a if k in b]
    return max(diffs) if diffs else float("nan")
