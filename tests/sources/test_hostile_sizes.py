"""Issue 24: what a read costs is bounded by what it keeps, not by the size of the file it is given.

A sparse 1 GiB file (4 KB on disk, zeros when read) named like each kind of tracker file: before, each was
read whole (2-13 GB peak, one killed after 90 s with no output); now each is refused from its first bytes, a
named per-file error, while the healthy run beside it is judged, and the exit code says something was
unreadable (3). Run in a child under an address-space cap (``bounded_run``): a regression fails, it cannot
take the machine down."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bounded_run import klwatch_bounded

SAMPLES = Path(__file__).resolve().parents[2] / "sample_runs"
GIB = 1 << 30

KINDS = {
    "csv": ("metrics.csv", "not a CSV table: binary data"),
    "jsonl": ("metrics.jsonl", "not a JSONL table: binary data"),
    "parquet": ("metrics.parquet", "Parquet magic"),
    "tensorboard": ("events.out.tfevents.1700000000.host", "corrupt event file"),
    "wandb": ("run-20260101_000000-abcd1234/run-abcd1234.wandb", "not a W&B transaction log"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_sparse_1_gib_file_of_any_kind_is_a_named_error_in_bounded_time_and_memory(tmp_path: Path, kind: str):
    name, said = KINDS[kind]
    root = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard" / "resume-fixed", root / "healthy")
    big = root / "hostile" / name
    big.parent.mkdir(parents=True)
    with open(big, "wb") as f:
        f.truncate(GIB)
    assert big.stat().st_blocks * 512 < 1 << 20  # sparse: nothing on disk
    got = klwatch_bounded("scan", str(root), "--no-cache", "--format", "json", timeout=120)
    assert got.seconds < 60 and got.peak_mib < 1024, (got.seconds, got.peak_mib)
    assert got.returncode == 3, (got.returncode, got.stderr[-1000:])
    report = json.loads(got.stdout)
    errors = [lin["error"] or "" for lin in report["lineages"]] + [s["error"] or "" for s in report["sources"]]
    assert any(said in e and Path(name).parts[-1 if kind != "wandb" else 0] in e for e in errors), errors
    healthy = [lin for lin in report["lineages"] if lin["name"].startswith("healthy") or "resume-fixed" in lin["name"]]
    assert healthy and all(lin["status"] == "ok" for lin in healthy), [(lin["name"], lin["status"]) for lin in report["lineages"]]


def test_a_whole_file_read_holds_its_bytes_once(tmp_path: Path) -> None:
    """``read_regular`` of a 200 MiB file peaks near 200 MiB more, not twice that (chunks, then joined)."""
    import subprocess
    import sys

    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        for _ in range(200):
            f.write(bytes(range(256)) * 4096)
    code = ("import resource, sys; from pathlib import Path; from klwatch.sources.limits import Budget, read_regular;"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
            "data = read_regular(Path(sys.argv[1]), budget=Budget());"
            "print(len(data), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)")
    size, grown_mib = map(int, subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True,
                                              check=True, timeout=120).stdout.split())
    assert size == 200 << 20 and grown_mib < 300, grown_mib
