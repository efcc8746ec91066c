"""Training progress in learning-rate units: how far updates have moved the policy since a given step.

Adam-style optimisers move each weight by about the learning rate per update, so the policy's distance
from a reference taken at step r grows with the sum of the learning rates of the updates since r, not
with the count of steps. A regrowth after a reference reset inside an lr warm-up therefore climbs faster
per step than the run's own opening did (the opening ran at the warm-up's first, tiny rates); in
progress units both follow one curve. Without a logged learning rate, progress is the count of updates.

The KL a framework logs at step t is computed inside step t's loss, before its update (TRL
``compute_loss``, NeMo-RL's loss function, verl's ``update_policy``): the updates that moved the policy
are r + 1 .. t - 1 after a reference taken at the start of step r + 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .declarations import config_number
from .metrics import LR, find_metric
from .model import Lineage, Series


def run_lr(lineage: Lineage) -> Series | None:
    """The learning rate the run applied, as one series over its pieces in order: each piece's points up to
    the next piece's first (a resumed launch re-logs the steps a crashed one ran past its checkpoint, and
    its values are the ones the run lived). None when the run logs no learning rate."""
    name = find_metric(lineage.metric_names(), family=LR)
    if name is None:
        return None
    parts = [p[name] for p in lineage.pieces if name in p and len(p[name])]
    kept = [s.take(s.steps < nxt.steps[0]) for s, nxt in zip(parts, parts[1:])] + parts[-1:]
    lr = Series.concat([s for s in kept if len(s)])
    ok = np.isfinite(lr.values) & (lr.values >= 0)
    return _with_declared_warmup(lr.take(ok), lineage.config) if int(np.sum(ok)) >= 2 else None


WARMUP_KEYS = (("warmup_steps", "warmup_ratio", "max_steps"),  # HF TrainingArguments (TRL)
               ("lr_warmup_steps", "lr_warmup_steps_ratio", "total_training_steps"))  # verl's optim config
"""Where a run's config declares its warm-up: (steps, share of the run, the run's steps); steps win when positive."""


def declared_warmup(config: Mapping[str, Any]) -> float | None:
    """The warm-up the config declares, in steps (HF: ``warmup_steps``, a float under 1 read as a ratio as
    recent transformers do, else ``warmup_ratio`` x ``max_steps``; verl: ``lr_warmup_steps``, -1 meaning
    ``lr_warmup_steps_ratio`` x ``total_training_steps``), or None."""
    for steps_key, ratio_key, total_key in WARMUP_KEYS:
        steps, ratio = config_number(config, leaf=steps_key), config_number(config, leaf=ratio_key)
        total = config_number(config, leaf=total_key)
        if steps is not None and 0 < steps < 1:
            steps, ratio = None, steps
        if steps is not None and steps >= 1:
            return steps
        if ratio is not None and ratio > 0 and total is not None and total > 0:
            return ratio * total
    return None


def _with_declared_warmup(lr: Series, config: Mapping[str, Any]) -> Series:
    """The logged rates with the ramp the config declares before the first of them (HF and verl warm up linearly
    from 0 at step 0): a warm-up that ends before the first log leaves no trace in the logs, yet the opening ran
    through it."""
    warmup, first = declared_warmup(config), float(lr.steps[0])
    if warmup is None or first <= 0:
        return lr
    ramp_end = int(round(warmup))
    knots = [(0, 0.0)] + ([(ramp_end, float(lr.values[0]))] if 0 < ramp_end < first else [])
    steps = np.array([k for k, _ in knots] + lr.steps.tolist())
    return Series(steps, np.array([v for _, v in knots] + lr.values.tolist()))


WARMING = 1e-3
"""A first logged rate this share under the run's highest is inside a warm-up (float32 logs of a constant or a decay
from the start are equal to their highest at the first point)."""


def _lr_at(lr: Series | None, steps: np.ndarray) -> np.ndarray:
    """The learning rate of the update at each step: interpolated between logged points, extended before the
    first along its first two (a warm-up logged every L steps, or a decay), held after the last; 1 without one.
    A warm-up that ended before the second logged point is extended along the line from 0 at step 0 (the HF
    schedulers' ramp) instead: the first two straddle its peak."""
    if lr is None:
        return np.ones(len(steps))
    order = np.argsort(lr.steps, kind="stable")
    x, y = lr.steps[order].astype(float), lr.values[order]
    out = np.interp(steps, x, y)
    early = steps < x[0]
    if len(x) < 2 or x[1] <= x[0] or not np.any(early):
        return out
    top = (1 - WARMING) * float(np.max(y))
    if y[0] < top and not y[0] < y[1] < top and x[0] > 0:
        out[early] = np.clip(y[0] * steps[early] / x[0], 0.0, None)
    else:
        slope = (y[1] - y[0]) / (x[1] - x[0])
        out[early] = np.clip(y[0] + slope * (steps[early] - x[0]), 0.0, None)
    return out


def window_progress(lr: Series | None, ends: np.ndarray, *, since: int) -> np.ndarray:
    """The mean progress since the start of step ``since + 1`` over each logging window ending at ``ends``
    (a window runs from the previous end, or from ``since``, to its own end): what a trainer that logs
    the mean of its steps since the last log shows, in progress units."""
    last = int(np.max(ends)) if len(ends) else since
    steps = np.arange(since + 1, last + 1, dtype=float)
    # updates since + 1 .. t - 1; update s runs at the rate logged at step s - 1 (the HF Trainer logs the
    # rate its scheduler set for the next update: a warm-up's first update runs at 0)
    moved = np.concatenate([[0.0], np.cumsum(_lr_at(lr, steps - 1.0))[:-1]])
    out, lo = [], since
    for end in ends.astype(int):
        window = moved[max(lo, since) - since:end - since]
        out.append(float(np.mean(window)) if len(window) else float("nan"))
        lo = end
    return np.array(out)


REACH = 1.25
"""How far past the opening's last window (in progress) its curve is carried along its last segment."""


def _on_opening(prog: np.ndarray, vals: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The opening's value at progress ``q``, read log-log between its windows (a KL grows as a power of the
    distance moved), along its first segment before its first window and its last a little past its last (``REACH``),
    NaN further on."""
    keep = (prog > 0) & (vals > 0)
    x, y = np.log(prog[keep]), np.log(vals[keep])
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    if len(x) < 2 or not np.all(np.diff(x) > 0):
        return np.full(len(q), np.nan)
    lq = np.log(np.clip(q, 1e-300, None))
    out = np.interp(lq, x, y)
    slope = (y[1] - y[0]) / (x[1] - x[0])
    out = np.where(lq < x[0], y[0] + slope * (lq - x[0]), out)
    slope = (y[-1] - y[-2]) / (x[-1] - x[-2])  # a little past its last window, along its last segment
    out = np.where(lq > x[-1], y[-1] + slope * (lq - x[-1]), out)
    return np.where((q > 0) & (lq <= x[-1] + np.log(REACH)), np.exp(out), np.nan)


def retraced_points(opening: Series, after: Series, *, lr: Series | None, reset_step: int, band: float) -> int:
    """How many points of ``after`` lie on the run's ``opening`` at the same progress since ``reset_step``
    (within ``band`` in log space), counting the points the opening reaches; 0 when the first positive one
    is not among them or any compared point is off the curve. Logged windows are compared as windows."""
    before = opening.take(opening.steps < after.steps[0])
    theirs = _on_opening(window_progress(lr, before.steps, since=0), before.values,
                         window_progress(lr, after.steps, since=reset_step))
    ours = after.values
    seen = np.isfinite(theirs) & (ours > 0)
    if not len(ours) or not seen[int(np.argmax(ours > 0))]:
        return 0
    return _on_curve(ours, theirs, seen, band)


def _on_curve(ours: np.ndarray, theirs: np.ndarray, seen: np.ndarray, band: float) -> int:
    """How many ``seen`` points lie within ``band`` (log space) of the curve's values there; 0 when any is off it."""
    if not np.any(seen):
        return 0
    return int(np.sum(seen)) if bool(np.all(np.abs(np.log(ours[seen] / theirs[seen])) <= band)) else 0


def opening_on_regrowth(opening: Series, after: Series, *, lr: Series | None, reset_step: int, band: float) -> int:
    """The converse of ``retraced_points``: how many of the ``opening``'s windows lie on the curve of ``after`` at the
    same progress (since step 0 for the opening, since ``reset_step`` for ``after``; within ``band`` in log space),
    counting the windows that curve reaches; 0 when any compared window is off it. A regrowth faster than the
    opening (a reset late in a warm-up, when the opening is only two windows long) soon runs past the progress the
    opening reached, so its later windows cannot be read on the opening; the opening's windows can be read on it."""
    before = opening.take(opening.steps < after.steps[0])
    theirs = _on_opening(window_progress(lr, after.steps, since=reset_step), after.values,
                         window_progress(lr, before.steps, since=0))
    ours = before.values
    return _on_curve(ours, theirs, np.isfinite(theirs) & (ours > 0), band)
