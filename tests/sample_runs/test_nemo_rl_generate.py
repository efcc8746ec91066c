"""Regenerating the NeMo-RL corpus (``sample_runs/nemo_rl``) still gives NeMo-RL's layout and a truthful manifest.

Slow, and skipped unless NeMo-RL's source is there (``KLWATCH_NEMO_RL_SRC``, an export of the commit in
``sample_runs/nemo_rl_corpus/NEMO_RL_COMMIT``) and the generation venv is (``KLWATCH_NEMO_RL_PYTHON``, else
``.venv-nemo-rl/bin/python`` made by ``sample_runs/nemo_rl_corpus/setup.sh``): CI has neither and only reads the
committed data. Two scenarios are regenerated into a temporary folder; this checks the files and the manifest the
processes wrote, not klwatch's verdicts.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS_PKG = REPO / "sample_runs" / "nemo_rl_corpus"
SCENARIOS = ("nemo-grpo-resume-buggy", "nemo-dpo-resume-correct")


def crash_step(name: str) -> int:
    """Where the scenario's first launch crashes, as the generator's scenario table says."""
    from sample_runs.nemo_rl_corpus.generate import SCENARIOS

    return int(SCENARIOS[name]["crashes"][0])


def nemo_rl_source() -> Path | None:
    raw = os.environ.get("KLWATCH_NEMO_RL_SRC")
    src = Path(raw) if raw else None
    return src if src and (src / "nemo_rl" / "utils" / "logger.py").is_file() else None


def generation_python() -> str | None:
    py = os.environ.get("KLWATCH_NEMO_RL_PYTHON") or str(REPO / ".venv-nemo-rl" / "bin" / "python")
    if not Path(py).exists():
        return None
    probe = subprocess.run([py, "-c", "import trl, wandb, mlflow, tensorboard, ray, omegaconf, hydra"],
                           capture_output=True)
    return py if probe.returncode == 0 else None


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> tuple[Path, dict]:
    src, py = nemo_rl_source(), generation_python()
    if src is None:
        pytest.skip("no NeMo-RL source: set KLWATCH_NEMO_RL_SRC to an export of NEMO_RL_COMMIT")
    if py is None:
        pytest.skip("no generation venv: run sample_runs/nemo_rl_corpus/setup.sh or set KLWATCH_NEMO_RL_PYTHON")
    out = tmp_path_factory.mktemp("nemo_rl")
    subprocess.run([py, "-m", "sample_runs.nemo_rl_corpus.generate", "--nemo-rl", str(src), "--out", str(out),
                    "--scenarios", ",".join(SCENARIOS), "--restart-gap", "0.5", "--quiet"],
                   check=True, timeout=1200, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    return out, json.loads((out / "manifest.json").read_text())


@pytest.mark.slow
def test_manifest_records_what_each_launch_did(regenerated):
    _, m = regenerated
    assert m["nemo_rl"]["commit"] == (CORPUS_PKG / "NEMO_RL_COMMIT").read_text().strip()
    assert set(m["scenarios"]) == set(SCENARIOS) and m["generation_seconds"] > 0
    for name, sc in m["scenarios"].items():
        first, second = sc["launches"]
        c = crash_step(name)
        assert (first["crashed"], first["crash_after"], first["last_step"]) == (True, c, c), name
        assert (second["crashed"], second["resumed_from_step"], second["first_step"]) == (False, c, c + 1), name
        assert second["resume_from"] == f"results/{name}/step_{c}"
        assert [f["exp_dir"] for f in (first, second)] == [f"logs/{name}/exp_001", f"logs/{name}/exp_002"]
        assert first["wandb_run_id"] != second["wandb_run_id"] and first["mlflow_run_id"] != second["mlflow_run_id"]
        assert {first["wandb_run_name"], second["wandb_run_name"]} == {name}
        assert list(sc["logged_config_differences"]) == ["logger.log_dir"], sc["logged_config_differences"]
        assert [(b["step"], b["resumed_from_step"]) for b in sc["boundaries"]] == [(c + 1, c)]


@pytest.mark.slow
def test_reference_is_measured_and_the_verdict_follows_it(regenerated):
    _, m = regenerated
    buggy = m["scenarios"]["nemo-grpo-resume-buggy"]["launches"][1]["reference_check"]
    correct = m["scenarios"]["nemo-dpo-resume-correct"]["launches"][1]["reference_check"]
    # a copied reference equals its source weight for weight; the other differs by training's updates
    assert buggy["max_abs_diff_to_checkpoint"] < 1e-9 < 1e-4 < buggy["max_abs_diff_to_base"]
    assert correct["max_abs_diff_to_base"] < 1e-9 < 1e-4 < correct["max_abs_diff_to_checkpoint"]
    assert m["scenarios"]["nemo-grpo-resume-buggy"]["boundaries"][0]["expected_verdict"] == "reference_reset"
    assert m["scenarios"]["nemo-dpo-resume-correct"]["boundaries"][0]["expected_verdict"] == "ok"
    grpo = m["scenarios"]["nemo-grpo-resume-buggy"]["launches"]
    assert all(ln["step0_keys"] and all(k.startswith("timing/setup/") for k in ln["step0_keys"]) for ln in grpo)
    dpo = m["scenarios"]["nemo-dpo-resume-correct"]["launches"]
    assert any(k.startswith("validation-default/") for k in dpo[0]["step0_keys"]) and not dpo[1]["step0_keys"]


@pytest.mark.slow
def test_files_are_laid_out_as_nemo_rl_writes_them(regenerated):
    out, m = regenerated
    assert not (out / ".work").exists()
    for name, sc in m["scenarios"].items():
        for ln in sc["launches"]:
            tb = out / ln["exp_dir"] / "tensorboard"
            assert len(list(tb.glob("events.out.tfevents.*"))) == 1, tb
            assert len(list(tb.glob("*/events.out.tfevents.*"))) == 1, tb  # add_hparams' timestamp subfolder
            run_dir = out / ln["wandb_run_dir"]
            assert [p.name for p in run_dir.iterdir()] == [f"run-{ln['wandb_run_id']}.wandb"], run_dir
        for step in sorted(ln["checkpoints_saved"][-1] for ln in sc["launches"] if ln["checkpoints_saved"]):
            ck = out / "results" / name / f"step_{step}"
            assert sorted(p.name for p in ck.iterdir()) == ["config.yaml", "training_info.json"], ck
            assert json.loads((ck / "training_info.json").read_text())["total_steps"] == step


@pytest.mark.slow
def test_one_mlflow_store_a_new_run_per_launch(regenerated):
    out, m = regenerated
    con = sqlite3.connect(out / "mlflow" / "mlflow.db")
    try:
        rows = con.execute("select r.run_uuid, r.name, r.status, e.name from runs r "
                           "join experiments e on e.experiment_id = r.experiment_id").fetchall()
    finally:
        con.close()
    by_id = {r[0]: r[1:] for r in rows}
    for name, sc in m["scenarios"].items():
        first, second = sc["launches"]
        experiment = f"nemo-rl-{sc['algorithm']}"
        assert by_id[first["mlflow_run_id"]] == (name, "FAILED", experiment)
        assert by_id[second["mlflow_run_id"]] == (name, "FINISHED", experiment)
