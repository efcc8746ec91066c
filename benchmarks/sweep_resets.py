"""Sweep: how many reference resets ``klwatch scan`` catches, and how many false alarms it raises, on
synthetic-but-realistic runs written as TensorBoard event files.

    python benchmarks/sweep_resets.py [--runs-per-profile 40] [--seed 0] [--profiles grpo-1step,dpo-nstep]
                                      [--keep DIR] [--json PATH]

Each profile is a folder of training runs (half buggy, half healthy), judged by ONE
``klwatch scan ROOT --format json -o report.json --jobs 2 --no-cache`` process. The runs are written
the way a Hugging Face / TRL trainer writes them: one event file per launch in the run's folder
(``events.out.tfevents.<launch time>.<host>.<pid>.0``, a later time per launch), the ``args`` text
summary at step 0, then one scalar per event under ``train/`` at each logging step, logged at the
global step of the log call. Every run draws its own length, curve shape (saturating exponential,
linear-then-plateau, square root), noise level (5-30% multiplicative, lognormal), slow drift, step time,
lr schedule (an HF warm-up in ~40% of the runs: the first update then uses lr 0, so the KL of step 2 is
exactly 0 too; constant, linear or cosine decay) and restart downtime. The KL (or the DPO margin) is a
function of the progress made since the reference was taken (the sum of the learning rates of the
updates since), so a buggy run regrows like its own opening, faster when the opening was in warm-up.
A crashed launch may have run (and logged) past its last checkpoint: the resumed launch re-logs
those steps.

Profiles:

- ``grpo-1step``: TRL GRPO, ``train/kl`` (k3 estimator) logged every step: exactly 0.0 at step 1 and,
  in a buggy run, at the first step after the resume (the policy equals the reference); one resume at
  10-90% of the run;
- ``grpo-nstep``: the same with ``logging_steps`` L in {5, 10}; a logged point is the MEAN of the L
  per-step values since the last log (TRL averages its metrics; a launch starts its own window), at the
  step of the log call; the checkpoint step is a multiple of L in ~70% of the runs;
- ``early-1step`` / ``early-nstep``: the resume at 5-15% of a run of 40-4000 steps (at least 2 logged
  points before it, at least 3 after: an N-step run is then at least ~67 steps long with L=5, ~134
  with L=10);
- ``mid``: the resume at 30-80%, logging every 1, 5 or 10 steps;
- ``dpo-1step`` / ``dpo-nstep``: TRL DPOTrainer: ``train/rewards/{chosen,rejected,margins,accuracies}``,
  ``train/loss``, ``train/learning_rate``, ``train/grad_norm``, ``train/epoch`` (no KL), simulated per
  sample (batch 8-64): the per-sample margin grows from 0 (chosen slightly up or down, rejected down),
  accuracy (strict ``>``) from 0 towards 0.6-0.98, the sigmoid loss from ln 2 down; a buggy resume
  resets them all (exactly 0 / 0 / ln 2 at the first step after the resume with 1-step logging), and
  they regrow like the opening.

Healthy runs cycle through: a plain healthy resume; a healthy resume where the KL (margin) dips 30%
at the resume and recovers over a few steps; eval pauses (no resume: 1-3 evaluations, each a clock gap
of 5-40 minutes with ``eval/*`` logged, in the same event file); a KL penalty of 0 throughout (``beta``
0, ``train/kl`` logged as 0.0; GRPO profiles only). A quarter of the other runs, buggy ones included,
also get eval pauses. Declared ``sync_ref_model`` syncs are not generated (the ``args`` text carries
TRL's defaults, ``sync_ref_model: false``).

Scored per run, from the report: a buggy run is caught when the boundary at its resume (the one nearest
the first step logged after it) is judged ``reference_reset``; a healthy run is a false alarm when any of
its boundaries is; a ``reference_reset`` at another boundary of a buggy run (an eval pause) is counted as
a false alarm too. A table per profile is printed (and written as JSON with ``--json``), then every miss
and false alarm with the run's seed, length, resume step, logging interval and klwatch's verdict and
explanation. Not a test: no assertions, but the exit code is 1 when any false alarm happened (2 when a
scan failed), so CI can run it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fleet import tfrecord  # noqa: E402  (TFRecord framing with masked CRC-32C, as TensorBoard writes it)
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2  # noqa: E402

KLWATCH = [sys.executable, "-m", "klwatch.cli"]
LN2 = math.log(2.0)


@dataclass(frozen=True)
class Profile:
    kind: str  # grpo | dpo
    intervals: tuple[int, ...]
    where: tuple[float, float]  # the resume, as a fraction of the run
    lengths: tuple[int, int]  # run length, log-uniform


PROFILES: dict[str, Profile] = {
    "grpo-1step": Profile("grpo", (1,), (0.10, 0.90), (60, 3000)),
    "grpo-nstep": Profile("grpo", (5, 10), (0.10, 0.90), (100, 3000)),
    "early-1step": Profile("grpo", (1,), (0.05, 0.15), (40, 4000)),
    "early-nstep": Profile("grpo", (5, 10), (0.05, 0.15), (40, 4000)),
    "mid": Profile("grpo", (1, 5, 10), (0.30, 0.80), (60, 3000)),
    "dpo-1step": Profile("dpo", (1,), (0.10, 0.90), (60, 3000)),
    "dpo-nstep": Profile("dpo", (5, 10), (0.10, 0.90), (100, 3000)),
}
HEALTHY_VARIANTS = {"grpo": ("healthy", "dip", "eval_pause", "kl_zero"), "dpo": ("healthy", "dip", "eval_pause")}


@dataclass
class RunSpec:
    """One training run: its structure (what the report is matched against) and the seed of the rest."""

    name: str
    profile: str
    kind: str  # grpo | dpo
    variant: str  # reset | healthy | dip | eval_pause | kl_zero
    buggy: bool
    seed: int
    length: int
    interval: int  # logging_steps
    resumes: list[int] = field(default_factory=list)  # checkpoint steps the launches resumed from
    resets: list[int] = field(default_factory=list)  # those of them where the reference was rebuilt
    overshoot: list[int] = field(default_factory=list)  # steps the crashed launch ran past each checkpoint
    evals: list[int] = field(default_factory=list)  # steps followed by an evaluation pause
    params: dict = field(default_factory=dict)  # curve, noise, schedule (filled when written)

    def first_logged_after(self, c: int) -> int:
        """The first step the launch resumed from checkpoint ``c`` logs (its next multiple of L)."""
        return (c // self.interval + 1) * self.interval


# ---------------------------------------------------------------------------------------------- specs


def draw_resume(rng: np.random.Generator, prof: Profile, interval: int) -> tuple[int, int]:
    """A run length and a resume step in the profile's range, with >= 2 logged points before the
    resume and >= 3 after (lengths are redrawn until that fits)."""
    lo, hi = prof.lengths
    for _ in range(10_000):
        n = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        c = int(round(rng.uniform(*prof.where) * n))
        if interval > 1 and rng.random() < 0.7:
            c = max(interval, int(round(c / interval)) * interval)
        if max(2, 2 * interval) <= c <= n - 3 * interval and c <= n - 3:
            return n, c
    raise RuntimeError(f"no run length fits {prof}")


def make_specs(profile: str, runs: int, seed: int) -> list[RunSpec]:
    prof = PROFILES[profile]
    base = np.random.default_rng([seed, list(PROFILES).index(profile)])
    n_buggy = (runs + 1) // 2
    healthy = HEALTHY_VARIANTS[prof.kind]
    variants = ["reset"] * n_buggy + [healthy[i % len(healthy)] for i in range(runs - n_buggy)]
    order = base.permutation(runs)  # folder names say nothing about the run
    specs = []
    for k, i in enumerate(order):
        variant = variants[i]
        run_seed = int(seed * 1_000_000 + list(PROFILES).index(profile) * 10_000 + k)
        rng = np.random.default_rng(run_seed)
        interval = int(rng.choice(prof.intervals))
        n, c = draw_resume(rng, prof, interval)
        spec = RunSpec(name=f"run-{k:04d}", profile=profile, kind=prof.kind, variant=variant,
                       buggy=variant == "reset", seed=run_seed, length=n, interval=interval)
        if variant != "eval_pause":
            spec.resumes = [c]
            spec.resets = [c] if variant in ("reset", "kl_zero") else []
            spec.overshoot = [0 if rng.random() < 0.5 else int(rng.integers(1, max(2, min(50, n // 10, n - c - 3))))]
        if variant == "eval_pause" or rng.random() < 0.25:
            spec.evals = eval_steps(rng, n, spec.resumes)
        specs.append(spec)
    return specs


def eval_steps(rng: np.random.Generator, n: int, resumes: list[int]) -> list[int]:
    """1-3 evaluations at a fixed period (``eval_steps``), none right at a resume."""
    count = int(rng.integers(1, 4))
    period = max(2, n // (count + 1))
    return [e for e in range(period, n - 1, period) if all(abs(e - c) > 2 for c in resumes)][:count]


# ----------------------------------------------------------------------------------------- the curves


def lr_factors(n: int, warmup: int, decay: str) -> tuple[np.ndarray, np.ndarray]:
    """HF schedules: ``used[t-1]`` the lr factor of the update made at step t (lr_lambda(t-1): 0 at the
    first update under warm-up), ``logged[s-1]`` the one the trainer logs after step s (lr_lambda(s))."""
    x = np.arange(0, n + 1, dtype=float)
    lam = np.ones_like(x)
    if warmup > 0:
        lam = np.where(x < warmup, x / warmup, 1.0)
    rest = np.clip((x - warmup) / max(1, n - warmup), 0.0, 1.0)
    if decay == "linear":
        lam = np.where(x < warmup, lam, 1.0 - rest)
    elif decay == "cosine":
        lam = np.where(x < warmup, lam, 0.5 * (1 + np.cos(np.pi * rest)))
    return lam[:n], lam[1:]


def shape_fn(shape: str, p: np.ndarray, scale: float) -> np.ndarray:
    if shape == "satexp":
        return 1.0 - np.exp(-p / scale)
    if shape == "linplateau":
        return np.minimum(1.0, p / scale)
    return np.sqrt(p / scale)


def smooth_wander(rng: np.random.Generator, n: int, sd: float, corr: float) -> np.ndarray:
    """exp of an AR(1) walk: a slow multiplicative drift of the curve, a function of the step."""
    phi = math.exp(-1.0 / corr)
    e = rng.normal(0.0, sd * math.sqrt(1 - phi * phi), n)
    out = np.empty(n)
    acc = rng.normal(0.0, sd)
    for i in range(n):
        acc = phi * acc + e[i]
        out[i] = acc
    return np.exp(out)


class Curves:
    """A run's hidden quantities (drawn once from its seed), from which every launch is computed."""

    def __init__(self, spec: RunSpec, rng: np.random.Generator) -> None:
        n = spec.length
        self.n = n
        warm = rng.random() < 0.4
        self.warmup = int(max(1, round(rng.uniform(0.03, 0.10) * n))) if warm else 0
        self.decay = str(rng.choice(["constant", "linear", "cosine"]))
        self.used, self.logged_lr = lr_factors(n, self.warmup, self.decay)
        self.cum = np.concatenate([[0.0], np.cumsum(self.used)])  # cum[t]: progress after t updates
        self.shape = str(rng.choice(["satexp", "linplateau", "sqrt"]))
        lo, hi = {"satexp": (0.03, 0.5), "linplateau": (0.1, 0.7), "sqrt": (0.5, 1.5)}[self.shape]
        self.scale = max(2.0, rng.uniform(lo, hi) * n)
        self.noise = float(rng.uniform(0.05, 0.30))
        self.wander = smooth_wander(rng, n + 1, 0.08, max(5.0, n / 20))
        self.lr_max = float(rng.choice([1e-6, 3e-6, 5e-7, 1e-5]))
        self.step_seconds = float(rng.uniform(4, 60))
        self.round_loss = bool(rng.random() < 0.5)  # some transformers versions log round(loss, 4)
        self.steps_per_epoch = int(rng.integers(max(2, n // 4), 2 * n + 2))
        spec.params = dict(shape=self.shape, scale=round(self.scale, 1), noise=round(self.noise, 3),
                           warmup=self.warmup, decay=self.decay)

    def progress(self, steps: np.ndarray, ref: int) -> np.ndarray:
        """The progress of the policy that computes step s's loss (after s-1 updates) since the
        reference was taken after ``ref`` updates."""
        return self.cum[steps - 1] - self.cum[ref]

    def f(self, steps: np.ndarray, ref: int) -> np.ndarray:
        return shape_fn(self.shape, np.maximum(self.progress(steps, ref), 0.0), self.scale) * self.wander[steps]

    def jitter(self, rng: np.random.Generator, k: int) -> np.ndarray:
        return np.exp(rng.normal(0.0, self.noise, k) - self.noise ** 2 / 2)


def dip_factor(spec: RunSpec, steps: np.ndarray, start: int, rng: np.random.Generator) -> np.ndarray:
    """A healthy resume whose KL happens to dip 30% at the resume, recovering over a few steps."""
    decay = rng.uniform(1.0, max(2.0, 3.0 * spec.interval))
    return 1.0 - 0.3 * np.exp(-(steps - start) / decay)


def grpo_steps(spec: RunSpec, cv: Curves, steps: np.ndarray, ref: int, rng: np.random.Generator,
               hyper: dict, dip: np.ndarray | None) -> dict[str, np.ndarray]:
    """Per-step values of one launch (before TRL averages them into logged points)."""
    k = len(steps)
    kl = hyper["K"] * cv.f(steps, ref) * cv.jitter(rng, k)
    if dip is not None:
        kl = kl * dip
    if hyper["beta"] == 0.0:
        kl = np.zeros(k)
    prog = cv.cum[steps - 1] / max(1.0, cv.cum[-1])  # the policy's own progress: continues across resumes
    reward = hyper["r0"] + (hyper["r1"] - hyper["r0"]) * (1 - np.exp(-4 * prog)) + rng.normal(0, 0.05, k)
    return {
        "train/kl": kl,
        "train/loss": hyper["beta"] * kl + rng.normal(0.0, 0.002, k),  # GRPO's loss is about beta * KL
        "train/reward": reward,
        "train/reward_std": np.abs(0.3 + rng.normal(0, 0.05, k)),
        "train/entropy": 0.6 * np.exp(-prog) + 0.2 + rng.normal(0, 0.02, k),
        "train/grad_norm": hyper["g"] * np.exp(rng.normal(0, 0.3, k)),
    }


def dpo_steps(spec: RunSpec, cv: Curves, steps: np.ndarray, ref: int, rng: np.random.Generator,
              hyper: dict, dip: np.ndarray | None) -> dict[str, np.ndarray]:
    """Per-step values of a DPO launch, each the mean over a batch of per-sample implicit rewards."""
    k, b = len(steps), hyper["batch"]
    f = cv.f(steps, ref)
    mu = hyper["M"] * f * cv.jitter(rng, k)
    sd = hyper["D"] * np.sqrt(f)
    z = rng.normal(0.0, 1.0, (k, b))
    m = mu[:, None] + sd[:, None] * z
    e = 0.2 * sd[:, None] * rng.normal(0.0, 1.0, (k, b))
    if dip is not None:
        m, e = m * dip[:, None], e * dip[:, None]
    chosen = hyper["c"] * m + e
    rejected = chosen - m
    sig = 1.0 / (1.0 + np.exp(m))  # sigmoid(-m): the weight of each sample's gradient
    return {
        "train/rewards/chosen": chosen.mean(1),
        "train/rewards/rejected": rejected.mean(1),
        "train/rewards/margins": m.mean(1),
        "train/rewards/accuracies": (m > 0).mean(1),
        "train/loss": np.logaddexp(0.0, -m).mean(1),  # sigmoid loss, ln 2 where policy == reference
        "train/grad_norm": hyper["g"] * 2 * sig.mean(1) * np.exp(rng.normal(0, 0.2, k)),
    }


def window_means(values: np.ndarray, steps: np.ndarray, logs: np.ndarray, start: int) -> np.ndarray:
    """TRL's logged points: the mean of the per-step values since the last log (the launch's start
    for its first log)."""
    cs = np.concatenate([[0.0], np.cumsum(values)])
    hi = logs - start + 1
    lo = np.concatenate([[0], hi[:-1]])
    return (cs[hi] - cs[lo]) / (hi - lo)


# -------------------------------------------------------------------------------------- event files


def _event(step: int, wall: float, items: list[tuple[str, float]]) -> bytes:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in items])
    return tfrecord(event_pb2.Event(step=step, wall_time=wall, summary=summary).SerializeToString())


def _text_event(tag: str, text: str, wall: float) -> bytes:
    """``SummaryWriter.add_text`` (what the HF TensorBoardCallback writes for its ``args``)."""
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()],
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto(
                                        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
    value = summary_pb2.Summary.Value(tag=f"{tag}/text_summary", metadata=meta, tensor=tensor)
    return tfrecord(event_pb2.Event(step=0, wall_time=wall, summary=summary_pb2.Summary(value=[value]))
                    .SerializeToString())


def hf_args(spec: RunSpec, cv: Curves, hyper: dict, folder: Path) -> str:
    args = {
        "output_dir": f"/ckpt/{spec.name}", "logging_dir": f"/ckpt/{spec.name}/tb", "run_name": spec.name,
        "logging_strategy": "steps", "logging_steps": spec.interval, "logging_first_step": False,
        "save_strategy": "steps", "save_steps": 50, "eval_strategy": "steps" if spec.evals else "no",
        "eval_steps": (spec.evals[0] if spec.evals else None), "max_steps": spec.length,
        "learning_rate": cv.lr_max, "lr_scheduler_type": cv.decay,
        "warmup_steps": cv.warmup, "seed": 42, "bf16": True, "report_to": ["tensorboard"],
        "per_device_train_batch_size": hyper.get("batch", 8), "gradient_accumulation_steps": 1,
        "beta": hyper["beta"], "sync_ref_model": False, "ref_model_sync_steps": 512 if spec.kind == "grpo" else 64,
        "ref_model_mixup_alpha": 0.6 if spec.kind == "grpo" else 0.9,
    }
    if spec.kind == "grpo":
        args.update(num_generations=8, max_completion_length=512, num_iterations=1, loss_type="dapo")
    else:
        args.update(loss_type="sigmoid", label_smoothing=0.0, max_length=1024)
    return json.dumps(args, indent=2)


def write_run(root: Path, spec: RunSpec, *, lean: bool = False, batched: bool = False) -> list[Path]:
    """Write one run's event files (one per launch) under ``root/spec.name``. ``lean``: only the KL,
    loss, reward, grad norm and lr (GRPO); ``batched``: one event per logged step holding every tag
    (faster to write and read; the HF writer puts one tag per event)."""
    rng = np.random.default_rng(spec.seed + 7)
    cv = Curves(spec, rng)
    n, L = spec.length, spec.interval
    folder = root / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    if spec.kind == "grpo":
        hyper = dict(K=float(math.exp(rng.uniform(math.log(0.003), math.log(0.3)))),
                     beta=0.0 if spec.variant == "kl_zero" else float(rng.choice([0.01, 0.04, 0.1])),
                     r0=float(rng.uniform(0.0, 0.3)), r1=float(rng.uniform(0.4, 0.9)),
                     g=float(rng.uniform(0.05, 1.0)))
    else:
        acc_max = float(rng.uniform(0.6, 0.98))
        r = _norm_ppf(acc_max)  # margin / spread of the per-sample margins at the plateau
        D = float(rng.uniform(0.4, 1.0)) * _loss_min_spread(r)  # the loss falls from ln 2 all the way up
        hyper = dict(M=D * r, D=D, c=float(rng.uniform(-0.4, 0.4)),
                     batch=int(rng.choice([8, 16, 32, 64])), beta=float(rng.choice([0.05, 0.1, 0.5])),
                     g=float(rng.uniform(1.0, 20.0)), acc_max=acc_max)
    spec.params.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in hyper.items()})
    per_step = grpo_steps if spec.kind == "grpo" else dpo_steps
    averaged_point = {"train/learning_rate", "train/epoch", "train/grad_norm"}  # HF logs these as of the step
    eval_seconds = rng.uniform(300, 2400)
    host, wall, ref = f"node-{rng.integers(100):02d}", 1.7e9 + float(rng.uniform(0, 3e7)), 0
    starts = [1] + [c + 1 for c in spec.resumes]
    ends = [c + o for c, o in zip(spec.resumes, spec.overshoot)] + [n]
    paths = []
    for k, (a, b) in enumerate(zip(starts, ends)):
        if k and spec.resumes[k - 1] in spec.resets:
            ref = spec.resumes[k - 1]  # the reference rebuilt from the resumed weights
        launch = wall
        steps = np.arange(a, b + 1)
        dip = dip_factor(spec, steps, a, rng) if (k and spec.variant == "dip") else None
        values = per_step(spec, cv, steps, ref, rng, hyper, dip)
        logs = steps[steps % L == 0]
        logged = {t: window_means(v, steps, logs, a) for t, v in values.items() if t not in averaged_point}
        if "train/grad_norm" in values:
            logged["train/grad_norm"] = values["train/grad_norm"][logs - a]
        logged["train/learning_rate"] = cv.lr_max * cv.logged_lr[logs - 1]
        logged["train/epoch"] = logs / cv.steps_per_epoch
        if cv.round_loss:
            logged["train/loss"] = np.round(logged["train/loss"], 4)
        if lean:
            keep = ("train/kl", "train/loss", "train/reward", "train/grad_norm", "train/learning_rate",
                    "train/rewards/chosen", "train/rewards/rejected", "train/rewards/margins",
                    "train/rewards/accuracies")
            logged = {t: v for t, v in logged.items() if t in keep}
        # the clock: setup, then steps of about step_seconds; an eval after the steps in spec.evals
        dt = cv.step_seconds * np.exp(rng.normal(0, 0.1, len(steps)))
        pause = np.array([eval_seconds * rng.uniform(0.9, 1.1) if s in spec.evals else 0.0 for s in steps])
        done = launch + rng.uniform(60, 600) + np.cumsum(dt) + np.concatenate([[0.0], np.cumsum(pause)[:-1]])
        pid = int(rng.integers(1000, 99999))
        path = folder / f"events.out.tfevents.{int(launch)}.{host}.{pid}.0"
        out = [tfrecord(event_pb2.Event(wall_time=launch, file_version="brain.Event:2").SerializeToString())]
        if not lean:
            out.append(_text_event("args", hf_args(spec, cv, hyper, folder), launch + 1.0))
        tags = list(logged)
        columns = [logged[t].tolist() for t in tags]
        for j, s in enumerate(logs.tolist()):
            w = float(done[s - a])
            if batched:
                out.append(_event(s, w, [(t, col[j]) for t, col in zip(tags, columns)]))
            else:
                for i, (t, col) in enumerate(zip(tags, columns)):
                    out.append(_event(s, w + 1e-4 * i, [(t, col[j])]))
            if s in spec.evals:
                ev = [("eval/loss", float(columns[tags.index("train/loss")][j]) * 1.05)]
                if "train/rewards/margins" in logged:
                    ev.append(("eval/rewards/margins", float(logged["train/rewards/margins"][j]) * 0.9))
                elif not lean:
                    ev.append(("eval/reward", float(logged["train/reward"][j]) * 0.95))
                for i, item in enumerate(ev):
                    out.append(_event(s, w + eval_seconds + 1e-4 * i, [item]))
        if k == len(starts) - 1 and not lean:  # the end of training: HF's summary log
            w = float(done[-1]) + 1.0
            runtime = w - launch
            for i, (t, v) in enumerate([("train/train_runtime", runtime), ("train/train_samples_per_second", 1.0),
                                        ("train/train_steps_per_second", 1.0 / cv.step_seconds),
                                        ("train/total_flos", 1e18), ("train/train_loss", 0.1)]):
                out.append(_event(n, w + 1e-4 * i, [(t, float(v))]))
        path.write_bytes(b"".join(out))
        paths.append(path)
        wall = float(done[-1]) + rng.uniform(120, 6 * 3600)  # the crash, the queue, the next launch
    return paths


def _loss_min_spread(r: float) -> float:
    """The spread D of per-sample margins N(D*r, D^2) at which the mean sigmoid loss is lowest (capped
    at 6): below it the loss falls monotonically as the margin and its spread grow together."""
    z = np.random.default_rng(0).normal(0.0, 1.0, 20_000)
    grid = np.linspace(0.05, 6.0, 120)
    loss = [np.logaddexp(0.0, -d * (r + z)).mean() for d in grid]
    return float(grid[int(np.argmin(loss))])


def _norm_ppf(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


# ------------------------------------------------------------------------------------------- scoring


def run_scan(root: Path, report: Path, *, jobs: int = 2) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    done = subprocess.run([*KLWATCH, "scan", str(root), "--format", "json", "-o", str(report),
                           "--jobs", str(jobs), "--no-cache"], capture_output=True, text=True)
    return time.perf_counter() - t0, done.returncode, done.stderr[-3000:]


def boundaries_by_run(report: dict) -> tuple[dict[str, list[dict]], dict[str, list[str]], dict[str, list[str]]]:
    """Each run folder's boundaries (with their lineage's status), the statuses of its lineages, and
    the lineages that join several run folders (a stitching mistake)."""
    out: dict[str, list[dict]] = {}
    status: dict[str, list[str]] = {}
    merged: dict[str, list[str]] = {}
    for lin in report.get("lineages", []):
        folders = sorted({Path(m["ref"]).parts[0] for m in lin.get("members", []) if m.get("ref")})
        if len(folders) > 1:
            merged[lin.get("name") or lin.get("id")] = folders
        for f in folders:
            status.setdefault(f, []).append(lin.get("status"))
            for b in lin.get("boundaries", []):
                out.setdefault(f, []).append({**b, "lineage_status": lin.get("status")})
    return out, status, merged


def match_resume(spec: RunSpec, c: int, bounds: list[dict]) -> dict | None:
    """The boundary that stands for the resume from checkpoint ``c``: nearest the first step the
    resumed launch logs, within a logging interval or two."""
    first = spec.first_logged_after(c)
    near = [b for b in bounds if c + 1 - 2 * spec.interval <= b["step"] <= first + 2 * spec.interval
            or b.get("resumed_from_step") == c]
    return min(near, key=lambda b: abs(b["step"] - first)) if near else None


def score(specs: list[RunSpec], report: dict) -> dict:
    bounds, statuses, merged = boundaries_by_run(report)
    res = dict(runs=len(specs), buggy=0, caught=0, buggy_inconclusive=0, buggy_ok=0, buggy_no_boundary=0,
               healthy=0, false_alarms=0, healthy_boundaries=0, healthy_ok=0, healthy_inconclusive=0,
               healthy_other=0, healthy_runs_without_boundary=0, healthy_status={}, healthy_by_variant={},
               merged_lineages=merged,
               misses=[], alarms=[])
    for spec in specs:
        got = bounds.get(spec.name, [])
        row = dict(profile=spec.profile, name=spec.name, seed=spec.seed, variant=spec.variant, length=spec.length,
                   interval=spec.interval, resumes=spec.resumes, overshoot=spec.overshoot, evals=spec.evals,
                   params=spec.params, lineage_status=statuses.get(spec.name))
        at_resumes = {c: match_resume(spec, c, got) for c in spec.resumes}
        matched = {id(b) for b in at_resumes.values() if b is not None}
        if spec.buggy:
            res["buggy"] += 1
            c = spec.resets[0]
            b = at_resumes[c]
            verdict = b["verdict"] if b else None
            if verdict == "reference_reset":
                res["caught"] += 1
            else:
                res["buggy_inconclusive" if verdict == "inconclusive" else
                    "buggy_ok" if verdict == "ok" else "buggy_no_boundary"] += 1
                res["misses"].append({**row, "resume_step": c, "boundary": _short(b),
                                      "all_boundaries": [_short(x) for x in got]})
            for x in got:  # a reset judged where the run had none (an eval pause of a buggy run)
                if id(x) not in matched and x["verdict"] == "reference_reset":
                    res["false_alarms"] += 1
                    res["alarms"].append({**row, "resume_step": None, "boundary": _short(x),
                                          "where": "non-resume boundary of a buggy run"})
            continue
        res["healthy"] += 1
        for st in statuses.get(spec.name, ["(no lineage)"]):
            res["healthy_status"][st] = res["healthy_status"].get(st, 0) + 1
        if not got:
            res["healthy_runs_without_boundary"] += 1
        alarmed = [x for x in got if x["verdict"] == "reference_reset"]
        per = res["healthy_by_variant"].setdefault(spec.variant, {"runs": 0})
        per["runs"] += 1
        for x in got:
            res["healthy_boundaries"] += 1
            key = {"ok": "healthy_ok", "inconclusive": "healthy_inconclusive"}.get(x["verdict"], "healthy_other")
            res[key] += 1
            per[x["verdict"]] = per.get(x["verdict"], 0) + 1
        if alarmed:
            res["false_alarms"] += 1
            for x in alarmed:
                res["alarms"].append({**row, "resume_step": spec.resumes[0] if spec.resumes else None,
                                      "boundary": _short(x), "where": "healthy run"})
    return res


def _short(b: dict | None) -> dict | None:
    if b is None:
        return None
    return {k: b.get(k) for k in ("step", "resumed_from_step", "verdict", "score", "kl_before", "kl_after",
                                  "evidence", "explanation", "lineage_status")}


# ---------------------------------------------------------------------------------------------- main


def sweep_profile(profile: str, *, runs: int, seed: int, workdir: Path) -> dict:
    root = workdir / profile / "runs"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    t0 = time.perf_counter()
    specs = make_specs(profile, runs, seed)
    files = sum(len(write_run(root, s)) for s in specs)
    gen = time.perf_counter() - t0
    (workdir / profile / "manifest.json").write_text(json.dumps([asdict(s) for s in specs], indent=1))
    report_path = workdir / profile / "report.json"
    took, rc, err = run_scan(root, report_path)
    if rc not in (0, 1, 3) or not report_path.exists():
        return dict(profile=profile, error=f"klwatch scan exited {rc}: {err}", generate_seconds=gen, scan_seconds=took)
    res = score(specs, json.loads(report_path.read_text()))
    res.update(profile=profile, scan_exit=rc, event_files=files, generate_seconds=round(gen, 2),
               scan_seconds=round(took, 2), steps=sum(s.length for s in specs))
    return res


def print_table(results: list[dict]) -> None:
    head = (f"{'profile':<12} {'runs':>4} {'caught':>9} {'false al.':>9} {'bug inc':>7} {'bug ok':>6} {'bug -':>5} "
            f"{'h.bnd ok':>8} {'h.bnd inc':>9} {'h.bnd oth':>9} {'gen s':>6} {'scan s':>6}")
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['profile']:<12} ERROR {r['error'][:200]}")
            continue
        print(f"{r['profile']:<12} {r['runs']:>4} {r['caught']:>4}/{r['buggy']:<4} "
              f"{r['false_alarms']:>4}/{r['healthy']:<4} "
              f"{r['buggy_inconclusive']:>7} {r['buggy_ok']:>6} {r['buggy_no_boundary']:>5} "
              f"{r['healthy_ok']:>8} {r['healthy_inconclusive']:>9} {r['healthy_other']:>9} "
              f"{r['generate_seconds']:>6.1f} {r['scan_seconds']:>6.1f}")
    print("caught: buggy runs judged reference_reset at their resume / buggy runs; false al.: healthy runs with any "
          "reference_reset (+ resets judged at a buggy run's non-resume boundary) / healthy runs;\n"
          "bug inc / ok / -: buggy resumes judged inconclusive / ok / not found as a boundary; "
          "h.bnd: boundaries of healthy runs judged ok / inconclusive / other (intentional)")
    for r in results:
        if "error" in r:
            continue
        extra = f"  healthy lineage statuses: {r['healthy_status']}; healthy runs without a boundary: " \
                f"{r['healthy_runs_without_boundary']}"
        extra += "; healthy boundary verdicts by variant: " + ", ".join(
            f"{v} ({c.pop('runs')} runs) " + (" ".join(f"{k}={n}" for k, n in c.items()) or "none")
            for v, c in ((v, dict(c)) for v, c in sorted(r["healthy_by_variant"].items())))
        if r["merged_lineages"]:
            extra += f"; lineages joining several run folders: {r['merged_lineages']}"
        print(f"{r['profile']}:{extra}")


def print_cases(results: list[dict]) -> None:
    for r in results:
        for kind, rows in (("MISS", r.get("misses", [])), ("FALSE ALARM", r.get("alarms", []))):
            for m in rows:
                b = m["boundary"] or {}
                p = m["params"]
                print(f"\n{kind} {m['profile']} {m['name']} ({m['variant']}) seed={m['seed']} length={m['length']} "
                      f"resume={m['resume_step']} L={m['interval']} overshoot={m['overshoot']} evals={m['evals']}\n"
                      f"  curve={p.get('shape')} scale={p.get('scale')} noise={p.get('noise')} "
                      f"warmup={p.get('warmup')} "
                      f"decay={p.get('decay')} lineage={m['lineage_status']}")
                if b:
                    print(f"  boundary step={b['step']} from={b['resumed_from_step']} verdict={b['verdict']} "
                          f"score={b['score']} kl {b['kl_before']} -> {b['kl_after']} evidence={b['evidence']}\n"
                          f"  {b['explanation']}")
                else:
                    print(f"  no boundary at the resume; boundaries found: "
                          f"{[(x['step'], x['verdict']) for x in m.get('all_boundaries', [])]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs-per-profile", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated, of: " + ", ".join(PROFILES))
    parser.add_argument("--keep", type=Path, help="write (and keep) the runs, manifests and reports here")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    names = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = [p for p in names if p not in PROFILES]
    if unknown:
        parser.error(f"unknown profile(s) {unknown}; known: {list(PROFILES)}")
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="klwatch-sweep-")
    workdir = args.keep or Path(tmp.name)
    results = []
    try:
        for name in names:
            print(f"[{name}] generating {args.runs_per_profile} runs and scanning ...", file=sys.stderr, flush=True)
            results.append(sweep_profile(name, runs=args.runs_per_profile, seed=args.seed, workdir=workdir))
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"\nklwatch reference-reset sweep (seed {args.seed}, {args.runs_per_profile} runs per profile)\n")
    print_table(results)
    print_cases(results)
    if args.json:
        args.json.write_text(json.dumps(dict(seed=args.seed, runs_per_profile=args.runs_per_profile,
                                             profiles=results), indent=1, default=str))
    if any("error" in r for r in results):
        return 2
    return 1 if any(r["false_alarms"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
