"""Helpers for the finding-detector tests.

Two kinds of runs: synthetic processes built here from the real run model and put through the real
pipeline (``build_lineages`` then ``judge_lineage``), and sample runs made by the sample generator
(``sample_runs/generate.py``: a real GRPO loop whose faults are planted through the real mechanism)
into a temporary folder, once per test session, and read back with ``klwatch.pipeline.scan``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from klwatch.model import Finding, LineageResult, Segment, Series
from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage

REPO = Path(__file__).resolve().parents[2]

HEALTHY = ("continuous", "resume-fixed", "rewind-fixed")
BUGGY_REFERENCE = ("resume-buggy", "ratchet-buggy")
FAULTS = {  # scenario -> the detector its planted fault must fire
    "lr-restart": "lr_schedule_restart",
    "optimizer-reset": "optimizer_state_lost",
    "data-restart": "data_order_restart",
    "kl-coef-reset": "kl_coef_reset",
}
SCENARIOS = HEALTHY + BUGGY_REFERENCE + tuple(FAULTS)


def planted_step(manifest: dict, detector: str) -> int:
    """The boundary step where the generator planted ``detector``'s fault (from its manifest)."""
    [step] = {f["step"] for f in manifest["faults"] if f["fault"] == detector}
    return int(step)

Process = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def kl_curve(steps: np.ndarray, *, rng: np.random.Generator, level: float = 0.05, tau: float = 30.0) -> np.ndarray:
    """A healthy reference KL: grows from zero, multiplicative noise, never reset."""
    steps = np.asarray(steps, dtype=float)
    return level * (1 - np.exp(-steps / tau)) * np.exp(rng.normal(0.0, 0.15, len(steps)))


def judge(processes: Sequence[Process], *, config: dict | None = None, checkpoint_steps: Sequence[int] = (),
          with_kl: bool = True, seed: int = 0, kind: str = "wandb-offline") -> LineageResult:
    """One training run made of ``processes`` (each: metric -> (steps, values)), judged by the real
    pipeline. Each process is its own tracker run, ten seconds a step, ten minutes between them; a
    healthy KL is added (the pipeline judges a run only when it has one) unless ``with_kl`` is off."""
    rng = np.random.default_rng(seed)
    segs: list[Segment] = []
    t = 1_700_000_000.0
    for k, proc in enumerate(processes):
        series: dict[str, Series] = {}
        first = min(int(np.min(s)) for s, _ in proc.values())
        end = t
        for name, (steps, values) in proc.items():
            st = np.asarray(steps, dtype=np.int64)
            wall = t + (st - first) * 10.0
            end = max(end, float(wall.max()))
            series[name] = Series(st, np.asarray(values, dtype=float), wall)
        if with_kl and "train/kl_penalty" not in series:
            st = next(iter(series.values())).steps
            series["train/kl_penalty"] = Series(st, kl_curve(st, rng=rng), t + (st - first) * 10.0)
        segs.append(Segment(kind=kind, ref=f"run-{k}", source="synthetic", run_id=f"run-{k}", name="run",
                            group="run", config=dict(config or {}), series=series, store="synthetic"))
        t = end + 600.0
    if checkpoint_steps:
        segs.append(Segment(kind="checkpoints", ref="checkpoints", source="synthetic", name="run",
                            checkpoint_steps=list(checkpoint_steps)))
    scan_config = ScanConfig()
    lineages = build_lineages(segs, config=scan_config)
    assert len(lineages) == 1, [lin.name for lin in lineages]
    return judge_lineage(lineages[0], config=scan_config)


def of(result: LineageResult, detector: str) -> list[Finding]:
    return [f for f in result.findings if f.detector == detector]


def alarms(result: LineageResult) -> set[str]:
    """Detectors that raised a warning or an error on a run (info summaries are not alarms)."""
    return {f.detector for f in result.findings if f.severity in ("warning", "error")}


@st.composite
def odd_processes(draw, names: Sequence[str], *, processes: tuple[int, int] = (1, 4), constant: float = 1.0):
    """Processes of any length (0 included) logging some of ``names``: steps that repeat or go back,
    values with NaN, inf, zeros, negatives and a constant, for detectors that must never fail."""
    procs: list[dict[str, Series]] = []
    start = 1
    for _ in range(draw(st.integers(*processes))):
        n = draw(st.integers(0, 30))
        first = draw(st.integers(max(1, start - 10), start + 10))
        steps = sorted(draw(st.lists(st.integers(first, first + 60), min_size=n, max_size=n)))
        start = (steps[-1] + 1) if steps else start
        proc = {}
        for name in draw(st.lists(st.sampled_from(list(names)), min_size=1, max_size=4, unique=True)):
            vals = draw(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                                           st.just(0.0), st.just(constant)), min_size=n, max_size=n))
            proc[name] = Series(np.array(steps, dtype=np.int64), np.array(vals, dtype=float),
                                1.7e9 + np.arange(n, dtype=float) + 1e4 * len(procs))
        procs.append(proc)
    return procs


def odd_results(procs: list[dict[str, Series]]) -> list[LineageResult]:
    """The processes as one run's W&B pieces, through the real pipeline up to the findings."""
    segs = [Segment(kind="wandb-offline", ref=f"r{k}", source="odd", run_id=f"r{k}", name="odd", group="odd",
                    series=p, store="odd") for k, p in enumerate(procs)]
    return [LineageResult(lin, lin.kl_metric, "ok") for lin in build_lineages(segs, config=ScanConfig(findings=False))]
