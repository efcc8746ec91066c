"""The README's Python example runs as written (with its placeholders bound to a real run)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from synthetic import KLRun, kl_values

REPO = Path(__file__).resolve().parents[1]


def _block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    [block] = [b for b in blocks if marker in b]
    return block


def test_the_detector_example_judges_a_scan_and_streams_a_verdict(monkeypatch, capsys):
    monkeypatch.chdir(REPO / "sample_runs" / "tensorboard")  # "runs/" in the example
    (before, after) = kl_values(KLRun(amplitude=0.08, tau=15.0, noise=0.08, every=1, resumes=[400], buggy=[True],
                                      last_step=440), np.random.default_rng(0))[:2]
    code = _block("detector.stream(").replace('"runs/"', '"."')
    scope = {"logged_before_the_restart": list(zip(*before)), "logged_after_it": list(zip(*after))}
    exec(compile(code, "README.md", "exec"), scope)
    assert len(scope["verdicts"]) == len(scope["result"].results) > 0
    assert capsys.readouterr().out.startswith("reference_reset ")
