"""One launch of a NeMo-RL-shaped run: ``python -m sample_runs.nemo_rl_corpus.launch SPEC.json``.

The process does what examples/run_grpo.py (or run_dpo.py) and ``grpo.setup`` do, with NeMo-RL's own code
imported from ``spec["nemo_rl_src"]``: ``load_config`` on the shipped example config, hydra overrides through
``parse_hydra_overrides``, resolve, ``get_next_experiment_dir``, ``Logger(config.logger)``,
``log_hyperparams(config)``, ``CheckpointManager``, ``get_latest_checkpoint_path`` + ``load_training_info``. The
training itself is TRL's (``GRPOTrainer`` / ``DPOTrainer`` on a tiny local model, CPU), logged under NeMo-RL's
names and steps through NeMo-RL's ``Logger.log_metrics``; checkpoints go through NeMo-RL's CheckpointManager
(``tmp_step_N`` -> ``step_N``) and a relaunch resumes from the latest one.

``spec["reference"]``: ``base`` keeps TRL's frozen reference built from ``policy.model_name`` (the base model:
correct); ``snapshot`` copies the policy into the reference after the resume weights are loaded, as
DTensorPolicyWorkerV2 does in NeMo-RL #2955 (``policy.model_name`` unchanged, so the logged config does not show
it). ``spec["crash_after"]``: after logging that step the process flushes the trackers as an uncaught exception
would and dies with ``os._exit(1)``. The process writes what it really did to ``spec["result"]``.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
    "WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "WANDB_DISABLE_GIT": "true", "WANDB_X_DISABLE_STATS": "true",
    "WANDB_X_DISABLE_META": "true", "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
    "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0", "NRL_LOG_LEVEL": "WARNING",
}


def prepare_process(spec: dict[str, Any]) -> None:
    """Offline switches, and cwd = the corpus root so NeMo-RL's relative ``logs/`` and ``results/`` land there.

    GIT_CEILING_DIRECTORIES keeps git from finding klwatch's own checkout above the corpus: WandbLogger uploads
    ``git ls-files`` and ``git diff`` as artifacts when it runs inside a repository (a run in a container)."""
    for key, value in {**OFFLINE_ENV, **spec.get("env", {})}.items():
        os.environ[key] = str(value)
    out = Path(spec["out"]).resolve()
    os.environ["GIT_CEILING_DIRECTORIES"] = str(out.parent)
    os.chdir(out)


@contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Serialises MLflowLogger's get-or-create of the experiment between launches running in parallel."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Launch:
    """The state of one process: NeMo-RL's logger and checkpointer, TRL's trainer, and the result record."""

    def __init__(self, spec: dict[str, Any], nemo, config) -> None:
        self.spec, self.nemo, self.config = spec, nemo, config
        self.algo = spec["algorithm"]
        self.section = config.grpo if self.algo == "grpo" else config.dpo
        self.scratch = Path(spec["scratch"])
        self.result: dict[str, Any] = {
            "index": spec["index"], "pid": os.getpid(), "started_at": time.time(), "algorithm": self.algo,
            "scenario": spec["scenario"], "reference_mode": spec["reference"], "crash_after": spec.get("crash_after"),
            "exp_dir": config.logger["log_dir"], "logged": [], "validation": [], "step0_keys": [],
            "checkpoints_saved": [], "crashed": False}

    def setup(self) -> None:
        """grpo.setup / dpo.setup up to the policy: Logger, hyperparameters, checkpointer, resume state."""
        t0 = time.perf_counter()
        with file_lock(self.spec["lock"]):
            self.logger = self.nemo.Logger(self.config.logger)
        logged = self.config.model_dump()
        self.logger.log_hyperparams(logged)
        self.result["logged_config"] = logged  # compared between launches by generate.py (not in the manifest)
        self.checkpointer = self.nemo.CheckpointManager(self.config.checkpointing)
        self.last = self.checkpointer.get_latest_checkpoint_path()
        self.info = self.checkpointer.load_training_info(self.last) or {}
        self.result["resume_from"] = os.path.relpath(self.last) if self.last else None
        self.result["resumed_from_step"] = self.info.get("total_steps") if self.last else None
        self.result["training_info_loaded"] = self.info or None
        self._build_policy(t0)

    def _build_policy(self, t0: float) -> None:
        from transformers import AutoTokenizer

        from sample_runs.nemo_rl_corpus.training import build_dpo, build_grpo

        t_gen = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(self.config.policy["tokenizer"]["name"])
        gen_time = time.perf_counter() - t_gen
        t_pol = time.perf_counter()
        build = build_grpo if self.algo == "grpo" else build_dpo
        self.trainer = build(self.config, self.config.policy["model_name"], self.scratch / "trl", self.tokenizer)
        policy_time = time.perf_counter() - t_pol
        self.trainer.add_callback(make_bridge(self))
        if self.algo == "grpo":  # grpo.py logs its setup timings at step 0 in every launch; dpo.py logs none
            total = time.perf_counter() - t0
            timings = self.nemo.SetupTimingMetrics(vllm_init_time_s=gen_time, policy_init_time_s=policy_time,
                                                   parallel_init_enabled=0.0, total_setup_time_s=total,
                                                   other_setup_time_s=total - gen_time - policy_time)
            self.log(timings.to_metrics_dict(), 0, "timing/setup")

    def log(self, metrics: dict[str, float], step: int, prefix: str, step_finished: bool = False) -> None:
        """NeMo-RL's ``Logger.log_metrics``; the keys logged at step 0 are recorded for the manifest."""
        self.logger.log_metrics(metrics, step, prefix=prefix, step_finished=step_finished)
        if step == 0:
            self.result["step0_keys"] += [f"{prefix}/{k}" for k in metrics]

    def resume_folder(self) -> str | None:
        """One HF-style folder (symlinks) over NeMo-RL's ``policy/weights`` + ``policy/optimizer`` of step_N,
        found with NeMo-RL's ``get_resume_paths``, for TRL's ``train(resume_from_checkpoint=...)``."""
        if not self.last:
            return None
        weights, optimizer = self.nemo.CheckpointManager.get_resume_paths(self.last)
        self.weights_path = weights
        folder = self.scratch / f"resume-{Path(self.last).name}"
        folder.mkdir(parents=True, exist_ok=True)
        for src in [*Path(weights).iterdir(), *(Path(optimizer).iterdir() if optimizer else [])]:
            (folder / src.name).unlink(missing_ok=True)
            (folder / src.name).symlink_to(src.resolve())
        return str(folder)

    def run(self) -> int:
        """dpo.py's validation at start (first launch only), then training; a normal end flushes like grpo_train."""
        resume = self.resume_folder()
        if self.algo == "dpo" and self.section["val_at_start"] and not self.info.get("total_steps"):
            self.validate_dpo(step=0)
        with self.checkpointer:
            self.trainer.train(resume_from_checkpoint=resume)
        self.tensorboard_writer().flush()
        self.write_result()
        return 0

    def validate_dpo(self, step: int) -> None:
        """dpo.py ``validate``: ``validation-default/*`` and the two validation timings."""
        from sample_runs.nemo_rl_corpus.bridge import dpo_metrics

        t0 = time.perf_counter()
        logs = self.trainer.evaluate()
        took = time.perf_counter() - t0
        metrics = {**dpo_metrics(logs, prefix="eval_"), "num_valid_samples": float(self.trainer.eval_dataset.num_rows)}
        self.log(metrics, step, "validation-default")
        self.log({"total_validation_time": took}, step, "timing/validation-default")
        self.log({"total_validation_time": took}, step, "timing/validation")
        self.result["validation"].append({"step": step, **metrics})

    def tensorboard_writer(self):
        return next(lg.writer for lg in self.logger.loggers if type(lg).__name__ == "TensorboardLogger")

    def tracker_pieces(self) -> None:
        """Which W&B run, MLflow run and TensorBoard event files this process wrote."""
        run = self.logger.wandb_logger.run if self.logger.wandb_logger else None
        if run is not None:
            self.result.update(wandb_run_id=run.id, wandb_run_name=run.name,
                               wandb_run_dir=os.path.relpath(Path(run.dir).parent))
        for lg in self.logger.loggers:
            if type(lg).__name__ == "MLflowLogger":
                self.result.update(mlflow_run_id=lg.run_id, mlflow_experiment_id=lg.run.info.experiment_id)
        tb = Path(self.tensorboard_writer().log_dir)
        self.result["tensorboard_dir"] = os.path.relpath(tb)
        self.result["event_files"] = sorted(os.path.relpath(p) for p in tb.rglob("events.out.tfevents.*"))

    def write_result(self) -> None:
        self.tracker_pieces()
        self.result["ended_at"] = time.time()
        steps = [r["step"] for r in self.result["logged"]]
        self.result["first_step"] = min(steps) if steps else None
        self.result["last_step"] = max(steps) if steps else None
        Path(self.spec["result"]).write_text(json.dumps(self.result, indent=1))

    def crash(self) -> None:
        """What an uncaught exception leaves: W&B finished with exit code 1, the MLflow run FAILED, TensorBoard
        flushed, the checkpointer's pending rename flushed (``with checkpointer:``), no end-of-training log."""
        self.result["crashed"] = True
        self.write_result()
        self.tensorboard_writer().flush()
        import mlflow

        mlflow.flush_async_logging()
        if mlflow.active_run() is not None:
            mlflow.end_run(status="FAILED")
        if self.logger.wandb_logger and self.logger.wandb_logger.run is not None:
            self.logger.wandb_logger.run.finish(exit_code=1)
        self.checkpointer.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def make_bridge(launch: Launch):
    """Built lazily: TrainerCallback needs transformers, imported after the environment is set."""
    from sample_runs.nemo_rl_corpus.callback import NemoBridge

    return NemoBridge(launch)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    prepare_process(spec)
    sys.path.insert(0, spec["repo"])
    import torch

    from sample_runs.nemo_rl_corpus import nemo

    torch.set_num_threads(1)
    nrl = nemo.load(Path(spec["nemo_rl_src"]))
    config = nemo.build_config(nrl, spec["algorithm"], nemo.overrides_for(spec))
    launch = Launch(spec, nrl, config)
    launch.setup()
    return launch.run()


if __name__ == "__main__":
    raise SystemExit(main())
