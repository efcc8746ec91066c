"""The KL reference-reset detector: did the frozen reference get rebuilt from the resumed weights?

The bug's signature is mechanical. If the reference is snapshotted *after* the checkpoint is loaded,
policy and reference are equal at the step the run resumed from, so the KL is about zero there, and
it then grows back the way it grew at the start of training. If the reference is the base model, KL
simply continues. So at every boundary we weigh two hypotheses for the first logged points after the
resume, in log space (KL is positive and its noise is multiplicative):

- H0, *continues*: the points scatter around the level just before, with the run's own step-to-step
  noise (estimated robustly from the pre-resume window). When the resume falls inside the run's logged
  opening, while the KL may still be growing, H0 also admits the opening curve *continued*, at its last
  pace or slower.
- H1, *reset*: the points follow a regrowth from zero that starts at the reset step r (the checkpoint
  the run resumed from, else the last logged step before): the run's own opening curve (on its
  absolute steps, at a few speeds, since learning-rate warm-up makes the opening slower than a mid-run
  regrowth) or ramps from zero.

Loggers do not all log the KL of one step. Trainers log every L steps (``logging_steps``), the point
carrying the step of the log call, and TRL logs the *mean* over the window since its last log. So
each H1 curve g enters twice: as a point sample g(s - r) and as its mean over the window
(max(r, s - L), s]. The first point after a buggy resume is then small, but not about zero.

Both use Student-t likelihoods (one outlier is not a verdict). The templates' noise is broad, since
their speed and shape are guesses; but in an early resume, with the opening in the logs, a regrowth from
zero cannot put its first point above the fastest template at that offset, so a first point above that
ceiling is charged at the run's own noise: a KL that carries on (or rises) past an early resume leans to
``ok``. The score is the posterior probability of H1 (prior 1/2 by default), from the first
``window_after`` (3) logged points only; later points are not waited for. A reset also needs its shape:
the first point significantly low (against the level and against any continuation), the points rising
through the window, and two low points, or with sparse logging one low point followed by one still below
the level (one low point and straight back is a dropout). An ``ok`` needs a continuation: a first point
far below the level, or an opening of only a few points before the resume, is at best ``inconclusive``,
unless the points after it sit above anything a regrowth from zero could have reached by then. A resume
before KL had grown, a run whose KL is zero throughout, too few points, or an early resume where
continuing and restarting the opening predict the same first point, are ``inconclusive`` rather than
guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from . import incremental
from .boundaries import named_reset_step
from .declarations import ReferenceSchedule, explain_boundary, reference_schedules, schedule_note
from .detector import Detector
from .metrics import NO_MATCH, closest_names, describe_match, preference_metrics
from .progress import run_lr
from .post_side import STARTS_PAST_FIRST_STEP, PostSideConfig, late_opening
from .snapshot_mark import SnapshotMarkConfig, off_the_floor, snapshot_mark
from .window_mark import WindowMarkConfig, window_mark
from .model import (Boundary, BoundaryVerdict, Finding, Lineage, LineageResult, Series, Verdict, cadence_of,
                    logging_interval, step_bounds, steps_between)
from .stats import diff_noise, floored_log, t_logpdf, theil_sen_slope

Curve = Callable[[np.ndarray], np.ndarray]
"""A regrowth curve: the KL predicted at offsets k >= 0 steps after the reset step."""


@dataclass(frozen=True)
class ReferenceResetConfig:
    """Thresholds of the reference-reset detector (the dashboard exposes them)."""

    reset_score: float = 0.95
    """Posterior at or above which a boundary is a ``reference_reset``."""
    ok_score: float = 0.2
    """Posterior at or below which a boundary is ``ok``; between the two it is ``inconclusive``."""
    min_points_before: int = 5
    min_points_before_in_opening: int = 3
    """Points before enough when the resume lies in the run's logged opening (an early resume): the
    opening itself tells what the KL was doing. Enough to call a reset, not to call ``ok``, which
    still needs ``min_points_before``."""
    min_points_after: int = 2
    window_before: int = 20
    window_after: int = 3
    """Logged points after the resume that the verdict rests on (later ones only explain it)."""
    noise_window: int = 60
    """Points before the resume whose step-to-step differences measure the noise."""
    level_points: int = 8
    """The level before the resume is the median of this many last points."""
    grown_fraction: float = 0.1
    """KL before the resume must reach this fraction of the run's typical KL to be judged."""
    zero_fraction: float = 0.01
    """Values below this fraction of the run's typical KL count as zero (the log-space floor)."""
    low_fraction: float = 0.5
    """A post-resume point is 'low' below this fraction of the level before; the first one must be."""
    min_low_points: int = 2
    """Low points needed after a resume logged every step."""
    sparse_low_credit: int = 1
    """With logging every L > 1 steps the first point already averages (or samples) L steps of the
    regrowth, so it counts this many extra low points."""
    regrowth_ceiling_sigmas: float = 1.0
    """The second point after the resume may lie at most this many noise SDs above the level: a
    regrowth has not overshot it one logged point after the reset; a dropout's return may."""
    min_drop_sigmas: float = 3.0
    """The first post point must lie at least this many noise SDs below the level for a reset."""
    rising_sigmas: float = 2.0
    """No point after the first may lie more than this many noise SDs below it, and the second not
    this far above the level: a regrowth rises from its first point, a dropout returns at once."""
    ok_max_drop_sigmas: float = 4.0
    """A first post point this many noise SDs below the level is at best ``inconclusive``, never
    ``ok``: an ``ok`` needs a continuation."""
    separation_sigmas: float = 3.0
    """In the opening, judge only where continuing and restarting the opening differ by this many
    noise SDs at the first post point."""
    growing_sigmas: float = 1.0
    """The KL is still growing at the resume (an early resume) when its trend before the resume, carried
    to the first post point, rises this many noise SDs ..."""
    early_level_fraction: float = 0.35
    """... or when the level before is under this fraction of the run's typical KL (noise can hide
    the growth in a few points)."""
    regrowth_sigmas: float = 2.0
    """With sparse logging, the second point after the resume must still lie this many noise SDs
    below the level for one low point to be a regrowth rather than a dropout."""
    rise_sigmas: float = 2.0
    """An early resume with fewer than ``min_points_before`` points before it is ``ok`` only when its first
    point lies this many noise SDs above the highest a regrowth from zero predicts there (the fastest
    template) and the next points stay above it: a KL no reset could have reached so soon."""
    sparse_noise: float = 0.3
    """Log-space noise assumed when fewer than ``min_points_before`` points are before the resume:
    two or three step differences do not measure the noise."""
    opening_speeds: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    """Speeds at which the run's opening may regrow; capped at 4x so no template explains a
    one-point dropout."""
    ramp_steps: tuple[float, ...] = (4.0, 8.0, 16.0, 32.0, 64.0)
    """Ramps from zero reaching the old level after this many steps (plus 2L and 4L). Where the run's opening is in
    the logs, a ``reference_reset`` must also hold with only the ramps no faster than ``max(opening_speeds)`` times
    the opening's pace to that level (a faster ramp stands for a shape, not for a regrowth no reset gives)."""
    ramp_cadences: tuple[float, ...] = (2.0, 4.0)
    """Extra ramps, in multiples of the logging cadence L."""
    max_reset_candidates: int = 3
    """Reset steps tried between the last logged step before and the first after when the checkpoint
    step is unknown (sparse logging hides where the run saved)."""
    aligned_reset_prior: float = 0.95
    """Prior that an unknown reset step is the last logged step before the resume (the rest is
    spread over the steps up to the first logged after)."""
    continuation_rates: tuple[float, ...] = (0.5,)
    """Besides its last log-slope, an early resume's KL may go on growing at these fractions of it (an
    opening's growth slows as the KL saturates; 0 holds the level it reached)."""
    slope_points: int = 5
    growth_points: int = 10
    """Last points before the resume whose log-slope tells whether the KL is still growing."""
    """Last points before the resume whose log-slope continues the opening."""
    prior: float = 0.5
    dof: float = 3.0
    noise_floor: float = 0.1
    """Smallest log-space noise assumed, so a very smooth KL does not make every wiggle significant."""
    min_h1_noise: float = 0.5
    """Log-space noise of the reset templates: they are shapes, not fits."""
    kl_off_tolerance: float = 1e-12
    """A KL whose every finite point is under this in size is the penalty switched off (``kl_disabled``):
    there is no reference to reset. Float noise of an exact zero, not a small KL."""
    opening_zero_fraction: float = 0.05
    """A run's first logged KL under this fraction of its typical KL is its opening even when logged late
    (the template of a regrowth from zero)."""
    snapshot: SnapshotMarkConfig = SnapshotMarkConfig()
    """The snapshot mark (a first point at the estimator's floor, then a regrowth retracing the opening),
    which decides a boundary the statistic leaves ``inconclusive`` (an early resume)."""
    window: WindowMarkConfig = WindowMarkConfig()
    """The window mark (with logging every L > 1 steps, the first window after the checkpoint back in the band of
    the run's first window, then climbing), which decides an early resume the statistic leaves ``inconclusive``."""
    post_side: PostSideConfig = PostSideConfig()
    """A launch whose logs start past the run's first step, at the floor, and regrow: a reset whose earlier
    side is not in the logs (``klwatch.post_side``)."""
    mixup_depth_slack: float = 0.25
    """A declared sync mixing ``alpha`` of the policy leaves about (1 - alpha)^2 of the KL; a drop under
    this share of that is deeper than the sync explains and stays ``inconclusive``."""


def typical_kl(values: np.ndarray) -> float:
    """The run's typical KL: the 90th percentile of its positive values (robust to one spike)."""
    v = values[np.isfinite(values) & (values > 0)]
    return float(np.percentile(v, 90)) if len(v) else 0.0


FEW_POINTS_NOISE = 0.5
"""Log-space noise assumed when fewer than three points are there to measure it (a factor of ~1.6)."""


def _noise(logs: np.ndarray, floor: float) -> float:
    """The run's own step-to-step noise in log space, never under ``floor``."""
    if len(logs) < 3:
        return max(floor, FEW_POINTS_NOISE)
    return max(floor, diff_noise(logs))


def logging_cadence(*series: Series | None) -> int:
    """The KL's logging interval L, read off the first series that has two points (the piece before the
    resume, else the opening, else the piece after)."""
    return logging_interval([next((s for s in series if s is not None and len(s) >= 2), None)])


def _opening_curve(start: Series) -> tuple[np.ndarray, np.ndarray, float]:
    """The opening on its absolute steps, anchored at KL 0 at step 0 (reference = initial policy), so
    an opening logged at L, 2L, ... lines up with post points logged at r + L, r + 2L; and its first
    logged value."""
    steps = start.steps.astype(float)
    vals = np.clip(start.values, 0.0, None)
    keep = np.isfinite(vals)
    steps, vals = steps[keep], vals[keep]
    order = np.argsort(steps, kind="stable")
    steps, vals = steps[order], vals[order]
    first = float(vals[0]) if len(vals) else 0.0
    if len(steps) and steps[0] > 0:
        steps, vals = np.concatenate([[0.0], steps]), np.concatenate([[0.0], vals])
    return steps, vals, first


def _curves(level: float, start: Series | None, cadence: int, config: ReferenceResetConfig, *,
            paced: bool = False) -> list[Curve]:
    """H1's regrowth curves g(k), k steps after the reset: the run's opening at several speeds (as
    logged, and less its first value for a run whose reference differs from the initial policy), and
    ramps that have (or have not yet) grown one step's worth at k = 1; ``paced``: only the ramps no faster
    than the fastest opening speed allows, where the run's opening shows how long it took to reach ``level``."""
    curves: list[Curve] = []
    if start is not None and len(start) >= 3:
        s_off, s_val, first = _opening_curve(start)
        origin = _zero_update_step(start, cadence)
        for base in (s_val, np.clip(s_val - first, 0.0, None)):
            for speed in config.opening_speeds:
                if origin is None:
                    curves.append(lambda k, b=base, sp=speed: np.interp(k * sp, s_off, b))
                else:  # the first step after the reset is the opening's first: no speed moves it
                    curves.append(lambda k, b=base, sp=speed, o=origin:
                                  np.interp(o + np.maximum(k - 1.0, 0.0) * sp, s_off, b))
    ramps = sorted(set(config.ramp_steps) | {c * cadence for c in config.ramp_cadences})
    reach = _opening_reach(start, level, cadence) if paced and start is not None and len(start) >= 3 else None
    if reach is not None:  # a regrowth at most max(opening_speeds) times the opening's own pace
        ramps = [r for r in ramps if r * max(config.opening_speeds) >= reach]
    for ramp in ramps:
        curves.append(lambda k, R=ramp: level * np.clip((k - 1.0) / R, 0.0, 1.0))
        curves.append(lambda k, R=ramp: level * np.clip(k / R, 0.0, 1.0))
    return curves


def _opening_reach(start: Series, level: float, cadence: int) -> float | None:
    """Steps the run's opening took to first reach ``level`` (None when it never did in the logs, or when ``start``
    is not the run's first window: a piece regrowing after an earlier reset starts its steps at that reset, not 0):
    the pace a regrowth from zero retraces. Frameworks restart the same optimisation from a reference equal to the
    policy, and the implicit rewards or KL regrow like the opening (``FRAMEWORKS.md``), faster only by a schedule
    that ran slower there (warm-up), which ``opening_speeds`` bounds."""
    if int(start.steps[0]) > max(1, cadence):
        return None
    steps, vals, _ = _opening_curve(start)
    above = np.flatnonzero(vals >= level)
    return float(steps[above[0]]) if len(above) else None


def _zero_update_step(start: Series, cadence: int) -> float | None:
    """The opening's first step when it is logged every step from the run's first: the frameworks compute
    the logged KL inside the step's loss (TRL ``compute_loss``, NeMo-RL's loss function, verl's
    ``update_policy``), so the first step of a run, and the first after a reset, is measured with the
    policy still equal to the reference, whatever speed the KL regrows at afterwards. None when the
    opening is logged sparsely (its first point already averages L steps)."""
    first = float(start.steps[0])
    return first if cadence <= 1 and first <= 1.0 else None


def _observed(curve: Curve, steps: np.ndarray, reset_step: int, cadence: int) -> list[np.ndarray]:
    """What a logger shows of a curve at ``steps``: a point sample at s - r, and (L > 1) the mean over
    the logging window (max(r, s - L), s], which is how TRL averages its logged metrics."""
    k = (steps - reset_step).astype(float)
    out = [curve(k)]
    if cadence > 1:
        out.append(np.array([float(np.mean(curve(np.arange(max(1.0, kk - cadence + 1), kk + 1.0))))
                             if kk >= 1 else float(curve(np.array([kk]))[0]) for kk in k]))
    return out


def _reset_candidates(boundary: Boundary, pre: Series, post: Series, reset_step: int | None,
                      config: ReferenceResetConfig) -> list[int]:
    """The step the reference was reset at: the checkpoint resumed from, else anywhere from the last
    logged step before to the step before the first logged after (HF saves at logged steps, but a
    ``save_steps`` that is not a multiple of ``logging_steps`` saves in between)."""
    if reset_step is not None:
        return [int(reset_step)]
    if boundary.resumed_from_step is not None:
        return [int(boundary.resumed_from_step)]
    lo, hi = int(pre.steps[-1]), int(post.steps[0]) - 1
    return steps_between(min(lo, hi), hi, config.max_reset_candidates)


def _guessed_checkpoint(boundary: Boundary, post: Series, cadence: int) -> bool:
    """Whether the boundary's resumed-from step is only the pipeline's guess, the step before the first logged
    after the resume (no checkpoint folder names it), where the run logs every L > 1 steps: a launch resumed from
    checkpoint N logs N + 1 first only when it logs every step."""
    return cadence > 1 and boundary.resumed_from_step is not None and "checkpoint" not in boundary.evidence \
        and int(boundary.resumed_from_step) == int(post.steps[0]) - 1 and int(boundary.resumed_from_step) > 0


def _candidate_weights(candidates: list[int], config: ReferenceResetConfig) -> dict[int, float]:
    """Prior weight of each reset step: trainers save at ``save_steps``, usually a multiple of
    ``logging_steps``, so the last logged step before the resume is the likeliest."""
    rest = (1.0 - config.aligned_reset_prior) / max(1, len(candidates) - 1)
    if len(candidates) == 1 or rest <= 0:
        return {candidates[0]: 1.0}
    return {r: (config.aligned_reset_prior if i == 0 else rest) for i, r in enumerate(candidates)}


def _log_slope(pre: Series, lpre: np.ndarray, points: int, floor: float) -> tuple[float, float]:
    """Theil-Sen line (slope never negative, intercept) through the last ``points`` log-KL points,
    leaving out KLs at the zero floor (a snapshot step's exact 0 is not on the growth curve)."""
    n = min(points, len(lpre))
    x, y = pre.steps[-n:].astype(float), lpre[-n:]
    keep = y > floor
    x, y = x[keep], y[keep]
    slope = max(0.0, theil_sen_slope(x, y))
    return slope, float(np.median(y - slope * x))


def _continuation(pre: Series, lpre: np.ndarray, steps: np.ndarray, cap: float, floor: float,
                  config: ReferenceResetConfig, rate: float = 1.0) -> np.ndarray:
    """H0 while the KL is still growing: the opening continued past its last point by ``rate`` times
    its last log-slope (never falling; 0 holds the level it reached), capped at the run's typical KL."""
    slope, intercept = _log_slope(pre, lpre, config.slope_points, floor)
    last = float(pre.steps[-1])
    x = last + rate * (steps.astype(float) - last)
    return np.minimum(intercept + slope * x, max(cap, float(np.max(lpre[-config.slope_points:]))))


@dataclass(frozen=True)
class _Windows:
    """The KL the verdict rests on: the finite points of each side, the windows compared, their levels."""

    pre_all: Series
    post_all: Series
    pre: Series
    post: Series
    kl_before: float | None
    kl_after: float | None
    span_before: tuple[int, int] | None
    span_after: tuple[int, int] | None


def _finite_points(s: Series) -> Series:
    """``s`` without its non-finite points: ``s`` itself when it has none (which a watched run's kept facts
    say without a pass over it, ``klwatch.incremental``), so a poll copies no whole piece."""
    facts = incremental.value_facts(s.values)
    if facts is not None and facts.finite == len(s):
        return s
    ok = np.isfinite(s.values)
    return s if bool(ok.all()) else s.take(ok)


def _windows(before: Series, after: Series, config: ReferenceResetConfig) -> _Windows:
    pre_all, post_all = _finite_points(before), _finite_points(after)
    if len(post_all) and len(pre_all) and step_bounds(pre_all.steps)[1] < post_all.steps[0]:
        earlier = pre_all  # every point before comes before the first after (a copy of all of them would)
    else:
        earlier = pre_all.take(pre_all.steps < post_all.steps[0]) if len(post_all) else pre_all
    if len(earlier) >= 2:
        # a launch that crashed after its checkpoint logged on past it; the resumed one re-logs those steps
        # from the checkpoint: the level it resumed from is the one logged before them, not where the
        # crashed launch got to (early in a run, that is far higher)
        pre_all = earlier
    pre = pre_all.take(slice(-config.window_before, None))
    post = post_all.take(slice(0, config.window_after))
    return _Windows(pre_all, post_all, pre, post,
                    float(np.median(pre.values[-config.level_points:])) if len(pre) else None,
                    float(post.values[0]) if len(post) else None,
                    (int(pre.steps[0]), int(pre.steps[-1])) if len(pre) else None,
                    (int(post.steps[0]), int(post.steps[-1])) if len(post) else None)


@dataclass(frozen=True)
class _Opening:
    """Where the resume lies in the run: its logging cadence L, whether the piece before is still the
    opening (its curve is then the best regrowth template), and how many points before are enough."""

    cadence: int
    in_opening: bool
    start: Series | None
    need: int


def _opening_of(w: _Windows, start: Series | None, scale: float, config: ReferenceResetConfig, *,
                cadence: int | None, opening_max_step: int | None) -> _Opening:
    L = int(cadence) if cadence else logging_cadence(w.pre_all, start, w.post_all)
    first_step = int(w.pre_all.steps[0]) if len(w.pre_all) else None
    # the piece before is an opening when it starts the run, or when it regrows from a KL of ~0 (the
    # piece after an earlier reset of a ratchet: its own regrowth is the best template for the next)
    regrows = len(w.pre_all) >= 3 and scale > 0 and float(w.pre_all.values[0]) <= config.zero_fraction * scale
    in_opening = first_step is not None and (
        first_step <= (opening_max_step if opening_max_step is not None else L) or regrows)
    if in_opening and len(w.pre_all) >= 3 and (start is None or regrows):
        start = w.pre_all  # the piece before is an opening: its curve is the best H1 template
    in_opening = in_opening and start is not None
    need = min(config.min_points_before, config.min_points_before_in_opening) if in_opening else config.min_points_before
    return _Opening(L, in_opening, start, need)


def _unjudgeable(w: _Windows, op: _Opening, at: str, scale: float, config: ReferenceResetConfig) -> str | None:
    """Why this boundary cannot be judged at all (too few points, a KL that had not grown, a penalty
    switched off), or None."""
    if len(w.pre) < op.need:
        return f"Only {len(w.pre)} KL point(s) before the resume {at}: too few to know its level."
    if len(w.post) == 0:
        return f"No KL logged after the resume {at} yet."
    assert w.kl_before is not None
    if scale <= 0 or w.kl_before <= 0 or w.kl_before < config.grown_fraction * scale:
        return (f"KL before the resume {at} ({w.kl_before:.3g}) had not grown above its opening level yet; "
                "a reset cannot be told from a continuation this early.")
    if len(w.post) >= 3 and np.all(w.post.values == 0.0) and np.any(w.pre.values != 0.0):
        return (f"KL is exactly 0 after the resume {at}: the KL penalty looks switched off, not reset. "
                "Check the KL coefficient in the resumed config.")
    return None


@dataclass(frozen=True)
class _Noise:
    """The log-space picture both hypotheses share: the floor, the logs, the run's own noise, the level
    before, and the candidate reset steps with their prior weights and per-point noise."""

    eps: float
    lpre: np.ndarray
    lpost: np.ndarray
    sigma0: float
    mu0: float
    candidates: list[int]
    log_w: dict[int, float]
    sigs: dict[int, np.ndarray]

    @property
    def sig(self) -> np.ndarray:
        """The full first window's noise: the strictest reading of a drop."""
        return self.sigs[self.candidates[0]]


def _noise_model(w: _Windows, boundary: Boundary, reset_step: int | None, L: int, scale: float,
                 config: ReferenceResetConfig) -> _Noise:
    eps = config.zero_fraction * scale
    lpre, lpost = floored_log(w.pre.values, eps), floored_log(w.post.values, eps)
    # the noise from more points than the level: 20 step differences misjudge it by 2x too often
    # a KL of exactly 0 (the first step after the reference was snapshotted) is structure, not noise
    recent = w.pre_all.values[-config.noise_window:]
    noise_logs = floored_log(recent[recent > eps], eps)
    sigma0 = _noise(noise_logs, config.noise_floor)
    if len(noise_logs) < config.min_points_before:
        # two or three step differences of a growing opening measure its curvature, not its noise
        sigma0 = config.sparse_noise
    weights = _candidate_weights(_reset_candidates(boundary, w.pre, w.post, reset_step, config), config)

    def noise_at(r: int) -> np.ndarray:
        """Per-point noise: a window cut short by a resume at r averages fewer steps, so the first
        point after it is noisier (by sqrt(L / steps averaged))."""
        out = np.full(len(w.post), sigma0)
        if L > 1:
            out[0] *= float(np.sqrt(L / max(1, min(L, int(w.post.steps[0]) - r))))
        return out

    return _Noise(eps, lpre, lpost, sigma0, float(np.median(lpre[-config.level_points:])), list(weights),
                  {r: float(np.log(x)) for r, x in weights.items()}, {r: noise_at(r) for r in weights})


def _continuations(w: _Windows, n: _Noise, scale: float, config: ReferenceResetConfig) -> list[np.ndarray]:
    """H0's growing readings in an early resume: the opening continued at its last pace, then at each
    of ``continuation_rates`` of it."""
    cap, floor = float(np.log(scale + n.eps)), float(np.log(2 * n.eps))
    return [_continuation(w.pre, n.lpre, w.post.steps, cap, floor, config)] + \
           [_continuation(w.pre, n.lpre, w.post.steps, cap, floor, config, rate=x) for x in config.continuation_rates]


def _h0_loglik(n: _Noise, conts: list[np.ndarray], config: ReferenceResetConfig) -> float:
    """H0, the KL continues: the level carries on; in the opening the opening may also keep growing.
    The level and the continuations share H0's prior by halves: a growing opening's median level lags
    where it got to, and its growth may go on at its last pace, slow down, or stop."""
    from scipy.special import logsumexp  # not at import: the CLI starts without scipy

    means: list[np.ndarray | float] = [n.mu0, *conts]
    logw = [0.0] if not conts else [float(np.log(0.5))] + [float(np.log(0.5 / len(conts)))] * len(conts)
    terms = [(lw + n.log_w[r], t_logpdf(n.lpost, config.dof, m, n.sigs[r])) for lw, m in zip(logw, means)
             for r in n.candidates]
    return float(logsumexp([lw + float(np.sum(t)) for lw, t in terms]))


def _h1_loglik(w: _Windows, n: _Noise, op: _Opening, config: ReferenceResetConfig, *,
               paced: bool = False) -> tuple[float, dict[int, np.ndarray]]:
    """H1, a regrowth from zero at the reset step, point-sampled or window-averaged; and the ceiling,
    the highest any template reaches at each post point.

    Curves are averaged over, and so is the reset step (weighted as in H0); whether the logger samples
    or averages is a fact of the logger, not a shape: each curve takes the better reading. In an early
    resume, with the opening in the logs, a regrowth from zero cannot put the first point above where
    its fastest template is at that offset (the opening at the speed cap, a ramp reaching the level):
    the templates' broad noise stands for their unknown speed and shape, which covers a first point
    below that ceiling but not one above it. Above it, only the run's own noise explains the excess, so
    a KL that carries on (or rises) past the resume leans to a continuation. (Mid-run, the ceiling is
    only the level, and a first point above it is one more outlier.)
    """
    from scipy.special import logsumexp  # not at import: the CLI starts without scipy

    assert w.kl_before is not None
    curves = _curves(w.kl_before, op.start, op.cadence, config, paced=paced)
    early_opening = op.in_opening and op.start is not None and len(op.start) >= 3
    preds = {r: [[floored_log(obs, n.eps) for obs in _observed(g, w.post.steps, r, op.cadence)] for g in curves]
             for r in n.candidates}
    ceiling = {r: np.max([p for per_g in preds[r] for p in per_g], axis=0) for r in n.candidates}

    def point_terms(pred: np.ndarray, r: int) -> np.ndarray:
        terms = t_logpdf(n.lpost, config.dof, pred, np.maximum(n.sigs[r], config.min_h1_noise))
        top, s0 = float(ceiling[r][0]), float(n.sigs[r][0])
        if early_opening and n.lpost[0] > top:
            terms[0] = (t_logpdf(top, config.dof, pred[0], max(s0, config.min_h1_noise))
                        + t_logpdf(n.lpost[0], config.dof, top, s0) - t_logpdf(top, config.dof, top, s0))
        return terms

    ll1s = [float(logsumexp([n.log_w[r] + max(float(np.sum(point_terms(p, r))) for p in preds[r][i])
                             for r in n.candidates]))
            for i in range(len(curves))]
    return float(logsumexp(ll1s) - np.log(len(ll1s))), ceiling


@dataclass(frozen=True)
class _Shape:
    """What the points after the resume look like against what a continuation predicts there (the
    level, or in an early resume the opening continued: a regrowth must be judged against where the
    KL was heading, not where it was)."""

    early: bool
    low: int
    first_low: bool
    rising: bool
    enough_low: bool
    far_below: bool


def _shape(w: _Windows, n: _Noise, conts: list[np.ndarray], L: int, scale: float,
           config: ReferenceResetConfig) -> _Shape:
    assert w.kl_before is not None
    cont = conts[0] if conts else None
    # still growing: judged over more points than the continuation uses, so a noisy plateau's last few
    # points do not read as growth
    trend, _ = _log_slope(w.pre, n.lpre, config.growth_points, float(np.log(2 * n.eps)))
    early = cont is not None and (trend * (int(w.post.steps[0]) - int(w.pre.steps[-1])) > config.growing_sigmas * n.sigma0
                                  or w.kl_before < config.early_level_fraction * scale)
    expect = np.maximum(n.mu0, cont) if early and cont is not None else np.full(len(w.post), n.mu0)
    lpost, sig = n.lpost, n.sig
    is_low = lpost < expect + np.log(config.low_fraction)
    low = int(np.sum(is_low))
    # the first point must be low against the level before as well as against any continuation, and
    # significantly so: a reset's first point is the deepest of its regrowth
    first_low = bool(is_low[0] and w.post.values[0] < config.low_fraction * w.kl_before
                     and lpost[0] < n.mu0 - config.min_drop_sigmas * sig[0])
    # a regrowth rises from its first point: no later point falls far below it, and the next point does
    # not jump above the level (a dropout that returns, or outliers on both sides, does)
    rising = len(w.post) >= 2 and bool(np.all(lpost[1:] >= lpost[0] - config.rising_sigmas * sig[1:])
                                       and lpost[1] <= expect[1] + config.regrowth_ceiling_sigmas * sig[1])
    # with sparse logging one low point may be all a fast regrowth leaves, but then the next point must
    # still sit below the level: one low point and straight back is a dropout, not a regrowth
    still_below = len(w.post) >= 2 and bool(lpost[1] < expect[1] - config.regrowth_sigmas * n.sigma0)
    enough_low = low >= config.min_low_points or (
        L > 1 and still_below and low >= config.min_low_points - config.sparse_low_credit)
    far_below = bool(lpost[0] < expect[0] - config.ok_max_drop_sigmas * sig[0])
    return _Shape(early, low, first_low, rising, enough_low, far_below)


def _indistinct(w: _Windows, n: _Noise, op: _Opening, cont: np.ndarray, config: ReferenceResetConfig) -> bool:
    """An early resume where continuing and restarting the opening predict about the same first point."""
    assert op.start is not None
    s_off, s_val, _ = _opening_curve(op.start)
    restart = [float(floored_log(obs[:1], n.eps)[0]) for r in n.candidates
               for obs in _observed(lambda k: np.interp(k, s_off, s_val), w.post.steps[:1], r, op.cadence)]
    return min(abs(float(cont[0]) - x) for x in restart) < config.separation_sigmas * n.sigma0


def _reset_verdict(w: _Windows, sh: _Shape, at: str, config: ReferenceResetConfig) -> tuple[Verdict, str]:
    """A score past the reset threshold: a reset when the points show its shape, else wait for more."""
    assert w.kl_before is not None and w.kl_after is not None
    if len(w.post) < config.min_points_after or not (sh.first_low and sh.rising and sh.enough_low):
        return "inconclusive", (
            f"KL fell from {w.kl_before:.3g} to {w.kl_after:.3g} at the resume {at}, but the next point(s) "
            f"do not show a regrowth ({sh.low} low, first {'low' if sh.first_low else 'not low'}, "
            f"{'rising' if sh.rising else 'not rising'}): wait for more steps before calling it a reset.")
    ratio = w.kl_after / w.kl_before if w.kl_before else float("nan")
    return "reference_reset", (
        f"KL fell from {w.kl_before:.3g} to {w.kl_after:.3g} ({ratio:.1%} of its level) at the first logged step "
        f"after the resume {at} and grows again from there: the reference policy was rebuilt from the "
        "resumed weights. Load the reference from the base model, not the checkpoint.")


def _too_fast(w: _Windows, op: _Opening, at: str) -> str:
    """Why a drop that only a regrowth faster than the run's own opening explains is no reset: a rebuilt reference
    restarts the same optimisation, and the KL (or implicit rewards) regrow like the opening did."""
    assert w.kl_before is not None and w.kl_after is not None and op.start is not None
    reach = _opening_reach(op.start, w.kl_before, op.cadence)
    return (f"KL fell from {w.kl_before:.3g} to {w.kl_after:.3g} at the resume {at}, but only a regrowth far faster than "
            f"the run's own opening (which took {reach:.0f} steps to reach {w.kl_before:.3g}) would explain the points "
            "after it as a reset: a healthy dip is as likely. Too little to call it either way.")


def _low_score_verdict(w: _Windows, n: _Noise, op: _Opening, sh: _Shape, ceiling: dict[int, np.ndarray], at: str,
                       config: ReferenceResetConfig) -> tuple[Verdict, str]:
    """A score at or under ``ok_score``: ``ok`` needs a continuation. Judged only because they are the
    opening, too few points before cannot rule out a reset that regrew as fast, unless the KL after the
    resume sits above anything a regrowth from zero could reach by then."""
    assert w.kl_before is not None and w.kl_after is not None
    early_opening = op.in_opening and op.start is not None and len(op.start) >= 3
    lpost, cands = n.lpost, n.candidates
    above_regrowth = early_opening and len(w.post) >= config.min_points_after and bool(
        lpost[0] >= max(float(ceiling[r][0]) + config.rise_sigmas * float(n.sigs[r][0]) for r in cands)
        and np.all(lpost[1:] >= np.max([ceiling[r][1:] for r in cands], axis=0)))
    few_before = len(w.pre) < config.min_points_before and not above_regrowth
    if not sh.far_below and not few_before:
        if early_opening and lpost[0] > float(ceiling[cands[0]][0]):
            last, reach = float(w.pre.values[-1]), float(np.exp(ceiling[cands[0]][0]) - n.eps)
            return "ok", (f"KL carries on the run's opening across the resume {at} ({last:.3g} at step "
                          f"{int(w.pre.steps[-1])}, {w.kl_after:.3g} after): a reference rebuilt there would have "
                          f"restarted it from zero, at most {reach:.3g} by step {int(w.post.steps[0])}.")
        return "ok", f"KL continues at its level across the resume {at} ({w.kl_before:.3g} before, {w.kl_after:.3g} after)."
    if few_before:
        return "inconclusive", (
            f"KL continues across the resume {at} ({w.kl_before:.3g} before, {w.kl_after:.3g} after), but only "
            f"{len(w.pre)} points of the opening precede it, not enough to rule out a reset that regrew as fast.")
    return "inconclusive", (f"KL dropped from {w.kl_before:.3g} to {w.kl_after:.3g} at the resume {at}, far below its "
                            "noise, but the points after do not regrow like a reset: too little to call it either way.")


def judge_boundary(
    boundary: Boundary,
    before: Series,
    after: Series,
    *,
    start: Series | None,
    scale: float,
    config: ReferenceResetConfig = ReferenceResetConfig(),
    cadence: int | None = None,
    reset_step: int | None = None,
    opening_max_step: int | None = None,
) -> BoundaryVerdict:
    """Judge one resume boundary from the KL just before and just after it.

    ``before`` is the KL of the piece that ends at the boundary, ``after`` of the piece that starts
    there; ``start`` the run's opening KL when the logs hold it; ``scale`` the run's typical KL.
    ``cadence`` is the KL's logging interval L (default: read off ``before``); ``reset_step`` the step
    the run resumed from (default: ``boundary.resumed_from_step``, else every step between the last
    logged point before and the first after); ``opening_max_step`` the latest first step at which
    ``before`` still counts as the run's opening when ``start`` is not given (default: L, since a run
    logging every L steps logs its first point at step L). A ``before`` that regrows from a KL of ~0
    (the piece after an earlier reset) counts as an opening too.
    """
    from scipy.special import expit  # not at import: the CLI starts without scipy

    w = _windows(before, after, config)

    def verdict(v: Verdict, score: float, why: str) -> BoundaryVerdict:
        return BoundaryVerdict(boundary, v, float(np.clip(score, 0.0, 1.0)), w.kl_before, w.kl_after, why,
                               w.span_before, w.span_after)

    op = _opening_of(w, start, scale, config, cadence=cadence, opening_max_step=opening_max_step)
    at = f"at step {boundary.step}"
    why = _unjudgeable(w, op, at, scale, config)
    if why is not None:
        return verdict("inconclusive", 0.5, why)
    n = _noise_model(w, boundary, reset_step, op.cadence, scale, config)
    conts = _continuations(w, n, scale, config) if op.in_opening else []
    ll1, ceiling = _h1_loglik(w, n, op, config)
    prior_logit = float(np.log(config.prior / (1.0 - config.prior)))
    ll0 = _h0_loglik(n, conts, config)
    score = float(expit(ll1 - ll0 + prior_logit))
    sh = _shape(w, n, conts, op.cadence, scale, config)
    if sh.early and conts and op.start is not None and _indistinct(w, n, op, conts[0], config):
        return verdict("inconclusive", score,
                       f"The resume {at} falls in the run's opening, where the KL is still growing: continuing "
                       f"the opening and restarting it predict about the same first point ({w.kl_after:.3g}), so a "
                       "reset cannot be told from a continuation this early.")
    if score >= config.reset_score:
        paced = float(expit(_h1_loglik(w, n, op, config, paced=True)[0] - ll0 + prior_logit))
        if paced < config.reset_score:
            return verdict("inconclusive", paced, _too_fast(w, op, at))
        v, why = _reset_verdict(w, sh, at, config)
        return verdict(v, score, why)
    if score <= config.ok_score:
        v, why = _low_score_verdict(w, n, op, sh, ceiling, at, config)
        lo = int(w.pre.steps[-1])
        if v == "ok" and reset_step is None and _guessed_checkpoint(boundary, w.post, op.cadence) and judge_boundary(
                boundary, before, after, start=start, scale=scale, config=config, cadence=cadence, reset_step=lo,
                opening_max_step=opening_max_step).verdict != "ok":
            return verdict("inconclusive", score, (
                f"{why[:-1]}, if the run resumed from step {boundary.resumed_from_step}, the step before the first "
                f"logged after it; but no checkpoint folder names that step, and logged every {op.cadence} steps a "
                f"resumed launch first logs at the next multiple: from a checkpoint at step {lo}, the last logged "
                "before, a reset is not ruled out."))
        return verdict(v, score, why)
    assert w.kl_before is not None and w.kl_after is not None
    return verdict("inconclusive", score,
                   f"KL moved from {w.kl_before:.3g} to {w.kl_after:.3g} at the resume {at}; neither a continuation "
                   "nor a reset explains it clearly.")


# ------------------------------------------------------------------------------- the detector


def _nearest_before(kl_pieces: Sequence[Series | None], k: int) -> Series | None:
    """The KL of the nearest piece before piece ``k`` that logs one."""
    return next((kl_pieces[j] for j in range(k - 1, -1, -1) if kl_pieces[j] is not None), None)


@dataclass(frozen=True)
class _KlSummary:
    """What the whole run's KL says before any boundary is judged."""

    finite: int
    """How many finite points it has."""
    max_abs: float
    """The largest of them in size (0.0 with none)."""
    scale: float
    """``typical_kl`` of them."""


def _kl_summary(kl_pieces: Sequence[Series | None]) -> _KlSummary:
    """The run's finite KL points counted and summed up, from the facts a watched run keeps as it grows
    (``klwatch.incremental``: exact, in time proportional to what is new) or from the points themselves."""
    parts = [k.values for k in kl_pieces if k is not None]
    facts = incremental.all_facts(parts, incremental.value_facts)
    if facts is not None and parts:
        positive = [part for f in facts for part in f.positive.parts if len(part)]
        scale = incremental.percentile_of_sorted(positive, 90) if positive else 0.0
        return _KlSummary(sum(f.finite for f in facts), max(f.max_abs for f in facts), scale)
    allkl = np.concatenate(parts) if parts else np.empty(0)
    finite = allkl[np.isfinite(allkl)]
    return _KlSummary(len(finite), float(np.max(np.abs(finite))) if len(finite) else 0.0, typical_kl(finite))


class ReferenceResetDetector(Detector[ReferenceResetConfig]):
    """The headline check: was the frozen reference rebuilt from the resumed weights at a resume?

    ``judge(lineage)`` gives a training run its status and every boundary its verdict, owning the whole
    policy: a KL that is zero throughout is a penalty switched off, too few points are not judged, the
    run's opening is the regrowth template, a reset the run declares is ``intentional``.
    ``stream()`` is the same judgement one logged point at a time (a live watcher, a training callback).
    """

    name = "reference_reset"
    config_class = ReferenceResetConfig

    def __init__(self, *, config: ReferenceResetConfig | None = None, intentional_resets: Sequence[int] = (),
                 metrics: Sequence[str] = ()) -> None:
        super().__init__(config=config)
        self.intentional_resets = tuple(intentional_resets)
        """Steps the user declares (``--intentional-reset``), besides what the run's config declares."""
        self.metrics = tuple(metrics)
        """The ``--metric`` names or globs the KL was chosen by (for the message when none matched)."""

    def judge(self, lineage: Lineage) -> LineageResult:
        """The run's status and a verdict for every boundary (no findings: those are other detectors').
        An unreadable part is named in ``error`` whatever the rest of the run was judged (a run without
        a KL, or with too little of it, is still a run with an unreadable part: exit code 3), and the
        result lists it among the reasons the run is ``incomplete``."""
        errors = [s.error for s in lineage.segments if s.error]
        if errors and all(s.error for s in lineage.segments):
            return LineageResult(lineage, None, "error", error="; ".join(errors))
        result = self._judge_kl(lineage)
        if self.metrics and (said := describe_match(lineage.metric_names(), self.metrics, chosen=lineage.kl_metric)):
            result.findings.append(Finding("kl_metric", None, "info", said))  # what a glob matched, and left out
        if errors:
            result.error = "; ".join(errors)
        return result

    def _judge_kl(self, lineage: Lineage) -> LineageResult:
        metric = lineage.kl_metric
        if metric is None:
            return self._no_kl_metric(lineage)
        kl_pieces = lineage.kl_pieces()
        summary = _kl_summary(kl_pieces)
        result = LineageResult(lineage, metric, "ok")
        if summary.finite and summary.max_abs < self.config.kl_off_tolerance:
            result.status = "kl_disabled"
            _unjudged(result, lineage.boundaries,
                      f"{metric} is 0 for the whole run: the KL penalty is off, so there is no reference to reset.")
            return result
        if summary.finite < self.config.min_points_before + 1:
            result.status = "insufficient_data"
            _unjudged(result, lineage.boundaries, f"Only {summary.finite} finite {metric} point(s) in the whole run: too few to judge.")
            return result
        scale = summary.scale
        start = self.opening(kl_pieces, scale=scale)
        schedules = reference_schedules(lineage.config, cli_steps=self.intentional_resets)
        lr = run_lr(lineage) if lineage.boundaries else None
        for b in lineage.boundaries:
            v = self._verdict_at(kl_pieces, b, scale=scale, start=start, declared=self._declared(schedules, kl_pieces, b),
                                 named=named_reset_step(lineage, b), lr=lr)
            if v is None:
                _unjudged(result, [b], "No KL logged on both sides of this boundary.")
                continue
            if v.verdict == "reference_reset":
                self._apply_declarations(v, schedules, before=_nearest_before(kl_pieces, b.piece_index),
                                         after=kl_pieces[b.piece_index])
            result.verdicts.append(v)
        late = self._late_opening(lineage, kl_pieces, schedules, quantity="KL")
        if late is not None:
            result.verdicts.insert(0, late)
        result.status = roll_up(result.verdicts)
        return result

    def _late_opening(self, lineage: Lineage, kl_pieces: Sequence[Series | None], schedules: list[ReferenceSchedule],
                      *, quantity: str) -> BoundaryVerdict | None:
        """The verdict at the first step of logs that start past the run's first step, when that launch opens at
        the floor and regrows (``klwatch.post_side``): the launch before it is not in the logs."""
        first = kl_pieces[0] if kl_pieces else None
        if first is None or not len(first):
            return None
        mark = late_opening(first, cadence=logging_cadence(first), config=self.config.post_side)
        if mark is None:
            return None
        resumed = mark.first_step - 1
        evidence = [STARTS_PAST_FIRST_STEP] + (["checkpoint"] if resumed in lineage.checkpoint_steps else [])
        b = Boundary(step=mark.first_step, resumed_from_step=resumed, evidence=evidence, piece_index=0)  # type: ignore[list-item]
        declared = explain_boundary(schedules, step=b.step, resumed_from=resumed, last_before=None)
        if declared is not None:
            return BoundaryVerdict(b, "intentional", self.config.reset_score, None, mark.value,
                                   f"{mark.describe(quantity)}; a reference update that is intentional: {declared.why}.")
        return BoundaryVerdict(b, "reference_reset", self.config.reset_score, None, mark.value,
                               f"{mark.describe(quantity)}: the reference policy was rebuilt from the resumed weights. "
                               "Load the reference from the base model, not the checkpoint.",
                               None, (mark.first_step, mark.first_step + self.config.window_after - 1))

    def _no_kl_metric(self, lineage: Lineage) -> LineageResult:
        """No KL to judge: say what was logged, so the user can name the KL with ``--metric``."""
        names = [n for n in lineage.metric_names() if not n.startswith("_")]
        shown = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
        close = closest_names(names, self.metrics) if self.metrics else []
        msg = (f"No reference-KL metric among the {len(names)} logged ({shown or 'none'}); "
               "name it with --metric." if not self.metrics else
               f"{NO_MATCH} {' '.join(self.metrics)}" + (f": did you mean {' or '.join(close)}?" if close else "") +
               f" (logged: {shown or 'none'}).")
        preference = preference_metrics(names)
        if preference and not self.metrics:
            msg = (f"No reference-KL metric: a preference trainer, whose reference shows in its implicit rewards "
                   f"({', '.join(f'{q} {n}' for q, n in preference.items())}); judge it with "
                   "klwatch.preference_reset.PreferenceResetDetector, as klwatch scan does.")
        result = LineageResult(lineage, None, "no_kl_metric", findings=[Finding("kl_metric", None, "warning", msg)])
        _unjudged(result, lineage.boundaries, "No KL logged on both sides of this boundary.")
        return result

    def opening(self, kl_pieces: Sequence[Series | None], *, scale: float) -> Series | None:
        """The run's opening KL (logged from its first logging step; TRL logs every ``logging_steps``),
        the template of a regrowth from zero; None when the logs do not start at the beginning."""
        first = next((k for k in kl_pieces if k is not None), None)
        if first is not None and len(first) >= 3 and (first.steps[0] <= cadence_of({"kl": first}, prefer=("kl",))
                                                      or first.values[0] < self.config.opening_zero_fraction * scale):
            return first
        return None

    def _verdict_at(self, kl_pieces: Sequence[Series | None], b: Boundary, *, scale: float,
                    start: Series | None, declared: bool = False, named: int | None = None,
                    lr: Series | None = None) -> BoundaryVerdict | None:
        """The statistic's verdict at ``b``. A boundary a declared schedule touches is judged at the
        detector's own reset threshold, not the user's: whether a declared reset is ``intentional``
        must not change with ``--reset-score`` (at 1.0 it would otherwise read as no reset at all).
        ``named`` is the checkpoint step the logs name for ``b`` (``named_reset_step``), if any."""
        after, before = kl_pieces[b.piece_index], _nearest_before(kl_pieces, b.piece_index)
        if after is None or before is None:
            return None
        config = replace(self.config, reset_score=ReferenceResetConfig.reset_score) if declared else self.config
        return marked(judge_boundary(b, before, after, start=start, scale=scale, config=config),
                      before, after, opening=start, config=config, quantity="KL", named=named, lr=lr)

    @staticmethod
    def _declared(schedules: list[ReferenceSchedule], kl_pieces: Sequence[Series | None], b: Boundary) -> bool:
        """Whether the run declares a reference update at ``b`` (a schedule explains it)."""
        before = _nearest_before(kl_pieces, b.piece_index)
        last = int(before.steps[-1]) if before is not None and len(before) else None
        return explain_boundary(schedules, step=b.step, resumed_from=b.resumed_from_step, last_before=last) is not None

    def confirms_reset(self, lineage: Lineage, boundary: Boundary) -> bool:
        """Whether the KL says the reference was reset at ``boundary`` (how a pause inside one tracker
        piece earns its boundary): the statistic alone, before any declaration excuses it."""
        if lineage.kl_metric is None:
            return False
        kl_pieces = lineage.kl_pieces()
        summary = _kl_summary(kl_pieces)
        if not summary.finite or not summary.max_abs >= self.config.kl_off_tolerance:
            return False
        scale = summary.scale
        v = self._verdict_at(kl_pieces, boundary, scale=scale, start=self.opening(kl_pieces, scale=scale),
                             named=named_reset_step(lineage, boundary), lr=run_lr(lineage))
        return v is not None and v.verdict == "reference_reset"

    def _apply_declarations(self, v: BoundaryVerdict, schedules: list[ReferenceSchedule], *, before: Series | None,
                            after: Series | None) -> None:
        """A reset the run declared is ``intentional``; a mixing sync (alpha < 1) cannot take the KL to ~0,
        so a drop far deeper than its mix predicts stays in doubt rather than excused."""
        assert before is not None and after is not None
        b = v.boundary
        exp = explain_boundary(schedules, step=b.step, resumed_from=b.resumed_from_step,
                               last_before=int(before.steps[-1]) if len(before) else None)
        if exp is None:
            note = schedule_note(schedules, step=b.step)
            if note:
                v.explanation = f"{v.explanation} {note}"
            return
        alpha = exp.schedule.alpha
        fell = f"KL fell from {v.kl_before:.3g} to {v.kl_after:.3g} at the resume at step {b.step}"
        first_after = next((float(x) for x in after.values if np.isfinite(x)), None)
        if not exp.schedule.full and v.kl_before and first_after is not None and \
                first_after / v.kl_before < self.config.mixup_depth_slack * (1 - alpha) ** 2:
            v.verdict = "inconclusive"
            v.explanation = (f"{fell}, far deeper than a reference sync mixing {alpha:g} of the policy predicts "
                             f"(~{(1 - alpha) ** 2:.0%} of the level; {exp.why}): the reference may have been "
                             "rebuilt from the resumed weights.")
            return
        v.verdict = "intentional"
        v.explanation = f"{fell}, a reference update that is intentional: {exp.why}."

    def stream(self, *, name: str = "run", config: dict | None = None) -> "StreamingReferenceReset":
        """The same judgement fed one logged KL point at a time (see ``StreamingReferenceReset``)."""
        return StreamingReferenceReset(detector=self, name=name, config=config)


def marked(v: BoundaryVerdict, before: Series, after: Series, *, opening: Series | None,
           config: ReferenceResetConfig, quantity: str, named: int | None = None,
           lr: Series | None = None) -> BoundaryVerdict:
    """A verdict the statistic left ``inconclusive`` decided by the snapshot mark (``klwatch.snapshot_mark``):
    the value at the estimator's floor at the first step after the checkpoint, then the opening retraced, is
    a reset; so is its sparse-logging form, the window mark (``klwatch.window_mark``; ``lr`` the run's
    learning rate, ``klwatch.progress.run_lr``); a value far off the floor (``off_the_floor``) is a kept
    reference."""
    if v.verdict != "inconclusive":
        return v
    mark = snapshot_mark(before, after, reset_step=v.boundary.resumed_from_step, opening=opening, lr=lr,
                         config=config.snapshot)
    if mark is None:
        window = window_mark(before, after, reset_step=named, opening=opening,
                             evidence=v.boundary.evidence, lr=lr, config=config.window)
        # a deep fall alone is weaker than the exact floor: it decides where the statistic could not weigh the
        # points, or leans to a reset, never against a statistic leaning to a continuation; a retrace or a fall
        # under the re-logged steps decides
        if window is not None and (window.retraced or window.relogged or v.score >= 0.5):
            return replace(v, verdict="reference_reset", score=max(v.score, config.reset_score), explanation=(
                f"{window.describe(quantity)}: the reference policy was rebuilt from the resumed weights. "
                "Load the reference from the base model, not the checkpoint."))
        off = off_the_floor(before, after, reset_step=named, opening=opening, config=config.snapshot)
        if off is None:
            return v
        return replace(v, verdict="ok", score=min(v.score, config.ok_score), explanation=(
            f"{quantity} was {off}: the reference was kept across the resume at step {v.boundary.step} "
            f"({v.kl_before:.3g} before, {v.kl_after:.3g} after)."))
    return replace(v, verdict="reference_reset", score=max(v.score, config.reset_score), explanation=(
        f"{mark.describe(quantity)}: the reference policy was rebuilt from the resumed weights. "
        "Load the reference from the base model, not the checkpoint."))


def _unjudged(result: LineageResult, boundaries: list[Boundary], why: str) -> None:
    """Boundaries that cannot be judged are still reported, saying why."""
    for b in boundaries:
        result.verdicts.append(BoundaryVerdict(b, "inconclusive", 0.5, None, None, why))


ROLLED_UP = ("reference_reset", "inconclusive", "intentional", "ok")
"""The statuses a run's verdicts roll up to (the others say why nothing was judged)."""


def roll_up(verdicts: Sequence[BoundaryVerdict]) -> str:
    """A run's status from its boundaries' verdicts: any reset makes it a reset run; a boundary left
    ``inconclusive`` makes it ``inconclusive``, never ``ok`` (nothing says all is well there)."""
    kinds = {v.verdict for v in verdicts}
    for status in ("reference_reset", "inconclusive", "intentional"):
        if status in kinds:
            return status
    return "ok"


class StreamingReferenceReset:
    """The reference-reset check fed as the run logs (river-style ``update``): for a live watcher or a
    callback inside training, which see a resume when it happens and want the verdict as soon as the
    points that decide it are in.

    Call ``update(step, kl)`` for every logged KL point (as a distance: flip a KL logged negated) and
    ``resume(resumed_from_step=...)`` when the process restarts from a checkpoint. The verdict of a
    resume rests on its first ``window_after`` logged points, like ``klwatch scan``'s: ``update`` returns
    it with the point that completes them (None otherwise) and keeps it in ``verdicts``. Given the same
    points, it is the verdict a scan of the logs up to that point gives.
    """

    def __init__(self, *, detector: ReferenceResetDetector, name: str = "run", config: dict | None = None) -> None:
        self.detector = detector
        self.name = name
        self.config = dict(config or {})
        """The run's config, for the reference updates it declares (TRL's ``sync_ref_model``, ...)."""
        self._steps: list[list[int]] = [[]]
        self._values: list[list[float]] = [[]]
        self._resumed_from: list[int | None] = [None]
        self._done: list[bool] = [False]
        self.verdicts: list[BoundaryVerdict] = []
        """Final verdicts, one per resume, in order."""

    def resume(self, *, resumed_from_step: int | None = None) -> BoundaryVerdict | None:
        """A restart: later points belong to a new piece. A resume still waiting for its points is
        judged on those it has (returned), since the next resume cuts it short."""
        pending = self._finish() if len(self._steps) > 1 and self._steps[-1] and not self._done[-1] else None
        if not self._steps[-1] and len(self._steps) > 1:  # resumed again before logging: one restart
            self._resumed_from[-1] = resumed_from_step
            return pending
        self._steps.append([])
        self._values.append([])
        self._resumed_from.append(resumed_from_step)
        self._done.append(False)
        return pending

    def update(self, step: int, kl: float) -> BoundaryVerdict | None:
        """One logged KL point; the resume's verdict when this point completes its window."""
        self._steps[-1].append(int(step))
        self._values[-1].append(float(kl))
        if len(self._steps) < 2 or self._done[-1]:
            return None
        finite_after = int(np.sum(np.isfinite(self._values[-1])))
        return self._finish() if finite_after >= self.detector.config.window_after else None

    def current(self) -> BoundaryVerdict | None:
        """The latest resume's verdict on the points so far (provisional until ``update`` returns it)."""
        if len(self._steps) < 2 or not self._steps[-1]:
            return None
        return self._judge()

    def lineage(self) -> Lineage:
        """What has been fed, as the lineage a scan of the same logs builds."""
        kept = [k for k, s in enumerate(self._steps) if s]
        pieces = [{"kl": Series(np.array(self._steps[k]), np.array(self._values[k]))} for k in kept]
        boundaries = [Boundary(step=self._steps[k][0], resumed_from_step=self._resumed_from[k], evidence=["declared"],
                               piece_index=i) for i, k in enumerate(kept) if i > 0]
        return Lineage(id=self.name, name=self.name, segments=[], pieces=pieces, piece_segments=[0] * len(pieces),
                       boundaries=boundaries, config=self.config, kl_metric="kl")

    def _judge(self) -> BoundaryVerdict | None:
        result = self.detector.judge(self.lineage())
        return result.verdicts[-1] if result.verdicts else None

    def _finish(self) -> BoundaryVerdict | None:
        self._done[-1] = True
        v = self._judge()
        if v is not None:
            self.verdicts.append(v)
        return v
