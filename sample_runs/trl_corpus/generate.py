"""Generate the real-TRL corpus: ``python -m sample_runs.trl_corpus.generate [--out DIR] [--scenarios a,b] [--quiet]``.

``--corpus preference`` generates the preference-trainer corpus instead (``trl.DPOTrainer``, ``trl.KTOTrainer``,
``trl.RLOOTrainer``; default out ``sample_runs/trl_preference``): see ``preference.py``. Without ``--corpus`` (or with
``--corpus grpo``) this is the GRPO corpus described below.

Every launch is its own process (``python -m sample_runs.trl_corpus.launch SPEC``) training with the real
``trl.GRPOTrainer`` on CPU and logging through the stock ``report_to`` callbacks (W&B offline, MLflow SQLite,
TensorBoard). The manifest (``DIR/manifest.json``) is written from the result each process reports: the steps it
logged, its KL, where it resumed, whether it crashed and what its reference really was (compared weight for
weight with the base model and the resumed checkpoint inside the process).

Output under DIR (default: ``sample_runs/trl``):
- ``tensorboard/<scenario>/``: TRL's ``output_dir``: ``runs/<date>_<host>/`` per launch (HF's default) or one
  ``runs/tb/`` for all launches (``TENSORBOARD_LOGGING_DIR``), and ``checkpoint-N/trainer_state.json`` of the
  checkpoints a launch resumed from (weights, optimizer and the other checkpoints are deleted);
- ``wandb/<layout>/wandb/offline-run-*``: pruned to the ``.wandb`` log and the small ``files/`` metadata;
- ``mlflow/mlflow.db``: experiment ``klwatch-trl`` (re-paged to 1 KiB pages and vacuumed to keep it small);
- ``verl/``: the verl-flavoured scenarios (``verl.utils.tracking.Tracking``): ``verl/wandb/``,
  ``verl/tensorboard/klwatch-verl/<experiment>/``, ``verl/checkpoints/<experiment>/global_step_N/``.

Needs the ``trl`` extra (see README.md); run it with that interpreter, or point ``KLWATCH_TRL_PYTHON`` at it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sample_runs.trackers import compact_mlflow  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_OUT = REPO / "sample_runs" / "trl"
WANDB_PROJECT = "klwatch-trl"
MLFLOW_EXPERIMENT = "klwatch-trl"
KL_METRIC = {"wandb": "train/kl", "mlflow": "kl", "tensorboard": "train/kl"}
STEP_METRIC = {"wandb": "train/global_step", "mlflow": None, "tensorboard": None}
INCONCLUSIVE_BELOW = 0.05  # a resume before the KL reached 5% of the run's peak has nothing to judge

COMMON = {"lr": 0.005, "beta": 0.1, "max_steps": 12, "save_steps": 6, "logging_steps": 1, "seed": 42}

# Each scenario: launches (model_from, resume checkpoint step, crash_after), overrides, and the layout in each
# tracker (None: that tracker is not written for this scenario, to keep the committed corpus small: TRL logs ~27
# keys a step plus ~7 profiling values, which cost ~5 KB a step in a .wandb file and ~14 KB a step in MLflow).
#   W&B:   group   = new run per launch, same name, WANDB_RUN_GROUP
#          name    = new run per launch, same display name, no group
#          renamed = new run per launch, a different name per launch, no group
#          resume  = the same run re-attached (WANDB_RUN_ID + WANDB_RESUME=allow)
#   MLflow: new-run = a new run per launch, same run name;  resume = MLFLOW_RUN_ID of the first launch
#   TensorBoard: new-folder = runs/<date>_<host>/ per launch (HF default);  same-folder = TENSORBOARD_LOGGING_DIR
SCENARIOS: dict[str, dict] = {
    "continuous": {
        "description": "one process, 12 steps, no restart",
        "launches": [("base", None, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "new-folder"}},
    "resume-correct": {
        "description": "crash after the step-6 checkpoint; relaunch with model=<base> and "
                       "resume_from_checkpoint=checkpoint-6 (TRL's documented way): reference = base",
        "launches": [("base", None, 6), ("base", 6, None)],
        "layouts": {"wandb": "group", "mlflow": "new-run", "tensorboard": "new-folder"}},
    "resume-buggy": {
        "description": "crash after the step-6 checkpoint; relaunch with model=checkpoint-6 and "
                       "resume_from_checkpoint=checkpoint-6 (trl #3179): reference = resumed weights",
        "launches": [("base", None, 6), ("checkpoint", 6, None)],
        "layouts": {"wandb": "group", "mlflow": "new-run", "tensorboard": "new-folder"}},
    "ratchet-buggy": {
        "description": "checkpoints every 4, crashes after 4 and 8, each relaunched with the checkpoint as the "
                       "model: the KL anchor ratchets forward twice",
        "overrides": {"save_steps": 4},
        "launches": [("base", None, 4), ("checkpoint", 4, 8), ("checkpoint", 8, None)],
        "layouts": {"wandb": None, "mlflow": "resume", "tensorboard": "same-folder"}},
    "lora-correct": {
        "description": "LoRA adapter (peft_config), crash after 6; relaunch with model=<base>, the same peft_config "
                       "and resume_from_checkpoint: the adapter is restored, reference = base with adapter disabled",
        "overrides": {"lr": 0.05},
        "launches": [("peft-base", None, 6), ("peft-base", 6, None)],
        "layouts": {"wandb": "renamed", "mlflow": None, "tensorboard": None}},
    "lora-buggy": {
        "description": "LoRA adapter, crash after 6; relaunch with model=PeftModel.from_pretrained(base, "
                       "checkpoint-6, is_trainable=True) and no peft_config: TRL copies the loaded adapter into a "
                       "frozen 'ref' adapter, so reference = resumed adapter",
        "overrides": {"lr": 0.05},
        "launches": [("peft-base", None, 6), ("peft-checkpoint", 6, None)],
        "layouts": {"wandb": "resume", "mlflow": None, "tensorboard": "new-folder"}},
    "sync-ref": {
        "description": "sync_ref_model=True, ref_model_sync_steps=6, ref_model_mixup_alpha=1.0: the reference is "
                       "replaced by the policy at steps 6 and 12 (inside the process: no resume); crash after 6 and "
                       "relaunch with the checkpoint as the model, i.e. the reference the step-6 sync had made",
        "overrides": {"sync_ref_model": True, "ref_model_sync_steps": 6, "ref_model_mixup_alpha": 1.0},
        "launches": [("base", None, 6), ("checkpoint", 6, None)],
        "layouts": {"wandb": "name", "mlflow": None, "tensorboard": "new-folder"}},
    "sparse-buggy": {
        "description": "logging_steps=3 (each logged KL is the mean of 3 steps), 18 steps, checkpoints every 9, "
                       "crash after 9, relaunch with the checkpoint as the model",
        "overrides": {"max_steps": 18, "save_steps": 9, "logging_steps": 3},
        "launches": [("base", None, 9), ("checkpoint", 9, None)],
        "layouts": {"wandb": "name", "mlflow": None, "tensorboard": None}},
    "sparse-correct": {
        "description": "logging_steps=3, 18 steps, checkpoints every 9, crash after 9, correct relaunch",
        "overrides": {"max_steps": 18, "save_steps": 9, "logging_steps": 3},
        "launches": [("base", None, 9), ("base", 9, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "same-folder"}},
    "early-buggy": {
        "description": "checkpoints every 3, crash after 3, relaunch with checkpoint-3 as the model "
                       "(a resume a few steps into training)",
        "overrides": {"save_steps": 3},
        "launches": [("base", None, 3), ("checkpoint", 3, None)],
        "layouts": {"wandb": "renamed", "mlflow": None, "tensorboard": None}},
    "crash-midrun": {
        "description": "checkpoints every 4, the process dies after step 7 (between checkpoints); correct "
                       "relaunch from checkpoint-4, so steps 5-7 are logged twice",
        "overrides": {"save_steps": 4},
        "launches": [("base", None, 7), ("base", 4, None)],
        "layouts": {"wandb": "resume", "mlflow": "resume", "tensorboard": "same-folder"}},
    "older-checkpoint-buggy": {
        "description": "checkpoints at 4 and 8, crash after 8, relaunch from the older checkpoint-4 with it as "
                       "the model: steps 5-8 are logged twice and the reference is the step-4 weights",
        "overrides": {"save_steps": 4},
        "launches": [("base", None, 8), ("checkpoint", 4, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "new-folder"}},
}

# verl flavour: the same GRPOTrainer training, its report_to callbacks off, logged instead through verl's own
# ``verl.utils.tracking.Tracking`` (from the PyPI ``verl`` wheel) with verl's names, step axis and layouts: a new W&B
# run per launch with the same name, a new MLflow run per launch in experiment ``klwatch-verl``, the same
# TensorBoard folder (``TENSORBOARD_DIR``) for every launch, ``global_step_N/`` checkpoints.
SCENARIOS.update({
    "verl-resume-buggy": {
        "description": "verl names and layouts; crash after the step-6 checkpoint, relaunch with the checkpoint "
                       "as the model (actor_rollout_ref.model.path = the checkpoint): reference = resumed weights",
        "flavour": "verl",
        "launches": [("base", None, 6), ("checkpoint", 6, None)],
        "layouts": {"wandb": "name", "mlflow": None, "tensorboard": "same-folder"}},
    "verl-resume-correct": {
        "description": "verl names and layouts; crash after the step-6 checkpoint, correct relaunch",
        "flavour": "verl",
        "launches": [("base", None, 6), ("base", 6, None)],
        "layouts": {"wandb": "name", "mlflow": None, "tensorboard": "same-folder"}},
})
VERL_PROJECT = "klwatch-verl"
VERL_KL, VERL_STEP = "actor/kl_loss", "training/global_step"


def say(quiet: bool, *a) -> None:
    if not quiet:
        print(*a, flush=True)


def trl_python() -> str:
    return os.environ.get("KLWATCH_TRL_PYTHON", sys.executable)


def verl_env(out: Path, name: str, sc: dict) -> tuple[dict, dict]:
    lay = sc["layouts"]
    env: dict = {"WANDB_DIR": str(out / "verl" / "wandb"), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
                 "WANDB_RUN_GROUP": None, "WANDB_RUN_ID": None, "WANDB_RESUME": None, "MLFLOW_RUN_ID": None,
                 "MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlflow' / 'mlflow.db'}",
                 "TENSORBOARD_DIR": str(out / "verl" / "tensorboard" / VERL_PROJECT / name)}
    backends = [b for b in ("wandb", "mlflow", "tensorboard") if lay.get(b)]
    return env, {"project": VERL_PROJECT, "experiment": name, "backends": backends,
                 "checkpoint_root": str(out / "verl" / "checkpoints" / name)}


def output_dir_of(out: Path, work: Path, name: str) -> Path:
    if SCENARIOS[name].get("flavour") == "verl":
        return work / "trl-output" / name  # TRL's own checkpoints, needed to resume; not committed
    return out / "tensorboard" / name


def tracker_env(out: Path, name: str, sc: dict, i: int, first: dict | None, *, project: str = WANDB_PROJECT,
                experiment: str = MLFLOW_EXPERIMENT) -> tuple[dict, list[str], str]:
    lay = sc["layouts"]
    env: dict = {"WANDB_PROJECT": project, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
                 "WANDB_RUN_GROUP": None, "WANDB_RUN_ID": None, "WANDB_RESUME": None, "MLFLOW_RUN_ID": None,
                 "TENSORBOARD_LOGGING_DIR": None}
    report_to = ["tensorboard"]
    run_name = name
    if lay.get("wandb"):
        report_to.append("wandb")
        env["WANDB_DIR"] = str(out / "wandb" / lay["wandb"])
        if lay["wandb"] == "group":
            env["WANDB_RUN_GROUP"] = name
        elif lay["wandb"] == "renamed" and i > 0:
            run_name = f"{name}-resumed{i}" if i > 1 else f"{name}-resumed"
        elif lay["wandb"] == "resume" and first is not None:
            env["WANDB_RUN_ID"] = first["wandb_run_id"]
            env["WANDB_RESUME"] = "allow"
    if lay.get("mlflow"):
        report_to.append("mlflow")
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{out / 'mlflow' / 'mlflow.db'}"
        env["MLFLOW_EXPERIMENT_NAME"] = experiment
        if lay["mlflow"] == "resume" and first is not None:
            env["MLFLOW_RUN_ID"] = first["mlflow_run_id"]
    if lay.get("tensorboard") == "same-folder":
        env["TENSORBOARD_LOGGING_DIR"] = str(out / "tensorboard" / name / "runs" / "tb")
    if not lay.get("tensorboard"):
        report_to.remove("tensorboard")
    return env, report_to, run_name


def parse_run_options(ap: argparse.ArgumentParser, argv: list[str] | None, scenarios: dict) -> tuple[argparse.Namespace, list[str]]:
    """The options both corpora's generators share (after their own ``--out`` and ``--scenarios``), parsed,
    and the scenarios asked for, each one of ``scenarios`` (else a usage error)."""
    ap.add_argument("--jobs", type=int, default=2, help="scenarios run in parallel (each launch is one process)")
    ap.add_argument("--restart-gap", type=float, default=1.0, help="seconds between a crash and the relaunch")
    ap.add_argument("--keep-work", action="store_true", help="keep the launch specs, results and logs")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    names = [s for s in a.scenarios.split(",") if s]
    unknown = [s for s in names if s not in scenarios]
    if unknown:
        ap.error(f"unknown scenarios {unknown}")
    return a, names


def manifest_head(*, generator: str, framework: str, t0: float, experiment: str, project: str) -> dict:
    """The fields every real-TRL corpus manifest opens with: what wrote it, when, with which versions, where."""
    return {
        "schema": "klwatch.sample-manifest/1",
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generator": generator,
        "framework": framework,
        "versions": versions(),
        "generation_seconds": round(time.time() - t0, 1),
        "mlflow": {"store": "mlflow/mlflow.db", "experiment": experiment},
        "wandb": {"project": project, "mode": "offline"},
        "tensorboard": {"root": "tensorboard"},
    }


def finish(out: Path, work: Path, manifest_text: str, *, keep_work: bool, quiet: bool, runs: int, t0: float) -> int:
    """Write the manifest, drop the work folder unless kept, say so."""
    (out / "manifest.json").write_text(manifest_text)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    say(quiet, f"done in {time.time() - t0:.0f}s: {runs} tracker runs, manifest at {out / 'manifest.json'}")
    return 0


def fresh_out(out: Path, wandb_layouts: list[tuple[str | None, str | None]]) -> Path:
    """Empty OUT's tracker folders and manifest (nothing else the user keeps there), make the W&B folder each
    scenario's (layout, flavour) logs to and the MLflow folder, and return a fresh work folder under OUT."""
    for sub in ("tensorboard", "wandb", "mlflow", "verl", "manifest.json"):
        p = out / sub
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    work = out / ".work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (out / "mlflow").mkdir(parents=True, exist_ok=True)
    for layout, flavour in wandb_layouts:
        if layout:
            (out / "verl" / "wandb" if flavour == "verl" else out / "wandb" / layout).mkdir(parents=True, exist_ok=True)
    return work


def base_model(work: Path) -> Path:
    """The tiny base model, built locally (no download) in its own process with the TRL interpreter."""
    base = work / "base-model"
    subprocess.run([trl_python(), "-c", "from sample_runs.trl_corpus.tiny_model import build_base_model;"
                    f" build_base_model({str(base)!r})"], cwd=REPO, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    return base


def mlflow_store(out: Path, experiments: tuple[str, ...]) -> None:
    """Create the MLflow store and its experiments once, so parallel launches do not race on the schema migration."""
    made = "; ".join(f"mlflow.set_experiment({e!r})" for e in experiments)
    subprocess.run([trl_python(), "-c", f"import mlflow; mlflow.set_tracking_uri('sqlite:///{out / 'mlflow' / 'mlflow.db'}'); "
                    + made], check=True, capture_output=True)


def launch_once(spec: dict, work: Path, name: str, i: int) -> dict:
    """Run launch ``i`` of scenario ``name`` as its own training process (``sample_runs.trl_corpus.launch``) from
    ``spec``, keep its log in ``work``, and return the result it wrote; a launch that wrote none, or exited
    otherwise than its crash plan says, is an error with the log's tail."""
    spec_file = work / f"{name}.{i}.spec.json"
    spec_file.write_text(json.dumps(spec, indent=1))
    proc = subprocess.run([trl_python(), "-m", "sample_runs.trl_corpus.launch", str(spec_file)], cwd=work,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    (work / f"{name}.{i}.log").write_text(proc.stdout + proc.stderr)
    res_file = Path(spec["result"])
    if not res_file.exists():
        raise RuntimeError(f"{name} launch {i} failed (rc {proc.returncode}); log: {work / f'{name}.{i}.log'}\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    res = json.loads(res_file.read_text())
    if proc.returncode != (1 if res["crashed"] else 0):
        raise RuntimeError(f"{name} launch {i}: rc {proc.returncode}, crashed={res['crashed']}")
    return res


def run_scenario(name: str, out: Path, base: Path, work: Path, quiet: bool, gap: float) -> dict:
    sc = SCENARIOS[name]
    cfg = {**COMMON, **sc.get("overrides", {})}
    output_dir = output_dir_of(out, work, name)
    if not sc["layouts"].get("tensorboard") and sc.get("flavour") != "verl":
        output_dir = work / "trl-output" / name  # no TensorBoard: TRL's output_dir is not committed
    results: list[dict] = []
    for i, (model_from, resume_step, crash_after) in enumerate(sc["launches"]):
        verl = None
        if sc.get("flavour") == "verl":
            (env, verl), report_to, run_name = verl_env(out, name, sc), [], name
        else:
            env, report_to, run_name = tracker_env(out, name, sc, i, results[0] if results else None)
        resume = str(output_dir / f"checkpoint-{resume_step}") if resume_step is not None else None
        spec = {**cfg, "index": i, "base_model": str(base), "output_dir": str(output_dir), "run_name": run_name,
                "report_to": report_to, "model_from": model_from, "resume_from": resume, "crash_after": crash_after,
                "env": env, "verl": verl, "result": str(work / f"{name}.{i}.result.json")}
        t0 = time.time()
        res = launch_once(spec, work, name, i)
        res["report_to"], res["run_name"], res["spec"] = report_to, run_name, spec
        results.append(res)
        kls = [r for r in res["logged"] if "kl" in r]
        say(quiet, f"  {name}[{i}] model={model_from} resume={resume_step} steps {res['first_step']}-"
                   f"{res['last_step']} crashed={res['crashed']} reference={res['reference_from']} "
                   f"kl first/last {kls[0]['kl']:.4f}/{kls[-1]['kl']:.4f} ({time.time() - t0:.0f}s)")
        if i + 1 < len(sc["launches"]):
            time.sleep(gap)
    return {"name": name, "config": cfg, "results": results}


def _rel(p: str | None, out: Path) -> str | None:
    return None if p is None else os.path.relpath(p, out)


def _portable(check: dict, out: Path) -> dict:
    """The reference check with the model path made relative to the corpus (or named, when outside it)."""
    check = dict(check)
    p = check.get("name_or_path")
    if p:
        if Path(p).resolve().is_relative_to(out):
            check["name_or_path"] = os.path.relpath(p, out)
        elif Path(p).name == "base-model":
            check["name_or_path"] = "<base model>"
        else:
            check["name_or_path"] = "<work>/" + "/".join(Path(p).parts[-2:])
    return check


def build_runs(done: dict, out: Path) -> list[dict]:
    name, cfg, results = done["name"], done["config"], done["results"]
    sc = SCENARIOS[name]
    verl = sc.get("flavour") == "verl"
    kl_by_proc = [{r["step"]: r["kl"] for r in res["logged"] if "kl" in r} for res in results]
    peak = max(max(k.values()) for k in kl_by_proc if k)
    sync_steps = []
    if cfg.get("sync_ref_model"):
        sync_steps = list(range(cfg["ref_model_sync_steps"], cfg["max_steps"] + 1, cfg["ref_model_sync_steps"]))
    boundaries = []
    for i in range(1, len(results)):
        res, prev = results[i], results[i - 1]
        rstep = res["resumed_from_step"]
        before = {s: v for k in kl_by_proc[:i] for s, v in k.items() if s <= rstep}
        kl_last_before = kl_by_proc[i - 1][max(kl_by_proc[i - 1])]
        kl_at_ckpt = before[max(before)] if before else None
        kl_first_after = kl_by_proc[i][min(kl_by_proc[i])]
        if res["reference_from"] == "checkpoint":
            if rstep in sync_steps and cfg.get("ref_model_mixup_alpha") == 1.0:
                verdict, why = "intentional", (f"sync_ref_model=True with ref_model_sync_steps="
                                               f"{cfg['ref_model_sync_steps']}, alpha 1.0: the step-{rstep} sync "
                                               "makes exactly this reference")
            elif kl_at_ckpt is not None and kl_at_ckpt < INCONCLUSIVE_BELOW * peak:
                verdict = "inconclusive"
                why = "reference rebuilt from the resumed weights, but the KL had not grown yet"
            else:
                verdict, why = "reference_reset", "reference rebuilt from the resumed weights"
        elif res["reference_from"] == "base":
            verdict, why = "ok", "reference = base model"
        else:
            verdict, why = "inconclusive", "reference is neither the base nor the checkpoint"
        boundaries.append({"step": min(kl_by_proc[i]), "resumed_from_step": rstep,
                           "previous_last_step": prev["last_step"], "reference_from": res["reference_from"],
                           "model_from": res["model_from"], "expected_verdict": verdict, "why": why,
                           "kl_last_before": kl_last_before, "kl_at_checkpoint": kl_at_ckpt,
                           "kl_first_after": kl_first_after, "kl_peak_of_run": peak,
                           "kl_first_3_after": [kl_by_proc[i][s] for s in sorted(kl_by_proc[i])[:3]]})
    verdicts = {b["expected_verdict"] for b in boundaries}
    status = ("reference_reset" if "reference_reset" in verdicts else
              "inconclusive" if "inconclusive" in verdicts else "intentional" if "intentional" in verdicts else "ok")
    seen: dict[int, int] = {}
    for k in kl_by_proc:
        for s in k:
            seen[s] = seen.get(s, 0) + 1
    relogged = sorted(s for s, n in seen.items() if n > 1)
    all_steps = [s for k in kl_by_proc for s in k]
    runs = []
    for tracker in ("tensorboard", "wandb", "mlflow"):
        layout = sc["layouts"].get(tracker)
        if not layout:
            continue
        procs = []
        for res in results:
            p = {"index": res["index"], "first_step": res["first_step"], "last_step": res["last_step"],
                 "resumed_from_step": res["resumed_from_step"], "crashed": res["crashed"],
                 "reference_from": res["reference_from"], "model_from": res["model_from"],
                 "reference_check": _portable(res["reference_check"], out), "started_at": res["started_at"],
                 "ended_at": res["ended_at"], "checkpoints_saved": res["checkpoints_saved"],
                 "run_name": res["run_name"],
                 "logged_steps": sorted({r["step"] for r in res["logged"] if "kl" in r})}
            if tracker == "tensorboard":
                p["event_files"] = [_rel(f, out) for f in res.get("event_files", [])]
                p["logging_dir"] = _rel(res.get("tensorboard_dir"), out)
            elif tracker == "wandb":
                p["run_dir"] = _rel(res.get("wandb_run_dir"), out)
                p["run_id"] = res.get("wandb_run_id")
            else:
                p["run_id"] = res.get("mlflow_run_id")
            procs.append(p)
        run = {"id": f"{tracker}/{layout}/{name}", "scenario": name, "description": sc["description"],
               "tracker": tracker, "layout": layout, "flavour": "verl" if verl else "trl",
               "framework": "trl.GRPOTrainer" + (" logged through verl.utils.tracking.Tracking" if verl else ""),
               "name": name, "kl_metric": VERL_KL if verl else KL_METRIC[tracker],
               "step_metric": VERL_STEP if verl else STEP_METRIC[tracker],
               "config": cfg, "expected_status": status, "boundaries": boundaries, "relogged_steps": relogged,
               "declared_reference_resets": [{"step": s, "kind": "sync_ref_model",
                                              "alpha": cfg["ref_model_mixup_alpha"], "resume": False}
                                             for s in sync_steps],
               "processes": procs, "first_step": min(all_steps), "last_step": max(all_steps),
               "checkpoint_dir": (f"verl/checkpoints/{name}" if verl else
                                  f"tensorboard/{name}" if sc["layouts"].get("tensorboard") else None)}
        if verl:
            run["verl_project"] = VERL_PROJECT
        if tracker == "wandb":
            run["path"] = "verl/wandb" if verl else f"wandb/{layout}"
            run["run_dirs"] = [p["run_dir"] for p in procs]
            run["group"] = name if layout == "group" else None
        elif tracker == "mlflow":
            run["path"] = "mlflow/mlflow.db"
            run["experiment"] = VERL_PROJECT if verl else MLFLOW_EXPERIMENT
            run["run_ids"] = sorted({p["run_id"] for p in procs})
        else:
            run["path"] = f"verl/tensorboard/{VERL_PROJECT}/{name}" if verl else f"tensorboard/{name}"
        runs.append(run)
    return runs


def prune(out: Path, done: list[dict], scenarios: dict | None = None) -> None:
    scenarios = SCENARIOS if scenarios is None else scenarios
    for d in done:
        if scenarios[d["name"]].get("flavour") == "verl" or not scenarios[d["name"]]["layouts"].get("tensorboard"):
            continue
        output_dir = out / "tensorboard" / d["name"]
        resumed = {r["resumed_from_step"] for r in d["results"] if r["resumed_from_step"] is not None}
        for ck in output_dir.glob("checkpoint-*"):
            step = int(ck.name.split("-")[-1])
            if step not in resumed:
                shutil.rmtree(ck)
                continue
            for f in ck.iterdir():
                if f.name != "trainer_state.json":
                    shutil.rmtree(f) if f.is_dir() else f.unlink()
        for f in output_dir.iterdir():
            if f.is_file():  # the model card README.md and the like
                f.unlink()
    wandb_roots = [*(out / "wandb").glob("*/wandb"), out / "verl" / "wandb" / "wandb"]
    for run_dir in [d for root in wandb_roots for d in root.glob("*run-*")]:
        for f in list(run_dir.rglob("*")):
            if f.is_file() and not (f.suffix == ".wandb" or (f.parent.name == "files" and f.suffix in (".json", ".yaml")
                                                                and f.stat().st_size < 20000)):
                f.unlink()
        for f in sorted(run_dir.rglob("*"), reverse=True):
            if f.is_dir() and not any(f.iterdir()):
                f.rmdir()
    for extra in [e for root in wandb_roots for e in root.glob("*")]:
        if extra.is_symlink() or (extra.is_dir() and "run-" not in extra.name):
            extra.unlink() if extra.is_symlink() else shutil.rmtree(extra)
    compact_mlflow(out / "mlflow" / "mlflow.db", page_size=1024)  # TRL's ~230 params per run fill larger pages


def versions() -> dict:
    code = ("import json, importlib.metadata as m\n"
            "print(json.dumps({p: m.version(p) for p in ['trl','transformers','torch','peft','accelerate',"
            "'datasets','tokenizers','wandb','mlflow','tensorboard','verl']}))")
    try:
        return json.loads(subprocess.run([trl_python(), "-c", code], capture_output=True, text=True,
                                         check=True).stdout)
    except Exception as exc:  # noqa: BLE001
        return {"error": repr(exc)}


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--corpus", choices=("grpo", "preference"), default="grpo")
    known, rest = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.corpus == "preference":
        from sample_runs.trl_corpus import preference

        return preference.main(rest)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=("grpo", "preference"), default="grpo",
                    help="grpo (default): this corpus; preference: DPO/KTO/RLOO into sample_runs/trl_preference "
                         "(see --corpus preference --help)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from: " + ", ".join(SCENARIOS))
    a, names = parse_run_options(ap, argv, SCENARIOS)
    out = Path(a.out).resolve()
    work = fresh_out(out, [(SCENARIOS[n]["layouts"].get("wandb"), SCENARIOS[n].get("flavour")) for n in names])
    t0 = time.time()
    base = base_model(work)
    if any(SCENARIOS[n]["layouts"].get("mlflow") for n in names):
        mlflow_store(out, (MLFLOW_EXPERIMENT, VERL_PROJECT))
    say(a.quiet, f"generating {len(names)} scenarios into {out}")
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        done = list(pool.map(lambda n: run_scenario(n, out, base, work, a.quiet, a.restart_gap), names))
    runs = [r for d in done for r in build_runs(d, out)]
    prune(out, done)
    for d in done:
        for b in build_runs(d, out)[0]["boundaries"]:
            say(a.quiet, f"  {d['name']}: resume at {b['step']} from {b['resumed_from_step']} "
                         f"reference={b['reference_from']} KL before {b['kl_last_before']:.4f} "
                         f"after {b['kl_first_after']:.4f} -> {b['expected_verdict']}")
    manifest = {
        **manifest_head(generator="sample_runs/trl_corpus/generate.py", framework="trl.GRPOTrainer", t0=t0,
                        experiment=MLFLOW_EXPERIMENT, project=WANDB_PROJECT),
        "base_config": COMMON,
        "expected_verdict_rule": ("reference_from=checkpoint: reference_reset, unless the KL at the checkpoint was "
                                  f"under {INCONCLUSIVE_BELOW:.0%} of the run's peak (inconclusive) or the resume step "
                                  "is a sync_ref_model step with alpha 1 (intentional); reference_from=base: ok"),
        "model": {"arch": "LlamaForCausalLM", "hidden_size": 32, "layers": 2, "tokenizer": "word-level, 24 tokens",
                  "reward": "share of completion words equal to 'good'"},
        "scenarios": {n: {"description": SCENARIOS[n]["description"], "layouts": SCENARIOS[n]["layouts"]}
                      for n in names},
        "runs": runs,
    }
    return finish(out, work, json.dumps(manifest, indent=1) + "\n", keep_work=a.keep_work, quiet=a.quiet,
                  runs=len(runs), t0=t0)


if __name__ == "__main__":
    raise SystemExit(main())
