"""Generate the verl ``file``-logger corpus: runs whose only log is the JSONL verl's own ``FileLogger`` writes.

    .venv/bin/python -m sample_runs.verl_file_corpus.generate --verl /tmp/verl-src [--out DIR] [--scenarios a,b]

Why: verl's ``file`` backend reopens its JSONL with ``"wb"`` at every launch, so after a crash and a resume the
file holds the last launch alone, starting at the resumed step (``../shared/FRAMEWORKS.md``). klwatch must judge
a reset from that side only (``klwatch.post_side``). The training is the project's tiny GRPO loop
(``sample_runs/grpo.py``: real Adam updates against a real frozen reference), each launch its own process
(``python -m sample_runs.launch``), logging verl's metric names through verl's ``Tracking`` class loaded from a
verl source tree at the pinned commit in ``VERL_COMMIT`` (``--verl DIR`` or ``KLWATCH_VERL_SRC``). verl's code is
never copied into klwatch; CI only reads the committed files. The checkpoints the launches resume from live in
a scratch folder and are not kept: the file is all a user of this backend has.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sample_runs import grpo, scenarios, trackers  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROJECT = "klwatch-samples"
SCENARIOS = ("resume-buggy", "resume-fixed", "ratchet-buggy", "continuous")
STEPS = 40
COMMIT = (HERE / "VERL_COMMIT").read_text().strip()


def launch_all(name: str, sc: scenarios.Scenario, *, out: Path, verl: Path, scratch: Path) -> list[dict[str, Any]]:
    """Every launch of one scenario, each a new process writing the same JSONL; their own reports."""
    work = scratch / name
    work.mkdir(parents=True)
    cfg = grpo.TrainConfig.from_dict({**grpo.TrainConfig().to_dict(), **sc.overrides})
    spec: dict[str, Any] = {"tracker": "verl-file", "flavour": "verl", "project": PROJECT, "name": name,
                            "config": cfg.to_dict(), "ckpt_root": str(work / "checkpoints"), "verl_src": str(verl),
                            "verl_file_root": str(out / name), "step_delay": 0.0}
    results = []
    for i, launch in enumerate(sc.launches):
        if i:
            time.sleep(1.0)  # the job scheduler's delay before the restarted job runs
        spec.update(resume_from=launch.resume_from, stop_after=launch.stop_after, order=launch.order,
                    lose=list(launch.lose), result_path=str(work / f"result-{i}.json"))
        (work / f"spec-{i}.json").write_text(json.dumps(spec))
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, "-m", "sample_runs.launch", str(work / f"spec-{i}.json")],
                              cwd=work, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: launch {i} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        results.append(json.loads((work / f"result-{i}.json").read_text()))
    return results


def manifest_entry(name: str, sc: scenarios.Scenario, results: list[dict[str, Any]], *, out: Path) -> dict[str, Any]:
    """What the processes did, and what klwatch should conclude from the file alone: only the last launch is in
    it, so a reference rebuilt at its resume is a reset at its first step, the launch before it absent."""
    last = results[-1]
    jsonl = Path(last["tracker"]["jsonl"]).resolve().relative_to(out.resolve())
    boundaries = []
    if last["resumed_from_step"] is not None and last["reference_from"] == "checkpoint":
        boundaries.append({"step": last["first_step"], "resumed_from_step": last["resumed_from_step"],
                           "expected_verdict": "reference_reset", "evidence": ["starts_past_first_step"],
                           "why": "reference rebuilt from the resumed weights; the launch before it is not in the file",
                           "kl_first_after": last["kl"][0]})
    return {
        "id": f"verl-file/{name}", "scenario": name, "tracker": "verl-file", "flavour": "verl",
        "kl_metric": trackers.KL_METRIC["verl"], "path": str(jsonl),
        "expected_status": "reference_reset" if boundaries else "ok", "boundaries": boundaries,
        "processes": [{"index": i, "first_step": r["first_step"], "last_step": r["last_step"],
                       "resumed_from_step": r["resumed_from_step"], "crashed": r["crashed"],
                       "reference_from": r["reference_from"]} for i, r in enumerate(results)],
        "steps_in_file": [last["first_step"], last["last_step"]],
    }


def generate(*, out: Path, verl: Path, names: Sequence[str] = SCENARIOS) -> dict[str, Any]:
    """Write every scenario's JSONL under ``out/<scenario>/`` and ``out/manifest.json``."""
    table = scenarios.build(steps=STEPS)
    started = time.time()
    runs = []
    with tempfile.TemporaryDirectory(prefix="klwatch-verl-file-") as tmp:
        for name in names:
            shutil.rmtree(out / name, ignore_errors=True)
            results = launch_all(name, table[name], out=out, verl=verl, scratch=Path(tmp))
            runs.append(manifest_entry(name, table[name], results, out=out))
            print(f"{name}: {len(results)} launch(es), file keeps steps {runs[-1]['steps_in_file']}")
    manifest = {"generator": "sample_runs/verl_file_corpus/generate.py",
                "verl": {"commit": COMMIT, "file": "verl/utils/tracking.py"}, "steps": STEPS, "generation_seconds": round(time.time() - started, 1), "runs": runs}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verl", type=Path, default=os.environ.get("KLWATCH_VERL_SRC"),
                    help="a verl source tree at the commit in VERL_COMMIT (default: $KLWATCH_VERL_SRC)")
    ap.add_argument("--out", type=Path, default=HERE.parent / "verl_file")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args(argv)
    if args.verl is None or not (args.verl / "verl" / "utils" / "tracking.py").is_file():
        ap.error("give a verl source tree (--verl DIR or KLWATCH_VERL_SRC) holding verl/utils/tracking.py")
    args.out.mkdir(parents=True, exist_ok=True)
    generate(out=args.out, verl=args.verl.resolve(), names=[n for n in args.scenarios.split(",") if n])
    return 0


if __name__ == "__main__":
    sys.exit(main())
