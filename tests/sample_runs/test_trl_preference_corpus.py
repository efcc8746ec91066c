"""klwatch on the real TRL preference corpus (``sample_runs/trl_preference``), judged against its manifest.

The corpus was trained with the real ``trl.DPOTrainer`` (sigmoid and IPO losses, LoRA, precomputed reference
log-probs, ``sync_ref_model``, logging every step and every 3 steps, an early resume), ``trl.KTOTrainer`` and
``trl.RLOOTrainer`` on the CPU and logged by the stock ``report_to`` callbacks to W&B (offline), MLflow and
TensorBoard; the manifest was written from what each training process did (its steps, its crash, where it
resumed and whether its reference was the base model or the resumed weights). Every expectation below is read
from that manifest:

- every launch of a training run lands in one lineage, and no lineage holds two training runs;
- every boundary gets the manifest's verdict (DPO, which logs no KL, from its implicit rewards), nothing else
  is flagged, and every healthy run is ``ok`` (not ``inconclusive``: a negative stays quiet);
- the verdict is already right 3 logged points after each resume;
- the MLflow runs read through a real ``mlflow server`` give the same verdicts.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from mlflow_server import MlflowServer, serving_a_copy

from corpus_checks import (REPO, cut_view_problems, no_false_alarm_problems, pair_runs, scan_json,
                           verdict_problems)

CORPUS = REPO / "sample_runs" / "trl_preference"


def manifest() -> dict:
    return json.loads((CORPUS / "manifest.json").read_text())


@pytest.fixture(scope="module")
def committed() -> tuple[int, dict]:
    if not (CORPUS / "manifest.json").exists():
        pytest.skip("sample_runs/trl_preference has no manifest.json "
                    "(python -m sample_runs.trl_corpus.generate --corpus preference)")
    return scan_json(CORPUS)


def test_manifest_has_a_reset_and_a_healthy_run_per_trainer_and_tracker():
    by_key: dict[tuple[str, str], set[str]] = {}
    for run in manifest()["runs"]:
        by_key.setdefault((run["trainer"], run["tracker"]), set()).add(run["expected_status"])
        for proc, b in zip(run["processes"][1:], run["boundaries"]):
            assert proc["reference_from"] == b["reference_from"] in ("base", "checkpoint"), (run["id"], b)
            assert b["step"] == min(proc["logged_steps"]), (run["id"], b)
    trainers = {t for t, _ in by_key}
    assert trainers == {"trl.DPOTrainer", "trl.KTOTrainer", "trl.RLOOTrainer"}, trainers
    for trainer in trainers:
        for tracker in ("tensorboard", "wandb", "mlflow"):
            assert {"reference_reset", "ok"} <= by_key.get((trainer, tracker), set()), (trainer, tracker)


def test_the_corpus_is_read_and_exits_1(committed):
    code, report = committed
    assert code == 1, code
    assert all(s["error"] is None for s in report["sources"]), report["sources"]


def test_every_launch_in_one_lineage_and_no_two_runs_joined(committed):
    _, report = committed
    _, problems = pair_runs(manifest(), report)
    assert not problems, "\n".join(problems)


def test_every_boundary_judged_as_planted_every_negative_quiet_nothing_else_flagged(committed):
    _, report = committed
    doc = manifest()
    pairs, _ = pair_runs(doc, report)
    problems = verdict_problems(pairs) + no_false_alarm_problems(doc, report)
    assert len(pairs) == len(doc["runs"]) and not problems, "\n".join(problems)


def test_dpo_runs_are_judged_on_their_implicit_reward_margin(committed):
    _, report = committed
    doc = {**manifest(), "runs": [r for r in manifest()["runs"] if r["trainer"] == "trl.DPOTrainer"]}
    pairs, problems = pair_runs(doc, report)
    assert doc["runs"] and len(pairs) == len(doc["runs"]) and not problems, problems
    for run, lin in pairs:
        assert lin["metric"] == run["series_metric"] or lin["metric"].endswith("/" + run["series_metric"]), \
            (run["id"], lin["metric"])
        for b in lin["boundaries"]:
            assert "margin" in b["explanation"].lower() or "reference's log-probs" in b["explanation"], b


def test_verdicts_from_at_most_3_logged_points_after_each_resume(tmp_path):
    problems = cut_view_problems(manifest(), CORPUS, tmp_path)
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def preference_mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    store = CORPUS / manifest()["mlflow"]["store"]
    with serving_a_copy(store, workdir=tmp_path_factory.mktemp("preference-mlflow-server")) as server:
        yield server


@pytest.mark.server
def test_the_mlflow_runs_through_a_real_mlflow_server_get_the_planted_verdicts(preference_mlflow_server):
    code, report = scan_json(preference_mlflow_server.spec)
    doc = {**manifest(), "runs": [r for r in manifest()["runs"] if r["tracker"] == "mlflow"]}
    pairs, problems = pair_runs(doc, report)
    problems += verdict_problems(pairs) + no_false_alarm_problems(doc, report)
    assert code == 1 and len(pairs) == len(doc["runs"]) and not problems, "\n".join(problems)


# --- regenerate with the real TRL ---------------------------------------------------------------------------


@pytest.mark.slow
def test_regenerated_early_and_sparse_dpo_runs_get_the_planted_verdicts(tmp_path):
    """The cases the margin's statistic alone leaves open, trained again: a resume at 15% of a run logged every
    step, and a resume logged every 3 steps, each with a rebuilt and a kept reference."""
    from test_trl_corpus import trl_python

    py = trl_python()
    if py is None:
        pytest.skip("trl (with peft, wandb, mlflow, tensorboard) is not importable here; install the `trl` extra "
                    "or point KLWATCH_TRL_PYTHON at an interpreter that has it")
    subprocess.run([py, "-m", "sample_runs.trl_corpus.generate", "--corpus", "preference", "--out", str(tmp_path),
                    "--quiet", "--scenarios", "dpo-early-buggy,dpo-early-correct,dpo-sparse-buggy,dpo-sparse-correct",
                    "--restart-gap", "0.5"], check=True, timeout=1200, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    doc = json.loads((tmp_path / "manifest.json").read_text())
    assert {b["expected_verdict"] for r in doc["runs"] for b in r["boundaries"]} == {"reference_reset", "ok"}
    code, report = scan_json(tmp_path)
    pairs, pairing = pair_runs(doc, report)
    problems = pairing + verdict_problems(pairs) + no_false_alarm_problems(doc, report)
    assert code == 1 and not problems, "\n".join(problems)
