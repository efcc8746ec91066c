"""Generate klwatch's sample runs: real training processes logging through the real trackers.

    .venv/bin/python sample_runs/generate.py                       # regenerate the committed data
    .venv/bin/python sample_runs/generate.py --out /tmp/s --scenarios resume-buggy --trackers tensorboard

Every launch of a training run is its own process (``sample_runs/launch.py``), so each restart writes
a new event file / W&B run folder / MLflow run (or resumes the same one), the tracker's runtime
restarts and there is a real wall-clock gap. ``manifest.json`` records what was actually done —
where each process started, which checkpoint it loaded, how its reference was built, which faults
were planted — and the verdict klwatch should reach at every boundary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sample_runs import grpo, scenarios, trackers  # noqa: E402
from sample_runs.trackers import compact_mlflow, prune_wandb  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRACKERS = ("tensorboard", "wandb", "mlflow")
LAYOUTS: dict[str, tuple[str, ...]] = {"tensorboard": ("new-file",), "wandb": ("new-run", "resume"),
                                       "mlflow": ("new-run", "resume")}
PROJECT = "klwatch-samples"
DEFAULT_STEPS = 40
DEFAULT_CONFIG = grpo.TrainConfig().to_dict()
CORE = ("continuous", "resume-fixed", "resume-buggy", "ratchet-buggy", "rewind-fixed", "rewind-buggy",
        "kl-off", "intentional-reset")
ALL = CORE + ("early-resume-buggy", "lr-restart", "optimizer-reset", "data-restart", "kl-coef-reset")
COVERAGE: dict[str, dict[tuple[str, str], tuple[str, ...]]] = {
    # What the committed sample_runs/ holds, to stay under the 3 MB cap: every scenario in
    # TensorBoard and in W&B's new-run layout; in the second layouts and in MLflow (whose SQLite
    # store costs ~300 bytes per logged value) the scenarios whose reading depends on the layout.
    # (The ratchet is left out of W&B's resume layout, where its one id resumed three times adds
    # nothing the single resumes and the rewinds there do not show.)
    "committed": {
        ("tensorboard", "new-file"): ALL,
        ("wandb", "new-run"): ALL,
        ("wandb", "resume"): ("resume-fixed", "resume-buggy", "rewind-fixed", "rewind-buggy"),
        ("mlflow", "new-run"): ("resume-buggy", "ratchet-buggy", "intentional-reset", "kl-coef-reset"),
        ("mlflow", "resume"): ("resume-buggy", "rewind-fixed", "rewind-buggy"),
    },
    # Every scenario in every tracker's first layout, the core ones in the second layout too.
    "full": {
        ("tensorboard", "new-file"): ALL,
        ("wandb", "new-run"): ALL,
        ("wandb", "resume"): CORE,
        ("mlflow", "new-run"): ALL,
        ("mlflow", "resume"): CORE,
    },
}
GENERATED = ("tensorboard", "wandb", "mlflow", "manifest.json")
FAULT_OF_LOST_STATE = {
    "scheduler": "lr_schedule_restart",
    "optimizer": "optimizer_state_lost",
    "sampler": "data_order_restart",
    "kl_controller": "kl_coef_reset",
}
EARLY_KL_FRACTION = 0.05
"""A buggy resume whose pre-resume KL is below this fraction of the run's peak KL is expected to be
judged ``inconclusive``: the KL had not grown yet, so a drop cannot be told from noise."""


@dataclass(frozen=True)
class RunPlan:
    """One training run to produce: a scenario written by one tracker in one layout."""

    scenario: scenarios.Scenario
    tracker: str
    layout: str
    config: grpo.TrainConfig

    @property
    def flavour(self) -> trackers.Flavour:
        return trackers.FLAVOUR_OF_TRACKER[self.tracker]

    @property
    def name(self) -> str:
        if self.tracker == "tensorboard":
            return self.scenario.name
        return f"{self.scenario.name}.{self.layout}"

    @property
    def lane(self) -> str:
        """Runs of one lane run one after another; lanes run side by side."""
        return f"{self.tracker}:{self.layout}"


def plan_runs(*, steps: int, names: Sequence[str] | None, tracker_names: Sequence[str],
              layouts: Sequence[str] | None, coverage: str = "committed") -> list[RunPlan]:
    """The runs to produce: named scenarios in every selected tracker and layout, else a coverage."""
    table = scenarios.build(steps=steps)
    unknown = [n for n in (names or []) if n not in table]
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(table)}")
    plans = []
    for tracker in tracker_names:
        for layout in LAYOUTS[tracker]:
            if layouts and layout not in layouts:
                continue
            for sc in table.values():
                if names and sc.name not in names:
                    continue
                if not names and sc.name not in COVERAGE[coverage][(tracker, layout)]:
                    continue
                cfg = grpo.TrainConfig.from_dict({**grpo.TrainConfig().to_dict(), **sc.overrides})
                if tracker == "mlflow" and cfg.kl_coef > 0:
                    cfg = replace(cfg, kl_ctrl="adaptive")  # verl flavour: an adaptive KL controller
                plans.append(RunPlan(sc, tracker, layout, cfg))
    return plans


# ------------------------------------------------------------------------------------ running


def _env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONSOLE="off",
        WANDB_CACHE_DIR=str(scratch / "wandb-cache"),
        WANDB_CONFIG_DIR=str(scratch / "wandb-config"),
        WANDB_DATA_DIR=str(scratch / "wandb-data"),
        MLFLOW_ENABLE_ASYNC_LOGGING="false",
        PYTHONHASHSEED="0",
    )
    env.pop("WANDB_RUN_ID", None)
    env.pop("MLFLOW_RUN_ID", None)
    return env


def run_training(plan: RunPlan, *, out: Path, scratch: Path, step_delay: float, restart_gap: float,
                 db_ready: threading.Event | None = None) -> dict[str, Any]:
    """Run every launch of one training run, each in a new process; return their results.

    ``db_ready``: MLflow runs share one SQLite store, whose tables the first launch creates; the
    other lanes wait for it so two processes never race to create the schema.
    """
    key = f"{plan.tracker}-{plan.layout}-{plan.scenario.name}"
    work = scratch / key
    work.mkdir(parents=True)
    if plan.tracker == "tensorboard":
        ckpt_root = out / "tensorboard" / plan.scenario.name / "checkpoints"
    else:
        ckpt_root = work / "checkpoints"
    spec: dict[str, Any] = {
        "tracker": plan.tracker,
        "layout": plan.layout,
        "flavour": plan.flavour,
        "writer": plan.scenario.tb_writer,
        "name": plan.name,
        "group": plan.name,
        "project": PROJECT,
        "config": plan.config.to_dict(),
        "ckpt_root": str(ckpt_root),
        "tb_dir": str(out / "tensorboard" / plan.scenario.name),
        "wandb_root": str(out / "wandb" / plan.layout),
        "mlflow_uri": f"sqlite:///{(out / 'mlflow' / 'mlflow.db').resolve()}",
        "mlflow_artifacts": str(out / "mlflow" / "artifacts"),
        "step_delay": step_delay,
    }
    if plan.tracker == "mlflow":
        (out / "mlflow").mkdir(parents=True, exist_ok=True)
    if plan.tracker == "wandb" and plan.layout == "resume":
        spec["wandb_id"] = secrets.token_hex(4)
    results = []
    for i, launch in enumerate(plan.scenario.launches):
        if i:
            time.sleep(restart_gap)  # the job scheduler's delay before the restarted job runs
        spec.update(
            resume_from=launch.resume_from,
            stop_after=launch.stop_after,
            order=launch.order,
            lose=list(launch.lose),
            result_path=str(work / f"result-{i}.json"),
        )
        spec_path = work / f"spec-{i}.json"
        spec_path.write_text(json.dumps(spec))

        proc = subprocess.run(
            [sys.executable, "-m", "sample_runs.launch", str(spec_path)],
            cwd=work, env=_env(scratch), capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{key}: launch {i} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        if db_ready is not None:
            db_ready.set()
        res = json.loads(Path(spec["result_path"]).read_text())
        if plan.tracker == "mlflow" and plan.layout == "resume":
            spec["mlflow_run_id"] = res["tracker"]["run_id"]
        results.append(res)
    return {"plan": plan, "results": results}


# ------------------------------------------------------------------------------------- pruning


def prune_checkpoints(root: Path) -> None:
    """Keep ``step_N/training_info.json`` (the resume evidence); drop weights and optimizer state."""
    for step_dir in root.glob("tensorboard/*/checkpoints/step_*"):
        for p in step_dir.iterdir():
            if p.name != "training_info.json":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    for tmp in root.glob("tensorboard/*/checkpoints/tmp_step_*"):
        shutil.rmtree(tmp)


# ------------------------------------------------------------------------------------ manifest


def _rel(p: str | Path, out: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(out.resolve()))
    except ValueError:
        return str(p)


def manifest_entry(done: dict[str, Any], *, out: Path) -> dict[str, Any]:
    """What one training run did, and the verdicts klwatch should reach, derived from the results."""
    plan: RunPlan = done["plan"]
    results: list[dict[str, Any]] = done["results"]
    flavour = plan.flavour
    kl_by_step: dict[int, float] = {}
    all_kl: list[float] = []
    for r in results:
        all_kl.extend(r["kl"])
    peak = max(all_kl) if all_kl else 0.0
    kl_disabled = plan.config.kl_coef == 0.0

    processes = []
    boundaries = []
    faults = []
    relogged: list[int] = []
    declared_resets: list[int] = []
    for i, r in enumerate(results):
        proc: dict[str, Any] = {
            "index": i,
            "first_step": r["first_step"],
            "last_step": r["last_step"],
            "resumed_from_step": r["resumed_from_step"],
            "crashed": r["crashed"],
            "reference_from": r["reference_from"],
            "lost_state": r["lost_state"],
            "started_at": r["started_at"],
            "ended_at": r["ended_at"],
            "checkpoints_saved": r["checkpoints_saved"],
        }
        where = r["tracker"]
        if plan.tracker == "tensorboard":
            proc["event_files"] = [_rel(p, out) for p in where["event_files"]]
        elif plan.tracker == "wandb":
            proc["run_dir"] = _rel(where["run_dir"], out)
            proc["run_id"] = where["run_id"]
        else:
            proc["run_id"] = where["run_id"]
        processes.append(proc)
        declared_resets.extend(r["reference_resets"])
        if i:
            prev = results[i - 1]
            resumed = r["resumed_from_step"]
            window = [kl_by_step[s] for s in sorted(kl_by_step) if s <= resumed][-3:]
            level = sum(window) / len(window) if window else 0.0
            if r["reference_from"] == "declared-resnapshot":
                verdict, why = "intentional", "the config declares reference_reset_on_resume"
            elif kl_disabled:
                verdict, why = "inconclusive", "KL penalty off: the KL is 0 throughout"
            elif r["reference_from"] == "checkpoint":
                if level < EARLY_KL_FRACTION * peak:
                    verdict, why = "inconclusive", (
                        f"reference rebuilt from resumed weights, but the KL before the resume "
                        f"({level:.2g}) was under {EARLY_KL_FRACTION:.0%} of the run's peak ({peak:.2g})")
                else:
                    verdict, why = "reference_reset", "reference rebuilt from the resumed weights"
            else:
                verdict, why = "ok", "reference snapshotted from the base weights"
            if resumed < prev["last_step"]:
                relogged.extend(range(resumed + 1, prev["last_step"] + 1))
            boundaries.append({
                "step": r["first_step"],
                "resumed_from_step": resumed,
                "previous_last_step": prev["last_step"],
                "reference_from": r["reference_from"],
                "expected_verdict": verdict,
                "why": why,
                "kl_last_before": prev["kl"][-1] if prev["kl"] else None,
                "kl_at_checkpoint": kl_by_step.get(resumed),
                "kl_first_after": r["kl"][0] if r["kl"] else None,
            })
            for lost in r["lost_state"]:
                faults.append({"fault": FAULT_OF_LOST_STATE[lost], "step": r["first_step"],
                               "resumed_from_step": resumed})
        for k, v in zip(range(r["first_step"], r["last_step"] + 1), r["kl"]):
            kl_by_step[k] = v  # a re-logged step is overwritten by what the resumed process logged

    verdicts = [b["expected_verdict"] for b in boundaries]
    if kl_disabled:
        status = "kl_disabled"
    elif "reference_reset" in verdicts:
        status = "reference_reset"
    elif "inconclusive" in verdicts:  # a resume that cannot be judged: the run is not known to be well
        status = "inconclusive"
    elif "intentional" in verdicts:
        status = "intentional"
    else:
        status = "ok"

    entry: dict[str, Any] = {
        "id": f"{plan.tracker}/{plan.layout}/{plan.scenario.name}",
        "scenario": plan.scenario.name,
        "tracker": plan.tracker,
        "layout": plan.layout,
        "flavour": flavour,
        "name": plan.name,
        "kl_metric": trackers.KL_METRIC[flavour],
        "lookalike_metric": trackers.LOOKALIKE_METRIC[flavour],
        "step_metric": trackers.STEP_METRIC[flavour],
        "config_overrides": {k: v for k, v in plan.config.to_dict().items() if v != DEFAULT_CONFIG.get(k)},
        "expected_status": status,
        "boundaries": boundaries,
        "faults": faults,
        "relogged_steps": relogged,
        "declared_reference_resets": sorted(set(declared_resets)),
        "processes": processes,
        "first_step": results[0]["first_step"],
        "last_step": results[-1]["last_step"],
    }
    if plan.tracker == "tensorboard":
        entry["writer"] = plan.scenario.tb_writer
        entry["path"] = _rel(out / "tensorboard" / plan.scenario.name, out)
        ck = out / "tensorboard" / plan.scenario.name / "checkpoints"
        entry["checkpoint_dir"] = _rel(ck, out)
        entry["checkpoint_steps_kept"] = grpo.checkpoint_steps(ck)
    elif plan.tracker == "wandb":
        entry["path"] = _rel(out / "wandb" / plan.layout, out)
        entry["run_dirs"] = [p["run_dir"] for p in processes]
    else:
        entry["path"] = _rel(out / "mlflow" / "mlflow.db", out)
        entry["experiment"] = PROJECT
        entry["run_ids"] = list(dict.fromkeys(p["run_id"] for p in processes))
    return entry


def dump_json(obj: Any) -> str:
    """Indented JSON with lists of scalars and flat objects (a process, a boundary) on one line each:
    a manifest a person can read and diff, at a third of the size."""
    text = json.dumps(obj, indent=1)
    text = re.sub(r"\[\s*([^\[\]{}]*?)\s*\]", lambda m: "[" + ", ".join(
        x.strip() for x in m.group(1).split(",\n")) + "]", text)
    text = re.sub(r"\{\n([^{}]*?)\n\s*\}", lambda m: "{" + ", ".join(
        x.strip() for x in m.group(1).split(",\n")) + "}", text)
    return text + "\n"


def format_table(entries: list[dict[str, Any]]) -> str:
    """One line per boundary: KL just before the crash vs the first KL logged after the resume."""
    rows = [("run", "step", "from", "ref", "KL last before", "KL first after", "expected")]
    for e in entries:
        if not e["boundaries"]:
            rows.append((e["id"], "-", "-", "-", "-", "-", e["expected_status"]))
        for b in e["boundaries"]:
            rows.append((e["id"], str(b["step"]), str(b["resumed_from_step"]), b["reference_from"],
                         f"{b['kl_last_before']:.4f}", f"{b['kl_first_after']:.4f}", b["expected_verdict"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# ----------------------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="generate.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: sample_runs/ itself)")
    ap.add_argument("--scenarios", default="", help="comma-separated scenario names (default: all)")
    ap.add_argument("--trackers", default=",".join(TRACKERS), help="comma-separated: tensorboard,wandb,mlflow")
    ap.add_argument("--layouts", default="", help="comma-separated layouts: new-file,new-run,resume (default: all)")
    ap.add_argument("--coverage", choices=sorted(COVERAGE), default="committed",
                    help="which scenario x tracker x layout matrix to write when --scenarios is not given")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                    help="steps of the base run; crash and checkpoint points scale with it (60 gives the "
                         "canonical 20/40/47 points)")
    ap.add_argument("--step-delay", type=float, default=0.01, help="seconds to sleep after each step")
    ap.add_argument("--restart-gap", type=float, default=1.0, help="seconds between a crash and the restart")
    ap.add_argument("--quiet", action="store_true", help="do not print the boundary table")
    return ap.parse_args(argv)


def _split(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


TRACKER_MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",)}
"""What each tracker's writers import (tensorboardX: the torch-style writer of half the TensorBoard scenarios;
klwatch itself never needs it, so it comes with the ``examples`` extra, not the package)."""


def _tracker_installed(tracker: str) -> bool:
    """Whether the packages a tracker's writers need import; said on stderr when not (the tracker is skipped)."""
    for module in TRACKER_MODULES[tracker]:
        try:
            __import__(module)
        except ImportError:
            print(f"skipping {tracker}: the {module} package is not installed (pip install 'klwatch[examples]', "
                  "or scripts/setup.sh --test)", file=sys.stderr)
            return False
    return True


def generate(*, out: Path, scenario_names: Sequence[str] | None = None,
             tracker_names: Sequence[str] = TRACKERS, layouts: Sequence[str] | None = None,
             coverage: str = "committed", steps: int = DEFAULT_STEPS, step_delay: float = 0.01,
             restart_gap: float = 1.0) -> dict[str, Any]:
    """Produce the runs under ``out`` (its generated folders are replaced) and return the manifest."""
    bad = [t for t in tracker_names if t not in TRACKERS]
    if bad:
        raise SystemExit(f"unknown tracker(s): {', '.join(bad)}; known: {', '.join(TRACKERS)}")
    available = [t for t in tracker_names if _tracker_installed(t)]
    plans = plan_runs(steps=steps, names=scenario_names, tracker_names=available, layouts=layouts,
                      coverage=coverage)
    if not plans:
        raise SystemExit("nothing to generate for that selection")
    out = out.resolve()  # launches run in a scratch folder: every path handed to them is absolute
    out.mkdir(parents=True, exist_ok=True)
    for name in GENERATED:
        p = out / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)

    lanes: dict[str, list[RunPlan]] = {}
    for p in plans:
        lanes.setdefault(p.lane, []).append(p)
    done: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="klwatch-gen-") as tmp:
        scratch = Path(tmp)

        db_ready = threading.Event()
        first_mlflow = next((k for k in lanes if k.startswith("mlflow:")), None)

        def run_lane(key: str, lane: list[RunPlan]) -> None:
            if key.startswith("mlflow:") and key != first_mlflow:
                db_ready.wait()  # the first MLflow launch creates the store's tables
            try:
                for plan in lane:
                    d = run_training(plan, out=out, scratch=scratch, step_delay=step_delay,
                                     restart_gap=restart_gap, db_ready=db_ready if plan.tracker == "mlflow" else None)
                    with lock:
                        done[plans.index(plan)] = d
            finally:
                if key == first_mlflow:
                    db_ready.set()  # a failed first lane must not leave the others waiting

        with ThreadPoolExecutor(max_workers=len(lanes)) as pool:
            for f in [pool.submit(run_lane, key, lane) for key, lane in lanes.items()]:
                f.result()

    prune_wandb(out / "wandb")
    compact_mlflow(out / "mlflow" / "mlflow.db")
    prune_checkpoints(out)
    entries = [manifest_entry(done[i], out=out) for i in range(len(plans))]
    manifest = {
        "schema": "klwatch.sample-manifest/1",
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generator": "sample_runs/generate.py",
        "steps": steps,
        "mlflow": {"store": "mlflow/mlflow.db", "experiment": PROJECT} if "mlflow" in available else None,
        "wandb": {"project": PROJECT, "mode": "offline"} if "wandb" in available else None,
        "base_config": DEFAULT_CONFIG,
        "runs": entries,
    }
    manifest["scenarios"] = {
        p.scenario.name: {"description": p.scenario.description, "faults": list(p.scenario.faults)}
        for p in plans
    }
    (out / "manifest.json").write_text(dump_json(manifest))
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    manifest = generate(
        out=args.out,
        scenario_names=_split(args.scenarios) or None,
        tracker_names=_split(args.trackers),
        layouts=_split(args.layouts) or None,
        coverage=args.coverage,
        steps=args.steps,
        step_delay=args.step_delay,
        restart_gap=args.restart_gap,
    )
    if not args.quiet:
        print(format_table(manifest["runs"]))
        print(f"{len(manifest['runs'])} training runs written to {args.out} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
