"""The refactor guard: what ``klwatch scan`` and ``klwatch check`` write for the sample runs and the
real-framework corpus stays what it was (issue 11: behaviour unchanged, byte for byte).

The golden files in ``tests/golden/`` were written by the code before the refactor. A deliberate
change of behaviour rewrites them with ``KLWATCH_UPDATE_GOLDEN=1 pytest tests/test_report_golden.py``
and shows up in review as a diff of the reports.

Only ``generated_at`` (the clock) is left out. The report rounds every float it prints (6 significant
digits, scores to 4 decimals), so a byte comparison is a fair one on any machine; should a last digit
still differ on some CPU, the message says which field.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("KLWATCH_UPDATE_GOLDEN") == "1"

# (golden file, klwatch arguments); every source is given relative to the repository, as a user types it
CASES = {
    "scan-sample_runs.json": ["scan", "sample_runs/", "--format", "json"],
    "scan-sample_runs.md": ["scan", "sample_runs/", "--format", "markdown"],
    "scan-trl-corpus.json": ["scan", "sample_runs/trl/", "--format", "json"],
    "scan-negatives.json": ["scan", "sample_runs/negatives/", "--format", "json"],
}


def _klwatch(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from klwatch.cli import main; sys.argv[0] = 'klwatch'; main()",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "GITHUB_ACTIONS": "", **env})


def _normalise(text: str) -> str:
    return re.sub(r'"generated_at": "[^"]*"', '"generated_at": "-"', text)


def _compare(name: str, text: str) -> None:
    path = GOLDEN / name
    text = _normalise(text)
    if UPDATE:
        path.write_text(text, encoding="utf-8")
        return
    want = path.read_text(encoding="utf-8")
    if text == want:
        return
    if name.endswith(".json"):  # say where, not only that
        got_d, want_d = json.loads(text), json.loads(want)
        for i, (g, w) in enumerate(zip(got_d["lineages"], want_d["lineages"])):
            assert g == w, f"{name}: lineage {i} ({w['name']}) changed:\n{json.dumps(g, indent=1)[:3000]}\nwas\n{json.dumps(w, indent=1)[:3000]}"
        assert got_d == want_d, f"{name}: the report changed outside its lineages"
    got_lines, want_lines = text.splitlines(), want.splitlines()
    for i, (g, w) in enumerate(zip(got_lines, want_lines)):
        assert g == w, f"{name}: line {i + 1} changed:\n{g}\nwas\n{w}"
    assert len(got_lines) == len(want_lines), f"{name}: {len(got_lines)} lines, was {len(want_lines)}"
    assert text == want, f"{name}: whitespace changed"


@pytest.mark.parametrize("name", sorted(CASES))
def test_scan_output_is_unchanged_byte_for_byte(name):
    out = _klwatch(CASES[name])
    assert out.returncode in (0, 1), out.stderr[-3000:]
    _compare(name, out.stdout)


def test_check_output_junit_and_step_summary_are_unchanged(tmp_path):
    """``check --fail-on all`` under GitHub Actions: the annotations, the JUnit XML with findings folded
    in, the step summary with its sparklines."""
    junit, summary = tmp_path / "klwatch.xml", tmp_path / "summary.md"
    out = _klwatch(["check", "sample_runs/", "--fail-on", "all", "--junit", str(junit)],
                   GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    assert out.returncode == 1, out.stderr[-3000:]
    _compare("check-sample_runs.annotations.txt", out.stdout)
    _compare("check-sample_runs.junit.xml", junit.read_text(encoding="utf-8"))
    _compare("check-sample_runs.summary.md", summary.read_text(encoding="utf-8"))
