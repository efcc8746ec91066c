"""Generate the NeMo-RL corpus: ``python -m sample_runs.nemo_rl_corpus.generate --nemo-rl SRC [--out DIR]``.

Every launch is its own process (``python -m sample_runs.nemo_rl_corpus.launch SPEC``, run with the generation
venv made by setup.sh) that loads NeMo-RL's shipped example config, logs through NeMo-RL's own ``Logger`` (W&B
offline, TensorBoard, MLflow SQLite) and checkpoints through NeMo-RL's own ``CheckpointManager``, around real TRL
training of a tiny local model on CPU. A relaunch resumes from the latest ``step_N`` as NeMo-RL does. The manifest
(``DIR/manifest.json``) is written from what each process reported, never from the scenario table.

Output under DIR (default ``sample_runs/nemo_rl``), as NeMo-RL lays it out with cwd = DIR:
- ``logs/<scenario>/exp_NNN/{wandb,tensorboard}/``: one ``exp_NNN`` per launch (``get_next_experiment_dir``);
- ``results/<scenario>/step_N/{training_info.json,config.yaml}`` (weights, optimizer and tokenizer pruned) and
  ``results/<scenario>/latest_checkpoint_status.json`` (GRPO);
- ``mlflow/mlflow.db``: one SQLite store, experiments ``nemo-rl-grpo`` and ``nemo-rl-dpo``, a new run per launch.
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
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sample_runs.nemo_rl_corpus import nemo  # noqa: E402
from sample_runs.trackers import compact_mlflow  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_OUT = REPO / "sample_runs" / "nemo_rl"
DEFAULT_VENV_PY = REPO / ".venv-nemo-rl" / "bin" / "python"
TRACKING_URI = "sqlite:///mlflow/mlflow.db"  # relative to the corpus root, the launches' cwd
KL_METRIC = "train/kl_penalty"
INCONCLUSIVE_BELOW = 0.05  # a GRPO resume before the KL reached 5% of the run's peak has nothing to judge

GRPO = {"max_steps": 24, "save_period": 6, "lr": 0.05, "global_batch": 32, "micro_batch": 32, "prompts_per_step": 4,
        "generations_per_prompt": 8, "max_new_tokens": 6, "max_seq_len": 16, "kl_coef": 1.0, "weight_decay": 0.01}
DPO = {"max_steps": 12, "save_period": 6, "lr": 0.05, "global_batch": 8, "micro_batch": 8, "max_seq_len": 16,
       "kl_coef": 0.05, "weight_decay": 0.1}
BASE = {"grpo": GRPO, "dpo": DPO}

# reference: "base" (correct) or "snapshot" (#2955: the reference copied from the policy once the resume weights
# are loaded; every launch of the run runs that code, the first one has nothing to load). crashes: one entry per
# launch, the step after whose log that launch dies (None: it runs to the end). Relaunches resume from the latest
# step_N, found by NeMo-RL's get_latest_checkpoint_path.
SCENARIOS: dict[str, dict[str, Any]] = {
    "nemo-grpo-continuous": {"algorithm": "grpo", "reference": "base", "crashes": [None],
                             "description": "one launch, 24 steps, checkpoints every 6, no restart"},
    "nemo-grpo-resume-correct": {"algorithm": "grpo", "reference": "base", "crashes": [12, None],
                                 "description": "crash after step 12 (checkpoint step_12); the relaunch builds the "
                                                "reference from the base model"},
    "nemo-grpo-resume-buggy": {"algorithm": "grpo", "reference": "snapshot", "crashes": [12, None],
                               "description": "crash after step 12; the relaunch snapshots the reference from the "
                                              "loaded step_12 weights (NeMo-RL #2955)"},
    "nemo-grpo-ratchet-buggy": {"algorithm": "grpo", "reference": "snapshot", "crashes": [6, 12, 18, None],
                                "description": "checkpoints every 6, crashes after 6, 12 and 18, each relaunch "
                                               "snapshots the reference from the resumed weights"},
    "nemo-grpo-crash-relog": {"algorithm": "grpo", "reference": "base", "crashes": [11, None],
                              "overrides": {"save_period": 8},
                              "description": "checkpoints every 8, the process dies after step 11 (between "
                                             "checkpoints); the correct relaunch resumes from step_8 and logs 9-11 "
                                             "again"},
    "nemo-grpo-early-resume-correct": {"algorithm": "grpo", "reference": "base", "crashes": [3, None],
                                       "overrides": {"save_period": 3},
                                       "description": "checkpoints every 3, crash after step 3; a correct resume at "
                                                      "1/8 of the run"},
    "nemo-dpo-resume-correct": {"algorithm": "dpo", "reference": "base", "crashes": [6, None],
                                "description": "DPO, 12 steps, checkpoints every 6, crash after 6; the relaunch "
                                               "builds the reference from the base model"},
    "nemo-dpo-resume-buggy": {"algorithm": "dpo", "reference": "snapshot", "crashes": [6, None],
                              "description": "DPO, crash after 6; the relaunch snapshots the reference from the "
                                             "loaded step_6 weights (the same DTensorPolicyWorkerV2 path)"},
}


def say(quiet: bool, *a: Any) -> None:
    if not quiet:
        print(*a, flush=True)


def config_of(name: str) -> dict[str, Any]:
    sc = SCENARIOS[name]
    return {**BASE[sc["algorithm"]], **sc.get("overrides", {})}


def launch_spec(name: str, i: int, ctx: dict[str, Any]) -> dict[str, Any]:
    """What one process is told: the scenario's config values (turned into hydra overrides by nemo.py), its crash
    step, how it builds the reference, and where NeMo-RL's source and the corpus are."""
    sc, work = SCENARIOS[name], ctx["work"]
    return {"index": i, "scenario": name, "algorithm": sc["algorithm"], "reference": sc["reference"],
            "crash_after": sc["crashes"][i], "config": config_of(name), "out": str(ctx["out"]), "repo": str(REPO),
            "nemo_rl_src": str(ctx["src"]), "scratch": str(work / name / str(i)), "lock": str(work / "mlflow.lock"),
            "result": str(work / f"{name}.{i}.result.json"), "base_model": ".work/base-model",
            "project": f"nemo-rl-{sc['algorithm']}", "tracking_uri": TRACKING_URI}


def run_launch(spec: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """One process; its exit code must say what its result says (1 after a planted crash, else 0)."""
    work = ctx["work"]
    tag = f"{spec['scenario']}.{spec['index']}"
    spec_file = work / f"{tag}.spec.json"
    spec_file.write_text(json.dumps(spec, indent=1))
    proc = subprocess.run([ctx["python"], "-m", "sample_runs.nemo_rl_corpus.launch", str(spec_file)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    (work / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    res_file = Path(spec["result"])
    if not res_file.exists():
        raise RuntimeError(f"{tag} failed (rc {proc.returncode}), log {work / f'{tag}.log'}:\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    res = json.loads(res_file.read_text())
    if proc.returncode != (1 if res["crashed"] else 0):
        raise RuntimeError(f"{tag}: rc {proc.returncode} but crashed={res['crashed']}")
    return res


def run_scenario(name: str, ctx: dict[str, Any]) -> dict[str, Any]:
    results = []
    for i in range(len(SCENARIOS[name]["crashes"])):
        t0 = time.time()
        res = run_launch(launch_spec(name, i, ctx), ctx)
        results.append(res)
        say(ctx["quiet"], f"  {name}[{i}] {res['exp_dir']} resume={res['resumed_from_step']} steps "
                          f"{res['first_step']}-{res['last_step']} crashed={res['crashed']} "
                          f"reference={res['reference_from']} ({time.time() - t0:.0f}s)")
        if i + 1 < len(SCENARIOS[name]["crashes"]):
            time.sleep(ctx["gap"])  # a real wall-clock gap: tracker times of two launches never overlap
    return {"name": name, "results": results}


# --- the manifest, from the processes' own results ---------------------------------------------------------


def series_of(res: dict[str, Any], algorithm: str) -> dict[int, float]:
    """The series a reference reset shows in: GRPO's KL, DPO's implicit reward margin (chosen - rejected)."""
    if algorithm == "grpo":
        return {r["step"]: r["kl_penalty"] for r in res["logged"]}
    return {r["step"]: r["rewards_chosen_mean"] - r["rewards_rejected_mean"] for r in res["logged"]}


def expected_verdict(res: dict[str, Any], at_ckpt: float | None, peak: float, algorithm: str) -> tuple[str, str]:
    if res["reference_from"] == "checkpoint":
        if algorithm == "grpo" and at_ckpt is not None and at_ckpt < INCONCLUSIVE_BELOW * peak:
            return "inconclusive", "reference rebuilt from the resumed weights, but the KL had not grown yet"
        return "reference_reset", "reference snapshotted from the resumed weights (NeMo-RL #2955)"
    if res["reference_from"] == "base":
        return "ok", "reference = base model"
    return "inconclusive", "reference is neither the base model nor the checkpoint"


def boundaries(results: list[dict[str, Any]], algorithm: str) -> list[dict[str, Any]]:
    """One per relaunch, at the first train step it logged."""
    by_proc = [series_of(r, algorithm) for r in results]
    peak = max(max(s.values()) for s in by_proc if s)
    key = "kl" if algorithm == "grpo" else "margin"
    out = []
    for i in range(1, len(results)):
        res, rstep = results[i], results[i]["resumed_from_step"]
        before = {s: v for ser in by_proc[:i] for s, v in ser.items() if s <= rstep}  # later launches win
        at_ckpt = before[max(before)] if before else None
        verdict, why = expected_verdict(res, at_ckpt, peak, algorithm)
        first = min(by_proc[i])
        b = {"step": first, "resumed_from_step": rstep, "previous_last_step": results[i - 1]["last_step"],
             "reference_from": res["reference_from"], "reference_check": res["reference_check"],
             "expected_verdict": verdict, "why": why, "series": KL_METRIC if algorithm == "grpo" else
             "train/rewards_chosen_mean - train/rewards_rejected_mean",
             f"{key}_last_before": by_proc[i - 1][max(by_proc[i - 1])], f"{key}_at_checkpoint": at_ckpt,
             f"{key}_first_after": by_proc[i][first], f"{key}_peak_of_run": peak,
             f"{key}_first_3_after": [by_proc[i][s] for s in sorted(by_proc[i])[:3]]}
        if algorithm == "dpo":
            b["first_after"] = next(r for r in res["logged"] if r["step"] == first)
        out.append(b)
    return out


def launch_entry(res: dict[str, Any]) -> dict[str, Any]:
    steps = sorted(r["step"] for r in res["logged"])
    hparams = [f for f in res["event_files"] if Path(f).parent.name != "tensorboard"]
    return {"index": res["index"], "pid": res["pid"], "started_at": res["started_at"], "ended_at": res["ended_at"],
            "exp_dir": res["exp_dir"], "logged_steps": steps, "logged": res["logged"],
            "first_step": res["first_step"], "last_step": res["last_step"], "step0_keys": res["step0_keys"],
            "validation": res["validation"],
            "resume_from": res["resume_from"], "resumed_from_step": res["resumed_from_step"],
            "training_info_loaded": res["training_info_loaded"], "reference_mode": res["reference_mode"],
            "reference_from": res["reference_from"], "reference_check": res["reference_check"],
            "crash_after": res["crash_after"], "crashed": res["crashed"],
            "checkpoints_saved": res["checkpoints_saved"], "wandb_run_id": res["wandb_run_id"],
            "wandb_run_dir": res["wandb_run_dir"], "wandb_run_name": res["wandb_run_name"],
            "mlflow_run_id": res["mlflow_run_id"], "mlflow_experiment_id": res["mlflow_experiment_id"],
            "tensorboard_dir": res["tensorboard_dir"],
            "event_files": [f for f in res["event_files"] if f not in hparams], "hparams_event_files": hparams}


def relogged(results: list[dict[str, Any]]) -> list[int]:
    seen: dict[int, int] = {}
    for res in results:
        for s in {r["step"] for r in res["logged"]}:
            seen[s] = seen.get(s, 0) + 1
    return sorted(s for s, n in seen.items() if n > 1)


def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_differences(results: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The keys of the logged (resolved) config whose values differ between the launches of one run."""
    flats = [flat(r["logged_config"]) for r in results]
    keys = sorted(set().union(*flats))
    return {k: [f.get(k) for f in flats] for k in keys if len({json.dumps(f.get(k)) for f in flats}) > 1}


def scenario_entry(done: dict[str, Any]) -> dict[str, Any]:
    name, results = done["name"], done["results"]
    sc = SCENARIOS[name]
    bounds = boundaries(results, sc["algorithm"])
    verdicts = {b["expected_verdict"] for b in bounds}
    status = ("reference_reset" if "reference_reset" in verdicts else
              "inconclusive" if "inconclusive" in verdicts else "ok")
    steps = [s for r in results for s in (x["step"] for x in r["logged"])]
    return {"description": sc["description"], "algorithm": sc["algorithm"], "reference": sc["reference"],
            "config": config_of(name), "expected_status": status, "boundaries": bounds,
            "relogged_steps": relogged(results), "first_step": min(steps), "last_step": max(steps),
            "logged_config_differences": config_differences(results),
            "checkpoint_dir": f"results/{name}", "log_dir": f"logs/{name}",
            "launches": [launch_entry(r) for r in results]}


def tracker_runs(name: str, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The same run seen from each tracker, in the shape of sample_runs/trl/manifest.json's ``runs`` (the weight
    checks and step-0 keys are in ``scenarios[name]["launches"]``, not repeated here)."""
    runs = []
    for tracker, layout in (("tensorboard", "new-folder"), ("wandb", "name"), ("mlflow", "new-run")):
        procs = []
        for ln in entry["launches"]:
            p = {k: ln[k] for k in ("index", "first_step", "last_step", "resumed_from_step", "crashed",
                                    "reference_from", "started_at", "ended_at", "checkpoints_saved",
                                    "logged_steps", "exp_dir")}
            if tracker == "tensorboard":
                p.update(event_files=ln["event_files"], hparams_event_files=ln["hparams_event_files"],
                         logging_dir=ln["tensorboard_dir"])
            elif tracker == "wandb":
                p.update(run_dir=ln["wandb_run_dir"], run_id=ln["wandb_run_id"])
            else:
                p.update(run_id=ln["mlflow_run_id"], experiment_id=ln["mlflow_experiment_id"])
            procs.append(p)
        run = {"id": f"{tracker}/{layout}/{name}", "scenario": name, "description": entry["description"],
               "tracker": tracker, "layout": layout, "flavour": "nemo-rl", "algorithm": entry["algorithm"],
               "framework": "NeMo-RL Logger/CheckpointManager around trl." +
                            ("GRPOTrainer" if entry["algorithm"] == "grpo" else "DPOTrainer"),
               "name": name, "kl_metric": KL_METRIC if entry["algorithm"] == "grpo" else None,
               "step_metric": None, "config": entry["config"], "expected_status": entry["expected_status"],
               "boundaries": [{k: v for k, v in b.items() if k not in ("reference_check", "first_after")}
                              for b in entry["boundaries"]], "relogged_steps": entry["relogged_steps"],
               "declared_reference_resets": [], "processes": procs, "first_step": entry["first_step"],
               "last_step": entry["last_step"], "checkpoint_dir": entry["checkpoint_dir"]}
        if tracker == "wandb":
            run.update(path=entry["log_dir"], run_dirs=[p["run_dir"] for p in procs], group=None,
                       project=f"nemo-rl-{entry['algorithm']}")
        elif tracker == "mlflow":
            run.update(path="mlflow/mlflow.db", experiment=f"nemo-rl-{entry['algorithm']}",
                       run_ids=[p["run_id"] for p in procs])
        else:
            run["path"] = entry["log_dir"]
        runs.append(run)
    return runs


# --- pruning -------------------------------------------------------------------------------------------------


def prune(out: Path) -> None:
    """Checkpoints keep NeMo-RL's small JSON/YAML; W&B folders keep the ``.wandb`` log (and small files/ JSON or
    YAML, which offline runs do not write); the MLflow store is re-paged to 1 KiB and vacuumed."""
    for step_dir in (out / "results").glob("*/step_*"):
        for f in step_dir.iterdir():
            if f.name not in ("training_info.json", "config.yaml"):
                shutil.rmtree(f) if f.is_dir() else f.unlink()
    for wroot in (out / "logs").glob("*/exp_*/wandb/wandb"):
        for extra in wroot.iterdir():
            if extra.is_symlink() or extra.is_file():
                extra.unlink()
            elif "run-" in extra.name:
                prune_wandb_run(extra)
    compact_mlflow(out / "mlflow" / "mlflow.db", page_size=1024)


def prune_wandb_run(run_dir: Path) -> None:
    for f in list(run_dir.rglob("*")):
        if f.is_file() and not (f.suffix == ".wandb" or (f.parent.name == "files" and f.suffix in (".json", ".yaml")
                                                           and f.stat().st_size < 20000)):
            f.unlink()
    for d in sorted(run_dir.rglob("*"), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()


# --- main ----------------------------------------------------------------------------------------------------


def versions(py: str) -> dict[str, str]:
    pkgs = ["trl", "transformers", "torch", "accelerate", "datasets", "tokenizers", "wandb", "mlflow", "tensorboard",
            "ray", "omegaconf", "hydra-core", "swanlab", "pydantic"]
    code = f"import json, importlib.metadata as m; print(json.dumps({{p: m.version(p) for p in {pkgs!r}}}))"
    try:
        return json.loads(subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout)
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError) as exc:
        return {"error": repr(exc)}


def dump_json(obj: Any, level: int = 0) -> str:
    """Indented JSON with lists of scalars and short flat objects on one line (a line per step otherwise)."""
    pad, inner = " " * level, " " * (level + 1)
    flat_row = isinstance(obj, dict) and not any(isinstance(v, (dict, list)) for v in obj.values())
    if flat_row and len(json.dumps(obj)) <= 160:  # a logged step, a weight check: one line
        return json.dumps(obj)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {dump_json(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(inner + dump_json(v, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nemo-rl", help=f"NeMo-RL source folder (default ${nemo.ENV_SRC})")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from: " + ", ".join(SCENARIOS))
    ap.add_argument("--python", help="the generation venv's interpreter (default $KLWATCH_NEMO_RL_PYTHON, else "
                                     ".venv-nemo-rl/bin/python, else this one)")
    ap.add_argument("--jobs", type=int, default=2, help="scenarios in parallel (each launch is one process)")
    ap.add_argument("--restart-gap", type=float, default=1.5, help="seconds between a crash and the relaunch")
    ap.add_argument("--keep-work", action="store_true", help="keep DIR/.work (specs, results, logs, base model)")
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def generation_python(arg: str | None) -> str:
    env = os.environ.get("KLWATCH_NEMO_RL_PYTHON")
    return arg or env or (str(DEFAULT_VENV_PY) if DEFAULT_VENV_PY.exists() else sys.executable)


def fresh_out(out: Path, py: str) -> Path:
    """Replace the corpus's generated parts; make the scratch folder and the tiny base model inside it."""
    for sub in ("logs", "results", "mlflow", "manifest.json", ".work"):
        p = out / sub
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    work = out / ".work"
    (out / "mlflow").mkdir(parents=True)
    work.mkdir(parents=True)
    subprocess.run([py, "-c", "from sample_runs.trl_corpus.tiny_model import build_base_model; "
                    f"build_base_model({str(work / 'base-model')!r})"], cwd=REPO, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    return work


def manifest(done: list[dict[str, Any]], ctx: dict[str, Any], seconds: float) -> dict[str, Any]:
    scenarios = {d["name"]: scenario_entry(d) for d in done}
    return {
        "schema": "klwatch.sample-manifest/1",
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generator": "sample_runs/nemo_rl_corpus/generate.py",
        "framework": "NeMo-RL (config, Logger, CheckpointManager) around TRL training",
        "nemo_rl": {"commit": nemo.NEMO_RL_COMMIT, "source_git_commit": nemo.source_commit(ctx["src"]),
                    "example_configs": nemo.EXAMPLE_CONFIG},
        "versions": versions(ctx["python"]),
        "generation_seconds": round(seconds, 1), "jobs": ctx["jobs"], "restart_gap_seconds": ctx["gap"],
        "layout": {"logs": "logs/<scenario>/exp_NNN/{wandb,tensorboard}", "checkpoints": "results/<scenario>/step_N",
                   "mlflow": "mlflow/mlflow.db"},
        "mlflow": {"store": "mlflow/mlflow.db", "experiments": ["nemo-rl-grpo", "nemo-rl-dpo"]},
        "wandb": {"projects": ["nemo-rl-grpo", "nemo-rl-dpo"], "mode": "offline"},
        "base_config": BASE,
        "expected_verdict_rule": ("reference_from=checkpoint: reference_reset (GRPO: inconclusive if the KL at the "
                                  f"checkpoint was under {INCONCLUSIVE_BELOW:.0%} of the run's peak); "
                                  "reference_from=base: ok"),
        "model": {"arch": "LlamaForCausalLM", "hidden_size": 32, "layers": 2, "tokenizer": "word-level, 24 tokens",
                  "reward": "share of completion words equal to 'good'",
                  "preferences": "chosen completions hold 2-3 'good' words, rejected ones none"},
        "scenarios": scenarios,
        "runs": [r for name, e in scenarios.items() for r in tracker_runs(name, e)],
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    src = nemo.find_source(a.nemo_rl)
    if src is None:
        print(f"no NeMo-RL source: pass --nemo-rl DIR or set {nemo.ENV_SRC} (an export of commit "
              f"{nemo.NEMO_RL_COMMIT}); see sample_runs/nemo_rl_corpus/README.md", file=sys.stderr)
        return 2
    names = [s for s in a.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        print(f"unknown scenarios {unknown}", file=sys.stderr)
        return 2
    commit = nemo.source_commit(src)
    if commit and commit != nemo.NEMO_RL_COMMIT:
        print(f"warning: {src} is at {commit}, the corpus pins {nemo.NEMO_RL_COMMIT}", file=sys.stderr)
    out, py, t0 = Path(a.out).resolve(), generation_python(a.python), time.time()
    ctx = {"out": out, "src": src, "python": py, "work": fresh_out(out, py), "quiet": a.quiet,
           "gap": a.restart_gap, "jobs": a.jobs}
    say(a.quiet, f"generating {len(names)} scenarios into {out} with NeMo-RL from {src}")
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        done = list(pool.map(lambda n: run_scenario(n, ctx), names))
    prune(out)
    data = manifest(done, ctx, time.time() - t0)
    (out / "manifest.json").write_text(dump_json(data) + "\n")
    for name, e in data["scenarios"].items():
        for b in e["boundaries"]:
            say(a.quiet, f"  {name}: resume at {b['step']} from step_{b['resumed_from_step']} "
                         f"reference={b['reference_from']} -> {b['expected_verdict']}")
    if not a.keep_work:
        shutil.rmtree(ctx["work"], ignore_errors=True)
    say(a.quiet, f"done in {time.time() - t0:.0f}s, manifest at {out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
