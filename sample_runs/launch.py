"""One training process: ``python -m sample_runs.launch SPEC.json``.

Why a process of its own: a restart in real training is a new process, so each launch writes its
own event file / W&B run folder / MLflow run, the tracker's runtime counter restarts, and there is a
real wall-clock gap. The generator starts one of these per launch and reads back the result file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sample_runs import grpo, trackers  # noqa: E402


def open_writer(spec: dict[str, Any], *, config: dict[str, Any], first_step: int) -> trackers.TrackerWriter:
    tracker = spec["tracker"]
    if tracker == "tensorboard":
        cls = trackers.TensorboardXWriter if spec["writer"] == "tensorboardX" else trackers.TensorboardV2Writer
        return cls(logdir=Path(spec["tb_dir"]), config=config, first_step=first_step)
    if tracker == "wandb":
        return trackers.WandbWriter(
            root=Path(spec["wandb_root"]),
            project=spec["project"],
            name=spec["name"],
            group=spec["group"],
            config=config,
            run_id=spec.get("wandb_id"),
            resume=spec["layout"] == "resume",
            step_metric=trackers.STEP_METRIC[spec["flavour"]],
        )
    if tracker == "mlflow":
        return trackers.MlflowWriter(
            tracking_uri=spec["mlflow_uri"],
            experiment=spec["project"],
            artifact_root=Path(spec["mlflow_artifacts"]),
            name=spec["name"],
            group=spec["group"],
            config=config,
            run_id=spec.get("mlflow_run_id"),
        )
    if tracker == "verl-file":
        return trackers.VerlFileWriter(verl_src=Path(spec["verl_src"]), root=Path(spec["verl_file_root"]),
                                       project=spec["project"], experiment=spec["name"])
    raise ValueError(f"unknown tracker {tracker!r}")


def logged_config(cfg: grpo.TrainConfig) -> dict[str, Any]:
    """The config as a framework logs it: unset options are absent, not ``null``."""
    return {k: v for k, v in cfg.to_dict().items() if v is not None}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    cfg = grpo.TrainConfig.from_dict(spec["config"])
    config = logged_config(cfg)
    first = 1 if spec["resume_from"] is None else spec["resume_from"] + 1
    writer = open_writer(spec, config=config, first_step=first)
    adaptive = cfg.kl_ctrl == "adaptive"

    def on_step(log: grpo.StepLog) -> None:
        writer.log(log.step, trackers.flavour_metrics(log, flavour=spec["flavour"], adaptive_kl=adaptive))

    result = grpo.launch(
        cfg=cfg,
        ckpt_root=Path(spec["ckpt_root"]),
        resume_from=spec["resume_from"],
        stop_after=spec["stop_after"],
        order=spec["order"],
        lose=spec["lose"],
        on_step=on_step,
        step_delay=spec.get("step_delay", 0.0),
    )
    where = writer.close(crashed=result.crashed)
    return {**asdict(result), "tracker": where, "pid": os.getpid(), "started_at": started, "ended_at": time.time()}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = run(spec)
    Path(spec["result_path"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
