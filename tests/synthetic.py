"""Synthetic KL logs with the statistics of real ones, for detector tests that must not depend on
the numbers of our own sample runs: scales from 1e-4 to 1, multiplicative noise, heavy-tailed
outliers, several restarts, the reference reset or not at each, and logging as trainers do it.

Trainers log every ``every`` steps, at the steps that are multiples of it (HF ``logging_steps``), and
the point carries the step of the log call; after a resume from r the first point is at the next
multiple after r, not at r + 1. TRL logs the *mean* of each metric over the steps since its last log
(``mean_window``), so the first point after a reset is the mean of a regrowth from 0: small, not ~0."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from klwatch.model import Segment, Series


@dataclass
class KLRun:
    amplitude: float
    tau: float
    noise: float
    every: int
    resumes: list[int]
    buggy: list[bool]
    last_step: int
    outlier_rate: float = 0.0
    mean_window: bool = False
    """Log the mean over the steps since the last log (TRL) instead of the KL of the logged step."""


def logged_steps(first: int, last: int, every: int) -> np.ndarray:
    """The steps a trainer logging every ``every`` steps logs within [first, last]: the multiples."""
    steps = np.arange(first, last + 1)
    return steps[steps % every == 0] if every > 1 else steps


def kl_values(run: KLRun, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per process: (steps, KL) where KL grows from the step the reference was last snapshotted.

    Every step's KL gets its own noise; a logged point is that step's KL, or with ``mean_window``
    the mean over the window since the previous log, which a resume cuts short."""
    starts = [1] + [r + 1 for r in run.resumes]
    ends = list(run.resumes) + [run.last_step]
    ref_step = 0
    out = []
    for k, (a, b) in enumerate(zip(starts, ends)):
        if k > 0 and run.buggy[k - 1]:
            ref_step = a - 1
        every_step = np.arange(a, b + 1)
        base = run.amplitude * (1 - np.exp(-(every_step - ref_step) / run.tau))
        noisy = base * np.exp(rng.normal(0.0, run.noise, len(every_step)))
        if run.outlier_rate:
            hit = rng.random(len(every_step)) < run.outlier_rate
            noisy[hit] *= np.exp(rng.normal(0.0, 1.5, hit.sum()))
        steps = logged_steps(a, b, run.every)
        if run.mean_window and run.every > 1:
            vals = np.array([noisy[(every_step > max(a - 1, s - run.every)) & (every_step <= s)].mean() for s in steps])
        else:
            vals = noisy[steps - a]
        out.append((steps, vals))
    return out


def segments_for(run: KLRun, rng: np.random.Generator, *, name: str = "run", metric: str = "train/kl_penalty",
                 kind: str = "wandb-offline") -> list[Segment]:
    segs = []
    t = 1_700_000_000.0
    for k, (steps, vals) in enumerate(kl_values(run, rng)):
        wall = t + (steps - steps[0]) * 10.0
        t = float(wall[-1]) + 600.0
        segs.append(Segment(kind=kind, ref=f"{name}-{k}", source="synthetic", run_id=f"{name}-{k}", name=name,
                            group=name, series={metric: Series(steps, vals, wall)}, store="synthetic"))
    return segs
