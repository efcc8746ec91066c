"""TRL-GRPO-shaped runs for the finding tests: what ``trl.GRPOTrainer`` logs, healthy or with an
unlogged faulty restart.

Real GRPO logs are not the generator's tidy curves. The policy learns in fits and starts (a format
reward that switches on within a few steps), completions grow until they hit
``max_completion_length`` (every ``completions/*`` key and ``clipped_ratio`` change level at once;
a format reward that needs the closing tag falls back toward zero), rewards saturate (``reward_std``
to 0 and ``frac_reward_zero_std`` to 1 together), entropy collapses, the grad norm spikes. TRL logs
every ``logging_steps`` the *mean* of the per-step values since the last log, ``kl`` only when
``beta`` is not 0, ``clip_ratio/*`` at exactly 0 unless ``num_iterations > 1``, and ``num_tokens``
cumulatively. This module simulates a latent policy state per optimizer step, samples B prompts ×
G completions from it as TRL would score them, and logs the window means under TRL's keys.

A faulty restart is planted through the latent state, as the real bug does it: ``reference_at``
rebuilds the reference from the current weights (the KL falls to ~0 and regrows, the loss with it);
``reference_every`` does it again and again; ``weights_lost_at`` starts the policy over from the base model (every weight-driven series returns
to its opening, the KL to 0 when there is one). The restart leaves no mark in the logs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from klwatch.model import LineageResult, Segment, Series
from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage


@dataclass(frozen=True)
class TrlRun:
    """The knobs of one simulated GRPO run (defaults: a plain healthy run logged every step)."""

    seed: int = 0
    steps: int = 300
    logging_steps: int = 1
    num_generations: int = 8
    prompts_per_step: int = 4
    max_completion_length: int = 128
    beta: float = 0.04
    num_iterations: int = 1
    reward_fns: tuple[str, ...] = ("format", "accuracy")
    learn_at: float = 0.4
    """When (fraction of the run) the policy learns the task ..."""
    learn_width: float = 10.0
    """... over how many steps (a few: an abrupt 'aha'; many: a slow climb)."""
    hit_max_at: float | None = 0.6
    """When completions start running into ``max_completion_length`` (None: never)."""
    hit_max_width: float = 5.0
    saturate: bool = False
    """Rewards reach 1 for every completion (reward_std to 0, frac_reward_zero_std to 1)."""
    entropy_collapse_at: float | None = None
    grad_spikes: int = 3
    reference_at: int | None = None
    reference_every: int | None = None
    """The reference rebuilt from the policy after every this many steps (a ratchet of unlogged resumes)."""
    weights_lost_at: int | None = None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50, 50)))


def simulate(run: TrlRun) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The run's logged series: TRL key -> (logged steps, window means)."""
    rng = np.random.default_rng(run.seed)
    T, B, G, M = run.steps, run.prompts_per_step, run.num_generations, run.max_completion_length
    n = B * G
    t = np.arange(1, T + 1, dtype=float)
    age = t.copy() if run.weights_lost_at is None else np.where(t >= run.weights_lost_at, t - run.weights_lost_at + 1, t)
    ref_age = age.copy() if run.reference_at is None else np.where(t >= run.reference_at, t - run.reference_at + 1, age)
    if run.reference_every:
        ref_age = (t - 1) % run.reference_every + 1

    skill = 0.05 + 0.9 * _sigmoid((age - run.learn_at * T) / max(run.learn_width, 0.5))
    if run.saturate:
        skill = np.minimum(1.0, skill + 0.1 * _sigmoid((age - (run.learn_at * T + 3 * run.learn_width)) / 5.0))
    base_len = 0.35 * M * (1 + 0.3 * skill)
    if run.hit_max_at is not None:
        base_len = base_len + 0.9 * M * _sigmoid((age - run.hit_max_at * T) / max(run.hit_max_width, 0.5))
    entropy_level = 1.2 - 0.6 * skill
    if run.entropy_collapse_at is not None:
        entropy_level = entropy_level * (1 - 0.6 * _sigmoid((age - run.entropy_collapse_at * T) / 4.0))
    drift = 1 - np.exp(-ref_age / 40.0)

    per_step: dict[str, np.ndarray] = {k: np.empty(T) for k in (
        "completions/mean_length", "completions/min_length", "completions/max_length",
        "completions/mean_terminated_length", "completions/min_terminated_length",
        "completions/max_terminated_length", "completions/clipped_ratio", "reward", "reward_std",
        "frac_reward_zero_std", "entropy", "grad_norm", "loss")}
    for fn in run.reward_fns:
        per_step[f"rewards/{fn}/mean"] = np.empty(T)
        per_step[f"rewards/{fn}/std"] = np.empty(T)
    tokens = np.empty(T)
    for i in range(T):
        lengths = np.minimum(M, np.maximum(1, rng.lognormal(np.log(base_len[i]), 0.35, n))).astype(int)
        clipped = lengths >= M
        term = lengths[~clipped]
        per_step["completions/mean_length"][i] = lengths.mean()
        per_step["completions/min_length"][i] = lengths.min()
        per_step["completions/max_length"][i] = lengths.max()
        # TRL logs 0 for the terminated stats when every completion was clipped
        per_step["completions/mean_terminated_length"][i] = term.mean() if len(term) else 0.0
        per_step["completions/min_terminated_length"][i] = term.min() if len(term) else 0.0
        per_step["completions/max_terminated_length"][i] = term.max() if len(term) else 0.0
        per_step["completions/clipped_ratio"][i] = clipped.mean()
        total = np.zeros(n)
        for fn in run.reward_fns:
            if fn == "format":  # needs the closing tag: a clipped completion never has it
                r = (rng.random(n) < min(1.0, skill[i] + 0.1)) & ~clipped
                r = r.astype(float)
            elif fn == "accuracy":
                r = (rng.random(n) < skill[i] ** 1.5).astype(float)
            else:  # a soft length reward in [0, 1]
                r = np.clip(1 - np.abs(lengths / M - 0.5) * 2 + rng.normal(0, 0.05, n), 0, 1)
            per_step[f"rewards/{fn}/mean"][i] = r.mean()
            per_step[f"rewards/{fn}/std"][i] = r.std(ddof=1)
            total += r
        groups = total.reshape(B, G)
        gstd = groups.std(axis=1, ddof=1)
        per_step["reward"][i] = total.mean()
        per_step["reward_std"][i] = gstd.mean()
        per_step["frac_reward_zero_std"][i] = float(np.mean(gstd < 1e-6))
        per_step["entropy"][i] = entropy_level[i] * np.exp(rng.normal(0, 0.05))
        spike = 1.0
        per_step["grad_norm"][i] = 0.3 * (1 + 0.5 * skill[i]) * np.exp(rng.normal(0, 0.25)) * spike
        tokens[i] = n * (40 + lengths.mean())
    if run.grad_spikes:
        at = rng.choice(np.arange(5, T), size=min(run.grad_spikes, T - 5), replace=False)
        per_step["grad_norm"][at] *= rng.uniform(3, 20, len(at))
    kl = 0.05 * drift * (1 + 0.5 * (base_len / M)) * np.exp(rng.normal(0, 0.2, T))
    kl[ref_age == 1] = 0.0  # the first step against a fresh reference: the policy is the reference
    per_step["loss"] = run.beta * kl + rng.normal(0, 0.002, T)
    if run.beta > 0:
        per_step["kl"] = kl
    if run.num_iterations > 1:
        low = np.clip(0.002 * (1 + 2 * skill) * np.exp(rng.normal(0, 0.6, T)), 0, 1)
        high = np.clip(0.001 * (1 + skill) * np.exp(rng.normal(0, 0.6, T)), 0, 1)
        per_step["clip_ratio/low_mean"] = low
        per_step["clip_ratio/high_mean"] = high
        per_step["clip_ratio/region_mean"] = low + high
    else:  # one iteration per batch: the ratio is exactly 1, nothing is clipped
        for k in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
            per_step[k] = np.zeros(T)
    warm = max(1, T // 10)
    per_step["learning_rate"] = np.where(t <= warm, 1e-6 * t / warm, 1e-6 * (T - t) / max(T - warm, 1))

    L = run.logging_steps
    logged = np.arange(L, T + 1, L)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key, v in per_step.items():
        means = np.array([v[s - L:s].mean() for s in logged])  # TRL averages since the last log
        out[key] = (logged.copy(), means)
    out["num_tokens"] = (logged.copy(), np.cumsum(tokens)[logged - 1])
    out["epoch"] = (logged.copy(), logged / T)
    return out


VERL_NAMES = {
    "kl": "actor/kl_loss", "loss": "actor/pg_loss", "grad_norm": "actor/grad_norm", "entropy": "actor/entropy",
    "learning_rate": "actor/lr", "reward": "critic/score/mean", "completions/mean_length": "response_length/mean",
    "completions/max_length": "response_length/max", "completions/min_length": "response_length/min",
    "completions/clipped_ratio": "response_length/clip_ratio", "clip_ratio/region_mean": "actor/pg_clipfrac",
}
"""The same quantities as verl's trainer logs them (keys it has no equivalent for are dropped)."""


def _as_verl(series: dict[str, tuple[np.ndarray, np.ndarray]], *, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """verl's names, plus the timers and throughput it logs every step (generation time follows the
    longest completion, so it changes level with the lengths)."""
    out = {VERL_NAMES[k]: v for k, v in series.items() if k in VERL_NAMES}
    steps, longest = series["completions/max_length"]
    gen = 0.02 * longest * np.exp(rng.normal(0, 0.1, len(steps)))
    update = 1.5 * np.exp(rng.normal(0, 0.1, len(steps)))
    out["timing_s/gen"] = (steps, gen)
    out["timing_s/update_actor"] = (steps, update)
    out["timing_s/step"] = (steps, gen + update + 0.3)
    out["perf/throughput"] = (steps, series["completions/mean_length"][1] * 32 / (gen + update + 0.3))
    out["critic/score/max"] = (steps, np.minimum(series["reward"][1] + 0.5, series["reward"][1].max()))
    out["critic/advantages/mean"] = (steps, rng.normal(0, 1e-3, len(steps)))
    out["critic/advantages/max"] = (steps, 1.5 + rng.normal(0, 0.1, len(steps)))
    return out


def judge_trl(run: TrlRun, *, style: str = "trl") -> LineageResult:
    """The run as one MLflow-style tracker run (one process, ten seconds a step), through the real
    pipeline. ``style``: "trl" (keys as TRL's MLflow and TensorBoard callbacks write them), "trl-wandb"
    (``train/<key>``, as the W&B callback writes them) or "verl" (the same quantities under verl's names)."""
    logged = simulate(run)
    if style == "verl":
        logged = _as_verl(logged, rng=np.random.default_rng(run.seed + 1))
    series: dict[str, Series] = {}
    t0 = 1_700_000_000.0
    for key, (steps, values) in logged.items():
        name = f"train/{key}" if style == "trl-wandb" else key
        series[name] = Series(steps.astype(np.int64), values.astype(float), t0 + steps * 10.0)
    seg = Segment(kind="mlflow", ref="trl-run", source="synthetic-trl", run_id="trl-run", name="grpo",
                  group="grpo", config={"beta": run.beta, "sync_ref_model": False, "ref_model_sync_steps": 512,
                                        "ref_model_mixup_alpha": 0.6},
                  series=series, store="synthetic-trl")
    config = ScanConfig()
    [lineage] = build_lineages([seg], config=config)
    return judge_lineage(lineage, config=config)


def healthy_variant(seed: int) -> TrlRun:
    """A healthy run drawn from the shapes real GRPO runs take (seeded, so a failure reproduces)."""
    rng = np.random.default_rng(10_000 + seed)
    L = int(rng.choice([1, 1, 5, 10]))
    steps = int(rng.choice([200, 300, 500, 800])) if L > 1 else int(rng.choice([120, 200, 300, 500]))
    fns = [("format", "accuracy"), ("accuracy",), ("format",), ("format", "accuracy", "length"), ("length",)]
    return TrlRun(
        seed=seed, steps=steps, logging_steps=L,
        num_generations=int(rng.choice([4, 8, 16])), prompts_per_step=int(rng.choice([1, 2, 4, 8])),
        max_completion_length=int(rng.choice([32, 64, 128, 256])),
        beta=float(rng.choice([0.0, 0.0, 0.04, 0.1])), num_iterations=int(rng.choice([1, 1, 2])),
        reward_fns=fns[int(rng.integers(len(fns)))],
        learn_at=float(rng.uniform(0.15, 0.85)), learn_width=float(rng.choice([1.0, 3.0, 10.0, 40.0])),
        hit_max_at=None if rng.random() < 0.3 else float(rng.uniform(0.2, 0.9)),
        hit_max_width=float(rng.choice([1.0, 3.0, 10.0])),
        saturate=bool(rng.random() < 0.4),
        entropy_collapse_at=None if rng.random() < 0.6 else float(rng.uniform(0.2, 0.9)),
        grad_spikes=int(rng.integers(0, 6)),
    )


def with_fault(run: TrlRun, **fault: int | None) -> TrlRun:
    return replace(run, **fault)
