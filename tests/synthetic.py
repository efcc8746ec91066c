"""Synthetic KL logs with the statistics of real ones, for detector tests that must not depend on
the numbers of our own sample runs: scales from 1e-4 to 1, multiplicative noise, heavy-tailed
outliers, logging every k steps, several restarts, the reference reset or not at each."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.model import Segment, Series


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


def kl_values(run: KLRun, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per process: (steps, KL) where KL grows from the step the reference was last snapshotted."""
    starts = [1] + [r + 1 for r in run.resumes]
    ends = [r for r in run.resumes] + [run.last_step]
    ref_step = 0
    out = []
    for k, (a, b) in enumerate(zip(starts, ends)):
        if k > 0 and run.buggy[k - 1]:
            ref_step = a - 1
        steps = np.arange(a, b + 1)
        steps = steps[(steps - 1) % run.every == 0] if run.every > 1 else steps
        if k > 0 and (len(steps) == 0 or steps[0] != a):
            steps = np.concatenate([[a], steps[steps > a]])  # frameworks log the first step after a resume
        base = run.amplitude * (1 - np.exp(-(steps - ref_step) / run.tau))
        noisy = base * np.exp(rng.normal(0.0, run.noise, len(steps)))
        if run.outlier_rate:
            hit = rng.random(len(steps)) < run.outlier_rate
            noisy[hit] *= np.exp(rng.normal(0.0, 1.5, hit.sum()))
        out.append((steps, noisy))
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
