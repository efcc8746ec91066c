"""The comparison statistic: does a checkpoint→resume run's KL follow a continuous run's?

The seed's reproduction test (``klwatch compare CONTROL RESUMED`` is its face). Run one config twice,
once straight through (CONTROL) and once with a checkpoint and a resume (RESUMED). With a correct
resume the two KL curves are the same up to noise (exactly the same with the same seed and
deterministic kernels); with a reference rebuilt from the resumed weights, RESUMED's KL collapses at
the resume and regrows from zero.

How "the same up to noise" is decided, in log space (KL noise is multiplicative):

- the per-step gap is ``d = log(RESUMED + eps) - log(CONTROL + eps)`` on the steps both logged;
- the tolerance is learned, never fixed: ``sigmas`` times the gap noise two independent runs would
  show, from the control's own step-to-step noise (robust MAD), widened to the spread of the gaps
  before the resume when the two runs already differ there (different seeds or trackers), with a
  small floor (float32 vs float64 storage, rounding);
- they *part* at the first step from the resume on where ``|d|`` exceeds the tolerance for
  ``consecutive`` steps in a row, confirmed by a two-sample test (Mann-Whitney U) of the gaps after
  vs before the resume, so a lone outlier or a run of noise does not fail a reproduction.

Pure: no I/O. ``scipy.stats`` is imported only when a test is run (it costs every CLI start most of a
second otherwise).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .model import LineageResult, Series
from .reference_reset import typical_kl
from .stats import diff_noise, floored_log, last_per_step, robust_sigma

KL_ZERO_FLOOR = 1e-12
"""The smallest log floor: a control whose KL is zero throughout still has finite logs."""

TWO_RUNS_SCALE = math.sqrt(2.0)
"""The gap of two independent runs adds two noises: its sigma is sqrt(2) that of one run."""

MIN_NOISE_POINTS = 3
"""Control points needed to measure its step-to-step noise (fewer: no noise term in the tolerance)."""

MIN_SPREAD_POINTS = 5
"""Gaps before the resume needed to measure their spread (and to warn that the runs already differ)."""

MIN_TEST_POINTS = 3
"""Gaps needed on each side of the resume for the two-sample test."""


@dataclass(frozen=True)
class CompareConfig:
    """How far apart two runs' KL may be before they count as parted (the ``klwatch compare`` options)."""

    sigmas: float = 4.0
    """Tolerance in units of the gap noise."""
    min_tolerance: float = 0.05
    """Smallest tolerance, in log units (about 5%): storage precision and rounding are not a parting."""
    consecutive: int = 2
    """Points in a row beyond the tolerance that make a parting."""
    window: int = 20
    """Points on each side of the resume compared by the two-sample test."""
    alpha: float = 0.01
    """Significance of the two-sample test that confirms a parting."""
    zero_fraction: float = 0.01
    """The log floor, as a fraction of the control's typical KL (a KL of ~0 stays finite)."""


@dataclass
class Comparison:
    """The verdict of one comparison, with what a person needs to check it."""

    verdict: Literal["agree", "parted", "insufficient"]
    resume_step: int
    n_pre: int
    n_post: int
    tolerance: float
    """In log units: the resumed KL may be within a factor exp(tolerance) of the control."""
    noise: float
    """The control's per-point noise (log units)."""
    pre_spread: float | None
    p_value: float | None
    part_step: int | None = None
    control_at: float | None = None
    resumed_at: float | None = None
    gap: float | None = None
    """RESUMED - CONTROL at the parting step."""
    ratio: float | None = None
    """RESUMED / CONTROL at the parting step."""
    max_gap_step: int | None = None
    max_ratio: float | None = None
    last_step: int | None = None
    explanation: str = ""
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Aligned:
    """Both runs on the steps both logged (the last value of each), and their gap in log space."""

    steps: np.ndarray
    control: np.ndarray
    resumed: np.ndarray
    gap: np.ndarray
    noise: float
    """The control's per-point noise, from all its points (log units)."""


def _align(control: Series, resumed: Series, *, zero_fraction: float) -> _Aligned:
    """Pair the runs step by step; a rewound step counts with what the resumed process logged last."""
    cs = last_per_step(control.take(np.isfinite(control.values)))
    rs = last_per_step(resumed.take(np.isfinite(resumed.values)))
    common = np.intersect1d(cs.steps, rs.steps)
    c = cs.values[np.searchsorted(cs.steps, common)]
    r = rs.values[np.searchsorted(rs.steps, common)]
    eps = max(zero_fraction * typical_kl(cs.values), KL_ZERO_FLOOR)
    log_control = floored_log(cs.values, eps)
    noise = diff_noise(log_control) if len(log_control) >= MIN_NOISE_POINTS else 0.0
    return _Aligned(common, c, r, floored_log(r, eps) - floored_log(c, eps), noise)


def _tolerance(config: CompareConfig, noise: float, pre_spread: float | None) -> float:
    """The largest of the floor, the gap two independent runs would show, and the gaps' own spread."""
    return max(config.min_tolerance, config.sigmas * TWO_RUNS_SCALE * noise,
               config.sigmas * pre_spread if pre_spread is not None else 0.0)


def _first_parting(d_post: np.ndarray, tol: float, consecutive: int) -> int | None:
    """Index of the first of ``consecutive`` gaps in a row beyond the tolerance, or None."""
    over = np.abs(d_post) > tol
    run = np.convolve(over.astype(int), np.ones(consecutive, dtype=int), mode="valid") == consecutive
    return int(np.argmax(run)) if run.any() else None


def _two_sample_p(after: np.ndarray, before: np.ndarray) -> float | None:
    """Mann-Whitney U p-value of the gaps after vs before the resume (None with too few points)."""
    if len(before) < MIN_TEST_POINTS or len(after) < MIN_TEST_POINTS:
        return None
    if np.ptp(np.concatenate([after, before])) == 0:
        return 1.0
    from scipy.stats import mannwhitneyu  # here, not at the top: it costs every CLI start

    return float(mannwhitneyu(after, before, alternative="two-sided").pvalue)


def compare_series(control: Series, resumed: Series, *, resume_step: int, config: CompareConfig = CompareConfig()) -> Comparison:
    """Compare two KL series (already on one step axis) from ``resume_step`` on. Pure: no I/O."""
    a = _align(control, resumed, zero_fraction=config.zero_fraction)
    pre, post = a.steps < resume_step, a.steps >= resume_step
    pre_win = a.gap[pre][-config.window:]
    pre_spread = robust_sigma(pre_win) if len(pre_win) >= MIN_SPREAD_POINTS else None
    tol = _tolerance(config, a.noise, pre_spread)
    post_steps = a.steps[post]
    out = Comparison("insufficient", int(resume_step), int(pre.sum()), int(post.sum()), tol, a.noise, pre_spread, None,
                     last_step=int(post_steps[-1]) if len(post_steps) else None)
    if len(pre_win) >= MIN_SPREAD_POINTS and abs(float(np.median(pre_win))) > tol:
        out.warnings.append(f"the runs already differ before the resume (median KL ratio {log_ratio(float(np.median(pre_win))):.3g}): "
                            "are they the same config and seed?")
    d_post = a.gap[post]
    if len(d_post) < config.consecutive:
        out.explanation = (f"Only {len(d_post)} step(s) logged by both runs from step {resume_step} on: "
                           f"need at least {config.consecutive} to compare.")
        return out
    first = _first_parting(d_post, tol, config.consecutive)
    start = first if first is not None else 0
    out.p_value = _two_sample_p(d_post[start:start + config.window], pre_win)
    _locate(out, post_steps, a.control[post], a.resumed[post], d_post, first)
    _conclude(out, config, n_post=len(d_post))
    return out


def _locate(out: Comparison, steps: np.ndarray, c: np.ndarray, r: np.ndarray, d: np.ndarray, first: int | None) -> None:
    """Fill in where the gap is largest and, when they part, the values at the parting step."""
    i_max = int(np.argmax(np.abs(d)))
    out.max_gap_step = int(steps[i_max])
    out.max_ratio = _ratio(r[i_max], c[i_max])
    if first is not None:
        out.part_step = int(steps[first])
        out.control_at, out.resumed_at = float(c[first]), float(r[first])
        out.gap = out.resumed_at - out.control_at
        out.ratio = _ratio(out.resumed_at, out.control_at)


def _conclude(out: Comparison, config: CompareConfig, *, n_post: int) -> None:
    """The verdict and its explanation: a parting beyond the tolerance counts only when the test confirms it."""
    tol_f = log_ratio(out.tolerance)
    p_txt = f"p={out.p_value:.2g}" if out.p_value is not None else "no two-sample test (too few steps before the resume)"
    if out.part_step is not None and (out.p_value is None or out.p_value < config.alpha):
        assert out.resumed_at is not None and out.control_at is not None and out.gap is not None
        out.verdict = "parted"
        out.explanation = (f"RESUMED's KL parts from CONTROL's at step {out.part_step}: {out.resumed_at:.3g} vs "
                           f"{out.control_at:.3g} (x{fmt_ratio(out.ratio)}, gap {out.gap:+.3g}), beyond the tolerance of "
                           f"x{tol_f:.3g} learned from the control's noise, for {config.consecutive}+ steps in a row ({p_txt}).")
        if out.resumed_at < out.control_at / tol_f:
            out.explanation += " The KL fell at the resume: the reference was likely rebuilt from the resumed weights."
        return
    out.verdict = "agree"
    out.explanation = (f"RESUMED's KL follows CONTROL's over {n_post} step(s) from step {out.resume_step}: largest "
                       f"ratio x{fmt_ratio(out.max_ratio)} at step {out.max_gap_step}, tolerance x{tol_f:.3g} ({p_txt}).")
    if out.part_step is not None:
        out.explanation += (f" (Beyond the tolerance from step {out.part_step}, but not distributed differently from the "
                            "gaps before the resume.)")


def _ratio(a: float, b: float) -> float | None:
    """a / b, None when only b is zero (no finite ratio), 1 when both are (they agree); ``inf`` past
    the float range (as Python floats, which overflow quietly where numpy's warn on stderr)."""
    if b == 0:
        return None if a != 0 else 1.0
    return float(a) / float(b)


def log_ratio(x: float) -> float:
    """A gap in log units as a ratio, ``inf`` beyond what a float holds: KL values logged near 1e±300
    make gaps of hundreds of log units, and ``math.exp`` raises on those instead of overflowing."""
    return math.exp(x) if x < math.log(sys.float_info.max) else math.inf


def fmt_ratio(x: float | None) -> str:
    """A ratio as people read it (3 significant digits), ``-`` when there is none."""
    return "-" if x is None else f"{x:.3g}"


# ------------------------------------------------------------------------------ two training runs


def kl_series(r: LineageResult) -> Series:
    """A training run's KL over all its pieces, signed as a distance."""
    return Series.concat([s for s in r.lineage.kl_pieces() if s is not None])


def first_resume(r: LineageResult) -> int | None:
    """The step RESUMED is compared from by default: its first boundary."""
    return int(r.lineage.boundaries[0].step) if r.lineage.boundaries else None


def compare_runs(control: LineageResult, resumed: LineageResult, *, resume_step: int,
                 config: CompareConfig = CompareConfig()) -> Comparison:
    """Compare two judged training runs' KL from ``resume_step`` on, warning when CONTROL is not a
    continuous run or the two log KL under different names."""
    cmp = compare_series(kl_series(control), kl_series(resumed), resume_step=resume_step, config=config)
    if control.lineage.boundaries:
        cmp.warnings.append(f"CONTROL {control.lineage.name} has resumes of its own (steps "
                            f"{', '.join(str(b.step) for b in control.lineage.boundaries)}): it is not a continuous run")
    if control.metric != resumed.metric:
        cmp.warnings.append(f"the runs log KL under different names: {control.metric} (CONTROL) vs {resumed.metric} (RESUMED)")
    return cmp


__all__ = ["CompareConfig", "Comparison", "compare_series", "compare_runs", "kl_series", "first_resume", "fmt_ratio",
           "log_ratio"]
