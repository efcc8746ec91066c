"""``klwatch scan sample_runs/`` against what the generator did: every buggy-ordering boundary is
flagged (the ratchet included), nothing else is, whichever tracker and layout holds the run.

The expected verdicts come from the generator's manifest, written from what its training processes
actually did; a second test regenerates runs from scratch so the check never rests on stale files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spec_shape import check_report

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"


def scan_json(*args: str) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", *args, "--format", "json"],
                         capture_output=True, text=True, timeout=300)
    return out.returncode, json.loads(out.stdout)


def process_refs(run: dict) -> set[str]:
    refs: set[str] = set()
    for p in run["processes"]:
        refs.update(p.get("event_files", []))
        if p.get("run_dir"):
            refs.add(p["run_dir"])
        if run["tracker"] == "mlflow" and p.get("run_id"):
            refs.add(p["run_id"])
    return refs


def match(manifest: dict, report: dict, prefix: str = "") -> list[tuple[dict, dict]]:
    """Pair each manifest run with the one lineage holding all of its processes' tracker pieces."""
    pairs = []
    for run in manifest["runs"]:
        want = {prefix + r if run["tracker"] != "mlflow" else r for r in process_refs(run)}
        owners = [lin for lin in report["lineages"] if want <= {m["ref"] for m in lin["members"]}]
        assert len(owners) == 1, f"{run['id']}: {len(owners)} lineages hold {sorted(want)}"
        pairs.append((run, owners[0]))
    return pairs


def assert_verdicts_match(pairs: list[tuple[dict, dict]]) -> None:
    for run, lin in pairs:
        assert lin["status"] == run["expected_status"], (run["id"], lin["status"], lin["boundaries"])
        got = [(b["step"], b["verdict"]) for b in lin["boundaries"]]
        want = [(b["step"], b["expected_verdict"]) for b in run["boundaries"]]
        assert got == want, (run["id"], got, want)
        for b, e in zip(lin["boundaries"], run["boundaries"]):
            assert b["resumed_from_step"] == e["resumed_from_step"], (run["id"], b, e)


@pytest.fixture(scope="module")
def committed() -> tuple[int, dict, dict]:
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    code, report = scan_json(str(SAMPLES))
    return code, report, manifest


def test_committed_sample_runs_report_follows_the_spec_and_exits_1(committed):
    code, report, _ = committed
    assert code == 1
    check_report(report)
    assert all(s["error"] is None for s in report["sources"])
    assert not [lin for lin in report["lineages"] if lin["status"] == "error"]


def test_committed_sample_runs_flag_exactly_the_buggy_ordering_boundaries(committed):
    _, report, manifest = committed
    pairs = match(manifest, report)
    assert_verdicts_match(pairs)
    # nothing outside the manifest is flagged, and every run is its own lineage
    assert len({id(lin) for _, lin in pairs}) == len(pairs)
    # sample_runs/ also holds the real-TRL and NeMo-RL corpora (trl/, nemo_rl/) and the negative cases
    # (negatives/), each with its own manifest: the whole folder flags exactly the resets all of them planted
    # (a preference trainer's from its implicit rewards, the others' from their KL)
    flagged = [lin["name"] for lin in report["lineages"] if lin["status"] == "reference_reset"]
    planted = 0
    for path in sorted(SAMPLES.rglob("manifest.json")):
        doc = json.loads(path.read_text())
        planted += sum(r["expected_status"] == "reference_reset" for r in doc.get("runs", []))
        planted += sum(c.get("expected_status") == "reference_reset" for c in doc.get("cases", []))
    assert len(flagged) == planted, flagged


def test_same_scenario_gets_the_same_verdicts_in_every_tracker(committed):
    _, report, manifest = committed
    by_scenario: dict[str, set] = {}
    for run, lin in match(manifest, report):
        verdicts = tuple((b["step"], b["verdict"]) for b in lin["boundaries"])
        by_scenario.setdefault(run["scenario"], set()).add((lin["status"], verdicts))
    assert all(len(v) == 1 for v in by_scenario.values()), by_scenario


def test_freshly_generated_runs_get_the_verdicts_the_generator_planted(tmp_path):
    subprocess.run([sys.executable, str(SAMPLES / "generate.py"), "--out", str(tmp_path), "--trackers", "tensorboard",
                    "--scenarios", "resume-buggy,resume-fixed,ratchet-buggy,rewind-fixed", "--restart-gap", "0.3",
                    "--quiet"], check=True, timeout=600, capture_output=True)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    code, report = scan_json(str(tmp_path))
    assert code == 1
    check_report(report)
    assert_verdicts_match(match(manifest, report))
