"""One launch of a training run: ``python -m sample_runs.trl_corpus.launch SPEC_JSON``.

SPEC_JSON (a file path or an inline JSON object) says how this process builds the policy and the reference,
where it resumes from, when it "crashes", and the tracker environment (``env``: WANDB_*, MLFLOW_*,
TENSORBOARD_LOGGING_DIR) the stock Hugging Face callbacks read. The process trains with ``trl.GRPOTrainer``
(``spec["trainer"]`` ``grpo``, the default) or with ``trl.DPOTrainer`` / ``trl.KTOTrainer`` / ``trl.RLOOTrainer``
(``dpo`` / ``kto`` / ``rloo``: the preference corpus, see ``preference.py``), reports through ``report_to`` and
writes what it actually did to ``spec["result"]`` (JSON): the steps it logged with their KL (and for the preference
trainers their implicit rewards, accuracy and loss), the checkpoints it saved, how its reference compares with the
base model and with the resumed checkpoint, and the tracker pieces it wrote.

Policy and reference, per ``spec["model_from"]``:
- ``base``: ``model=<base folder>``; a resume restores the checkpoint's weights, optimizer and scheduler through
  ``trainer.train(resume_from_checkpoint=...)``. TRL builds the reference from the base folder (correct).
- ``checkpoint``: ``model=<checkpoint-N folder>`` plus ``resume_from_checkpoint`` (trl #3179): TRL builds the
  reference from the config's ``_name_or_path``, i.e. the resumed weights (the reference reset).
- ``peft-base``: ``model=<base folder>``, ``peft_config=LoraConfig`` and ``resume_from_checkpoint``: the adapter
  is restored, the reference is the base with the adapter disabled (correct).
- ``peft-checkpoint``: ``model=PeftModel.from_pretrained(base, checkpoint-N, is_trainable=True)`` without
  ``peft_config`` (continuing the saved adapter) plus ``resume_from_checkpoint``: TRL copies the loaded adapter
  into a frozen ``ref`` adapter, so the reference is the resumed adapter (the reset). DPOTrainer does the same
  (dpo_trainer.py: ``model.add_adapter("ref", ...)`` and a copy of every ``.default.`` parameter into ``.ref.``,
  used through ``use_adapter(model, "ref")`` for the reference log-probs).

With ``precompute_ref_log_probs=True`` (DPO) there is no reference model at all: the reference log-probs of the whole
dataset are computed once, inside the trainer's constructor, with the policy as it was built (``model=``), i.e.
before ``train(resume_from_checkpoint=...)`` restores the checkpoint's weights; they are checked here against the
base model and the checkpoint, weight for weight (the model that computed them) and log-prob for log-prob.

A crash: after the checkpoint (``on_save``) or the log (``on_log``) of step ``crash_after`` the process flushes the
trackers as an uncaught exception would (W&B ``finish(exit_code=1)``, MLflow run FAILED, TensorBoard flushed,
not closed) and dies with ``os._exit(1)``: no end-of-training summary is logged.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _load_spec(arg: str) -> dict:
    return json.loads(arg) if arg.lstrip().startswith("{") else json.loads(Path(arg).read_text())


def _max_diff(state_a: dict, state_b: dict) -> float:
    diffs = [float((state_a[k].float() - state_b[k].float()).abs().max()) for k in state_a if k in state_b]
    return max(diffs) if diffs else float("nan")


# what a launch records of each log (the preference trainers' implicit rewards and accuracy among them)
RECORDED = ("kl", "reward", "loss", "learning_rate", "entropy", "rewards/chosen", "rewards/rejected",
            "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected", "grad_norm")


def make_config(kind: str, spec: dict):
    """The trainer's config from the launch spec (the same defaults as the GRPO corpus where they apply)."""
    common = dict(
        output_dir=spec["output_dir"],
        run_name=spec.get("run_name"),
        report_to=spec.get("report_to", ["wandb", "mlflow", "tensorboard"]),
        max_steps=spec["max_steps"],
        save_steps=spec["save_steps"],
        save_strategy="steps",
        logging_steps=spec.get("logging_steps", 1),
        learning_rate=spec.get("lr", 3e-3),
        lr_scheduler_type="constant",
        beta=spec.get("beta", 0.1),
        per_device_train_batch_size=spec.get("batch_size", 16),
        seed=spec.get("seed", 42),
        use_cpu=True,
        bf16=False,
        fp16=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        sync_ref_model=spec.get("sync_ref_model", False),
        ref_model_sync_steps=spec.get("ref_model_sync_steps", 512),
        ref_model_mixup_alpha=spec.get("ref_model_mixup_alpha", 0.6),
        save_total_limit=None,
    )
    if kind == "grpo":
        from trl import GRPOConfig

        return GRPOConfig(**common, num_generations=spec.get("num_generations", 8), max_completion_length=6,
                          temperature=1.0, log_completions=False)
    if kind == "rloo":
        from trl import RLOOConfig

        return RLOOConfig(**common, num_generations=spec.get("num_generations", 8), max_completion_length=6,
                          temperature=1.0, log_completions=False)
    if kind == "dpo":
        from trl import DPOConfig

        return DPOConfig(**common, loss_type=spec.get("loss_type", "sigmoid"),
                         precompute_ref_log_probs=spec.get("precompute_ref_log_probs", False))
    if kind == "kto":
        from trl import KTOConfig

        return KTOConfig(**common, loss_type=spec.get("loss_type", "kto"))
    raise SystemExit(f"unknown trainer {kind!r}")


def make_trainer(kind: str, model, args, processing_class, peft_config):
    from sample_runs.trl_corpus.tiny_model import (build_dataset, build_preference_dataset, build_unpaired_dataset,
                                                   reward_good)

    if kind == "grpo":
        from trl import GRPOTrainer

        return GRPOTrainer(model=model, reward_funcs=reward_good, args=args, train_dataset=build_dataset(),
                           processing_class=processing_class, peft_config=peft_config)
    if kind == "rloo":
        from trl import RLOOTrainer

        return RLOOTrainer(model=model, reward_funcs=reward_good, args=args, train_dataset=build_dataset(),
                           processing_class=processing_class, peft_config=peft_config)
    if kind == "dpo":
        from trl import DPOTrainer

        return DPOTrainer(model=model, args=args, train_dataset=build_preference_dataset(),
                          processing_class=processing_class, peft_config=peft_config)
    if kind == "kto":
        from trl import KTOTrainer

        return KTOTrainer(model=model, args=args, train_dataset=build_unpaired_dataset(),
                          processing_class=processing_class, peft_config=peft_config)
    raise SystemExit(f"unknown trainer {kind!r}")


def grpo_reference_check(trainer, base: str, resume: str | None, model_from: str) -> tuple[str, dict]:
    """GRPO: the reference model against the base model and the resumed checkpoint (the GRPO corpus's check)."""
    from transformers import AutoModelForCausalLM

    base_sd = AutoModelForCausalLM.from_pretrained(base).state_dict()
    ckpt_sd = None
    if resume and model_from in ("base", "checkpoint"):
        ckpt_sd = AutoModelForCausalLM.from_pretrained(resume).state_dict()
    ref_check: dict = {}
    if trainer.ref_model is not None:
        ref_sd = trainer.ref_model.state_dict()
        ref_check["max_abs_diff_to_base"] = _max_diff(ref_sd, base_sd)
        if ckpt_sd is not None:
            ref_check["max_abs_diff_to_checkpoint"] = _max_diff(ref_sd, ckpt_sd)
        ref_check["how"] = "separate ref_model built by GRPOTrainer from config._name_or_path"
        ref_check["name_or_path"] = str(trainer.ref_model.config._name_or_path)
        if ref_check["max_abs_diff_to_base"] == 0.0:
            reference_from = "base"
        elif ckpt_sd is not None and ref_check["max_abs_diff_to_checkpoint"] == 0.0:
            reference_from = "checkpoint"
        else:
            reference_from = "other"
    else:
        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        adapters = list(getattr(peft_model, "peft_config", {}))
        ref_check["adapters"] = adapters
        if "ref" in adapters:
            ref_b = [p for n, p in peft_model.named_parameters() if ".ref." in n and "lora_B" in n]
            ref_check["ref_adapter_lora_B_abs_max"] = float(max(p.abs().max() for p in ref_b))
            ref_check["how"] = "TRL copied the loaded adapter into a frozen 'ref' adapter"
            reference_from = "checkpoint" if ref_check["ref_adapter_lora_B_abs_max"] > 0 else "base"
        else:
            ref_check["how"] = "base model with the adapter disabled"
            reference_from = "base"
    return reference_from, ref_check


def _completion_logps(model, rows: list[dict], which: str) -> list[float]:
    """Sum of log p(completion token | prefix) for ``prompt_ids + <which>_ids``, with a plain forward pass."""
    import torch

    out = []
    with torch.no_grad():
        for row in rows:
            prompt, completion = list(row["prompt_ids"]), list(row[f"{which}_ids"])
            ids = torch.tensor([prompt + completion])
            logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            targets = ids[0, 1:]
            per_token = logps.gather(-1, targets[:, None])[:, 0]
            out.append(float(per_token[len(prompt) - 1:].sum()))
    return out


def _verdict(d_base: float, d_ckpt: float | None) -> str:
    if d_base == 0.0:
        return "base"
    if d_ckpt is not None and d_ckpt == 0.0:
        return "checkpoint"
    return "other"


def preference_reference_check(trainer, base: str, resume: str | None, model_from: str) -> tuple[str, dict]:
    """DPO / KTO / RLOO: what the trainer really uses as its reference, compared weight for weight with the base
    model and the resumed checkpoint (its full weights, or its saved adapter)."""
    from accelerate.utils import is_peft_model
    from transformers import AutoModelForCausalLM

    base_model = AutoModelForCausalLM.from_pretrained(base).eval()
    base_sd = base_model.state_dict()
    ckpt_model = ckpt_sd = None
    if resume and model_from in ("base", "checkpoint"):
        ckpt_model = AutoModelForCausalLM.from_pretrained(resume).eval()
        ckpt_sd = ckpt_model.state_dict()
    check: dict = {}
    policy = trainer.accelerator.unwrap_model(trainer.model)
    if trainer.ref_model is not None:
        ref_sd = trainer.accelerator.unwrap_model(trainer.ref_model).state_dict()
        check["how"] = "ref_model"  # built by the trainer from the policy's config._name_or_path
        check["name_or_path"] = str(trainer.ref_model.config._name_or_path)
        check["tensors_compared"] = len([k for k in ref_sd if k in base_sd])
        check["max_abs_diff_to_base"] = _max_diff(ref_sd, base_sd)
        if ckpt_sd is not None:
            check["max_abs_diff_to_checkpoint"] = _max_diff(ref_sd, ckpt_sd)
        if trainer.args.sync_ref_model:
            check["note"] = "as built; SyncRefModelCallback overwrites it every ref_model_sync_steps"
        return _verdict(check["max_abs_diff_to_base"], check.get("max_abs_diff_to_checkpoint")), check
    if is_peft_model(policy):
        adapters = list(policy.peft_config)
        check["adapters"] = adapters
        # the frozen weights under the adapters, named as in the plain model
        under = {n.replace("base_model.model.", "", 1).replace(".base_layer.", "."): p.detach()
                 for n, p in policy.named_parameters() if "lora_" not in n}
        check["tensors_compared"] = len([k for k in under if k in base_sd])
        check["base_layers_max_abs_diff_to_base"] = _max_diff(under, base_sd)
        if "ref" not in adapters:
            check["how"] = "adapter_disabled"  # no ref_model: the policy with its adapter disabled
            return ("base" if check["base_layers_max_abs_diff_to_base"] == 0.0 else "other"), check
        ref = {n.replace(".ref.", "."): p.detach() for n, p in policy.named_parameters() if ".ref." in n}
        check["how"] = "ref_adapter"  # no ref_model: a frozen 'ref' adapter, a copy of the loaded adapter
        check["ref_adapter_lora_B_abs_max"] = float(max(p.abs().max() for n, p in ref.items() if "lora_B" in n))
        saved = Path(resume or "") / "adapter_model.safetensors"
        if resume and saved.exists():
            from safetensors.torch import load_file

            ckpt_adapter = load_file(str(saved))
            check["ref_adapter_tensors_compared"] = len([k for k in ref if k in ckpt_adapter])
            check["ref_adapter_max_abs_diff_to_checkpoint_adapter"] = _max_diff(ref, ckpt_adapter)
        if check["base_layers_max_abs_diff_to_base"] != 0.0:
            return "other", check
        if check["ref_adapter_lora_B_abs_max"] == 0.0:
            return "base", check  # a zero LoRA B: the adapter is the identity, the reference is the base model
        if check.get("ref_adapter_max_abs_diff_to_checkpoint_adapter") == 0.0:
            return "checkpoint", check
        return "other", check
    # precompute_ref_log_probs=True: the reference exists only as the log-probs the constructor computed with the
    # policy as it was built (train() has not restored any checkpoint yet)
    policy_sd = policy.state_dict()
    check["how"] = "precomputed"  # no ref_model: log-probs precomputed in the constructor by the policy as built
    check["tensors_compared"] = len([k for k in policy_sd if k in base_sd])
    check["max_abs_diff_to_base"] = _max_diff(policy_sd, base_sd)
    if ckpt_sd is not None:
        check["max_abs_diff_to_checkpoint"] = _max_diff(policy_sd, ckpt_sd)
    ds = trainer.train_dataset
    if "ref_chosen_logps" in ds.column_names:
        rows = [ds[i] for i in range(min(8, len(ds)))]
        stored = [r["ref_chosen_logps"] for r in rows] + [r["ref_rejected_logps"] for r in rows]
        for label, model in (("base", base_model), ("checkpoint", ckpt_model)):
            if model is not None:
                mine = _completion_logps(model, rows, "chosen") + _completion_logps(model, rows, "rejected")
                check[f"ref_logps_max_abs_diff_to_{label}"] = max(abs(a - b) for a, b in zip(stored, mine))
        check["ref_logps_rows_compared"] = len(rows)
        check["ref_chosen_logps_first"] = rows[0]["ref_chosen_logps"]
    return _verdict(check["max_abs_diff_to_base"], check.get("max_abs_diff_to_checkpoint")), check


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = _load_spec(argv[0])
    for k, v in spec.get("env", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    # nothing reaches a network: no hub, W&B offline, no telemetry
    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_X_DISABLE_STATS": "true",
        "WANDB_X_DISABLE_META": "true",
        "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
        "TOKENIZERS_PARALLELISM": "false",
        "DISABLE_MLFLOW_INTEGRATION": "FALSE",
    }.items():
        os.environ.setdefault(key, value)

    started_at = time.time()
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    torch.set_num_threads(1)
    kind = spec.get("trainer", "grpo")
    base = spec["base_model"]
    resume = spec.get("resume_from")
    model_from = spec.get("model_from", "base")
    result: dict = {"index": spec.get("index", 0), "pid": os.getpid(), "started_at": started_at,
                    "model_from": model_from, "resume_from": resume,
                    "resumed_from_step": int(Path(resume).name.split("-")[-1]) if resume else None,
                    "logged": [], "checkpoints_saved": [], "crashed": False}
    if kind != "grpo":
        result["trainer"] = kind
    args = make_config(kind, spec)

    peft_config = None
    if model_from == "base":
        model = base
    elif model_from == "checkpoint":
        model = resume
    elif model_from == "peft-base":
        from peft import LoraConfig

        model = base
        # every linear layer but lm_head (TRL rejects an adapter on lm_head)
        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"])
    elif model_from == "peft-checkpoint":
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), resume, is_trainable=True)
    else:
        raise SystemExit(f"unknown model_from {model_from!r}")

    from transformers import AutoTokenizer

    processing_class = AutoTokenizer.from_pretrained(base, padding_side="left", truncation_side="left")
    trainer = make_trainer(kind, model, args, processing_class, peft_config)

    # --- what is the reference, really? -------------------------------------------------------------------
    if kind == "grpo":
        reference_from, ref_check = grpo_reference_check(trainer, base, resume, model_from)
    else:
        reference_from, ref_check = preference_reference_check(trainer, base, resume, model_from)
    result["reference_from"] = reference_from
    result["reference_check"] = ref_check

    crash_after = spec.get("crash_after")
    state = {"tb": None}
    verl = VerlLogger(spec["verl"], spec, args, result) if spec.get("verl") else None
    # the series that says "this step was logged": the KL, or for DPO (which logs no KL) the implicit reward margin
    primary = "rewards/margins" if kind == "dpo" else "kl"

    def tracker_pieces() -> None:
        backends = set(args.report_to or []) | set((spec.get("verl") or {}).get("backends", []))
        if "wandb" in backends:
            import wandb

            if wandb.run is not None:
                result["wandb_run_id"] = wandb.run.id
                result["wandb_run_dir"] = str(Path(wandb.run.dir).parent)
                result["wandb_run_name"] = wandb.run.name
        if "mlflow" in backends:
            import mlflow

            if mlflow.active_run() is not None:
                result["mlflow_run_id"] = mlflow.active_run().info.run_id
        for cb in trainer.callback_handler.callbacks:
            if type(cb).__name__ == "TensorBoardCallback" and cb.tb_writer is not None:
                state["tb"] = cb.tb_writer
                result["tensorboard_dir"] = str(cb.logging_dir)
        if verl is not None and "tensorboard" in verl.tracking.logger:
            state["tb"] = verl.tracking.logger["tensorboard"].writer
            result["tensorboard_dir"] = str(verl.tracking.logger["tensorboard"].writer.log_dir)

    def write_result() -> None:
        result["ended_at"] = time.time()
        steps = [r["step"] for r in result["logged"] if primary in r]
        result["first_step"] = min(steps) if steps else None
        result["last_step"] = max(steps) if steps else None
        tb_dir = result.get("tensorboard_dir")
        if tb_dir and Path(tb_dir).is_dir():
            result["event_files"] = sorted(str(p) for p in Path(tb_dir).glob("events.out.tfevents.*")
                                           if p.name.split(".")[-2] == str(os.getpid()) or
                                           f".{os.getpid()}." in p.name)
        Path(spec["result"]).write_text(json.dumps(result, indent=1))

    def crash() -> None:
        result["crashed"] = True
        tracker_pieces()
        if state["tb"] is not None:
            state["tb"].flush()
        backends = set(args.report_to or []) | set((spec.get("verl") or {}).get("backends", []))
        if "mlflow" in backends:  # (touching mlflow otherwise would create ./mlflow.db, MLflow 3's default store)
            try:
                import mlflow

                mlflow.flush_async_logging()
                if mlflow.active_run() is not None:
                    mlflow.end_run(status="FAILED")
            except Exception as exc:  # noqa: BLE001
                result["mlflow_flush_error"] = repr(exc)
        if "wandb" in backends:
            try:
                import wandb

                if wandb.run is not None:
                    wandb.run.finish(exit_code=1)
            except Exception as exc:  # noqa: BLE001
                result["wandb_finish_error"] = repr(exc)
        write_result()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    class Recorder(TrainerCallback):
        def on_log(self, args, st, control, logs=None, **kw):
            tracker_pieces()
            logs = logs or {}
            rec = {"step": st.global_step, "time": time.time()}
            for k in RECORDED:
                if k in logs:
                    rec[k] = float(logs[k])
            if kind != "grpo" and "train_runtime" not in logs:
                result["logged_keys"] = sorted(set(result.get("logged_keys", [])) | set(logs))
            if "train_runtime" in logs:
                rec["summary"] = True
            result["logged"].append(rec)
            if verl is not None and "kl" in logs:
                verl.log(st.global_step, logs)
            if crash_after is not None and st.global_step == crash_after and st.global_step % args.save_steps:
                crash()

        def on_save(self, args, st, control, **kw):
            result["checkpoints_saved"].append(st.global_step)
            if verl is not None:
                verl.save(st.global_step)
            if crash_after is not None and st.global_step == crash_after:
                crash()

    trainer.add_callback(Recorder())
    trainer.train(resume_from_checkpoint=resume)
    tracker_pieces()
    if verl is not None:
        verl.tracking.finish() if hasattr(verl.tracking, "finish") else None
    write_result()
    return 0


def load_verl_tracking():
    """verl's own ``verl/utils/tracking.py`` from the installed ``verl`` wheel (``pip install verl --no-deps``).

    It is loaded by file path: ``import verl`` runs ``verl/__init__.py``, which imports ``verl.protocol`` and with
    it ray and tensordict (GPU-cluster dependencies); ``tracking.py`` itself needs only orjson, packaging and the
    tracker clients (and pandas for MLflow params)."""
    import importlib.metadata
    import importlib.util

    path = importlib.metadata.distribution("verl").locate_file("verl/utils/tracking.py")
    mod_spec = importlib.util.spec_from_file_location("verl_utils_tracking", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module, importlib.metadata.version("verl")


class VerlLogger:
    """Log the same training through verl's ``Tracking`` with verl's names, step axis and checkpoint layout.

    Names as verl's ``ray_trainer.fit`` logs them (``actor/kl_loss``, ``actor/kl_coef``, ``actor/pg_loss``,
    ``actor/grad_norm``, ``actor/lr``, ``actor/entropy``, ``actor/pg_clipfrac``, ``critic/score/mean``,
    ``response_length/mean``, ``timing_s/step``, ``training/global_step``, ``training/epoch``), with
    ``step=global_step``; checkpoints as ``global_step_N/actor/huggingface/config.json`` plus
    ``latest_checkpointed_iteration.txt`` (weights are not kept)."""

    MAP = {"kl": "actor/kl_loss", "loss": "actor/pg_loss", "grad_norm": "actor/grad_norm", "learning_rate": "actor/lr",
           "entropy": "actor/entropy", "clip_ratio/region_mean": "actor/pg_clipfrac", "reward": "critic/score/mean",
           "reward_std": "critic/score/std", "completions/mean_length": "response_length/mean",
           "step_time": "timing_s/step"}

    def __init__(self, vspec: dict, spec: dict, args, result: dict):
        module, version = load_verl_tracking()
        self.vspec, self.spec, self.args, self.result = vspec, spec, args, result
        config = {
            "trainer": {"project_name": vspec["project"], "experiment_name": vspec["experiment"],
                        "logger": vspec["backends"], "total_training_steps": spec["max_steps"],
                        "save_freq": spec["save_steps"],
                        "resume_mode": "auto" if spec.get("resume_from") else "disable",
                        "default_local_dir": vspec["checkpoint_root"], "val_before_train": False},
            "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
            "actor_rollout_ref": {"model": {"path": str(spec["base_model"] if spec.get("model_from") == "base"
                                                        else spec.get("resume_from") or spec["base_model"])},
                                  "actor": {"use_kl_loss": True, "kl_loss_coef": spec.get("beta", 0.1),
                                            "kl_loss_type": "low_var_kl", "optim": {"lr": spec.get("lr")}},
                                  "rollout": {"n": spec.get("num_generations", 8)}},
        }
        self.tracking = module.Tracking(project_name=vspec["project"], experiment_name=vspec["experiment"],
                                        default_backend=vspec["backends"], config=config)
        result["verl_version"] = version

    def log(self, step: int, logs: dict) -> None:
        data = {v: float(logs[k]) for k, v in self.MAP.items() if k in logs}
        data["actor/kl_coef"] = float(self.spec.get("beta", 0.1))
        data["training/global_step"] = step
        data["training/epoch"] = int(float(logs.get("epoch", 0)))
        self.tracking.log(data=data, step=step)

    def save(self, step: int) -> None:
        root = Path(self.vspec["checkpoint_root"])
        hf = root / f"global_step_{step}" / "actor" / "huggingface"
        hf.mkdir(parents=True, exist_ok=True)
        src = Path(self.spec["output_dir"]) / f"checkpoint-{step}" / "config.json"
        if src.exists():
            (hf / "config.json").write_text(src.read_text())
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))


if __name__ == "__main__":
    raise SystemExit(main())
