"""Session fixtures for the finding-detector tests: the sample runs, generated once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from finding_helpers import REPO, SCENARIOS

from klwatch.model import LineageResult
from klwatch.pipeline import scan


def _generate(out: Path, names: Sequence[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "sample_runs" / "generate.py"), "--out", str(out), "--scenarios", ",".join(names),
         "--trackers", "tensorboard", "--step-delay", "0", "--restart-gap", "1.0", "--quiet"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


_early: dict[str, tuple[Path, list[subprocess.Popen]]] = {}


def _start(root: Path) -> tuple[Path, list[subprocess.Popen]]:
    """Two generator processes side by side, each writing half the scenarios."""
    lanes = [SCENARIOS[0::2], SCENARIOS[1::2]]
    return root, [_generate(root / f"lane{i}", names) for i, names in enumerate(lanes)]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start generating as soon as a selected test needs the samples: their ~20 s (a second of restart
    gap per launch) then overlap the tests that run before, as the mlflow server's start does."""
    if any("sample_root" in getattr(item, "fixturenames", ()) for item in session.items):
        _early["samples"] = _start(Path(tempfile.mkdtemp(prefix="klwatch-test-findings-samples-")))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    early = _early.pop("samples", None)
    if early is not None:
        for p in early[1]:
            if p.poll() is None:
                p.kill()
            p.communicate()
        shutil.rmtree(early[0], ignore_errors=True)


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every scenario the detectors are tested on, written by the sample generator (TensorBoard only,
    for speed), started when the session's tests were collected. The restart gap stays at a second:
    tensorboardX names event files by the second, so two launches within one would share a file name."""
    root, procs = _early.get("samples") or _start(tmp_path_factory.mktemp("samples"))
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    return root


@pytest.fixture(scope="session")
def sample(sample_root: Path) -> Callable[[str], LineageResult]:
    """The judged training run of one generated scenario (scanned once, then cached)."""
    cache: dict[str, LineageResult] = {}

    def get(name: str) -> LineageResult:
        if name not in cache:
            [folder] = [p for p in sample_root.glob(f"lane*/tensorboard/{name}") if p.is_dir()]
            res = scan([str(folder)])
            assert not res.any_error, [s.errors for s in res.sources]
            assert len(res.results) == 1, [r.lineage.name for r in res.results]
            cache[name] = res.results[0]
        return cache[name]

    return get


@pytest.fixture(scope="session")
def manifest(sample_root: Path) -> Callable[[str], dict]:
    """What the generator did in one scenario (its manifest entry): the boundaries with the step
    after each resume, the faults it planted and where, the steps it re-logged."""
    runs: dict[str, dict] = {}
    for path in sample_root.glob("lane*/manifest.json"):
        for run in json.loads(path.read_text())["runs"]:
            runs[run["scenario"]] = run
    return runs.__getitem__
