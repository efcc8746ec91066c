"""The resume guard's conclusions, logged by the training process, become findings of a scan."""

from __future__ import annotations

import numpy as np

from finding_helpers import judge, of


def _run(guard_metrics: dict) -> list:
    """Two processes; the second logs the guard's metrics (name -> (steps, values)) beside its KL."""
    first = {"train/loss": (np.arange(1, 101), np.ones(100))}
    second = {"train/loss": (np.arange(101, 131), np.ones(30)), **guard_metrics}
    return of(judge([first, second], checkpoint_steps=[100]), "training_guard")


def test_a_reference_the_guard_found_rebuilt_is_an_error_at_its_step():
    [f] = _run({"train/klwatch/reference_match": ([101], [0.0])})
    assert f.severity == "error" and f.step == 101 and "fingerprint" in f.message
    assert f.metrics == ("train/klwatch/reference_match",)


def test_a_resume_the_guards_kl_judge_called_a_reset_is_an_error_with_its_score():
    found = _run({"klwatch/resume_reset": ([103], [1.0]), "klwatch/resume_reset_score": ([103], [0.99])})
    [f] = found
    assert f.step == 103 and f.data["score"] > 0.9 and "0.99" in f.message


def test_what_the_guard_found_healthy_is_not_a_finding():
    assert _run({"train/klwatch/reference_match": ([101], [1.0]), "train/klwatch/resume_reset": ([103], [0.0]),
                 "train/klwatch/resume_reset_score": ([103], [0.01])}) == []


def test_a_run_without_the_guard_has_no_such_finding():
    assert _run({}) == []
