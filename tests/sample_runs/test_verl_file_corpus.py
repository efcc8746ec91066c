"""verl's ``file`` logger keeps only the last launch: klwatch judges a reset from that side alone, and stays quiet
on a correct resume and a run never resumed (``sample_runs/verl_file``, written through verl's own ``Tracking``).

The committed corpus is read as a user would (``klwatch scan`` on each run's folder); regenerating it needs verl's
source (``KLWATCH_VERL_SRC``, an export of the commit in ``sample_runs/verl_file_corpus/VERL_COMMIT``) and is slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "sample_runs" / "verl_file"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
RUNS = {r["scenario"]: r for r in MANIFEST["runs"]}


def scan(folder: Path) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", str(folder), "--format", "json"],
                         capture_output=True, text=True, timeout=300)
    return out.returncode, json.loads(out.stdout)


@pytest.mark.parametrize("scenario", sorted(RUNS))
def test_each_run_gets_the_verdict_of_what_its_launches_did(scenario):
    run = RUNS[scenario]
    code, report = scan(CORPUS / scenario)
    (lin,) = report["lineages"]
    assert lin["metric"].endswith(run["kl_metric"]) and lin["status"] == run["expected_status"]
    got = [(b["step"], b["resumed_from_step"], b["verdict"]) for b in lin["boundaries"]]
    assert got == [(b["step"], b["resumed_from_step"], b["expected_verdict"]) for b in run["boundaries"]]
    for b in lin["boundaries"]:
        assert "starts_past_first_step" in b["evidence"] and b["kl_before"] is None
        assert "not in the logs" in b["explanation"]
    assert code == (1 if run["expected_status"] == "reference_reset" else 0)


@pytest.mark.parametrize("scenario", sorted(RUNS))
def test_the_file_holds_the_last_launch_alone(scenario):
    run = RUNS[scenario]
    rows = [json.loads(line) for line in (CORPUS / run["path"]).read_text().splitlines()]
    last = run["processes"][-1]
    assert [r["step"] for r in rows] == list(range(last["first_step"], last["last_step"] + 1))
    assert set(rows[0]) == {"step", "data"} and run["kl_metric"] in rows[0]["data"]


def test_a_resumed_buggy_run_opens_its_file_at_a_kl_far_under_where_it_regrows():
    rows = [json.loads(line)["data"]["actor/kl_loss"] for line in (CORPUS / RUNS["resume-buggy"]["path"]).open()]
    assert rows[0] < 0.01 * max(rows) and rows[0] < rows[1]


def verl_source() -> Path | None:
    raw = os.environ.get("KLWATCH_VERL_SRC")
    return Path(raw) if raw and (Path(raw) / "verl" / "utils" / "tracking.py").is_file() else None


@pytest.mark.slow
@pytest.mark.skipif(verl_source() is None, reason="needs verl's source: KLWATCH_VERL_SRC (see VERL_COMMIT)")
def test_regenerating_the_corpus_gives_the_same_files_layout_and_verdicts(tmp_path):
    subprocess.run([sys.executable, "-m", "sample_runs.verl_file_corpus.generate", "--verl", str(verl_source()),
                    "--out", str(tmp_path)], check=True, timeout=600, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    fresh = json.loads((tmp_path / "manifest.json").read_text())
    for run in fresh["runs"]:
        assert (tmp_path / run["path"]).is_file()
        _, report = scan(tmp_path / run["scenario"])
        assert report["lineages"][0]["status"] == run["expected_status"] == RUNS[run["scenario"]]["expected_status"]
