"""Generate the UI-export corpus: the reference KL of sample runs as TensorBoard's own UI downloads it as CSV.

    .venv/bin/python -m sample_runs.ui_csv_corpus.generate [--out DIR]

Why: a user who only kept what they downloaded from TensorBoard's dashboard holds ``Wall time,Step,Value`` per
chart, the file named after the run (the data-download dialog's ``<run>.csv``): no event files, no tag name, no
launch boundary, only the clock. klwatch must still read it (``--metric <file stem>`` names the one series) and
find a reset where the clock shows the restart. This starts a real ``tensorboard`` server on loopback over the
committed TensorBoard sample runs (``sample_runs/tensorboard``), waits until it answers, and fetches every chosen
run's ``train/kl_penalty`` through the endpoint the UI's download link uses
(``/data/plugin/scalars/scalars?tag=...&run=...&format=csv``). The expected verdicts come from the sample runs'
manifest: a planted reset must be caught; every other resume, whose boundary the clock alone cannot confirm, is
``ok``.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent
TAG = "train/kl_penalty"
SCENARIOS = ("continuous", "resume-fixed", "resume-buggy", "ratchet-buggy", "rewind-fixed", "rewind-buggy",
             "lr-restart", "optimizer-reset")
"""Runs whose every resume the sample manifest expects ``ok`` or ``reference_reset`` (a declared reset, a
penalty switched off and a resume before the KL grew need the config or more than the chart holds)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310  (loopback, our own server)
        return r.read()


def serve(logdir: Path, *, deadline_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """A real TensorBoard server on loopback, returned once it lists the runs (never after a fixed sleep)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"tensorboard exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            if json.loads(_get(f"{base}/data/runs")):
                return proc, base
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"tensorboard on {base} did not list runs within {deadline_s:.0f} s")


def expected(sample_manifest: dict[str, Any], scenario: str) -> dict[str, Any]:
    run = next(r for r in sample_manifest["runs"] if r["id"] == f"tensorboard/new-file/{scenario}")
    resets = [b["step"] for b in run["boundaries"] if b["expected_verdict"] == "reference_reset"]
    return {"expected_status": "reference_reset" if resets else "ok", "expected_reset_steps": resets}


def generate(*, out: Path, names: Sequence[str] = SCENARIOS) -> dict[str, Any]:
    sample_manifest = json.loads((SAMPLES / "manifest.json").read_text())
    folder = out / "tensorboard"
    folder.mkdir(parents=True, exist_ok=True)
    proc, base = serve(SAMPLES / "tensorboard")
    exports = []
    try:
        for name in names:
            query = urllib.parse.urlencode({"tag": TAG, "run": name, "format": "csv"})
            (folder / f"{name}.csv").write_bytes(_get(f"{base}/data/plugin/scalars/scalars?{query}"))
            exports.append({"file": f"tensorboard/{name}.csv", "scenario": name, "tag": TAG, "metric": name,
                            **expected(sample_manifest, name)})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    import tensorboard

    manifest = {"generator": "sample_runs/ui_csv_corpus/generate.py", "tensorboard": tensorboard.__version__,
                "endpoint": "/data/plugin/scalars/scalars?tag=&run=&format=csv", "exports": exports}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=SAMPLES / "ui_csv")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args(argv)
    generate(out=args.out, names=[n for n in args.scenarios.split(",") if n])
    return 0


if __name__ == "__main__":
    sys.exit(main())
