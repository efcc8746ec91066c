"""TRL's per-step logs under NeMo-RL's metric names and step convention.

Why a mapping and not NeMo-RL's training loop: NeMo-RL trains through Ray workers on GPUs (DTensor/Megatron
policies, vLLM generation); here TRL does the optimisation of a tiny model on CPU and this module renames what TRL
measured to what ``nemo_rl/algorithms/grpo.py`` / ``dpo.py`` log, at NeMo-RL's step (``total_steps + 1``, which is
TRL's ``global_step`` after the optimizer step). Quantities TRL does not have are marked ``SYNTHETIC`` below.
"""

from __future__ import annotations

import math
import random
from typing import Any


def _noise(step: int, salt: int, scale: float) -> float:
    """Deterministic small noise: the same numbers when a step is re-run from a checkpoint."""
    return random.Random(step * 1000 + salt).gauss(0.0, scale)


def grpo_train_metrics(logs: dict[str, float], step: int, cfg: dict[str, Any], valid_toks: float) -> dict[str, float]:
    """``train/*`` of grpo.py's ``logger.log_metrics(metrics, total_steps + 1, prefix="train")``.

    ``kl_penalty``: NeMo-RL logs ``kl / reference_policy_kl_penalty`` (loss_functions.py), i.e. the KL itself;
    TRL's ``kl`` is the unscaled per-token k3 estimate of KL(policy || reference), so it is logged as is."""
    seqs = cfg["prompts_per_step"] * cfg["generations_per_prompt"]
    return {
        "loss": float(logs["loss"]),
        "grad_norm": float(logs.get("grad_norm", math.nan)),
        "reward": float(logs["reward"]),
        "kl_penalty": float(logs["kl"]),
        "approx_entropy": float(logs["entropy"]),
        # SYNTHETIC: generation and training use the same HF model here (no vLLM), so the logprob mismatch is ~0
        "gen_kl_error": abs(_noise(step, 1, 2e-4)),
        "token_mult_prob_error": 1.0 + abs(_noise(step, 2, 2e-3)),
        "probs_ratio": 1.0,  # one optimizer step per batch (TRL num_iterations=1): the PPO ratio is exactly 1
        "probs_ratio_clamped": 1.0,
        "num_valid_samples": float(seqs),
        "lr": float(logs["learning_rate"]),
        "wd": float(cfg["weight_decay"]),
        "global_valid_seqs": float(seqs),
        "global_valid_toks": float(valid_toks),
        "mean_gen_tokens_per_sample": float(logs.get("completions/mean_length", math.nan)),
    }


def dpo_metrics(logs: dict[str, float], prefix: str = "") -> dict[str, float]:
    """The ``DPOLossFn`` metrics (loss_functions.py) from TRL's DPO logs (``prefix`` "eval_" for evaluation).

    TRL's ``rewards/*`` are NeMo-RL's ``rewards_*_mean`` (beta * (log pi - log pi_ref), beta = the config's
    ``dpo.reference_policy_kl_penalty``); ``sft_loss`` is the chosen sequences' NLL (``-logps/chosen``), which
    NeMo-RL computes with weight 0 in the shipped config, so ``loss == preference_loss``."""
    g = lambda k: float(logs[prefix + k])  # noqa: E731
    return {"loss": g("loss"), "sft_loss": -g("logps/chosen"), "preference_loss": g("loss"),
            "accuracy": g("rewards/accuracies"), "rewards_chosen_mean": g("rewards/chosen"),
            "rewards_rejected_mean": g("rewards/rejected")}


def dpo_train_metrics(logs: dict[str, float], cfg: dict[str, Any], valid_toks: float) -> dict[str, float]:
    """``train/*`` of dpo.py: ``loss``, ``grad_norm`` and the loss function's microbatch metrics."""
    return {**dpo_metrics(logs), "grad_norm": float(logs.get("grad_norm", math.nan)),
            "num_valid_samples": float(cfg["global_batch"]), "lr": float(logs["learning_rate"]),
            "wd": float(cfg["weight_decay"]), "global_valid_seqs": float(2 * cfg["global_batch"]),
            "global_valid_toks": float(valid_toks)}


def timing_metrics(step_seconds: float, checkpoint_seconds: float | None, valid_toks: float) -> dict[str, float]:
    """``timing/train/*``: measured wall times of this process (one "GPU": cluster.gpus_per_node=1)."""
    out = {"total_step_time": step_seconds}
    if checkpoint_seconds is not None:
        out["checkpointing"] = checkpoint_seconds
    out["valid_tokens_per_sec_per_gpu"] = valid_toks / step_seconds if step_seconds > 0 else 0.0
    return out
