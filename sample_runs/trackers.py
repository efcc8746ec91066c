"""The real tracker writers, each speaking one framework's metric dialect.

Why: klwatch's defaults (which metric is the reference KL, which look-alike to leave out, which
series is the step axis) must be exercised on the names real frameworks log, written by the real
clients: TensorBoard runs speak NeMo-RL, W&B runs speak TRL, MLflow runs speak verl. Each flavour
also logs a policy-vs-old-policy KL (``approxkl`` / ``ppo_kl``), which does not reset at a resume and
which klwatch must not mistake for the reference KL, and the PPO clip fraction: together they measure
how far each step moved the policy, which is what fresh Adam moments at a resume inflate.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any, Literal, Protocol

from .grpo import StepLog

Flavour = Literal["nemo-rl", "trl", "verl"]

FLAVOUR_OF_TRACKER: dict[str, Flavour] = {"tensorboard": "nemo-rl", "wandb": "trl", "mlflow": "verl"}
KL_METRIC: dict[Flavour, str] = {"nemo-rl": "train/kl_penalty", "trl": "train/kl", "verl": "actor/kl_loss"}
LOOKALIKE_METRIC: dict[Flavour, str] = {
    "nemo-rl": "train/approxkl",
    "trl": "policy/approxkl_avg",
    "verl": "actor/ppo_kl",
}
STEP_METRIC: dict[Flavour, str | None] = {
    "nemo-rl": None,
    "trl": "train/global_step",
    "verl": "training/global_step",
}


def flavour_metrics(log: StepLog, *, flavour: Flavour, adaptive_kl: bool) -> dict[str, float]:
    """One step's measurements under the names the flavour's framework logs them."""
    if flavour == "nemo-rl":
        m = {
            "train/kl_penalty": log.kl,
            "train/loss": log.loss,
            "train/reward": log.reward,
            "train/lr": log.lr,
            "train/grad_norm": log.grad_norm,
            "train/entropy": log.entropy,
            "train/consumed_samples": float(log.consumed_samples),
            "train/mean_prompt_length": log.prompt_length,
            "train/approxkl": log.approx_kl,
            "train/clipfrac": log.clipfrac,
        }
        if adaptive_kl:
            m["train/kl_coef"] = log.kl_coef
        return m
    if flavour == "trl":
        m = {
            "train/kl": log.kl,
            "train/reward": log.reward,
            "train/loss": log.loss,
            "train/learning_rate": log.lr,
            "train/grad_norm": log.grad_norm,
            "train/entropy": log.entropy,
            "train/global_step": float(log.step),
            "train/epoch": log.epoch,
            "policy/approxkl_avg": log.approx_kl,
            "policy/clipfrac_avg": log.clipfrac,
        }
        if adaptive_kl:
            m["train/kl_coef"] = log.kl_coef
        return m
    return {
        "actor/kl_loss": log.kl,
        "actor/kl_coef": log.kl_coef,
        "actor/lr": log.lr,
        "actor/grad_norm": log.grad_norm,
        "actor/entropy": log.entropy,
        "actor/pg_loss": log.pg_loss,
        "actor/ppo_kl": log.approx_kl,
        "actor/pg_clipfrac": log.clipfrac,
        "critic/score/mean": log.reward,
        "training/global_step": float(log.step),
        "consumed_samples": float(log.consumed_samples),
    }


class TrackerWriter(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, *, crashed: bool) -> dict[str, Any]:
        """Finish the tracker run; return where it wrote (for the manifest)."""
        ...


class TensorboardXWriter:
    """torch/tensorboardX style: ``simple_value`` scalars, one new event file per process."""

    def __init__(self, *, logdir: Path, config: dict[str, Any], first_step: int) -> None:
        from tensorboardX import SummaryWriter

        before = set(logdir.glob("events.out.tfevents.*")) if logdir.exists() else set()
        # tensorboardX names files by the second: two launches in one second would share a file,
        # so the pid goes in the name, as torch's own SummaryWriter does
        self.writer = SummaryWriter(logdir=str(logdir), flush_secs=1, filename_suffix=f".{os.getpid()}")
        self.writer.add_text("config", json.dumps(config, sort_keys=True), global_step=first_step)
        self.writer.flush()
        self.files = sorted(set(logdir.glob("events.out.tfevents.*")) - before)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        wall = time.time()
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, global_step=step, walltime=wall)
        self.writer.flush()  # a live watcher must see each step as it lands

    def close(self, *, crashed: bool) -> dict[str, Any]:
        self.writer.close()
        return {"event_files": [str(p) for p in self.files]}


class TensorboardV2Writer:
    """``tensorboard.summary.Writer``: v2 tensor scalars, one new event file per process.

    That writer has no text summary, so the config goes through the same event file with the
    text plugin's own ``text_pb`` (what ``tf.summary.text`` writes).
    """

    def __init__(self, *, logdir: Path, config: dict[str, Any], first_step: int) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.text import summary_v2 as text_summary
        from tensorboard.summary import DirectoryOutput, Writer

        logdir.mkdir(parents=True, exist_ok=True)
        before = set(logdir.glob("events.out.tfevents.*"))
        self.output = DirectoryOutput(str(logdir))
        self.writer = Writer(self.output)
        event = event_pb2.Event(wall_time=time.time(), step=first_step)
        event.summary.CopyFrom(text_summary.text_pb("config", json.dumps(config, sort_keys=True)))
        self.output._ev_writer.add_event(event)  # the same file the scalars go to
        self.writer.flush()
        self.files = sorted(set(logdir.glob("events.out.tfevents.*")) - before)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        wall = time.time()
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step, wall_time=wall)
        self.writer.flush()

    def close(self, *, crashed: bool) -> dict[str, Any]:
        self.writer.close()
        return {"event_files": [str(p) for p in self.files]}


class WandbWriter:
    """The real ``wandb`` client, offline. ``resume`` reuses one run id across processes."""

    def __init__(
        self,
        *,
        root: Path,
        project: str,
        name: str,
        group: str,
        config: dict[str, Any],
        run_id: str | None,
        resume: bool,
        step_metric: str | None,
    ) -> None:
        import wandb

        root.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            x_disable_stats=True,
            x_disable_meta=True,
            x_disable_machine_info=True,
            x_save_requirements=False,
            console="off",
            disable_git=True,
            disable_code=True,
            save_code=False,
            silent=True,
        )
        kwargs: dict[str, Any] = {}
        if run_id:
            kwargs["id"] = run_id
        if resume:
            kwargs["resume"] = "allow"
        self.run = wandb.init(
            project=project, dir=str(root), name=name, group=group, config=config, settings=settings, **kwargs
        )
        if step_metric:  # what TRL's WandbCallback does: the framework's step is the x axis
            self.run.define_metric(step_metric)
            self.run.define_metric("*", step_metric=step_metric)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics)  # W&B's own _step auto-increments, as under TRL

    def close(self, *, crashed: bool) -> dict[str, Any]:
        run_dir = Path(self.run.dir).parent  # .../offline-run-<time>-<id>/files -> the run folder
        run_id = self.run.id
        self.run.finish(exit_code=1 if crashed else 0)
        return {"run_dir": str(run_dir), "run_id": run_id}


class MlflowWriter:
    """The real ``mlflow`` client on a SQLite store. ``run_id`` given: that run is resumed."""

    def __init__(
        self,
        *,
        tracking_uri: str,
        experiment: str,
        artifact_root: Path,
        name: str,
        group: str,
        config: dict[str, Any],
        run_id: str | None,
    ) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri)
        client = MlflowClient()
        exp = client.get_experiment_by_name(experiment)
        if exp is None:  # nothing is logged as an artifact; the location only has to be well defined
            exp_id = client.create_experiment(experiment, artifact_location=artifact_root.resolve().as_uri())
        else:
            exp_id = exp.experiment_id
        if run_id:
            self.run = mlflow.start_run(run_id=run_id)
        else:
            self.run = mlflow.start_run(experiment_id=exp_id, run_name=name, tags={"group": group})
            mlflow.log_params(config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.mlflow.log_metrics(metrics, step=step)  # verl's MLflow logger: step = global step

    def close(self, *, crashed: bool) -> dict[str, Any]:
        run_id = self.run.info.run_id
        self.mlflow.end_run(status="FAILED" if crashed else "FINISHED")
        return {"run_id": run_id}


class VerlFileWriter:
    """verl's own ``Tracking(default_backend="file")``, its class loaded from a verl source tree (``verl_src``) at
    generation time and never copied: ``FileLogger`` opens ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``
    with ``"wb"`` at every launch and writes ``{"step": N, "data": {...}}`` per step, so the file keeps only the
    last launch. The tracking module imports only the standard library and ``orjson`` at its top, so it is loaded
    from its file without importing the ``verl`` package (torch, ray, ...)."""

    def __init__(self, *, verl_src: Path, root: Path, project: str, experiment: str) -> None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("verl_utils_tracking", verl_src / "verl" / "utils" / "tracking.py")
        if spec is None or spec.loader is None:
            raise FileNotFoundError(f"{verl_src}: no verl/utils/tracking.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        os.environ["VERL_FILE_LOGGER_ROOT"] = str(root)
        os.environ.pop("VERL_FILE_LOGGER_PATH", None)
        self.tracking = module.Tracking(project_name=project, experiment_name=experiment, default_backend="file")
        self.path = Path(self.tracking.logger["file"].filepath)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.tracking.log(data=metrics, step=step)  # ray_trainer.fit: logger.log(data=metrics, step=self.global_steps)

    def close(self, *, crashed: bool) -> dict[str, Any]:
        self.tracking.logger["file"].finish()
        return {"jsonl": str(self.path)}


# ------------------------------------------------------------------ committed-size housekeeping


def prune_wandb(root: Path) -> None:
    """Keep what a reader needs: the ``.wandb`` log and small ``files/`` metadata."""
    for p in [q for q in root.rglob("wandb") if q.is_dir()]:
        for name in ("debug.log", "debug-internal.log", "latest-run"):
            q = p / name
            if q.is_symlink() or q.is_file():
                q.unlink()
        for run in p.iterdir():
            if not run.is_dir():
                continue
            for sub in ("logs", "tmp"):
                shutil.rmtree(run / sub, ignore_errors=True)
            files = run / "files"
            for name in ("requirements.txt", "output.log", "wandb-metadata.json"):
                (files / name).unlink(missing_ok=True)
            if files.is_dir() and not any(files.iterdir()):
                files.rmdir()


def compact_mlflow(db: Path, *, page_size: int = 512) -> None:
    """VACUUM with small pages: MLflow's many empty tables would otherwise cost 4 KiB each."""
    if not db.exists():
        return
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA journal_mode=DELETE")
        con.execute(f"PRAGMA page_size={int(page_size)}")
        con.execute("VACUUM")
    finally:
        con.close()
