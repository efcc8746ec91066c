"""The TRL side of a launch: data, optimizer/scheduler from NeMo-RL's config, and the trainer.

Everything the trainer is given comes from the resolved NeMo-RL config (batch sizes, steps, lr, optimizer kwargs,
scheduler list, KL coefficient, seed), so the logged config describes what really ran."""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

from sample_runs.trl_corpus.tiny_model import TARGET, WORDS, build_dataset, prompts, reward_good


def preference_dataset(n: int, seed: int):
    """Pairs from the tiny vocabulary: the chosen completion holds more ``good`` words than the rejected one."""
    from datasets import Dataset

    rng = random.Random(seed)
    others = [w for w in WORDS if w != TARGET]
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for p in prompts(n, seed):
        k = rng.randint(2, 3)
        rows["prompt"].append(p)
        rows["chosen"].append(" ".join([TARGET] * k + [rng.choice(others) for _ in range(3 - k)]))
        rows["rejected"].append(" ".join(rng.choice(others) for _ in range(3)))
    return Dataset.from_dict(rows)


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def build_optimizer(model, policy_cfg: dict[str, Any]):
    """``policy.optimizer`` and the ``policy.scheduler`` list (sub-schedulers + milestones -> SequentialLR), the
    way NeMo-RL's DTensor policy worker instantiates them by name."""
    import torch

    kwargs = dict(policy_cfg["optimizer"]["kwargs"])
    kwargs["betas"] = tuple(kwargs.get("betas", (0.9, 0.999)))
    kwargs = {k: (float(v) if k in ("lr", "eps", "weight_decay") else v) for k, v in kwargs.items()}
    opt = _resolve(policy_cfg["optimizer"]["name"])(model.parameters(), **kwargs)
    entries = policy_cfg["scheduler"]
    milestones = next((e["milestones"] for e in entries if "milestones" in e), [])
    scheds = [_resolve(e["name"])(opt, **e.get("kwargs", {})) for e in entries if "name" in e]
    sched = scheds[0] if len(scheds) == 1 else torch.optim.lr_scheduler.SequentialLR(opt, scheds, milestones)
    return opt, sched


def common_args(cfg, out_dir: Path, section: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments shared by GRPO and DPO, read off the NeMo-RL config."""
    pol = cfg.policy
    micro, glob = int(pol["train_micro_batch_size"]), int(pol["train_global_batch_size"])
    return dict(output_dir=str(out_dir), report_to=[], max_steps=int(section["max_num_steps"]), save_strategy="no",
                logging_steps=1, learning_rate=float(pol["optimizer"]["kwargs"]["lr"]),
                per_device_train_batch_size=micro, gradient_accumulation_steps=max(1, glob // micro),
                max_grad_norm=float(pol["max_grad_norm"]), seed=int(section["seed"]), use_cpu=True, bf16=False,
                fp16=False, disable_tqdm=True, dataloader_num_workers=0)


def build_grpo(cfg, base: str, out_dir: Path, tokenizer):
    """``trl.GRPOTrainer`` on the tiny prompts; beta = ``loss_fn.reference_policy_kl_penalty`` (> 0: TRL logs kl)."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    g, loss = cfg.grpo, cfg.loss_fn
    args = GRPOConfig(**common_args(cfg, out_dir, g), beta=float(loss["reference_policy_kl_penalty"]),
                      num_generations=int(g["num_generations_per_prompt"]),
                      max_completion_length=int(cfg.policy["generation"]["max_new_tokens"]),
                      temperature=float(cfg.policy["generation"]["temperature"]),
                      epsilon=float(loss["ratio_clip_min"]), epsilon_high=float(loss["ratio_clip_max"]),
                      log_completions=False)
    model = AutoModelForCausalLM.from_pretrained(base)
    return GRPOTrainer(model=model, reward_funcs=reward_good, args=args, train_dataset=build_dataset(256),
                       processing_class=tokenizer, optimizers=build_optimizer(model, cfg.policy))


def build_dpo(cfg, base: str, out_dir: Path, tokenizer):
    """``trl.DPOTrainer`` (sigmoid loss) on tiny preference pairs; beta = ``dpo.reference_policy_kl_penalty``."""
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    d = cfg.dpo
    args = DPOConfig(**common_args(cfg, out_dir, d), beta=float(d["reference_policy_kl_penalty"]),
                     loss_type="sigmoid", max_length=int(cfg.policy["max_total_sequence_length"]),
                     per_device_eval_batch_size=int(d["val_global_batch_size"]))
    model = AutoModelForCausalLM.from_pretrained(base)
    n_val = int(d["val_batches"]) * int(d["val_global_batch_size"])
    return DPOTrainer(model=model, args=args, train_dataset=preference_dataset(256, 11),
                      eval_dataset=preference_dataset(n_val, 23), processing_class=tokenizer,
                      optimizers=build_optimizer(model, cfg.policy))


def grpo_validate(trainer, tokenizer, n_prompts: int, max_new_tokens: int) -> dict[str, float]:
    """grpo.py's ``validate``: one sampled completion per validation prompt; ``accuracy`` is the mean reward,
    ``avg_length`` the mean generated length. The RNG is forked so validation does not shift training."""
    import torch

    model = trainer.accelerator.unwrap_model(trainer.model)
    batch = tokenizer(prompts(n_prompts, seed=97), return_tensors="pt", padding=True)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(97)
        was_training = model.training
        model.eval()
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0,
                             pad_token_id=tokenizer.pad_token_id)
        model.train(was_training)
    gen = out[:, batch["input_ids"].shape[1]:]
    texts = tokenizer.batch_decode(gen, skip_special_tokens=True)
    lengths = (gen != tokenizer.pad_token_id).sum(dim=1).float()
    return {"accuracy": float(sum(reward_good(texts)) / len(texts)), "avg_length": float(lengths.mean())}
