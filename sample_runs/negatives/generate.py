"""Write the negative cases: healthy runs, logged by real writers, in which klwatch must find no
reference reset, no boundary that is not there and no finding.

Why: every boundary and finding klwatch invents on a healthy run is a false alarm a user sees. These
are the layouts that real logs have and our own resume generator never produces (issue 10, part 2):

- ``eval-pauses``: one process that never restarts, pausing for evaluation every few steps (the
  wall-clock gaps are several times the step time), logging to TensorBoard, W&B (offline) and MLflow
  (SQLite) at once;
- ``same-step-train-val``: PyTorch Lightning's own ``CSVLogger`` from a real tiny Lightning training,
  whose ``metrics.csv`` holds train rows and validation rows with the same ``step``;
- ``rerun-appended``: the same training run twice, from step 0, appended to one CSV and one JSONL
  (the ``open(path, "a")`` loggers of many training scripts); no checkpoint behind the second;
- ``sibling-runs``: a sweep of twelve independent short runs in numbered folders ``runs/run-0000`` …;
- ``resume-at-kl-dip``: a real two-process run resumed correctly (reference rebuilt from the base
  model) from a Hugging Face-style ``checkpoint-N/``, where the KL happens to dip at the resume.

Each launch is its own process. ``manifest.json`` records, per case, what each process did and what
klwatch must conclude. Run with any interpreter that has the writers (``torch`` for
``torch.utils.tensorboard``, ``lightning``, ``wandb``, ``mlflow``); a missing one is replaced as the
README says and the manifest names the writer actually used.

    python sample_runs/negatives/generate.py [--out DIR] [--cases a,b] [--quiet]
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sample_runs.negatives.policy import PolicyConfig, TinyPolicy, trajectory  # noqa: E402
from sample_runs.trackers import compact_mlflow, prune_wandb  # noqa: E402

HERE = Path(__file__).resolve().parent
CASES = ("eval-pauses", "same-step-train-val", "rerun-appended", "sibling-runs", "resume-at-kl-dip")
SCHEMA = "klwatch.negatives/1"


# ------------------------------------------------------------------------------------ helpers


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def tb_writer(logdir: Path) -> tuple[Any, str]:
    """A real TensorBoard SummaryWriter: torch's when torch is installed, else tensorboardX's."""
    if _has("torch"):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(logdir), flush_secs=1), f"torch.utils.tensorboard (torch {_version('torch')})"
    from tensorboardX import SummaryWriter

    return SummaryWriter(logdir=str(logdir), flush_secs=1), f"tensorboardX {_version('tensorboardX')}"


def _pace(started: float, seconds: float) -> None:
    """Make one training step take ``seconds`` of wall clock, as a real step would."""
    left = seconds - (time.time() - started)
    if left > 0:
        time.sleep(left)


def _process_record(**extra: Any) -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), **extra}


def _run_child(spec: dict[str, Any], *, quiet: bool) -> dict[str, Any]:
    """Run one launch as its own process; it prints its process record as the last stdout line."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                          capture_output=True, text=True, env={**os.environ, "WANDB_SILENT": "true"})
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec['kind']} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    if not quiet and proc.stderr.strip():
        print(proc.stderr.strip()[-2000:], file=sys.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ the trackers


WANDB_SETTINGS = dict(x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                      x_save_requirements=False, console="off", disable_git=True, disable_code=True,
                      save_code=False, silent=True)


def _wandb_run(root: Path, *, name: str, config: dict[str, Any]) -> Any:
    """The real ``wandb`` client, offline, with TRL's step metric (``train/global_step``)."""
    import wandb

    root.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project="klwatch-negatives", dir=str(root), name=name, config=config, mode="offline",
                     settings=wandb.Settings(**WANDB_SETTINGS))
    run.define_metric("train/global_step")
    run.define_metric("*", step_metric="train/global_step", step_sync=True)
    return run


def _mlflow_run(db: Path, *, name: str, config: dict[str, Any]) -> Any:
    """The real ``mlflow`` client on a SQLite store, as verl's MLflow logger uses it."""
    import mlflow
    from mlflow.tracking import MlflowClient

    db.parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(f"sqlite:///{db.resolve()}")
    client = MlflowClient()
    exp = client.get_experiment_by_name("negatives")
    exp_id = exp.experiment_id if exp else client.create_experiment(
        "negatives", artifact_location=(db.parent / "artifacts").resolve().as_uri())
    run = mlflow.start_run(experiment_id=exp_id, run_name=name)
    mlflow.log_params(config)
    return run


# ------------------------------------------------------------------------------- the children


def child_eval_pauses(spec: dict[str, Any]) -> dict[str, Any]:
    """One process, never restarted, that stops for evaluation every ``eval_every`` steps."""
    out = Path(spec["out"])
    cfg = PolicyConfig(**spec["config"])
    policy = TinyPolicy(cfg)
    tb, tb_name = tb_writer(out / "tensorboard")
    tb.add_text("config", json.dumps(cfg.to_dict()))
    run = _wandb_run(out / "wandb", name="eval-pauses", config=cfg.to_dict()) if spec["wandb"] else None
    ml = _mlflow_run(out / "mlflow" / "mlflow.db", name="eval-pauses", config=cfg.to_dict()) if spec["mlflow"] else None
    if ml is not None:
        import mlflow
    pauses: list[dict[str, float]] = []
    started = time.time()
    for step in range(1, cfg.total_steps + 1):
        t0 = time.time()
        m = policy.train_step()
        _pace(t0, spec["step_time"])
        # NeMo-RL's names to TensorBoard, TRL's to W&B, verl's to MLflow: one dialect per tracker
        for k, v in {"train/kl_penalty": m["kl"], "train/loss": m["loss"], "train/reward": m["reward"],
                     "train/lr": m["learning_rate"], "train/grad_norm": m["grad_norm"],
                     "train/entropy": m["entropy"]}.items():
            tb.add_scalar(k, v, step)
        if run is not None:
            run.log({"train/kl": m["kl"], "train/loss": m["loss"], "train/reward": m["reward"],
                     "train/learning_rate": m["learning_rate"], "train/grad_norm": m["grad_norm"],
                     "train/entropy": m["entropy"], "train/epoch": step / cfg.total_steps,
                     "train/global_step": step})
        if ml is not None:
            mlflow.log_metrics({"actor/kl_loss": m["kl"], "actor/pg_loss": m["loss"], "actor/lr": m["learning_rate"],
                                "actor/grad_norm": m["grad_norm"], "actor/entropy": m["entropy"],
                                "critic/score/mean": m["reward"], "training/global_step": step}, step=step)
        if step % spec["eval_every"] == 0 and step < cfg.total_steps:
            t0 = time.time()
            ev = policy.evaluate()
            _pace(t0, spec["eval_pause"])  # the evaluation takes this long: no step is logged meanwhile
            pauses.append({"after_step": step, "seconds": round(time.time() - t0, 3)})
            tb.add_scalar("validation/reward", ev["reward"], step)
            tb.add_scalar("validation/accuracy", ev["accuracy"], step)
            if run is not None:
                run.log({"eval/reward": ev["reward"], "eval/accuracy": ev["accuracy"], "train/global_step": step})
            if ml is not None:
                # verl sanitises "@" to "_at_" for MLflow
                mlflow.log_metrics({"val-core/toy/reward/mean_at_1": ev["reward"]}, step=step)
        tb.flush()
    tb.close()
    rec: dict[str, Any] = _process_record(started_at=started, ended_at=time.time(), first_step=1,
                                          last_step=cfg.total_steps, eval_pauses=pauses,
                                          writers={"tensorboard": tb_name})
    if run is not None:
        rec["writers"]["wandb"] = f"wandb {_version('wandb')} (offline)"
        rec["wandb_run_id"] = run.id
        run.finish()
    if ml is not None:
        rec["writers"]["mlflow"] = f"mlflow {_version('mlflow') or _version('mlflow-skinny')} (sqlite)"
        rec["mlflow_run_id"] = ml.info.run_id
        mlflow.end_run()
    return rec


def child_lightning(spec: dict[str, Any]) -> dict[str, Any]:
    """A real tiny Lightning training on CPU, logged by Lightning's own CSVLogger."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    out = Path(spec["out"])
    steps, val_every = spec["steps"], spec["val_every"]
    L.seed_everything(spec["seed"], workers=True, verbose=False)

    class Policy(L.LightningModule):
        """A linear softmax policy over 6 actions with a KL penalty to its frozen initial copy."""

        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"n_actions": 6, "kl_coef": 1.0, "lr": 0.05, "warmup_steps": 6})
            self.net = torch.nn.Linear(8, 6)
            self.ref = torch.nn.Linear(8, 6)
            self.ref.load_state_dict(self.net.state_dict())
            self.ref.requires_grad_(False)
            self.task = torch.nn.Parameter(torch.randn(8, 6), requires_grad=False)

        def _rollout(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            logp = torch.log_softmax(self.net(x), -1)
            ref_logp = torch.log_softmax(self.ref(x), -1)
            actions = torch.distributions.Categorical(logits=logp).sample()
            reward = (x @ self.task).gather(1, actions[:, None])[:, 0] + 0.5 * torch.randn(len(x))
            adv = (reward - reward.mean()) / (reward.std() + 1e-6)
            lp = logp.gather(1, actions[:, None])[:, 0]
            log_r = ref_logp.gather(1, actions[:, None])[:, 0] - lp
            kl = (log_r.exp() - 1 - log_r).mean()  # k3, as TRL logs it
            return {"loss": -(adv * lp).mean() + self.hparams.kl_coef * kl, "kl": kl, "reward": reward.mean(),
                    "entropy": -(logp.exp() * logp).sum(-1).mean()}

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            r = self._rollout(batch[0])
            for k in ("kl", "loss", "reward", "entropy"):
                self.log(f"train/{k}", r[k], on_step=True, on_epoch=False)
            return r["loss"]

        def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            r = self._rollout(batch[0])
            for k in ("kl", "loss", "reward"):
                self.log(f"val/{k}", r[k], on_step=False, on_epoch=True)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.Adam(self.net.parameters(), lr=self.hparams.lr)
            warm = self.hparams.warmup_steps
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    train = DataLoader(TensorDataset(torch.randn(64 * steps, 8)), batch_size=64)
    val = DataLoader(TensorDataset(torch.randn(256, 8)), batch_size=128)
    logger = CSVLogger(save_dir=str(out), name="lightning_logs")
    trainer = L.Trainer(max_steps=steps, val_check_interval=val_every, check_val_every_n_epoch=None,
                        num_sanity_val_steps=0, log_every_n_steps=1, logger=logger, accelerator="cpu",
                        devices=1, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[LearningRateMonitor(logging_interval="step")])
    started = time.time()
    trainer.fit(Policy(), train_dataloaders=train, val_dataloaders=val)
    return _process_record(started_at=started, ended_at=time.time(), metrics_csv=str(Path(logger.log_dir) / "metrics.csv"),
                           writer=f"lightning {_version('lightning')} CSVLogger (torch {_version('torch')})")


def child_table_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One launch of a training script whose own logger appends one row per step to a CSV and a
    JSONL file (``open(path, "a")``): a second launch from scratch lands after the first."""
    cfg = PolicyConfig(**spec["config"])
    policy = TinyPolicy(cfg)
    csv_path, jsonl_path = Path(spec["csv"]), Path(spec["jsonl"])
    fields = ["step", "kl", "loss", "reward", "learning_rate", "grad_norm", "entropy", "timestamp"]
    started = time.time()
    new = not csv_path.exists()
    with open(csv_path, "a", newline="") as fc, open(jsonl_path, "a") as fj:
        writer = csv.DictWriter(fc, fieldnames=fields)
        if new:
            writer.writeheader()
        for _ in range(cfg.total_steps):
            t0 = time.time()
            m = policy.train_step()
            _pace(t0, spec["step_time"])
            row = {"step": policy.step - 1, **m, "timestamp": round(time.time(), 3)}  # the step about to finish, 0-based
            writer.writerow({k: row[k] for k in fields})
            fj.write(json.dumps(row) + "\n")
            fc.flush()
            fj.flush()
    return _process_record(started_at=started, ended_at=time.time(), first_step=0, last_step=cfg.total_steps - 1)


def child_sibling(spec: dict[str, Any]) -> dict[str, Any]:
    """One run of a sweep: its own folder, its own event file, its own config, step 1 onwards."""
    cfg = PolicyConfig(**spec["config"])
    policy = TinyPolicy(cfg)
    tb, tb_name = tb_writer(Path(spec["logdir"]))
    tb.add_text("config", json.dumps(cfg.to_dict()))
    started = time.time()
    for step in range(1, cfg.total_steps + 1):
        t0 = time.time()
        m = policy.train_step()
        _pace(t0, spec["step_time"])
        for k in ("kl", "loss", "reward", "learning_rate", "grad_norm", "entropy"):
            tb.add_scalar(f"train/{k}", m[k], step)
    tb.close()
    return _process_record(started_at=started, ended_at=time.time(), first_step=1, last_step=cfg.total_steps,
                           writer=tb_name)


def trl_args(cfg: PolicyConfig, out: Path) -> dict[str, Any]:
    """The TrainingArguments/GRPOConfig keys a TRL run logs as its ``args`` text (defaults included:
    ``sync_ref_model`` is off, so ``ref_model_sync_steps``/``ref_model_mixup_alpha`` declare nothing)."""
    return {"output_dir": str(out), "logging_dir": str(out / "logs"), "learning_rate": cfg.lr,
            "max_steps": cfg.total_steps, "warmup_steps": cfg.warmup_steps, "lr_scheduler_type": "cosine",
            "logging_steps": 1, "save_steps": 10, "save_total_limit": None, "seed": cfg.seed, "beta": cfg.kl_coef,
            "per_device_train_batch_size": cfg.batch, "sync_ref_model": False, "ref_model_sync_steps": 512,
            "ref_model_mixup_alpha": 0.6, "report_to": ["tensorboard"], "resume_from_checkpoint": None}


def child_hf_launch(spec: dict[str, Any]) -> dict[str, Any]:
    """One launch of a Hugging Face Trainer-style run: logs ``train/*`` to TensorBoard in
    ``logs/`` (a new event file per process), saves ``checkpoint-N/`` every ``save_steps`` (all
    kept: ``save_total_limit`` is None, the Trainer's default). Resuming loads the newest checkpoint's weights, optimizer
    moments, RNG and step, and rebuilds the reference from the base model (the correct order)."""
    out = Path(spec["out"])
    cfg = PolicyConfig(**spec["config"])
    policy = TinyPolicy(cfg)  # the reference is the base model, whatever the checkpoint holds
    args = trl_args(cfg, out)
    log_history: list[dict[str, Any]] = []
    resumed_from = None
    if spec["resume"]:
        ckpt = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        policy.load_state_dict(json.loads((ckpt / "training_state.json").read_text()))
        log_history = json.loads((ckpt / "trainer_state.json").read_text())["log_history"]
        resumed_from = policy.step
        args["resume_from_checkpoint"] = str(ckpt)
    tb, tb_name = tb_writer(out / "logs")
    tb.add_text("args", json.dumps(args))
    started = time.time()
    first = policy.step + 1
    while policy.step < spec["stop_after"]:
        t0 = time.time()
        m = policy.train_step()
        _pace(t0, spec["step_time"])
        step = policy.step
        row = {"epoch": step / cfg.total_steps, **m, "step": step}
        log_history.append(row)
        for k in ("loss", "grad_norm", "learning_rate", "kl", "reward", "entropy", "epoch"):
            tb.add_scalar(f"train/{k}", row[k], step)
        if step % args["save_steps"] == 0:
            ckpt = out / f"checkpoint-{step}"
            ckpt.mkdir(parents=True, exist_ok=True)
            (ckpt / "training_state.json").write_text(json.dumps(policy.state_dict()))
            (ckpt / "trainer_state.json").write_text(json.dumps({
                "best_metric": None, "best_model_checkpoint": None, "epoch": step / cfg.total_steps,
                "eval_steps": 500, "global_step": step, "is_hyper_param_search": False,
                "is_local_process_zero": True, "is_world_process_zero": True, "log_history": log_history,
                "logging_steps": 1, "max_steps": cfg.total_steps, "num_input_tokens_seen": 0,
                "num_train_epochs": 1, "save_steps": args["save_steps"], "total_flos": 0.0,
                "train_batch_size": cfg.batch, "trial_name": None, "trial_params": None}, indent=2))
            if args["save_total_limit"]:
                kept = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
                for old in kept[: -args["save_total_limit"]]:
                    shutil.rmtree(old)
        tb.flush()
    tb.close()
    return _process_record(started_at=started, ended_at=time.time(), first_step=first, last_step=policy.step,
                           resumed_from_step=resumed_from, reference_from="base", writer=tb_name)


CHILDREN = {"eval-pauses": child_eval_pauses, "lightning": child_lightning, "table-run": child_table_run,
            "sibling": child_sibling, "hf-launch": child_hf_launch}


# ---------------------------------------------------------------------------------- the cases


def case_eval_pauses(out: Path, *, step_time: float, eval_pause: float, quiet: bool) -> list[dict[str, Any]]:
    cfg = PolicyConfig(kl_coef=1.0, seed=11, total_steps=60)
    spec = {"kind": "eval-pauses", "out": str(out), "config": cfg.to_dict(), "step_time": step_time,
            "eval_every": 10, "eval_pause": eval_pause, "wandb": _has("wandb"), "mlflow": _has("mlflow")}
    rec = _run_child(spec, quiet=quiet)
    compact_mlflow(out / "mlflow" / "mlflow.db")
    common = {"case": "eval-pauses", "training_runs": 1, "boundaries": [], "expected_status": "ok",
              "expected_findings": [], "processes": [rec], "config": cfg.to_dict(),
              "what": f"one process, never restarted, logging every step (~{step_time} s) and pausing "
                      f"~{eval_pause} s for evaluation every 10 steps"}
    entries = [{**common, "tracker": "tensorboard", "path": "eval-pauses/tensorboard", "kl_metric": "train/kl_penalty",
                "writer": rec["writers"]["tensorboard"]}]
    if "wandb" in rec["writers"]:
        entries.append({**common, "tracker": "wandb", "path": "eval-pauses/wandb", "kl_metric": "train/kl",
                        "writer": rec["writers"]["wandb"]})
    if "mlflow" in rec["writers"]:
        entries.append({**common, "tracker": "mlflow", "path": "eval-pauses/mlflow", "kl_metric": "actor/kl_loss",
                        "writer": rec["writers"]["mlflow"]})
    return entries


def _lightning_layout(out: Path, *, steps: int, val_every: int, seed: int) -> dict[str, Any]:
    """Without Lightning: the same ``metrics.csv`` layout its CSVLogger writes (sorted columns,
    train rows per step, a validation row at the same step, empty cells for what a row lacks)."""
    cfg = PolicyConfig(kl_coef=1.0, seed=seed, total_steps=steps, warmup_steps=6)
    policy = TinyPolicy(cfg)
    rows: list[dict[str, Any]] = []
    for i in range(steps):
        m = policy.train_step()
        # LearningRateMonitor's row (no epoch), then the train row, then at a validation step the
        # validation row: three rows with one step, as Lightning writes them
        rows.append({"step": i, "lr-Adam": m["learning_rate"]})
        rows.append({"epoch": 0, "step": i, "train/kl": m["kl"], "train/loss": m["loss"],
                     "train/reward": m["reward"], "train/entropy": m["entropy"]})
        if (i + 1) % val_every == 0:
            ev = policy.evaluate()
            rows.append({"epoch": 0, "step": i, "val/kl": m["kl"], "val/loss": m["loss"], "val/reward": ev["reward"]})
    log_dir = out / "lightning_logs" / "version_0"
    log_dir.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r})
    with open(log_dir / "metrics.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    (log_dir / "hparams.yaml").write_text("kl_coef: 1.0\nlr: 0.05\nn_actions: 6\nwarmup_steps: 6\n")
    return _process_record(metrics_csv=str(log_dir / "metrics.csv"),
                           writer="the layout of Lightning's CSVLogger, written by this generator "
                                  "(lightning is not installed in this interpreter)")


def case_same_step_train_val(out: Path, *, quiet: bool) -> list[dict[str, Any]]:
    steps, val_every, seed = 60, 10, 7
    if _has("lightning") and _has("torch"):
        rec = _run_child({"kind": "lightning", "out": str(out), "steps": steps, "val_every": val_every,
                          "seed": seed}, quiet=quiet)
    else:
        rec = _lightning_layout(out, steps=steps, val_every=val_every, seed=seed)
    metrics = Path(rec["metrics_csv"])
    with open(metrics, newline="") as fh:
        rows = list(csv.DictReader(fh))
    val_steps = sorted({int(r["step"]) for r in rows if r.get("val/kl")})
    train_steps = {int(r["step"]) for r in rows if r.get("train/kl")}
    rec["metrics_csv"] = str(metrics.relative_to(out.parent))
    return [{"case": "same-step-train-val", "tracker": "table", "path": "same-step-train-val",
             "training_runs": 1, "boundaries": [], "expected_status": "ok", "expected_findings": [],
             "kl_metric": "train/kl", "writer": rec["writer"], "processes": [rec],
             "validation_steps": val_steps, "validation_steps_shared_with_train_rows": sorted(train_steps & set(val_steps)),
             "what": f"one Lightning training of {steps} steps validating every {val_every}: metrics.csv holds "
                     "train rows and validation rows with the same step"}]


def case_rerun_appended(out: Path, *, step_time: float, quiet: bool) -> list[dict[str, Any]]:
    cfg = PolicyConfig(kl_coef=1.0, seed=3, total_steps=40)
    (out / "csv").mkdir(parents=True, exist_ok=True)
    (out / "jsonl").mkdir(parents=True, exist_ok=True)
    spec = {"kind": "table-run", "config": cfg.to_dict(), "step_time": step_time,
            "csv": str(out / "csv" / "metrics.csv"), "jsonl": str(out / "jsonl" / "metrics.jsonl")}
    recs = []
    for launch in range(2):
        if launch:
            time.sleep(1.0)  # the user looks at the first run, then runs the same command again
        recs.append({"index": launch, "resumed_from_step": None, **_run_child(spec, quiet=quiet)})
    rows = (out / "jsonl" / "metrics.jsonl").read_text().splitlines()
    first, second = json.loads(rows[0]), json.loads(rows[cfg.total_steps])
    same_start = all(first[k] == second[k] for k in ("step", "kl", "loss", "reward", "learning_rate"))
    common = {"case": "rerun-appended", "tracker": "table", "training_runs": 2, "boundaries": [],
              "expected_status": "ok", "expected_findings": [], "kl_metric": "kl", "processes": recs,
              "config": cfg.to_dict(), "step0_values_identical": same_start, "checkpoints": [],
              "writer": f"Python {sys.version.split()[0]} csv/json, files opened in append mode",
              "what": "the same command run twice from scratch (steps 0..39, LR warm-up from 0 each time), "
                      "both appending to one table; no checkpoint exists"}
    return [{**common, "path": "rerun-appended/csv"}, {**common, "path": "rerun-appended/jsonl"}]


def case_sibling_runs(out: Path, *, step_time: float, quiet: bool, n: int = 12) -> list[dict[str, Any]]:
    recs = []
    for k in range(n):
        cfg = PolicyConfig(kl_coef=1.0, seed=100 + k, lr=(0.04, 0.06, 0.08)[k % 3], total_steps=25)
        logdir = out / "runs" / f"run-{k:04d}"
        rec = _run_child({"kind": "sibling", "logdir": str(logdir), "config": cfg.to_dict(),
                          "step_time": step_time}, quiet=quiet)
        recs.append({"folder": f"sibling-runs/runs/run-{k:04d}", "config": cfg.to_dict(), **rec})
    return [{"case": "sibling-runs", "tracker": "tensorboard", "path": "sibling-runs", "training_runs": n,
             "boundaries": [], "expected_status": "ok", "expected_findings": [], "kl_metric": "train/kl",
             "writer": recs[0]["writer"], "processes": recs, "run_folders": [r["folder"] for r in recs],
             "what": f"a sweep of {n} independent runs launched one after another, each in its own numbered "
                     "folder with its own event file, each from step 1"}]


def dip_config(start_seed: int = 365) -> tuple[PolicyConfig, int]:
    """A run and a checkpoint step where the KL at the first step after the checkpoint is a clear
    local dip (well below its recent level, not near 0) and the next points are back at the level.
    Searched, not forced: the KL is whatever the training gives."""
    import numpy as np

    for seed in [start_seed, *range(1000)]:
        cfg = PolicyConfig(kl_coef=1.0, seed=seed, total_steps=60)
        kl = [m["kl"] for m in trajectory(cfg)]
        k = lambda s: kl[s - 1]  # noqa: E731
        for c in (30, 40):
            level = float(np.median([k(s) for s in range(c - 9, c + 1)]))
            a = k(c + 1)
            if (a < min(k(c), k(c + 2)) and 0.25 * level <= a <= 0.6 * level and min(k(c + 2), k(c + 3)) >= 0.8 * level
                    and min(k(c - 2), k(c - 1), k(c)) >= 0.7 * level):
                return cfg, c
    raise RuntimeError("no seed gives a KL dip at a checkpoint")


def case_resume_at_kl_dip(out: Path, *, step_time: float, quiet: bool) -> list[dict[str, Any]]:
    cfg, ckpt = dip_config()
    base = {"kind": "hf-launch", "out": str(out), "config": cfg.to_dict(), "step_time": step_time}
    recs = [{"index": 0, **_run_child({**base, "resume": False, "stop_after": ckpt}, quiet=quiet)}]
    time.sleep(1.0)  # preempted after saving checkpoint-<ckpt>; the job is requeued
    recs.append({"index": 1, **_run_child({**base, "resume": True, "stop_after": cfg.total_steps}, quiet=quiet)})
    for ck in out.glob("checkpoint-*"):  # the resume evidence stays; weights are not needed to read it
        (ck / "training_state.json").unlink(missing_ok=True)
    history = {r["step"]: r for r in json.loads((out / f"checkpoint-{cfg.total_steps}" / "trainer_state.json")
                                                .read_text())["log_history"]}
    continuous = trajectory(cfg)
    # bit for bit: the resumed process restored every piece of state (JSON round-trips floats exactly)
    reproduces = all(history[s]["kl"] == continuous[s - 1]["kl"] for s in range(1, cfg.total_steps + 1))
    return [{"case": "resume-at-kl-dip", "tracker": "tensorboard", "path": "resume-at-kl-dip", "training_runs": 1,
             "boundaries": [{"step": ckpt + 1, "resumed_from_step": ckpt, "expected_verdict": "ok"}],
             "expected_status": "ok", "expected_findings": [], "kl_metric": "train/kl", "writer": recs[0]["writer"],
             "processes": recs, "config": cfg.to_dict(), "resume_reproduces_continuous_run": reproduces,
             "kl_around_resume": {str(s): round(history[s]["kl"], 6) for s in range(ckpt - 3, ckpt + 5)},
             "what": f"two processes; the second resumes from checkpoint-{ckpt} with the reference rebuilt from "
                     f"the base model; the KL at step {ckpt + 1} happens to be a local dip"}]


# ------------------------------------------------------------------------------------- driver


def write_case(case: str, out: Path, *, step_time: float, eval_pause: float, quiet: bool) -> list[dict[str, Any]]:
    target = out / case
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    t0 = time.time()
    if case == "eval-pauses":
        entries = case_eval_pauses(target, step_time=step_time, eval_pause=eval_pause, quiet=quiet)
    elif case == "same-step-train-val":
        entries = case_same_step_train_val(target, quiet=quiet)
    elif case == "rerun-appended":
        entries = case_rerun_appended(target, step_time=step_time, quiet=quiet)
    elif case == "sibling-runs":
        entries = case_sibling_runs(target, step_time=step_time / 2, quiet=quiet)
    else:
        entries = case_resume_at_kl_dip(target, step_time=step_time, quiet=quiet)
    prune_wandb(target)
    if not quiet:
        print(f"{case}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in {time.time() - t0:.1f} s",
              file=sys.stderr)
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="where to write (default: this folder)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--step-time", type=float, default=0.05, help="wall-clock seconds per training step")
    ap.add_argument("--eval-pause", type=float, default=1.5, help="seconds each evaluation pause lasts")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(CHILDREN[spec["kind"]](spec)))
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown case(s): {', '.join(unknown)}")
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    entries = [e for e in old.get("cases", []) if e["case"] not in cases]
    for case in cases:
        entries.extend(write_case(case, out, step_time=args.step_time, eval_pause=args.eval_pause, quiet=args.quiet))
    entries.sort(key=lambda e: (CASES.index(e["case"]), e["path"]))
    manifest = {
        "schema": SCHEMA,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "generator": {"python": sys.version.split()[0],
                      "packages": {p: _version(p) for p in ("numpy", "torch", "tensorboard", "tensorboardX",
                                                            "lightning", "wandb", "mlflow", "mlflow-skinny")}},
        "expectation": "no lineage reference_reset; exactly the boundaries listed (step, verdict); no findings; "
                       "training_runs lineages per path",
        "cases": entries,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
