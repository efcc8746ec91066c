"""A framework's own resume test, gated on klwatch's Python API (``assert_no_reference_reset``).

Train a few steps, checkpoint, crash, resume from the checkpoint, then assert on the logs the run
wrote that the KL to the reference did not collapse at the resume. Here klwatch's sample generator
stands in for the framework (a small GRPO-style job, one process per launch, logging through
TensorBoard); in your repository, call your own trainer instead of ``train_checkpoint_resume``.

    .venv/bin/pip install -e '.[examples]'   # the generator's TensorBoard writer (scripts/setup.sh --test has it)
    .venv/bin/pytest examples/pytest_resume_test.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from klwatch.ci import assert_no_reference_reset

REPO = Path(__file__).resolve().parents[1]


def train_checkpoint_resume(logdir: Path, *, buggy_reference: bool) -> None:
    """Stand-in for the framework: 60 steps, a checkpoint every 10, a crash after step 40, a resume.

    ``buggy_reference`` snapshots the reference policy *after* loading the checkpoint (the NeMo-RL
    DTensorPolicyWorkerV2 order), which is the bug the assertion must catch.
    """
    scenario = "resume-buggy" if buggy_reference else "resume-fixed"
    subprocess.run([sys.executable, str(REPO / "sample_runs" / "generate.py"), "--out", str(logdir),
                    "--scenarios", scenario, "--trackers", "tensorboard", "--step-delay", "0",
                    "--restart-gap", "0.2", "--quiet"], check=True, cwd=REPO)


def test_resume_keeps_the_reference_policy(tmp_path: Path) -> None:
    train_checkpoint_resume(tmp_path, buggy_reference=False)
    # min_boundaries=1: fail too when the resume does not show in the logs at all.
    assert_no_reference_reset(tmp_path, min_boundaries=1)


def test_a_reference_rebuilt_from_the_checkpoint_fails_the_test(tmp_path: Path) -> None:
    train_checkpoint_resume(tmp_path, buggy_reference=True)
    with pytest.raises(AssertionError, match=r"KL reference reset in run .* at boundary step \d+") as caught:
        assert_no_reference_reset(tmp_path)
    message = str(caught.value)
    assert "KL before" in message and "KL after" in message and "score" in message
