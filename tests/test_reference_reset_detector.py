"""``ReferenceResetDetector``: the KL reset check as a detector owning its policy, and its streaming
form, which must give the verdict a scan of the same logs gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from klwatch.model import Boundary, Lineage, Segment, Series
from klwatch.pipeline import ScanConfig, scan
from klwatch.reference_reset import ReferenceResetConfig, ReferenceResetDetector, StreamingReferenceReset
from synthetic import KLRun, kl_values

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


def _lineage(pieces: list[tuple[np.ndarray, np.ndarray]], *, metric: str = "train/kl", negated: bool = False,
             config: dict | None = None, resumed_from: list[int | None] | None = None) -> Lineage:
    """A lineage as the pipeline builds it, one tracker piece per process, a boundary at each restart."""
    segs = [Segment(kind="table", ref=f"p{k}", source="test") for k in range(len(pieces))]
    lin = Lineage(id="run", name="run", segments=segs, pieces=[{metric: Series(s, v)} for s, v in pieces],
                  piece_segments=list(range(len(pieces))), config=config or {}, kl_metric=metric, kl_negated=negated)
    lin.boundaries = [Boundary(int(pieces[k][0][0]), (resumed_from or [None] * len(pieces))[k], ["new_tracker_run"], k)
                      for k in range(1, len(pieces))]
    return lin


def _buggy(seed: int = 0, *, buggy: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    run = KLRun(amplitude=0.08, tau=15.0, noise=0.08, every=1, resumes=[60], buggy=[buggy], last_step=100)
    return kl_values(run, np.random.default_rng(seed))


def test_a_rebuilt_reference_makes_the_run_a_reset_run():
    result = ReferenceResetDetector().judge(_lineage(_buggy()))
    assert result.status == "reference_reset"
    [v] = result.verdicts
    assert v.verdict == "reference_reset" and v.boundary.step == 61


def test_a_kl_logged_negated_is_judged_as_the_distance_it_is():
    """``ppo_actor/kl_rewards/avg`` logs -KL: the lineage flips it back, so the same reset is caught."""
    pieces = [(s, -v) for s, v in _buggy()]
    result = ReferenceResetDetector().judge(_lineage(pieces, metric="ppo_actor/kl_rewards/avg", negated=True))
    assert result.status == "reference_reset"


def test_a_kl_of_zero_throughout_is_the_penalty_switched_off_and_the_tolerance_is_a_parameter():
    pieces = [(s, np.full(len(s), 1e-13)) for s, _ in _buggy()]
    assert ReferenceResetDetector().judge(_lineage(pieces)).status == "kl_disabled"
    strict = ReferenceResetDetector(config=ReferenceResetConfig(kl_off_tolerance=1e-14))
    assert strict.judge(_lineage(pieces)).status != "kl_disabled"


def test_a_reset_the_run_declares_is_intentional():
    config = {"sync_ref_model": True, "ref_model_sync_steps": 60, "ref_model_mixup_alpha": 1.0}
    result = ReferenceResetDetector().judge(_lineage(_buggy(), config=config, resumed_from=[None, 60]))
    assert result.status == "intentional"
    assert "intentional" in result.verdicts[0].explanation


def test_a_reset_declared_on_the_command_line_is_intentional():
    result = ReferenceResetDetector(intentional_resets=(60,)).judge(_lineage(_buggy(), resumed_from=[None, 60]))
    assert result.status == "intentional"


def test_no_kl_metric_names_what_was_logged_and_the_metric_asked_for():
    lin = _lineage(_buggy())
    lin.kl_metric = None
    result = ReferenceResetDetector(metrics=("my/kl",)).judge(lin)
    assert result.status == "no_kl_metric"
    assert "--metric my/kl" in result.findings[0].message and "train/kl" in result.findings[0].message
    assert all(v.verdict == "inconclusive" for v in result.verdicts)


def test_a_run_whose_every_part_is_unreadable_is_an_error_naming_them():
    lin = _lineage(_buggy())
    for s in lin.segments:
        s.error = f"{s.ref}: truncated"
    result = ReferenceResetDetector().judge(lin)
    assert result.status == "error" and "p0: truncated" in (result.error or "")


def _feed(stream: StreamingReferenceReset, lin: Lineage) -> list:
    """Feed a lineage's KL in order, resuming at each boundary; the verdicts ``update`` returns."""
    out = []
    for k, kl in enumerate(lin.kl_pieces()):
        if k:
            b = next(b for b in lin.boundaries if b.piece_index == k)
            pending = stream.resume(resumed_from_step=b.resumed_from_step)
            if pending is not None:
                out.append(pending)
        for step, value in zip(kl.steps if kl is not None else [], kl.values if kl is not None else []):
            v = stream.update(int(step), float(value))
            if v is not None:
                out.append(v)
    return out


def _truncated(lin: Lineage, upto: int, points: int) -> Lineage:
    """The lineage as its logs stood when piece ``upto`` had logged its first ``points`` KL points."""
    kl = lin.kl_pieces()
    pieces = [(k.steps, k.values) for k in kl[:upto]] + [(kl[upto].steps[:points], kl[upto].values[:points])]
    resumed = [None] + [b.resumed_from_step for b in sorted(lin.boundaries, key=lambda b: b.piece_index)]
    return _lineage(pieces, config=lin.config, resumed_from=resumed[:upto + 1])


@pytest.mark.parametrize("run", ["resume-buggy", "resume-fixed", "ratchet-buggy", "early-resume-buggy", "intentional-reset"])
def test_the_streaming_verdict_is_the_scan_verdict_of_the_same_points(run):
    """Fed point by point, each resume gets the verdict a scan of the logs up to its third point gives."""
    [result] = scan([str(SAMPLES / "tensorboard" / run)], config=ScanConfig(findings=False)).results
    lin = result.lineage
    assert lin.boundaries and all(k is not None for k in lin.kl_pieces())
    detector = ReferenceResetDetector()
    streamed = _feed(detector.stream(name=lin.name, config=lin.config), lin)
    assert len(streamed) == len(lin.boundaries)
    window = detector.config.window_after
    for v in streamed:
        k = v.boundary.piece_index
        [want] = [w for w in detector.judge(_truncated(lin, k, window)).verdicts if w.boundary.piece_index == k]
        assert (v.verdict, v.boundary.step) == (want.verdict, want.boundary.step)
        assert v.score == pytest.approx(want.score, abs=1e-9)


def test_the_stream_says_nothing_until_the_points_that_decide_are_in():
    lin = _lineage(_buggy())
    stream = ReferenceResetDetector().stream()
    before, after = lin.kl_pieces()
    assert all(stream.update(int(s), float(v)) is None for s, v in zip(before.steps, before.values))
    stream.resume(resumed_from_step=60)
    assert stream.update(int(after.steps[0]), float(after.values[0])) is None
    assert stream.current() is not None  # a provisional reading is there on request
    assert stream.update(int(after.steps[1]), float(after.values[1])) is None
    final = stream.update(int(after.steps[2]), float(after.values[2]))
    assert final is not None and final.verdict == "reference_reset" and stream.verdicts == [final]
    assert stream.update(int(after.steps[3]), float(after.values[3])) is None  # decided once


def test_a_second_resume_before_the_window_is_full_judges_the_first_on_what_it_has():
    lin = _lineage(_buggy())
    stream = ReferenceResetDetector().stream()
    before, after = lin.kl_pieces()
    for s, v in zip(before.steps, before.values):
        stream.update(int(s), float(v))
    stream.resume(resumed_from_step=60)
    for s, v in zip(after.steps[:2], after.values[:2]):
        stream.update(int(s), float(v))
    cut_short = stream.resume(resumed_from_step=int(after.steps[1]))
    assert cut_short is not None and cut_short.boundary.step == int(after.steps[0])


@pytest.mark.parametrize("reset_score", [0.5, 0.95, 1.0])
def test_a_declared_reset_is_intentional_whatever_the_reset_threshold(reset_score):
    """At ``--reset-score 1.0`` a declared reset used to read as no reset at all (run status ``ok``
    while its score showed 1.00); ``intentional`` is the run's declaration, not the user's threshold."""
    config = {"sync_ref_model": True, "ref_model_sync_steps": 60, "ref_model_mixup_alpha": 1.0}
    detector = ReferenceResetDetector(config=ReferenceResetConfig(reset_score=reset_score))
    result = detector.judge(_lineage(_buggy(), config=config, resumed_from=[None, 60]))
    assert result.status == "intentional" and result.verdicts[0].verdict == "intentional"


def test_the_reset_threshold_still_governs_undeclared_boundaries():
    strict = ReferenceResetDetector(config=ReferenceResetConfig(reset_score=1.0))
    [v] = strict.judge(_lineage(_buggy())).verdicts
    default = ReferenceResetDetector().judge(_lineage(_buggy())).verdicts[0]
    assert default.verdict == "reference_reset"
    assert v.verdict == ("reference_reset" if v.score >= 1.0 else "inconclusive")


def test_the_kl_detector_alone_names_a_preference_trainers_implicit_rewards():
    from klwatch.model import Segment, Series
    from klwatch.pipeline import ScanConfig, build_lineages

    steps = np.arange(1, 13)
    series = {name: Series(steps, np.linspace(0.0, 1.0, 12), steps * 1.0)
              for name in ("train/rewards_chosen_mean", "train/rewards_rejected_mean", "train/preference_loss",
                           "train/accuracy", "train/loss")}
    (lin,) = build_lineages([Segment(kind="mlflow", ref="r", source="s", run_id="r", name="dpo", series=series)],
                            config=ScanConfig())
    result = ReferenceResetDetector().judge(lin)  # klwatch scan hands such a run to the preference detector
    assert result.status == "no_kl_metric"
    (msg,) = [f.message for f in result.findings if f.detector == "kl_metric"]
    assert "preference trainer" in msg and "chosen train/rewards_chosen_mean" in msg and "loss train/preference_loss" in msg
    assert "PreferenceResetDetector" in msg

def test_a_healthy_resume_after_a_launch_that_logged_past_its_checkpoint_is_judged_from_the_checkpoint():
    # early in the run the KL still grows fast; the crashed launch logged 30 steps past its checkpoint at 57, the
    # resumed one re-logs them from 58 a little under where it was (a dip of a third, recovering): the level it
    # resumed from is the KL at 57, not where the crashed launch had got to by 87
    steps = np.arange(1, 301)
    kl = 0.05 * (1 - np.exp(-steps / 120.0)) * np.exp(np.random.default_rng(4).normal(0, 0.05, len(steps)))
    crashed = Series(steps[:87], kl[:87])
    resumed_kl = kl[57:].copy()
    resumed_kl[:3] *= 0.67
    resumed = Series(steps[57:], resumed_kl)
    lin = Lineage(id="r", name="r", segments=[], pieces=[{"kl": crashed}, {"kl": resumed}], piece_segments=[0, 1],
                  kl_metric="kl", boundaries=[Boundary(step=58, resumed_from_step=57,
                                                       evidence=["step_rewind", "duplicate_steps"], piece_index=1)])
    v = ReferenceResetDetector().judge(lin).verdicts[0]
    assert v.verdict != "reference_reset", v.explanation
    assert v.kl_before is not None and v.kl_before < float(kl[60])  # the level at the checkpoint, not at step 87
