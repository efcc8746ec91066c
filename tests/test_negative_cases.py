"""``klwatch scan`` on healthy runs written by real writers (``sample_runs/negatives/``): no reference
reset, no boundary that is not there, no finding (issue 10, part 2).

Why: every invented boundary or finding on a healthy run is a false alarm, and false alarms get a
detector switched off. The cases are layouts real logs have: evaluation pauses inside one process,
Lightning's train and validation rows at one step, from-scratch re-runs appended to one table,
numbered sibling run folders, and a correct resume that happens to land on a dip of the KL.
What klwatch must conclude comes from the generator's manifest, written from what its processes did;
each test also checks that the trap really is in the data, so a test cannot pass on a tame file.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spec_shape import check_report

ROOT = Path(__file__).resolve().parents[1]
NEGATIVES = ROOT / "sample_runs" / "negatives"


def scan_json(path: Path) -> tuple[int, dict]:
    """``python -m klwatch.cli scan PATH --format json``: the exit code and the report."""
    out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", str(path), "--format", "json"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout)


def load_manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def entries_of(case: str, root: Path = NEGATIVES) -> list[dict]:
    """The manifest entries (one per tracker or table format) of one case."""
    found = [e for e in load_manifest(root)["cases"] if e["case"] == case]
    assert found, f"{case}: not in {root / 'manifest.json'}"
    return found


def problems_with(entry: dict, code: int, report: dict) -> list[str]:
    """Everything in the report that the manifest entry says must not be there (empty: all good)."""
    where = entry["path"]
    out: list[str] = []
    if code != 0:
        out.append(f"{where}: exit code {code}, want 0 (all read, no reset)")
    out += [f"{where}: source error {s['error']}" for s in report["sources"] if s["error"]]
    lineages = report["lineages"]
    if len(lineages) != entry["training_runs"]:
        out.append(f"{where}: {len(lineages)} lineages, want {entry['training_runs']} "
                   f"({[lin['name'] for lin in lineages]})")
    # with one training run the manifest's boundaries are that run's; with several, each run's are none
    want = [(b["step"], b["expected_verdict"]) for b in entry["boundaries"]]
    for lin in lineages:
        name = lin["name"]
        if lin["status"] == "reference_reset":
            out.append(f"{where} [{name}]: status reference_reset")
        if lin["status"] != entry["expected_status"]:
            out.append(f"{where} [{name}]: status {lin['status']}, want {entry['expected_status']}")
        got = [(b["step"], b["verdict"]) for b in lin["boundaries"]]
        if got != want:
            detail = [(b["step"], b["verdict"], b["evidence"], b["score"]) for b in lin["boundaries"]]
            out.append(f"{where} [{name}]: boundaries {detail}, want {want}")
        if lin["findings"]:
            found = [(f["detector"], f["step"], f["severity"]) for f in lin["findings"]]
            out.append(f"{where} [{name}]: {len(found)} findings {found}, want none")
    return out


def check_entry(entry: dict, root: Path = NEGATIVES) -> dict:
    """Scan the entry's folder and fail listing every problem at once; returns the report."""
    code, report = scan_json(root / entry["path"])
    check_report(report)
    found = problems_with(entry, code, report)
    assert not found, "\n".join(found)
    return report


# ------------------------------------------------------------------ the trap is in the data


def tb_scalars(folder: Path, tag: str) -> list[tuple[int, float, float]]:
    """(step, wall time, value) of ``tag`` in every event file under ``folder``, by TensorBoard's own
    loader (not ours: the check must not rest on the code under test)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    points = []
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        for ev in EventFileLoader(str(path)).Load():
            for v in ev.summary.value:
                if v.tag == tag:
                    points.append((ev.step, ev.wall_time, float(tensor_util.make_ndarray(v.tensor))))
    return points


def assert_eval_pauses_are_in_the_data(entry: dict, root: Path) -> None:
    """The pauses really are several times the usual step time, between steps of one event file."""
    points = tb_scalars(root / "eval-pauses" / "tensorboard", "train/kl_penalty")
    gaps = np.diff([w for _, w, _ in points])
    usual = float(np.median(gaps))
    paused_after = {points[i][0] for i in np.flatnonzero(gaps > 5 * usual)}
    planted = [p["after_step"] for p in entry["processes"][0]["eval_pauses"]]
    # every planted pause is there (a busy machine may add a hiccup of its own: the data holds more, not less)
    assert set(planted) <= paused_after and len(planted) >= 3, (sorted(paused_after), planted)


def assert_train_and_val_rows_share_steps(root: Path) -> None:
    (path,) = (root / "same-step-train-val").rglob("metrics.csv")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    train = {r["step"] for r in rows if r["train/kl"]}
    val = {r["step"] for r in rows if r["val/kl"]}
    assert val and val <= train  # every validation row has a train row at the same step
    assert not any(r["train/kl"] and r["val/kl"] for r in rows)  # on separate rows


def assert_table_holds_two_runs_from_step_0(path: Path, runs: int = 2) -> None:
    if path.suffix == ".csv":
        with open(path, newline="") as fh:
            rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    starts = [i for i, r in enumerate(rows) if r["step"] == 0]
    assert len(starts) == runs
    first, second = rows[starts[0]], rows[starts[1]]
    assert first["kl"] == pytest.approx(0.0, abs=1e-12)  # the policy is its reference at step 0...
    assert second["kl"] == pytest.approx(0.0, abs=1e-12)  # ...both times
    for key in ("loss", "reward", "learning_rate"):  # the second run starts as the first did
        assert second[key] == pytest.approx(first[key], rel=1e-9)
    assert not list(path.parent.parent.rglob("checkpoint*"))


def assert_kl_dips_at_the_resume(entry: dict, root: Path) -> None:
    """Two event files (two processes), a checkpoint at the resume step, and a KL that dips there
    without collapsing: the first point after the resume well below the recent level, not near 0."""
    folder = root / entry["path"]
    (b,) = entry["boundaries"]
    assert len(list((folder / "logs").glob("events.out.tfevents.*"))) == 2
    assert (folder / f"checkpoint-{b['resumed_from_step']}" / "trainer_state.json").is_file()
    kl = {s: v for s, _, v in tb_scalars(folder / "logs", "train/kl")}
    level = float(np.median([kl[s] for s in range(b["step"] - 10, b["step"])]))
    assert 0.2 * level < kl[b["step"]] < 0.7 * level
    assert kl[b["step"]] < min(kl[b["step"] - 1], kl[b["step"] + 1])
    assert entry["resume_reproduces_continuous_run"]


# ------------------------------------------------------------------------------ one per case


def _ids(case: str) -> list[str]:
    return [e["path"] for e in entries_of(case)]


@pytest.mark.parametrize("path", _ids("eval-pauses"))
def test_eval_pauses_inside_one_process_make_no_boundary_and_no_finding(path: str) -> None:
    (entry,) = [e for e in entries_of("eval-pauses") if e["path"] == path]
    assert_eval_pauses_are_in_the_data(entry, NEGATIVES)
    check_entry(entry)


def test_lightning_train_and_val_rows_at_one_step_make_no_boundary_and_no_finding() -> None:
    (entry,) = entries_of("same-step-train-val")
    assert_train_and_val_rows_share_steps(NEGATIVES)
    check_entry(entry)


@pytest.mark.parametrize("path", _ids("rerun-appended"))
def test_from_scratch_reruns_appended_to_one_table_are_two_runs_without_a_resume(path: str) -> None:
    (entry,) = [e for e in entries_of("rerun-appended") if e["path"] == path]
    (table,) = [p for p in (NEGATIVES / path).iterdir() if p.suffix in (".csv", ".jsonl")]
    assert_table_holds_two_runs_from_step_0(table)
    check_entry(entry)


def assert_one_lineage_per_folder(entry: dict, report: dict) -> None:
    prefix = entry["path"] + "/"
    folders = [f[len(prefix):] for f in entry["run_folders"]]
    owners = {f: [lin["name"] for lin in report["lineages"]
                  if any(m["ref"].startswith(f + "/") for m in lin["members"])] for f in folders}
    assert all(len(o) == 1 for o in owners.values()), owners
    for lin in report["lineages"]:
        mine = {f for f in folders if any(m["ref"].startswith(f + "/") for m in lin["members"])}
        assert len(mine) == 1, (lin["name"], sorted(mine))


def test_numbered_sibling_run_folders_are_one_lineage_each_without_boundaries() -> None:
    (entry,) = entries_of("sibling-runs")
    assert len(entry["run_folders"]) == entry["training_runs"]
    assert all(len(list((NEGATIVES / f).glob("events.out.tfevents.*"))) == 1
               for f in entry["run_folders"])
    report = check_entry(entry)
    assert_one_lineage_per_folder(entry, report)


def test_correct_resume_at_a_local_kl_dip_is_one_ok_boundary() -> None:
    (entry,) = entries_of("resume-at-kl-dip")
    assert_kl_dips_at_the_resume(entry, NEGATIVES)
    check_entry(entry)


def test_all_negative_cases_scanned_together_keep_their_runs_apart_and_flag_nothing() -> None:
    """``klwatch scan sample_runs/`` reads every case at once: the cases must neither merge with each
    other nor split (a checkpoint folder belongs to the run logged beside it), and nothing is flagged.
    Each tracker's copy of ``eval-pauses`` counts as its own run, as klwatch reports the tracker
    copies of every run in ``sample_runs/``."""
    cases = load_manifest(NEGATIVES)["cases"]
    code, report = scan_json(NEGATIVES)
    check_report(report)
    assert code == 0
    lineages = report["lineages"]
    assert len(lineages) == sum(e["training_runs"] for e in cases), [lin["name"] for lin in lineages]
    assert not [lin["name"] for lin in lineages if lin["status"] != "ok"]
    assert not [(lin["name"], f["detector"], f["step"]) for lin in lineages for f in lin["findings"]]
    got = sorted((b["step"], b["verdict"]) for lin in lineages for b in lin["boundaries"])
    assert got == sorted((b["step"], b["expected_verdict"]) for e in cases for b in e["boundaries"])


# ------------------------------------------------------------------------------ regenerated


@pytest.mark.slow
def test_regenerated_negative_cases_get_no_boundary_no_finding_and_no_reset(tmp_path: Path) -> None:
    """The same checks on runs written now, so the committed files can never be stale. The writers
    are those of ``$KLWATCH_NEGATIVES_PYTHON`` (an interpreter with torch and lightning) when set,
    else of this interpreter (the manifest names what wrote each case)."""
    python = os.environ.get("KLWATCH_NEGATIVES_PYTHON", sys.executable)
    subprocess.run([python, str(NEGATIVES / "generate.py"), "--out", str(tmp_path), "--quiet"],
                   check=True, timeout=900, capture_output=True, cwd=ROOT)
    manifest = load_manifest(tmp_path)
    assert {e["case"] for e in manifest["cases"]} == {"eval-pauses", "same-step-train-val", "rerun-appended",
                                                      "sibling-runs", "resume-at-kl-dip"}
    by_case = {e["case"]: e for e in manifest["cases"]}
    assert_eval_pauses_are_in_the_data(by_case["eval-pauses"], tmp_path)
    assert_train_and_val_rows_share_steps(tmp_path)
    for e in manifest["cases"]:
        if e["case"] == "rerun-appended":
            (table,) = [p for p in (tmp_path / e["path"]).iterdir() if p.suffix in (".csv", ".jsonl")]
            assert_table_holds_two_runs_from_step_0(table)
    assert_kl_dips_at_the_resume(by_case["resume-at-kl-dip"], tmp_path)
    failures: list[str] = []
    for entry in manifest["cases"]:
        code, report = scan_json(tmp_path / entry["path"])
        check_report(report)
        failures += problems_with(entry, code, report)
        if entry["case"] == "sibling-runs":
            try:
                assert_one_lineage_per_folder(entry, report)
            except AssertionError as exc:
                failures.append(f"{entry['path']}: not one lineage per folder: {exc}")
    assert not failures, "\n".join(failures)
