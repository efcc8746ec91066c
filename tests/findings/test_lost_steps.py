from __future__ import annotations

import numpy as np
import pytest
from finding_helpers import SCENARIOS, judge, of

NAME = "lost_steps"


def run(*spans: tuple[int, int], every: int = 1, checkpoint_steps=()):
    """One process per (first, last) logged step span, logging every ``every`` steps of its own."""
    procs = []
    for lo, hi in spans:
        steps = np.arange(lo, hi + 1, every)
        procs.append({"train/loss": (steps, np.sin(steps / 7.0))})
    return judge(procs, checkpoint_steps=checkpoint_steps)


def test_rewind_reports_the_steps_trained_twice():
    [f] = of(run((1, 130), (101, 200), checkpoint_steps=[50, 100, 150]), NAME)
    assert f.severity == "info" and f.step == 101
    assert (f.data["kind"], f.data["first_lost"], f.data["last_lost"], f.data["steps_lost"]) == ("rewind", 101, 130, 30)
    assert "101-130" in f.message and "checkpoint 100" in f.message


def test_steps_dropped_by_the_tracker_after_a_resume_from_an_older_checkpoint_are_reported():
    # W&B refused the resumed process's steps 101-130 (below its current step): the log shows none
    [f] = of(run((1, 130), (131, 200), checkpoint_steps=[50, 100]), NAME)
    assert f.severity == "info" and f.step == 131
    assert (f.data["kind"], f.data["first_lost"], f.data["last_lost"]) == ("dropped", 101, 130)


def test_a_hole_in_the_logs_is_a_warning_with_its_range():
    [f] = of(run((1, 140), (150, 200)), NAME)
    assert f.severity == "warning"
    assert (f.data["kind"], f.data["first_lost"], f.data["last_lost"], f.data["steps_lost"]) == ("gap", 141, 149, 9)


@pytest.mark.parametrize("every", [1, 10])
def test_a_clean_resume_loses_nothing(every):
    assert of(run((1, 121), (121 + every, 201), every=every), NAME) == []


def test_logging_every_n_steps_is_not_a_loss_but_a_missing_stretch_is():
    assert of(run((1, 111), (121, 201), every=10), NAME) == []
    [f] = of(run((1, 111), (141, 201), every=10), NAME)
    assert (f.data["kind"], f.data["first_lost"], f.data["last_lost"]) == ("gap", 112, 140)


def test_reports_the_range_lost_on_the_generated_rewind(sample, manifest):
    result, planted = sample("rewind-fixed"), manifest("rewind-fixed")
    relogged = planted["relogged_steps"]
    [b] = planted["boundaries"]
    [f] = of(result, NAME)
    assert f.step == b["step"] and f.severity == "info"
    assert (f.data["kind"], f.data["first_lost"], f.data["last_lost"], f.data["steps_lost"]) == (
        "rewind", min(relogged), max(relogged), len(relogged))


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "rewind-fixed"])
def test_silent_on_the_generated_runs_that_resume_where_they_stopped(sample, scenario):
    assert of(sample(scenario), NAME) == []
