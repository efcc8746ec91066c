"""Generate the real-TRL preference corpus:
``python -m sample_runs.trl_corpus.generate --corpus preference [--out DIR] [--scenarios a,b] [--jobs N] [--quiet]``.

The same machinery as the GRPO corpus (``generate.py``, ``launch.py``): every launch is its own process training on
CPU with the real ``trl.DPOTrainer``, ``trl.KTOTrainer`` or ``trl.RLOOTrainer`` on the tiny local model, logging
through the stock ``report_to`` callbacks (W&B offline, MLflow SQLite, TensorBoard), crashing after a checkpoint and
relaunched the way users do it. The manifest (``DIR/manifest.json``, the GRPO corpus's schema plus ``trainer``,
``loss_type``, ``kl_metric``, ``preference_metrics`` and per relaunch ``first_after_resume``) is written from what the
processes report: the steps they logged, their implicit rewards / KL, where they resumed, and what their reference
really was (compared weight for weight inside the process).

DPO logs no KL: a reference rebuilt from the resumed weights shows in the implicit rewards
``beta * (log pi - log pi_ref)``, exactly 0 for every sample when the reference equals the policy, so on the first
step after such a resume ``rewards/chosen``, ``rewards/rejected`` and ``rewards/margins`` are 0.0,
``rewards/accuracies`` is 0.0 (a strict ``>``) and the loss is ln 2 (sigmoid) or 1/(4 beta^2) (IPO). KTO and RLOO
log ``kl`` as well.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sample_runs.trackers import compact_mlflow  # noqa: E402
from sample_runs.trl_corpus import generate as g  # noqa: E402

REPO = g.REPO
DEFAULT_OUT = REPO / "sample_runs" / "trl_preference"
WANDB_PROJECT = "klwatch-trl-preference"
MLFLOW_EXPERIMENT = "klwatch-trl-preference"
TRAINERS = {"dpo": "trl.DPOTrainer", "kto": "trl.KTOTrainer", "rloo": "trl.RLOOTrainer"}
# the series that shows the reference: DPO logs no KL, so its implicit reward margin
SERIES = {"dpo": "rewards/margins", "kto": "kl", "rloo": "kl"}
# the values recorded at the checkpoint and at the first logged step after a resume: short name -> TRL's key
VALUES = {"chosen": "rewards/chosen", "rejected": "rewards/rejected", "margin": "rewards/margins",
          "accuracy": "rewards/accuracies", "loss": "loss", "kl": "kl"}
# processes[].reference_check.how (launch.py): what the trainer used as its reference
REFERENCE_HOW = {
    "ref_model": "a separate ref_model the trainer built from the policy's config._name_or_path (compared weight for "
                 "weight with the base model and the resumed checkpoint)",
    "ref_adapter": "no ref_model: the policy through a frozen 'ref' adapter the trainer copied from the loaded "
                   "adapter (use_adapter(model, 'ref')); compared with the checkpoint's adapter_model.safetensors",
    "adapter_disabled": "no ref_model: the policy with its adapter disabled (the frozen base weights, compared with "
                        "the base model)",
    "precomputed": "no ref_model: precompute_ref_log_probs=True, the reference log-probs computed in the trainer's "
                   "constructor by the policy as built (its weights compared with base and checkpoint, and the "
                   "stored log-probs of 8 rows recomputed with both)"}
PREFERENCE_KEYS = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "loss"]
PREFIX = {"wandb": "train/", "tensorboard": "train/", "mlflow": ""}

BASE_CONFIG: dict[str, dict] = {
    # 64 pairs, batch 16 (4 steps an epoch); the margin grows from 0 to ~0.8 by step 4 and ~1.3 by step 8
    "dpo": {"lr": 0.005, "beta": 0.1, "loss_type": "sigmoid", "max_steps": 8, "save_steps": 4, "logging_steps": 1,
            "batch_size": 16, "seed": 42},
    # 64 rows, 3 in 4 desirable, batch 16; the KL grows from 0 to ~3 by step 4, ~5 by step 8
    "kto": {"lr": 0.002, "beta": 0.1, "loss_type": "kto", "max_steps": 8, "save_steps": 4, "logging_steps": 1,
            "batch_size": 16, "seed": 42},
    # 8 prompts x 8 generations a step, reward = share of 'good'; the KL grows from 0 to ~1.6 by step 4, ~1.9 by 8
    "rloo": {"lr": 0.03, "beta": 0.05, "max_steps": 8, "save_steps": 4, "logging_steps": 1, "batch_size": 64,
             "num_generations": 8, "seed": 42},
}

# Each scenario: trainer, launches (model_from, resume checkpoint step, crash_after), overrides, and the layout in
# each tracker (None: not written). The layouts mean what they mean in generate.py. Every scenario goes to
# TensorBoard; W&B and MLflow get what covers every layout used with a reset and a healthy run and every trainer with
# a buggy and a correct run, no more: the corpus must stay under 1.5 MB, and an MLflow metric row costs ~300 bytes,
# every MLflow run ~185 params (~32 KB), the empty MLflow store ~280 KB; RLOO logs ~33 values a step (profiling
# times included), ~6 KB a step in a .wandb file. Runs are 8 steps (the resume at 50%) for the same reason.
SCENARIOS: dict[str, dict] = {
    "dpo-continuous": {
        "trainer": "dpo",
        "description": "DPO (sigmoid), one process, 8 steps, no restart",
        "launches": [("base", None, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "new-folder"}},
    "dpo-resume-correct": {
        "trainer": "dpo",
        "description": "DPO (sigmoid), crash after the step-4 checkpoint; relaunch with model=<base> and "
                       "resume_from_checkpoint=checkpoint-4: reference = base",
        "launches": [("base", None, 4), ("base", 4, None)],
        "layouts": {"wandb": "group", "mlflow": None, "tensorboard": "new-folder"}},
    "dpo-resume-buggy": {
        "trainer": "dpo",
        "description": "DPO (sigmoid), crash after the step-4 checkpoint; relaunch with model=checkpoint-4 and "
                       "resume_from_checkpoint=checkpoint-4: DPOTrainer builds its ref_model from the checkpoint",
        "launches": [("base", None, 4), ("checkpoint", 4, None)],
        "layouts": {"wandb": "group", "mlflow": None, "tensorboard": "same-folder"}},
    "dpo-ipo-buggy": {
        "trainer": "dpo",
        "description": "DPO loss_type='ipo', crash after 4, relaunch with the checkpoint as the model",
        "overrides": {"loss_type": "ipo"},
        "launches": [("base", None, 4), ("checkpoint", 4, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "new-folder"}},
    "dpo-ipo-correct": {
        "trainer": "dpo",
        "description": "DPO loss_type='ipo', crash after 4, correct relaunch",
        "overrides": {"loss_type": "ipo"},
        "launches": [("base", None, 4), ("base", 4, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "same-folder"}},
    "dpo-lora-correct": {
        "trainer": "dpo",
        "description": "DPO with a LoRA adapter (peft_config, lr 0.01), crash after 4; relaunch with model=<base>, "
                       "the same peft_config and resume_from_checkpoint: reference = base with the adapter disabled",
        "overrides": {"lr": 0.01},
        "launches": [("peft-base", None, 4), ("peft-base", 4, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "new-folder"}},
    "dpo-lora-buggy": {
        "trainer": "dpo",
        "description": "DPO with a LoRA adapter, crash after 4; relaunch with model=PeftModel.from_pretrained(base, "
                       "checkpoint-4, is_trainable=True) and no peft_config: DPOTrainer copies the loaded adapter "
                       "into a frozen 'ref' adapter, so reference = resumed adapter",
        "overrides": {"lr": 0.01},
        "launches": [("peft-base", None, 4), ("peft-checkpoint", 4, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "same-folder"}},
    "dpo-precompute-buggy": {
        "trainer": "dpo",
        "description": "DPO precompute_ref_log_probs=True, crash after 4; relaunch with model=checkpoint-4: the "
                       "constructor precomputes the reference log-probs with the checkpoint's weights",
        "overrides": {"precompute_ref_log_probs": True},
        "launches": [("base", None, 4), ("checkpoint", 4, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "new-folder"}},
    "dpo-precompute-correct": {
        "trainer": "dpo",
        "description": "DPO precompute_ref_log_probs=True, crash after 4; correct relaunch (model=<base>): the "
                       "constructor precomputes the reference log-probs with the base weights, before the resume "
                       "restores the checkpoint's",
        "overrides": {"precompute_ref_log_probs": True},
        "launches": [("base", None, 4), ("base", 4, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "same-folder"},
        "committed": False},  # generated on request only (--scenarios): the corpus must stay under 1.5 MB
    "dpo-sparse-buggy": {
        "trainer": "dpo",
        "description": "DPO, logging_steps=3 (each logged value is the mean of 3 steps), 18 steps, checkpoints "
                       "every 9, crash after 9, relaunch with the checkpoint as the model (first logged point 12, "
                       "the mean of 10-12)",
        "overrides": {"max_steps": 18, "save_steps": 9, "logging_steps": 3},
        "launches": [("base", None, 9), ("checkpoint", 9, None)],
        "layouts": {"wandb": None, "mlflow": "new-run", "tensorboard": "same-folder"}},
    "dpo-sparse-correct": {
        "trainer": "dpo",
        "description": "DPO, logging_steps=3, 18 steps, checkpoints every 9, crash after 9, correct relaunch",
        "overrides": {"max_steps": 18, "save_steps": 9, "logging_steps": 3},
        "launches": [("base", None, 9), ("base", 9, None)],
        "layouts": {"wandb": None, "mlflow": "new-run", "tensorboard": "new-folder"}},
    "dpo-early-buggy": {
        "trainer": "dpo",
        "description": "DPO, 20 steps, checkpoints every 3, crash after 3 (15% of the run), relaunch with "
                       "checkpoint-3 as the model",
        "overrides": {"max_steps": 20, "save_steps": 3},
        "launches": [("base", None, 3), ("checkpoint", 3, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "new-folder"}},
    "dpo-early-correct": {
        "trainer": "dpo",
        "description": "DPO, 20 steps, checkpoints every 3, crash after 3 (15% of the run), correct relaunch",
        "overrides": {"max_steps": 20, "save_steps": 3},
        "launches": [("base", None, 3), ("base", 3, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "same-folder"}},
    "dpo-sync-ref": {
        "trainer": "dpo",
        "description": "DPO sync_ref_model=True, ref_model_sync_steps=4, ref_model_mixup_alpha=1.0: the reference "
                       "is replaced by the policy at steps 4 and 8 (inside the processes); crash after 4 and "
                       "relaunch with the checkpoint as the model, i.e. exactly the reference the step-4 sync made",
        "overrides": {"sync_ref_model": True, "ref_model_sync_steps": 4, "ref_model_mixup_alpha": 1.0},
        "launches": [("base", None, 4), ("checkpoint", 4, None)],
        "layouts": {"wandb": None, "mlflow": None, "tensorboard": "same-folder"}},
    "kto-resume-correct": {
        "trainer": "kto",
        "description": "KTO, crash after the step-4 checkpoint; relaunch with model=<base> and "
                       "resume_from_checkpoint=checkpoint-4: reference = base",
        "launches": [("base", None, 4), ("base", 4, None)],
        "layouts": {"wandb": "resume", "mlflow": "resume", "tensorboard": "new-folder"}},
    "kto-resume-buggy": {
        "trainer": "kto",
        "description": "KTO, crash after the step-4 checkpoint; relaunch with model=checkpoint-4: KTOTrainer "
                       "builds its ref_model from the checkpoint",
        "launches": [("base", None, 4), ("checkpoint", 4, None)],
        "layouts": {"wandb": "resume", "mlflow": "resume", "tensorboard": "same-folder"}},
    "rloo-resume-correct": {
        "trainer": "rloo",
        "description": "RLOO, crash after the step-4 checkpoint; relaunch with model=<base> and "
                       "resume_from_checkpoint=checkpoint-4: reference = base",
        "launches": [("base", None, 4), ("base", 4, None)],
        "layouts": {"wandb": "name", "mlflow": "resume", "tensorboard": "same-folder"}},
    "rloo-resume-buggy": {
        "trainer": "rloo",
        "description": "RLOO, crash after the step-4 checkpoint; relaunch with model=checkpoint-4: RLOOTrainer "
                       "builds its ref_model from the checkpoint",
        "launches": [("base", None, 4), ("checkpoint", 4, None)],
        "layouts": {"wandb": "name", "mlflow": "resume", "tensorboard": "new-folder"}},
}

EXPECTED_VERDICT_RULE = ("reference_from=checkpoint: reference_reset at the first step logged after the resume, "
                         "unless the resume step is a sync_ref_model step with alpha 1 (intentional); "
                         "reference_from=base: ok. No 'inconclusive' rule: early resumes keep their verdict, their "
                         "values are recorded (series_at_checkpoint, series_peak_of_run)")


def say(quiet: bool, *a) -> None:
    g.say(quiet, *a)


def config_of(name: str) -> dict:
    sc = SCENARIOS[name]
    return {**BASE_CONFIG[sc["trainer"]], **sc.get("overrides", {})}


def output_dir_of(out: Path, work: Path, name: str) -> Path:
    if SCENARIOS[name]["layouts"].get("tensorboard"):
        return out / "tensorboard" / name
    return work / "trl-output" / name  # no TensorBoard: TRL's output_dir is not committed


def run_scenario(name: str, out: Path, base: Path, work: Path, quiet: bool, gap: float) -> dict:
    sc = SCENARIOS[name]
    kind = sc["trainer"]
    cfg = config_of(name)
    output_dir = output_dir_of(out, work, name)
    results: list[dict] = []
    for i, (model_from, resume_step, crash_after) in enumerate(sc["launches"]):
        env, report_to, run_name = g.tracker_env(out, name, sc, i, results[0] if results else None,
                                                 project=WANDB_PROJECT, experiment=MLFLOW_EXPERIMENT)
        resume = str(output_dir / f"checkpoint-{resume_step}") if resume_step is not None else None
        spec = {**cfg, "trainer": kind, "index": i, "base_model": str(base), "output_dir": str(output_dir),
                "run_name": run_name, "report_to": report_to, "model_from": model_from, "resume_from": resume,
                "crash_after": crash_after, "env": env, "verl": None,
                "result": str(work / f"{name}.{i}.result.json")}
        t0 = time.time()
        res = g.launch_once(spec, work, name, i)
        res["report_to"], res["run_name"], res["spec"] = report_to, run_name, spec
        results.append(res)
        series = [r for r in res["logged"] if SERIES[kind] in r]
        say(quiet, f"  {name}[{i}] model={model_from} resume={resume_step} steps {res['first_step']}-"
                   f"{res['last_step']} crashed={res['crashed']} reference={res['reference_from']} "
                   f"{SERIES[kind]} first/last {series[0][SERIES[kind]]:.4f}/{series[-1][SERIES[kind]]:.4f} "
                   f"({time.time() - t0:.0f}s)")
        if i + 1 < len(sc["launches"]):
            time.sleep(gap)
    return {"name": name, "config": cfg, "results": results}


def _values(rec: dict | None) -> dict | None:
    """A logged point under short names (None where TRL did not log that key)."""
    if rec is None:
        return None
    return {"step": rec["step"], **{short: rec.get(key) for short, key in VALUES.items()}}


def first_after_resume(done: dict, boundary: dict) -> dict:
    """What the relaunched process of this boundary logged at its first logged step."""
    res = next(r for r in done["results"][1:] if r["resumed_from_step"] == boundary["resumed_from_step"])
    return _values(next(r for r in res["logged"] if SERIES[SCENARIOS[done["name"]]["trainer"]] in r))


def build_runs(done: dict, out: Path) -> list[dict]:
    name, cfg, results = done["name"], done["config"], done["results"]
    sc = SCENARIOS[name]
    kind = sc["trainer"]
    key = SERIES[kind]
    rows_by_proc = [{r["step"]: r for r in res["logged"] if key in r} for res in results]
    series_by_proc = [{s: r[key] for s, r in rows.items()} for rows in rows_by_proc]
    peak = max(max(k.values()) for k in series_by_proc if k)
    sync_steps = []
    if cfg.get("sync_ref_model"):
        sync_steps = list(range(cfg["ref_model_sync_steps"], cfg["max_steps"] + 1, cfg["ref_model_sync_steps"]))
    boundaries, first_after = [], {}
    for i in range(1, len(results)):
        res, prev = results[i], results[i - 1]
        rstep = res["resumed_from_step"]
        before_rows = {s: r for rows in rows_by_proc[:i] for s, r in rows.items() if s <= rstep}
        at_ckpt = before_rows[max(before_rows)] if before_rows else None
        last_before = rows_by_proc[i - 1][max(rows_by_proc[i - 1])]
        first = rows_by_proc[i][min(rows_by_proc[i])]
        if res["reference_from"] == "checkpoint":
            if rstep in sync_steps and cfg.get("ref_model_mixup_alpha") == 1.0:
                verdict, why = "intentional", (f"sync_ref_model=True with ref_model_sync_steps="
                                               f"{cfg['ref_model_sync_steps']}, alpha 1.0: the step-{rstep} sync "
                                               "makes exactly this reference")
            else:
                verdict, why = "reference_reset", "reference rebuilt from the resumed weights"
        elif res["reference_from"] == "base":
            verdict, why = "ok", "reference = base model"
        else:
            verdict, why = "inconclusive", "reference is neither the base nor the checkpoint"
        first_after[i] = _values(first)
        after = [series_by_proc[i][s] for s in sorted(series_by_proc[i])[:3]]
        b = {"step": first["step"], "resumed_from_step": rstep, "previous_last_step": prev["last_step"],
             "reference_from": res["reference_from"], "model_from": res["model_from"], "expected_verdict": verdict,
             "why": why, "series": key, "series_last_before": last_before[key],
             "series_at_checkpoint": at_ckpt[key] if at_ckpt else None, "series_first_after": first[key],
             "series_peak_of_run": peak, "series_first_3_after": after,
             "at_checkpoint": _values(at_ckpt)}
        boundaries.append(b)
    verdicts = {b["expected_verdict"] for b in boundaries}
    status = ("reference_reset" if "reference_reset" in verdicts else
              "intentional" if "intentional" in verdicts else "ok")
    seen: dict[int, int] = {}
    for k in series_by_proc:
        for s in k:
            seen[s] = seen.get(s, 0) + 1
    relogged = sorted(s for s, n in seen.items() if n > 1)
    all_steps = [s for k in series_by_proc for s in k]
    logged_keys = set().union(*(res.get("logged_keys", []) for res in results))
    runs = []
    for tracker in ("tensorboard", "wandb", "mlflow"):
        layout = sc["layouts"].get(tracker)
        if not layout:
            continue
        prefix = PREFIX[tracker]
        procs = []
        for i, res in enumerate(results):
            p = {"index": res["index"], "first_step": res["first_step"], "last_step": res["last_step"],
                 "resumed_from_step": res["resumed_from_step"], "crashed": res["crashed"],
                 "reference_from": res["reference_from"], "model_from": res["model_from"],
                 "reference_check": g._portable(res["reference_check"], out),
                 "started_at": round(res["started_at"], 3), "ended_at": round(res["ended_at"], 3),
                 "checkpoints_saved": res["checkpoints_saved"],
                 "run_name": res["run_name"], "logged_steps": sorted(series_by_proc[i])}
            if i > 0:
                p["first_after_resume"] = first_after[i]
            if tracker == "tensorboard":
                p["event_files"] = [g._rel(f, out) for f in res.get("event_files", [])]
                p["logging_dir"] = g._rel(res.get("tensorboard_dir"), out)
            elif tracker == "wandb":
                p["run_dir"] = g._rel(res.get("wandb_run_dir"), out)
                p["run_id"] = res.get("wandb_run_id")
            else:
                p["run_id"] = res.get("mlflow_run_id")
            procs.append(p)
        run = {"id": f"{tracker}/{layout}/{name}", "scenario": name,  # its description: manifest["scenarios"]
               "tracker": tracker, "layout": layout, "flavour": "trl", "framework": TRAINERS[kind],
               "trainer": TRAINERS[kind], "loss_type": cfg.get("loss_type"), "name": name,
               "kl_metric": prefix + "kl" if "kl" in logged_keys else None,
               "preference_metrics": [prefix + k for k in PREFERENCE_KEYS
                                      if k in logged_keys and (k != "loss" or "rewards/chosen" in logged_keys)],
               "series_metric": prefix + key, "step_metric": g.STEP_METRIC[tracker],
               "config": cfg, "expected_status": status, "boundaries": boundaries, "relogged_steps": relogged,
               "declared_reference_resets": [{"step": s, "kind": "sync_ref_model",
                                              "alpha": cfg["ref_model_mixup_alpha"], "resume": False}
                                             for s in sync_steps],
               "processes": procs, "first_step": min(all_steps), "last_step": max(all_steps),
               "checkpoint_dir": f"tensorboard/{name}" if sc["layouts"].get("tensorboard") else None}
        if tracker == "wandb":
            run["path"] = f"wandb/{layout}"
            run["run_dirs"] = [p["run_dir"] for p in procs]
            run["group"] = name if layout == "group" else None
        elif tracker == "mlflow":
            run["path"] = "mlflow/mlflow.db"
            run["experiment"] = MLFLOW_EXPERIMENT
            run["run_ids"] = sorted({p["run_id"] for p in procs})
        else:
            run["path"] = f"tensorboard/{name}"
        runs.append(run)
    return runs


# --- what the trackers really hold ------------------------------------------------------------------------------


def _tensorboard_tags(files: list[Path]) -> set[str]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    tags = set()
    for f in files:
        for ev in EventFileLoader(str(f)).Load():
            for v in ev.summary.value:
                tags.add(v.tag)
    return tags


def _wandb_history_keys(path: Path) -> set[str]:
    """The history keys in a ``run-<id>.wandb`` file: W&B's LevelDB-style record log (a 7-byte W&B header, then
    32 KiB blocks of records, each ``crc32 | length (2 bytes) | type (full/first/middle/last)``), whose payloads are
    ``wandb_internal_pb2.Record`` protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, keys, pos, block, buf = path.read_bytes(), set(), 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                keys.update(item.key or "/".join(item.nested_key) for item in rec.history.item)
    return keys


def stored_keys(run: dict, out: Path) -> set[str] | None:
    """The metric names the tracker stored for this run, read back from its files after generation."""
    if run["tracker"] == "tensorboard":
        return _tensorboard_tags([out / f for p in run["processes"] for f in p["event_files"]])
    if run["tracker"] == "mlflow":
        con = sqlite3.connect(out / run["path"])
        try:
            marks = ",".join("?" * len(run["run_ids"]))
            return {r[0] for r in con.execute(f"SELECT DISTINCT key FROM metrics WHERE run_uuid IN ({marks})",
                                              run["run_ids"])}
        finally:
            con.close()
    keys: set[str] = set()
    for d in run["run_dirs"]:
        for f in (out / d).glob("*.wandb"):
            keys |= _wandb_history_keys(f)
    return keys or None


def check_stored(runs: list[dict], out: Path) -> None:
    for run in runs:
        keys = stored_keys(run, out)
        run["stored_keys_checked"] = keys is not None
        if keys is None:
            continue
        want = run["preference_metrics"] + [run["series_metric"]] + ([run["kl_metric"]] if run["kl_metric"] else [])
        missing = [k for k in want if k not in keys]
        if missing:
            raise RuntimeError(f"{run['id']}: {missing} not in what {run['tracker']} stored: {sorted(keys)}")


def compact_smallest(db: Path) -> None:
    """Re-page and vacuum the MLflow store at 512 or 1024-byte pages, whichever is smaller (the empty MLflow schema
    is ~170 KB at 512, ~290 KB at 1024; rows cost ~20% more at 512)."""
    if not db.exists():
        return
    sizes = {}
    for ps in (1024, 512):
        trial = db.with_suffix(f".{ps}")
        shutil.copy2(db, trial)
        compact_mlflow(trial, page_size=ps)
        sizes[ps] = trial.stat().st_size
    best = min(sizes, key=sizes.get)
    db.with_suffix(f".{best}").replace(db)
    for ps in sizes:
        db.with_suffix(f".{ps}").unlink(missing_ok=True)


def dump_manifest(manifest: dict) -> str:
    """JSON with one line per process, boundary and list of values (the manifest is committed: keep it small)."""
    inline: dict[str, str] = {}

    def walk(o, key=None):
        if isinstance(o, dict):
            return {k: walk(v, k) for k, v in o.items()}
        if isinstance(o, list):
            if key in ("processes", "boundaries", "declared_reference_resets") or all(
                    not isinstance(x, (dict, list)) for x in o):
                mark = f"@@{len(inline)}@@"
                if key in ("processes", "boundaries", "declared_reference_resets") and o:
                    inline[mark] = "[\n" + ",\n".join("   " + json.dumps(x, separators=(",", ":")) for x in o) + "\n  ]"
                else:
                    inline[mark] = json.dumps(o)
                return mark
            return [walk(x) for x in o]
        return o

    text = json.dumps(walk(manifest), indent=1)
    text = re.sub(r'"(@@\d+@@)"', lambda m: inline[m.group(1)], text)
    assert json.loads(text) == manifest
    return text + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sample_runs.trl_corpus.generate --corpus preference",
                                 description="Generate the real-TRL preference corpus (DPO, KTO, RLOO).")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--scenarios", default=",".join(n for n, sc in SCENARIOS.items() if sc.get("committed", True)),
                    help="comma-separated, from: " + ", ".join(SCENARIOS) + " (default: all but "
                         + ", ".join(n for n, sc in SCENARIOS.items() if not sc.get("committed", True)) + ")")
    a, names = g.parse_run_options(ap, argv, SCENARIOS)
    out = Path(a.out).resolve()
    work = g.fresh_out(out, [(SCENARIOS[n]["layouts"].get("wandb"), None) for n in names])
    t0 = time.time()
    base = g.base_model(work)
    if any(SCENARIOS[n]["layouts"].get("mlflow") for n in names):
        g.mlflow_store(out, (MLFLOW_EXPERIMENT,))
    say(a.quiet, f"generating {len(names)} preference scenarios into {out}")
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        done = list(pool.map(lambda n: run_scenario(n, out, base, work, a.quiet, a.restart_gap), names))
    runs = [r for d in done for r in build_runs(d, out)]
    g.prune(out, done, SCENARIOS)
    compact_smallest(out / "mlflow" / "mlflow.db")
    check_stored(runs, out)
    for d in done:
        for b in build_runs(d, out)[0]["boundaries"]:
            f = first_after_resume(d, b)
            say(a.quiet, f"  {d['name']}: resume at {b['step']} from {b['resumed_from_step']} "
                         f"reference={b['reference_from']} {b['series']} before {b['series_last_before']:.4f} "
                         f"after {b['series_first_after']:.4f} (loss {f['loss']:.4f}) -> {b['expected_verdict']}")
    manifest = {
        **g.manifest_head(
            generator="sample_runs/trl_corpus/generate.py --corpus preference (sample_runs/trl_corpus/preference.py)",
            framework=", ".join(TRAINERS[k] for k in sorted({SCENARIOS[n]["trainer"] for n in names})), t0=t0,
            experiment=MLFLOW_EXPERIMENT, project=WANDB_PROJECT),
        "base_config": BASE_CONFIG,
        "expected_verdict_rule": EXPECTED_VERDICT_RULE,
        "model": {"arch": "LlamaForCausalLM", "hidden_size": 32, "layers": 2, "tokenizer": "word-level, 24 tokens",
                  "data": {"dpo": "64 pairs: prompt = 3 random words, chosen = 2-4 x 'good', rejected = 2-4 other "
                                  "words",
                           "kto": "64 rows: prompt = 3 random words, 3 in 4 desirable (2-4 x 'good'), the 4th "
                                  "undesirable (2-4 other words), in a fixed order (KTO samples sequentially)",
                           "rloo": "64 prompts of 3 random words; reward = share of completion words equal to 'good' "
                                   "(the GRPO corpus's reward)"}},
        "series": {TRAINERS[k]: v for k, v in SERIES.items()},
        "first_after_resume_values": VALUES,
        "reference_check_how": REFERENCE_HOW,
        "scenarios": {n: {"description": SCENARIOS[n]["description"], "trainer": TRAINERS[SCENARIOS[n]["trainer"]],
                          "layouts": SCENARIOS[n]["layouts"]} for n in names},
        "runs": runs,
    }
    return g.finish(out, work, dump_manifest(manifest), keep_work=a.keep_work, quiet=a.quiet, runs=len(runs), t0=t0)


if __name__ == "__main__":
    raise SystemExit(main())
