"""The shared series access of the finding detectors (``klwatch.findings.base``)."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.findings.base import (around, before_after, history, judge_resumes, pooled_values, restored_values,
                                   resumed_metric)
from klwatch.metrics import LR
from klwatch.model import Boundary, Finding, Lineage, Series


def lineage_of(pieces: list[dict[str, Series]], *, resumes: list[tuple[int, int | None]]) -> Lineage:
    """A run of ``pieces``, piece k > 0 starting at resume ``resumes[k - 1]`` = (step, resumed from)."""
    bounds = [Boundary(step=s, resumed_from_step=c, evidence=[], piece_index=k + 1) for k, (s, c) in enumerate(resumes)]
    return Lineage(id="run", name="run", segments=[], pieces=pieces, piece_segments=list(range(len(pieces))),
                   boundaries=bounds)


def test_around_takes_the_nearest_earlier_piece_that_has_data():
    assert around(["a", None, "c"], 2) == ("a", "c")
    assert around(["a", "b"], 1) == ("a", "b")
    assert around([None, "b"], 1) == (None, "b")
    assert around(["a"], 1) == ("a", None)  # no piece k: nothing after


def test_before_after_skips_a_piece_that_does_not_log_the_metric():
    lin = lineage_of([{"lr": Series([1, 2], [1.0, 2.0])}, {"loss": Series([3], [0.5])}, {"lr": Series([4], [3.0])}],
                     resumes=[(3, None), (4, None)])
    before, after = before_after(lin, lin.boundaries[1], "lr")
    assert before is not None and list(before.steps) == [1, 2]
    assert after is not None and list(after.steps) == [4]


def test_history_keeps_the_last_value_logged_at_a_rewound_step():
    lin = lineage_of([{"x": Series([1, 2, 3], [1.0, 2.0, 3.0])}, {"x": Series([2, 3, 4], [20.0, 30.0, 40.0])},
                      {"x": Series([5], [50.0])}], resumes=[(2, 1), (5, None)])
    hist = history(lin, lin.boundaries[1], "x")
    assert hist is not None
    assert list(hist.steps) == [1, 2, 3, 4]
    assert hist.values == pytest.approx([1.0, 20.0, 30.0, 40.0])


def test_restored_values_stop_at_the_checkpoint_resumed_from():
    hist = Series([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    assert restored_values(hist, Boundary(3, 2, [], 1)) == pytest.approx([1.0, 2.0])
    assert restored_values(hist, Boundary(5, None, [], 1)) == pytest.approx([1.0, 2.0, 3.0, 4.0])  # unknown: all
    assert restored_values(hist, Boundary(1, 0, [], 1)) == pytest.approx([1.0, 2.0, 3.0, 4.0])  # none up to it: all


def test_pooled_values_join_the_pieces_that_log_the_metric():
    assert pooled_values([Series([1], [1.0]), None, Series([3, 4], [3.0, 4.0])]) == pytest.approx([1.0, 3.0, 4.0])
    assert len(pooled_values([None, None])) == 0


def test_resumed_metric_is_none_for_a_run_without_a_resume():
    piece = {"train/learning_rate": Series([1, 2], [1e-4, 1e-4])}
    assert resumed_metric(lineage_of([piece], resumes=[]), LR) is None
    assert resumed_metric(lineage_of([piece, dict(piece)], resumes=[(3, None)]), LR) == "train/learning_rate"


def test_judge_resumes_judges_only_resumes_with_enough_history():
    x = {"x": Series(np.arange(1, 4), [1.0, 2.0, 3.0])}
    lin = lineage_of([x, {"x": Series([4], [4.0])}, {"loss": Series([5], [0.1])}, {"x": Series([6], [6.0])}],
                     resumes=[(4, None), (5, None), (6, None)])
    seen: list[tuple[int, int, int]] = []

    def judge(b: Boundary, hist: Series, after: Series) -> Finding | None:
        seen.append((b.step, len(hist), int(after.steps[0])))
        return Finding("test", b.step, "info", "judged") if b.step == 6 else None

    found = judge_resumes(lin, "x", judge, min_before=4)
    assert seen == [(6, 4, 6)]  # step 4 has 3 points of history, step 5 logs no x after it
    assert [f.step for f in found] == [6]
