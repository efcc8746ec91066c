"""Small TensorBoard fleets for the dashboard tests, written with tensorboardX (a real writer).

Each training run is a folder; each launch writes its own event file, as NeMo-RL and verl do. A
buggy run's KL restarts from zero after each resume (the reference was rebuilt from the resumed
weights); a fixed run's KL continues at its level.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _lr(step: int, steps: int) -> float:
    """Warm-up over 10 steps, then cosine decay to a tenth: the schedule trainers log."""
    if step <= 10:
        return 1e-5 * step / 10
    return 1e-6 + 9e-6 * 0.5 * (1 + np.cos(np.pi * (step - 10) / (steps - 10)))


def write_run(root: Path, *, name: str, resumes: list[int], buggy: bool, steps: int = 120, seed: int = 0,
              extra: bool = True, lr_restart: bool = False) -> Path:
    """One training run: KL (``train/kl_penalty``) plus loss, reward and learning rate, one event file per launch.
    With ``lr_restart`` the learning-rate schedule starts over at each resume (the scheduler's state was
    not restored) while the KL carries on: an ``ok`` run with a finding."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(seed)
    folder = root / name
    starts = [1, *resumes, steps + 1]
    t0 = 1_760_000_000.0
    for k in range(len(starts) - 1):
        writer = SummaryWriter(str(folder), filename_suffix=f".launch{k}", flush_secs=3600, max_queue=10_000)
        anchor = starts[k] - 1 if (buggy and k) else 0
        for step in range(starts[k], starts[k + 1]):
            wall = t0 + step * 10.0 + k * 3_600.0  # an hour between launches
            kl = 0.05 * (1.0 - np.exp(-(step - anchor) / 30.0)) * float(np.exp(rng.normal(0.0, 0.05)))
            writer.add_scalar("train/kl_penalty", kl, step, walltime=wall)
            if extra:
                writer.add_scalar("train/loss", 1.0 / (1.0 + step / 50.0) + rng.normal(0.0, 0.01), step, walltime=wall)
                writer.add_scalar("train/reward", 0.2 + step / 200.0 + rng.normal(0.0, 0.02), step, walltime=wall)
                lr = _lr(step - (starts[k] - 1 if lr_restart and k else 0), steps) if lr_restart else 1e-6
                writer.add_scalar("train/lr", lr, step, walltime=wall)
        writer.close()
    return folder


def write_fleet(root: Path) -> Path:
    """A flagged run (two resumes, reference reset at both), a fixed one and one that never restarted."""
    write_run(root, name="grpo-resume-buggy", resumes=[41, 81], buggy=True, seed=1)
    write_run(root, name="grpo-resume-fixed", resumes=[41, 81], buggy=False, seed=2)
    write_run(root, name="grpo-continuous", resumes=[], buggy=False, seed=3)
    return root


def write_paused_run(root: Path, *, name: str, pauses: list[int], steps: int = 120, seed: int = 0) -> Path:
    """One process, one event file, pausing an hour before each step of ``pauses`` (pauses alike: the
    run's routine, as evaluation is), its KL starting again from zero after each pause. Whether such a
    pause is a restart only the KL can tell, so the detector thresholds decide it."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(seed)
    writer = SummaryWriter(str(root / name), flush_secs=3600, max_queue=10_000)
    for step in range(1, steps + 1):
        k = sum(step >= p for p in pauses)
        anchor = pauses[k - 1] - 1 if k else 0
        kl = 0.05 * (1.0 - np.exp(-(step - anchor) / 30.0)) * float(np.exp(rng.normal(0.0, 0.05)))
        writer.add_scalar("train/kl_penalty", kl, step, walltime=1_760_000_000.0 + step * 10.0 + k * 3_600.0)
    writer.close()
    return root / name


def write_mlflow_store(root: Path, *, run_name: str, experiment: str = "grpo", param: str = "1e-6",
                       buggy: bool = True) -> Path:
    """An MLflow file store (``mlruns/``) as MLflow lays it out: one experiment, a run and its resumed
    continuation, both named ``run_name``; the run name, the experiment name and a param are any
    text, as a tracker stores what a person typed."""
    import yaml

    exp = root / "mlruns" / "1"
    exp.mkdir(parents=True)
    (exp / "meta.yaml").write_text(yaml.safe_dump({"experiment_id": "1", "name": experiment,
                                                   "lifecycle_stage": "active", "artifact_location": "x"}))
    t0 = 1_760_000_000_000
    for k, (rid, lo, hi) in enumerate([("a1b2c3d4e5", 1, 40), ("f6a7b8c9d0", 41, 80)]):
        run = exp / rid
        for sub in ("metrics/train", "tags", "params"):
            (run / sub).mkdir(parents=True)
        start = t0 + k * 3_600_000
        (run / "meta.yaml").write_text(yaml.safe_dump({
            "run_id": rid, "run_uuid": rid, "experiment_id": "1", "status": 3, "start_time": start,
            "end_time": start + 100_000, "lifecycle_stage": "active", "run_name": run_name}))
        (run / "tags" / "mlflow.runName").write_text(run_name)
        (run / "params" / "learning_rate").write_text(param)
        anchor = lo - 1 if (buggy and k) else 0
        lines = [f"{start + s * 1000} {0.05 * (1.0 - np.exp(-(s - anchor) / 8.0))} {s}" for s in range(lo, hi + 1)]
        (run / "metrics" / "train" / "kl_penalty").write_text("\n".join(lines) + "\n")
    return root


def write_findings_fleet(root: Path) -> Path:
    """A flagged run, a healthy resumed one, one whose LR schedule restarts at its resume (KL fine:
    status ``ok``, with an ``lr_schedule_restart`` finding at step 61), and the flagged run's control
    (same seed, never restarted: the two agree up to the resume and part there)."""
    write_run(root, name="grpo-resume-buggy", resumes=[61], buggy=True, seed=1)
    write_run(root, name="grpo-control", resumes=[], buggy=False, seed=1)
    write_run(root, name="grpo-resume-fixed", resumes=[61], buggy=False, seed=2)
    write_run(root, name="grpo-lr-restart", resumes=[61], buggy=False, seed=4, lr_restart=True)
    return root
