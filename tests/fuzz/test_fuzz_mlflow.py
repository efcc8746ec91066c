"""Fuzzing the local MLflow readers (issue 12) with stores the real mlflow client wrote: an ``mlruns/``
file store (experiment and run ``meta.yaml``, a metric file, a param and a tag file) and a SQLite
store (the committed ``sample_runs/mlflow/mlflow.db``), each damaged by truncations, bit flips,
random bytes spliced in or in place, and its format's own huge values (a step of 2^70 or a number of
5,000 digits in a metric line, a YAML alias bomb or a 5,000-digit time in a ``meta.yaml``, a page
size or database size of 2^16 / 2^32 in the SQLite header). Every input, read through
``read_source`` as a scan reads it, must give a clear error or warning naming the damaged file (or its
run folder), never a traceback, in bounded time and memory, and leave every file's bytes and mtime
as they were (``fuzz_helpers.check_read``, plus the mtimes here).

The default number of examples keeps this module to ~20 s on two busy cores; ``KLWATCH_FUZZ_EXAMPLES=N``
runs N examples per test instead (a long fuzz, e.g.
``KLWATCH_FUZZ_EXAMPLES=5000 pytest -p no:cacheprovider -s tests/fuzz/test_fuzz_mlflow.py``); ``-s``
shows this module's totals when it ends.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import TOTALS, check_read, damage, fuzz_settings

SAMPLE_DB = Path(__file__).resolve().parents[2] / "sample_runs" / "mlflow" / "mlflow.db"
T0 = 1_760_000_000_000
ALIAS_BOMB = b"a: &a [x, x, x, x, x, x, x, x]\n" + b"".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 8)}]\n".encode() for i in range(8))
START = Counter(TOTALS)


@dataclass
class Mlruns:
    """A client-written file store in ``folder/mlruns`` and the files to damage: (key, path, the
    run or experiment it belongs to, as messages name it)."""

    folder: Path
    targets: dict[str, tuple[Path, str]]


def mtimes(folder: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module", autouse=True)
def module_totals() -> Iterator[None]:
    """Print what this module's inputs gave (``-s`` shows it)."""
    yield
    mine = Counter(TOTALS)
    mine.subtract(START)
    keys = ("inputs", "clear errors", "warned", "read clean", "tracebacks", "hangs", "modified")
    print("\nmlflow fuzz: " + ", ".join(f"{k} {mine[k]}" for k in keys))


@pytest.fixture(scope="module")
def mlruns(tmp_path_factory: pytest.TempPathFactory) -> Mlruns:
    """Two runs of one training (the second resumed from step 5) and a third, by the real client."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    folder = tmp_path_factory.mktemp("fuzz-mlruns")
    old = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        c = MlflowClient(tracking_uri=(folder / "mlruns").as_uri())
        exp = c.create_experiment("grpo")
        ids = []
        for i, (first, last) in enumerate([(1, 10), (6, 15), (1, 8)]):
            t0, steps = T0 + 100_000 * i, range(first, last + 1)
            run = c.create_run(exp, run_name=f"grpo-{i}", start_time=t0, tags={"group": "g" if i < 2 else "h"})
            c.log_batch(run.info.run_id, params=[Param("lr", "1e-06"), Param("steps", "15")],
                        tags=[RunTag("team", "rl")],
                        metrics=[Metric("train/kl_penalty", 0.01 * s, t0 + s, s) for s in steps]
                        + [Metric("loss", 1.0 / s, t0 + s, s) for s in steps])
            ids.append(run.info.run_id)
    finally:
        if old is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = old
    run, exp_ref = folder / "mlruns" / exp / ids[1], f"mlruns/{exp}"
    run_ref = f"{exp_ref}/{ids[1]}"
    return Mlruns(folder, {
        "experiment meta.yaml": (folder / "mlruns" / exp / "meta.yaml", f"{exp_ref}/meta.yaml"),
        "run meta.yaml": (run / "meta.yaml", run_ref),
        "metric file": (run / "metrics" / "train" / "kl_penalty", run_ref),
        "param file": (run / "params" / "lr", run_ref),
        "tag file": (run / "tags" / "team", run_ref),
    })


def huge_text(data: bytes, at: int) -> bytes:
    """The format's own huge values at the line holding byte ``at``: in a metric line a step of 2^70 or
    a 5,000-digit timestamp; in YAML an alias bomb or a 5,000-digit start time."""
    if data.startswith(b"artifact") or b"lifecycle_stage" in data:  # a meta.yaml
        return ALIAS_BOMB + data if at % 2 else data + b"start_time: " + b"9" * 5000 + b"\n"
    lines = data.split(b"\n")
    i = min(data[:at].count(b"\n"), max(0, len(lines) - 2))
    parts = lines[i].split(b" ")
    if len(parts) >= 3:
        parts[2 if at % 2 else 0] = str(2 ** 70).encode() if at % 2 else b"9" * 5000
    lines[i] = b" ".join(parts)
    return b"\n".join(lines)


def huge_sqlite(data: bytes, at: int) -> bytes:
    """The SQLite header's page size (bytes 16-17: 1 means 65,536) or its database size in pages
    (bytes 28-31) set to the largest it holds."""
    if at % 2:
        return data[:16] + b"\x00\x01" + data[18:]
    return data[:28] + b"\xff\xff\xff\xff" + data[32:]


def check_untouched(folder: Path, before: dict[str, int]) -> None:
    """No file created, removed or given a new mtime (``check_read`` compares the bytes)."""
    after = mtimes(folder)
    if after != before:
        TOTALS["modified"] += 1
    assert after == before, "reading touched its input"


@fuzz_settings(200)
@given(target=st.sampled_from(["experiment meta.yaml", "run meta.yaml", "metric file", "param file", "tag file"]),
       data=st.data())
def test_a_damaged_mlruns_file_gives_a_clear_warning_or_error_naming_it(
        mlruns: Mlruns, target: str, data: st.DataObject) -> None:
    path, name = mlruns.targets[target]
    original = path.read_bytes()
    _, damaged = data.draw(damage(original, huge=huge_text))
    try:
        path.write_bytes(damaged)
        before = mtimes(mlruns.folder)
        check_read(mlruns.folder, folder=mlruns.folder, names=(name,), size=len(damaged))
        check_untouched(mlruns.folder, before)
    finally:
        path.write_bytes(original)


@pytest.fixture(scope="module")
def sqlite_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-sqlite")


@fuzz_settings(80)
@given(data=st.data())
def test_a_damaged_sqlite_store_gives_a_clear_error_naming_it(sqlite_folder: Path, data: st.DataObject) -> None:
    original = SAMPLE_DB.read_bytes()
    _, damaged = data.draw(damage(original, huge=huge_sqlite))
    shutil.rmtree(sqlite_folder)
    sqlite_folder.mkdir()
    db = sqlite_folder / "mlflow.db"
    db.write_bytes(damaged)
    before = mtimes(sqlite_folder)
    check_read(db, folder=sqlite_folder, names=("mlflow.db",), size=len(damaged))
    check_untouched(sqlite_folder, before)
