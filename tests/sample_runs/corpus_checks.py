"""Checks shared by the real-framework corpora (``sample_runs/trl``, ``sample_runs/nemo_rl``): each corpus's
manifest says what every training process did; a scan must put every launch of a run in one lineage, no two
runs in one, judge every boundary as planted, flag nothing else, and do so already 3 logged points after each
resume."""

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

REPO = Path(__file__).resolve().parents[2]
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
                ck_root = root / run["checkpoint_dir"]  # checkpoint-N/ (HF), global_step_N/ (verl), step_N/ (NeMo-RL)
                for ck in ck_root.glob("*"):
                    m = re.fullmatch(r"(?:checkpoint-|global_step_|step_)(\d+)", ck.name)
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



def cut_view_problems(manifest: dict, root: Path, dest: Path) -> list[str]:
    """Scan each truncated view (``truncated_views``); the problems: a run not in one lineage, a boundary
    whose verdict is not yet the planted one."""
    problems = []
    for view, sub, b, cut in truncated_views(manifest, root, dest):
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
    return problems
