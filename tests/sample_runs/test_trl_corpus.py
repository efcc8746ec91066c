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
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "sample_runs" / "trl"
POINTS_AFTER_RESUME = 3


def scan_json(source: Path) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", str(source), "--format", "json"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.stdout.strip(), f"scan printed nothing (exit {out.returncode}): {out.stderr[-2000:]}"
    return out.returncode, json.loads(out.stdout)


def process_refs(run: dict, processes: list[dict] | None = None) -> set[str]:
    refs: set[str] = set()
    for p in run["processes"] if processes is None else processes:
        if run["tracker"] == "tensorboard":
            refs.update(p.get("event_files", []))
        elif run["tracker"] == "wandb":
            refs.add(p["run_dir"])
        else:
            refs.add(p["run_id"])
    return refs


def member_refs(lineage: dict) -> set[str]:
    return {m["ref"] for m in lineage["members"]}


def pair_runs(manifest: dict, report: dict) -> tuple[list[tuple[dict, dict]], list[str]]:
    """Each manifest run with the one lineage holding all its launches, and the problems: a run whose launches
    are not all in one lineage, a lineage holding launches of two runs."""
    pairs, problems = [], []
    for run in manifest["runs"]:
        want = process_refs(run)
        owners = [lin for lin in report["lineages"] if want <= member_refs(lin)]
        if len(owners) != 1:
            partial = [(lin["name"], sorted(want & member_refs(lin))) for lin in report["lineages"]
                       if want & member_refs(lin)]
            problems.append(f"{run['id']}: {len(owners)} lineages hold all of its {len(want)} launches; "
                            f"pieces are in {partial}")
            continue
        pairs.append((run, owners[0]))
    owner_of: dict[str, str] = {}
    for run in manifest["runs"]:
        for ref in process_refs(run):
            owner_of[ref] = run["id"]
    for lin in report["lineages"]:
        runs_inside = sorted({owner_of[r] for r in member_refs(lin) if r in owner_of})
        if len(runs_inside) > 1:
            problems.append(f"lineage {lin['name']!r} joins {len(runs_inside)} training runs: {runs_inside}")
    return pairs, problems


def verdict_problems(pairs: list[tuple[dict, dict]]) -> list[str]:
    """Status, boundary steps and verdicts must be exactly the manifest's. ``resumed_from_step`` must be the
    checkpoint's step or null: SPEC.md makes it "the checkpoint's step when known, else null", and a tracker alone
    often cannot know it (a W&B run with sparse logging, a relaunch from an older checkpoint); a wrong number is
    never right."""
    problems = []
    for run, lin in pairs:
        got = [(b["step"], b["verdict"]) for b in lin["boundaries"]]
        want = [(b["step"], b["expected_verdict"]) for b in run["boundaries"]]
        wrong_from = [(b["step"], b["resumed_from_step"], e["resumed_from_step"])
                      for b, e in zip(lin["boundaries"], run["boundaries"])
                      if b["resumed_from_step"] not in (None, e["resumed_from_step"])]
        if lin["status"] != run["expected_status"] or got != want or wrong_from:
            problems.append(f"{run['id']}: status {lin['status']} (want {run['expected_status']}), "
                            f"boundaries (step, verdict) {got} (want {want})"
                            + (f", wrong resumed_from_step (step, got, want) {wrong_from}" if wrong_from else ""))
    return problems


def no_false_alarm_problems(manifest: dict, report: dict) -> list[str]:
    refs_expected_reset = set()
    for run in manifest["runs"]:
        if run["expected_status"] == "reference_reset":
            refs_expected_reset |= process_refs(run)
    return [f"lineage {lin['name']!r} ({sorted(member_refs(lin))[:3]}...) flagged, but no planted reset is in it"
            for lin in report["lineages"]
            if lin["status"] == "reference_reset" and not member_refs(lin) & refs_expected_reset]


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


def test_no_false_alarm(committed):
    _, report, manifest = committed
    problems = no_false_alarm_problems(manifest, report)
    assert not problems, "\n".join(problems)


# --- a verdict from at most 3 logged points after each resume ----------------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def _event_step(data: bytes) -> int:
    """The ``step`` (field 2, varint) of a serialized tensorflow Event; 0 when absent."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if field == 2 and wire == 0:
            return _varint(data, i)[0]
        if wire == 0:
            _, i = _varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = _varint(data, i)
            i += n
        else:
            return 0
    return 0


def cut_event_file(src: Path, dst: Path, last_step: int) -> None:
    """Copy the TFRecords of SRC whose event step is <= LAST_STEP, bytes and CRCs untouched."""
    raw, out, i = src.read_bytes(), bytearray(), 0
    while i + 12 <= len(raw):
        (n,) = struct.unpack("<Q", raw[i:i + 8])
        end = i + 12 + n + 4
        if _event_step(raw[i + 12:i + 12 + n]) <= last_step:
            out += raw[i:end]
        i = end
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(out))


def truncated_views(manifest: dict, root: Path, dest: Path) -> list[tuple[Path, dict, dict, int]]:
    """For each boundary of each TensorBoard and MLflow run: a folder holding that run's logs up to the
    POINTS_AFTER_RESUME-th logged step after the resume (later launches removed)."""
    views = []
    for run in manifest["runs"]:
        if run["tracker"] not in ("tensorboard", "mlflow"):
            continue
        for k, b in enumerate(run["boundaries"], start=1):
            proc = run["processes"][k]
            after = [s for s in proc["logged_steps"] if s >= b["step"]][:POINTS_AFTER_RESUME]
            cut, keep = after[-1], run["processes"][:k + 1]
            view = dest / f"{run['id'].replace('/', '__')}__{b['step']}"
            if run["tracker"] == "tensorboard":
                for p in keep:
                    for ef in p["event_files"]:
                        src = root / ef
                        if p is proc:
                            cut_event_file(src, view / ef, cut)
                        else:
                            (view / ef).parent.mkdir(parents=True, exist_ok=True)
                            shutil.copy2(src, view / ef)
                ck_root = root / run["checkpoint_dir"]  # checkpoint-N/ (HF) or global_step_N/ (verl)
                for ck in ck_root.glob("*"):
                    m = re.fullmatch(r"(?:checkpoint-|global_step_)(\d+)", ck.name)
                    if ck.is_dir() and m and int(m.group(1)) <= b["resumed_from_step"]:
                        shutil.copytree(ck, view / os.path.relpath(ck, root))
            else:
                db = view / run["path"]
                db.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / run["path"], db)
                con = sqlite3.connect(db)
                kept_ids = sorted({p["run_id"] for p in keep})
                marks = ",".join("?" * len(kept_ids))
                for table in ("metrics", "latest_metrics", "params", "tags", "runs"):  # only this run's launches
                    con.execute(f"DELETE FROM {table} WHERE run_uuid NOT IN ({marks})", kept_ids)
                for p in run["processes"][k + 1:]:  # same MLflow run re-attached: drop the later launches' rows
                    con.execute("DELETE FROM metrics WHERE run_uuid=? AND timestamp>=?",
                                (p["run_id"], int(p["started_at"] * 1000)))
                con.execute("DELETE FROM metrics WHERE run_uuid=? AND timestamp>=? AND step>?",
                            (proc["run_id"], int(proc["started_at"] * 1000), cut))
                con.commit()
                con.close()
            sub = {**run, "processes": keep, "boundaries": run["boundaries"][:k]}
            sub["expected_status"] = ("reference_reset" if any(x["expected_verdict"] == "reference_reset"
                                                               for x in sub["boundaries"]) else
                                      "intentional" if any(x["expected_verdict"] == "intentional"
                                                           for x in sub["boundaries"]) else "ok")
            views.append((view, sub, b, cut))
    return views


def test_verdict_from_at_most_3_logged_points_after_each_resume(tmp_path):
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    problems = []
    for view, sub, b, cut in truncated_views(manifest, CORPUS, tmp_path):
        _, report = scan_json(view)
        want = process_refs(sub)
        owners = [lin for lin in report["lineages"] if want <= member_refs(lin)]
        if len(owners) != 1:
            problems.append(f"{sub['id']} cut at {cut}: {len(owners)} lineages hold its launches")
            continue
        got = {x["step"]: x for x in owners[0]["boundaries"]}.get(b["step"])
        if got is None or got["verdict"] != b["expected_verdict"]:
            problems.append(f"{sub['id']} cut at step {cut} ({POINTS_AFTER_RESUME} points after the resume at "
                            f"{b['step']}): verdict {got and got['verdict']} (want {b['expected_verdict']})")
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
