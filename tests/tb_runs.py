"""Training runs as TensorBoard logs them, for tests of the faces (CLI, CI hook, watcher): a new
event file per process, KL growing from the step the reference was last snapshotted."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

_uid = itertools.count()


def write_run(folder: Path, *, resumes: list[int], buggy: bool, last: int = 90, metric: str = "train/kl_penalty",
              seed: int = 0, kl_scale: float = 0.05, start_wall: float = 1_700_000_000.0,
              extra: dict[str, float] | None = None) -> None:
    """Write one run; a buggy run rebuilds the reference at every resume. ``extra`` logs constant series."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(seed)
    starts, ends = [1] + [r + 1 for r in resumes], resumes + [last]
    ref, wall = 0, start_wall
    for k, (a, b) in enumerate(zip(starts, ends)):
        if k and buggy:
            ref = a - 1
        # tensorboardX names files by the second: a unique suffix keeps each process its own file
        w = SummaryWriter(str(folder), filename_suffix=f".p{k}.{next(_uid)}")
        for s in range(a, b + 1):
            kl = kl_scale * (1 - np.exp(-(s - ref) / 8.0)) * np.exp(rng.normal(0, 0.1))
            w.add_scalar(metric, kl, s, walltime=wall)
            w.add_scalar("train/loss", 1.0 / s, s, walltime=wall)
            for name, value in (extra or {}).items():
                w.add_scalar(name, value, s, walltime=wall)
            wall += 5.0
        w.close()
        wall += 900.0
