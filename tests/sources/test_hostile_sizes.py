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


def _hole_after(path: Path, head: bytes, *, tail: bytes = b"") -> None:
    """``head``, then zeros up to 1 GiB (a sparse hole: nothing on disk), then ``tail``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.seek(GIB - len(tail))
        f.write(tail)
        f.truncate(GIB)


def _rows(kind: str) -> bytes:
    """A valid table of 20,000 rows (~300 KB: more than the 64 KiB the head check used to read)."""
    if kind == "csv":
        return b"step,train/kl_penalty\n" + b"".join(b"%d,0.0%d\n" % (i, i % 7 + 1) for i in range(20_000))
    return b"".join(b'{"step": %d, "train/kl_penalty": 0.0%d}\n' % (i, i % 7 + 1) for i in range(20_000))


def _mlflow_metric_file(root: Path) -> Path:
    """A real MLflow file store (written by the mlflow client) with one run logging 20 steps of KL."""
    import os
    import subprocess
    import sys

    code = ("import mlflow, sys; mlflow.set_tracking_uri(sys.argv[1]); mlflow.set_experiment('grpo');\n"
            "with mlflow.start_run(run_name='hostile'):\n"
            "    [mlflow.log_metric('train/kl_penalty', 0.01 * (i + 1), step=i) for i in range(20)]")
    subprocess.run([sys.executable, "-c", code, (root / "mlruns").as_uri()], check=True, timeout=120,
                   env={**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}, capture_output=True)
    return next((root / "mlruns").glob("*/*/metrics/train/kl_penalty"))


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet", "tensorboard", "wandb", "mlflow"])
def test_a_valid_head_then_a_1_gib_hole_costs_the_head_not_the_gigabyte(tmp_path: Path, kind: str) -> None:
    """What a crash into a pre-extended file or a sparse copy leaves: whole records, then a gigabyte of zeros.
    Tables are refused by name (no table holds NUL bytes); an event file or a W&B log keeps its records before
    the hole, as TensorBoard's loader does, with a warning naming the zeros; an MLflow metric file is left out
    with a warning. Before: read whole (1.2-2.3 GB peak for event files, W&B logs and Parquet, any text table
    with more than 64 KiB before its hole)."""
    import pandas as pd

    root = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard" / "resume-fixed", root / "healthy")
    hostile = root / "hostile"
    if kind in ("csv", "jsonl"):
        big, said = hostile / f"metrics.{kind}", f"not a {kind.upper()} table: binary data (a NUL byte at byte"
        _hole_after(big, _rows(kind))
    elif kind == "parquet":
        (tmp_path / "t.parquet").parent.mkdir(exist_ok=True)
        pd.DataFrame({"step": range(20_000), "train/kl_penalty": [0.01] * 20_000}).to_parquet(tmp_path / "t.parquet")
        data = (tmp_path / "t.parquet").read_bytes()
        big, said = hostile / "metrics.parquet", "not a readable Parquet table: bytes"
        _hole_after(big, data[:len(data) // 2], tail=data[len(data) // 2:])
    elif kind == "tensorboard":
        first = sorted((SAMPLES / "tensorboard" / "ratchet-buggy").glob("events.out.tfevents.*"))[0]
        big, said = hostile / first.name, "zero bytes from byte"
        _hole_after(big, first.read_bytes())
    elif kind == "wandb":
        src = next((SAMPLES / "trl_preference" / "wandb").glob("*/wandb/offline-run-*"))
        shutil.copytree(src, hostile / src.name)
        log = next((hostile / src.name).glob("*.wandb"))
        big, said = log, "zero bytes from byte"
        _hole_after(big, log.read_bytes())
    else:
        metric = _mlflow_metric_file(hostile)
        big, said = metric, "binary data (a NUL byte at byte"
        _hole_after(big, metric.read_bytes())
    assert big.stat().st_size == GIB and big.stat().st_blocks * 512 < 4 << 20
    got = klwatch_bounded("scan", str(root), "--no-cache", "--format", "json", timeout=120)
    assert got.seconds < 60 and got.peak_mib < 1024, (got.seconds, got.peak_mib)
    report = json.loads(got.stdout)
    texts = [lin["error"] or "" for lin in report["lineages"]] + [" ".join(lin["warnings"]) for lin in report["lineages"]]
    assert any(said in t and big.name in t for t in texts), texts
    healthy = [lin for lin in report["lineages"] if lin["name"] == "healthy"]
    assert healthy and healthy[0]["status"] == "ok", [(lin["name"], lin["status"]) for lin in report["lineages"]]
    if kind in ("csv", "jsonl", "parquet"):
        assert got.returncode == 3, (got.returncode, got.stderr[-1000:])


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
