"""Session fixtures for the finding-detector tests: the sample runs, generated once."""

from __future__ import annotations

import json
import subprocess
import sys
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


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every scenario the detectors are tested on, written by the sample generator (TensorBoard only,
    for speed; two generator processes side by side). The restart gap stays at a second: tensorboardX
    names event files by the second, so two launches within one would share a file name."""
    root = tmp_path_factory.mktemp("samples")
    lanes = [SCENARIOS[0::2], SCENARIOS[1::2]]
    procs = [_generate(root / f"lane{i}", names) for i, names in enumerate(lanes)]
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
