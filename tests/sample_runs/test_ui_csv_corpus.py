"""TensorBoard's UI CSV download (``Wall time,Step,Value``, named after the run) keeps no launch evidence but the
clock: klwatch reads its one series under the file's name, catches the planted resets where the clock shows the
restart, and raises nothing on the other runs (``sample_runs/ui_csv``, fetched from a real TensorBoard server).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "sample_runs" / "ui_csv"
EXPORTS = {e["scenario"]: e for e in json.loads((CORPUS / "manifest.json").read_text())["exports"]}


def scan(*args: str) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", *args, "--format", "json"],
                         capture_output=True, text=True, timeout=300)
    return out.returncode, json.loads(out.stdout)


@pytest.mark.parametrize("scenario", sorted(EXPORTS))
def test_each_export_named_with_metric_gets_the_planted_verdict(scenario):
    export = EXPORTS[scenario]
    code, report = scan(str(CORPUS / export["file"]), "--metric", export["metric"])
    (lin,) = report["lineages"]
    assert lin["status"] == export["expected_status"], lin["boundaries"]
    resets = [b["step"] for b in lin["boundaries"] if b["verdict"] == "reference_reset"]
    assert resets == export["expected_reset_steps"]
    assert all(b["evidence"] == ["time_gap"] for b in lin["boundaries"])  # the clock is all the file keeps
    assert code == (1 if export["expected_status"] == "reference_reset" else 0)


def test_an_export_read_without_metric_says_which_name_to_pass():
    export = EXPORTS["resume-buggy"]
    _, report = scan(str(CORPUS / export["file"]))
    (lin,) = report["lineages"]
    assert lin["status"] == "no_kl_metric"
    assert any(f"--metric '{export['metric']}'" in w for w in lin["warnings"]), lin["warnings"]
    assert any(f"({export['metric']})" in f["message"] for f in lin["findings"])


def test_the_exports_are_tensorboards_csv_download_as_served():
    for export in EXPORTS.values():
        lines = (CORPUS / export["file"]).read_text().splitlines()
        assert lines[0] == "Wall time,Step,Value" and len(lines) > 20


@pytest.mark.slow
def test_regenerating_fetches_the_same_series_from_a_real_tensorboard_server(tmp_path):
    subprocess.run([sys.executable, "-m", "sample_runs.ui_csv_corpus.generate", "--out", str(tmp_path)],
                   check=True, timeout=600, cwd=REPO)
    fresh = json.loads((tmp_path / "manifest.json").read_text())["exports"]
    assert [e["scenario"] for e in fresh] == sorted(EXPORTS, key=list(EXPORTS).index)
    for e in fresh:
        ours = (tmp_path / e["file"]).read_text().splitlines()
        committed = (CORPUS / e["file"]).read_text().splitlines()
        assert [r.split(",")[1:] for r in ours] == [r.split(",")[1:] for r in committed]
