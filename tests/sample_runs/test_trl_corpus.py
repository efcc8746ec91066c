"""klwatch on the real-TRL corpus (``sample_runs/trl``), judged against its manifest.

The corpus was trained with the real ``trl.GRPOTrainer`` and logged by the stock Hugging Face ``report_to``
callbacks; ``sample_runs/trl/manifest.json`` was written from what each training process did (its steps, its
crash, where it resumed and whether its reference was the base model or the resumed weights). Every expectation
below is read from that manifest, never from a list in this file:

- every launch of a training run lands in exactly one lineage, and no lineage holds two training runs;
- every resume boundary is found at the first step logged after the resume, with the manifest's verdict
  (``reference_reset`` for a reference rebuilt from the resumed weights, ``ok`` for a correct resume,
  ``intentional`` where ``sync_ref_model`` made that very reference), and a ``resumed_from_step`` that is the
  checkpoint's step or null, never a wrong step;
- nothing else is flagged;
- the verdict is already right when the logs end 3 logged points after the resume (TensorBoard and MLflow
  pieces are cut there in a temporary copy; W&B's record log is not cut).

Many of these fail today (issue 10): that is the point of the corpus. Do not loosen them to pass.

The slow test regenerates a subset with the real TRL (``KLWATCH_TRL_PYTHON`` names an interpreter that has the
``trl`` extra installed; else this interpreter) and checks it the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from corpus_checks import (REPO, cut_view_problems, no_false_alarm_problems, pair_runs, scan_json,
                           verdict_problems)

CORPUS = REPO / "sample_runs" / "trl"


# --- the committed corpus ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def committed() -> tuple[int, dict, dict]:
    if not (CORPUS / "manifest.json").exists():
        pytest.skip("sample_runs/trl has no manifest.json (generate it: python -m sample_runs.trl_corpus.generate)")
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    code, report = scan_json(CORPUS)
    return code, report, manifest


def test_manifest_covers_every_tracker_layout_with_a_reset_and_a_healthy_run():
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    by_layout: dict[tuple[str, str], set[str]] = {}
    for run in manifest["runs"]:
        by_layout.setdefault((run["tracker"], run["layout"]), set()).add(run["expected_status"])
        assert len(run["boundaries"]) == len(run["processes"]) - 1, run["id"]
        for proc, b in zip(run["processes"][1:], run["boundaries"]):
            assert proc["resumed_from_step"] == b["resumed_from_step"], (run["id"], b)
            assert proc["reference_from"] == b["reference_from"] in ("base", "checkpoint"), (run["id"], b)
            assert b["step"] == min(proc["logged_steps"]), (run["id"], b)
    for key, statuses in by_layout.items():
        assert "reference_reset" in statuses and statuses - {"reference_reset"}, (key, statuses)


def test_committed_trl_corpus_is_read_and_exits_1(committed):
    code, report, _ = committed
    assert code == 1, code
    assert all(s["error"] is None for s in report["sources"]), report["sources"]
    assert not [lin["name"] for lin in report["lineages"] if lin["status"] == "error"]


def test_every_launch_in_one_lineage_and_no_two_runs_joined(committed):
    _, report, manifest = committed
    _, problems = pair_runs(manifest, report)
    assert not problems, "\n".join(problems)


def test_every_planted_reset_caught_and_every_boundary_judged_as_planted(committed):
    """A run whose launches are split over lineages has no boundary to judge: it counts as missed."""
    _, report, manifest = committed
    pairs, _ = pair_runs(manifest, report)
    paired = {run["id"] for run, _ in pairs}
    missed = [f"{run['id']}: launches not in one lineage, so its boundaries "
              f"{[(b['step'], b['expected_verdict']) for b in run['boundaries']]} were never judged"
              for run in manifest["runs"] if run["id"] not in paired and run["boundaries"]]
    problems = missed + verdict_problems(pairs)
    assert not problems, "\n".join(problems)


def test_a_launch_given_the_checkpoint_as_the_model_carries_that_evidence_and_no_other_does(committed):
    """Where each launch logs its own config (a new W&B or MLflow run per launch), the boundary of a launch that
    passed ``checkpoint-N`` as the model (trl #3179) says so; a launch from the base model never does. A
    re-attached MLflow run keeps its first params and an event file's text config holds no model path: there
    the evidence cannot be seen."""
    _, report, manifest = committed
    runs = [r for r in manifest["runs"] if r["tracker"] in ("wandb", "mlflow") and r["layout"] != "resume"]
    pairs, _ = pair_runs({**manifest, "runs": runs}, report)
    seen = 0
    for run, lin in pairs:
        got = {b["step"]: "model_from_checkpoint" in b["evidence"] for b in lin["boundaries"]}
        for proc, b in zip(run["processes"][1:], run["boundaries"]):
            assert got[b["step"]] == (proc["model_from"] == "checkpoint"), (run["id"], b["step"], proc["model_from"])
            seen += proc["model_from"] == "checkpoint"
    assert seen >= 4


def test_no_false_alarm(committed):
    _, report, manifest = committed
    problems = no_false_alarm_problems(manifest, report)
    assert not problems, "\n".join(problems)


# --- a verdict from at most 3 logged points after each resume ----------------------------------------------


def test_verdict_from_at_most_3_logged_points_after_each_resume(tmp_path):
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    problems = cut_view_problems(manifest, CORPUS, tmp_path)
    assert not problems, "\n".join(problems)


# --- regenerate with the real TRL ---------------------------------------------------------------------------


def trl_python() -> str | None:
    for py in (os.environ.get("KLWATCH_TRL_PYTHON"), sys.executable):
        if py and subprocess.run([py, "-c", "import trl, peft, wandb, mlflow, tensorboard"],
                                 capture_output=True).returncode == 0:
            return py
    return None


@pytest.mark.slow
def test_regenerated_trl_runs_get_the_planted_verdicts(tmp_path):
    py = trl_python()
    if py is None:
        pytest.skip("trl (with peft, wandb, mlflow, tensorboard) is not importable here; install the `trl` extra "
                    "or point KLWATCH_TRL_PYTHON at an interpreter that has it")
    subprocess.run([py, "-m", "sample_runs.trl_corpus.generate", "--out", str(tmp_path), "--quiet",
                    "--scenarios", "resume-buggy,resume-correct", "--restart-gap", "0.5"],
                   check=True, timeout=1200, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert {b["expected_verdict"] for r in manifest["runs"] for b in r["boundaries"]} == {"reference_reset", "ok"}
    code, report = scan_json(tmp_path)
    assert code == 1
    pairs, pairing = pair_runs(manifest, report)
    problems = pairing + verdict_problems(pairs) + no_false_alarm_problems(manifest, report)
    assert not problems, "\n".join(problems)
