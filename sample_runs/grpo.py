"""A genuine, tiny GRPO loop in numpy, with real checkpoints and both resume orderings.

Why it exists: klwatch must be tested on logs that a real mechanism produced, not on curves drawn to
look like the bug. Here the KL(policy ‖ reference) that gets logged is computed against a real frozen
copy of the reference weights, so when the reference is re-snapshotted from resumed weights (the
NeMo-RL DTensorPolicyWorkerV2 ordering) the KL at the first step after the resume really is ~0 and
really grows back, and when it is snapshotted from the base weights it really continues.

The task: a prompt is 2-4 tokens over a vocabulary of 8; the response is 4 tokens; the reward is the
fraction of response positions that follow a rule of the prompt (even positions: first prompt token
shifted by the position; odd positions: the last prompt token). The policy is a linear softmax over
sparse one-hot features of (position × first token, position × last token, previous token, position,
prompt length); it samples autoregressively. Each step samples a group of responses per prompt,
normalises rewards within each group (GRPO advantages), and takes one Adam step per minibatch on
the clipped surrogate plus ``kl_coef`` × the k3 KL estimator against the reference. Before each
minibatch's update it measures, as PPO/GRPO frameworks do, how far the earlier updates of the step
moved the policy from the one that sampled: the k3 approx-KL(old ‖ new) and the clip fraction. That is
the size of the optimizer's step, which is what fresh Adam moments at a resume inflate.

Everything that a resume must carry over is explicit state and goes into the checkpoint: weights,
Adam moments and count, the LR scheduler's step, the data sampler's position, the sampling RNG and
the adaptive KL controller. A fault of issue 6 is planted by *not* restoring one of them.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

Order = Literal["fixed", "buggy"]
LostState = Literal["scheduler", "optimizer", "sampler", "kl_controller"]

VOCAB = 8
RESPONSE_LEN = 4
MIN_PROMPT = 2
MAX_PROMPT = 4
BOS = VOCAB  # index of "no previous token" in the previous-token block
N_FEATURES = 2 * RESPONSE_LEN * VOCAB + (VOCAB + 1) + RESPONSE_LEN + (MAX_PROMPT - MIN_PROMPT + 1) + 1


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run; logged as the run's config (params) by every tracker."""

    total_steps: int = 60
    seed: int = 1234
    base_model_seed: int = 7
    base_model_prior: float = 1.0
    dataset_seed: int = 11
    dataset_size: int = 160
    prompts_per_step: int = 8
    group_size: int = 8
    minibatches: int = 2
    lr: float = 0.012
    warmup_steps: int = 5
    min_lr_ratio: float = 0.2
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    kl_coef: float = 0.05
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    kl_target: float = 0.08
    kl_horizon: int = 400
    save_period: int = 10
    keep_last: int | None = None
    reference_reset_interval: int | None = None
    reference_reset_on_resume: bool = False
    """Re-take the reference at every resume as well (declared in the config, so judged intentional)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "TrainConfig":
        return TrainConfig(**{k: v for k, v in d.items() if k in TrainConfig.__dataclass_fields__})


# ----------------------------------------------------------------------------------------- task


def make_dataset(*, size: int, seed: int) -> list[np.ndarray]:
    """The fixed prompt set (its order is the sampler's business)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(MIN_PROMPT, MAX_PROMPT + 1, size=size)
    return [rng.integers(0, VOCAB, size=int(n)) for n in lengths]


def targets(prompt: np.ndarray) -> np.ndarray:
    """The rule the reward checks: even positions (first + t) mod V, odd positions the last token."""
    t = np.arange(RESPONSE_LEN)
    return np.where(t % 2 == 0, (prompt[0] + t) % VOCAB, prompt[-1])


def reward(prompt: np.ndarray, response: np.ndarray) -> float:
    return float(np.mean(response == targets(prompt)))


def feature_index(first: np.ndarray, last: np.ndarray, length: np.ndarray, t: int, prev: np.ndarray) -> np.ndarray:
    """Indices of the six active one-hot features at response position ``t``, one row per sequence:
    position × first prompt token, position × last prompt token, previous token, position, prompt
    length, bias."""
    n = len(first)
    off1 = RESPONSE_LEN * VOCAB
    off2 = 2 * off1
    off3 = off2 + VOCAB + 1
    off4 = off3 + RESPONSE_LEN
    off5 = off4 + MAX_PROMPT - MIN_PROMPT + 1
    return np.stack([
        t * VOCAB + first,
        off1 + t * VOCAB + last,
        off2 + prev,
        np.full(n, off3 + t),
        off4 + length - MIN_PROMPT,
        np.full(n, off5),
    ], axis=1)


def base_weights(*, seed: int, prior: float) -> np.ndarray:
    """The "pretrained" base model every run starts from and the correct reference anchors to.

    Like a real base model it already half-knows the task (``prior`` logits toward the rule's
    tokens, plus noise), so GRPO sharpens it rather than learning from scratch.
    """
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, 0.35, size=(VOCAB, N_FEATURES))
    for t in range(RESPONSE_LEN):
        for tok in range(VOCAB):
            if t % 2 == 0:
                w[(tok + t) % VOCAB, t * VOCAB + tok] += prior
            else:
                w[tok, RESPONSE_LEN * VOCAB + t * VOCAB + tok] += prior
    return w


def features(idx: np.ndarray) -> np.ndarray:
    """Dense one-hot feature rows for active-feature index rows ``idx`` of shape (n, 6)."""
    x = np.zeros((len(idx), N_FEATURES))
    np.put_along_axis(x, idx, 1.0, axis=1)
    return x


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


# ------------------------------------------------------------------------------- stateful parts


@dataclass
class Adam:
    """Adam with its moments: the state an ``optimizer-reset`` fault loses."""

    m: np.ndarray
    v: np.ndarray
    t: int = 0

    @staticmethod
    def fresh(shape: tuple[int, ...]) -> "Adam":
        return Adam(np.zeros(shape), np.zeros(shape), 0)

    def step(self, w: np.ndarray, g: np.ndarray, *, lr: float, cfg: TrainConfig) -> None:
        self.t += 1
        self.m = cfg.adam_beta1 * self.m + (1 - cfg.adam_beta1) * g
        self.v = cfg.adam_beta2 * self.v + (1 - cfg.adam_beta2) * g * g
        mhat = self.m / (1 - cfg.adam_beta1**self.t)
        vhat = self.v / (1 - cfg.adam_beta2**self.t)
        w -= lr * mhat / (np.sqrt(vhat) + cfg.adam_eps)


@dataclass
class Scheduler:
    """Linear warm-up then cosine decay; its step count is what ``lr-restart`` loses."""

    step_count: int = 0

    def lr(self, cfg: TrainConfig) -> float:
        s = self.step_count
        if s < cfg.warmup_steps:
            return cfg.lr * (s + 1) / cfg.warmup_steps
        span = max(1, cfg.total_steps - cfg.warmup_steps)
        frac = min(1.0, (s - cfg.warmup_steps) / span)
        return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass
class Sampler:
    """Epoch-shuffled prompt order; its position is what ``data-restart`` loses."""

    epoch: int = 0
    cursor: int = 0
    consumed: int = 0

    def next_batch(self, *, cfg: TrainConfig, n_prompts: int) -> np.ndarray:
        if self.cursor + cfg.prompts_per_step > n_prompts:
            self.epoch += 1
            self.cursor = 0
        perm = np.random.default_rng([cfg.seed, self.epoch]).permutation(n_prompts)
        idx = perm[self.cursor : self.cursor + cfg.prompts_per_step]
        self.cursor += cfg.prompts_per_step
        self.consumed += cfg.prompts_per_step
        return idx


@dataclass
class KLController:
    """verl's adaptive KL controller; a fixed one never moves. ``kl-coef-reset`` loses its value."""

    value: float
    kind: str = "fixed"

    @staticmethod
    def fresh(cfg: TrainConfig) -> "KLController":
        return KLController(value=cfg.kl_coef, kind=cfg.kl_ctrl)

    def update(self, *, current_kl: float, n_samples: int, cfg: TrainConfig) -> None:
        if self.kind != "adaptive" or self.value == 0.0:
            return
        err = float(np.clip(current_kl / cfg.kl_target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + err * n_samples / cfg.kl_horizon


@dataclass
class TrainState:
    """All that a checkpoint holds. ``step`` is the last completed step."""

    weights: np.ndarray
    adam: Adam
    scheduler: Scheduler
    sampler: Sampler
    rng: np.random.Generator
    kl_ctrl: KLController
    step: int = 0

    @staticmethod
    def fresh(cfg: TrainConfig) -> "TrainState":
        w = base_weights(seed=cfg.base_model_seed, prior=cfg.base_model_prior)
        return TrainState(
            weights=w,
            adam=Adam.fresh(w.shape),
            scheduler=Scheduler(),
            sampler=Sampler(),
            rng=np.random.default_rng(cfg.seed),
            kl_ctrl=KLController.fresh(cfg),
        )


# ------------------------------------------------------------------------------------ one step


@dataclass
class StepLog:
    """What one training step measured; the trackers rename these to their framework's names."""

    step: int
    kl: float
    approx_kl: float
    clipfrac: float
    loss: float
    pg_loss: float
    reward: float
    entropy: float
    grad_norm: float
    lr: float
    kl_coef: float
    consumed_samples: int
    epoch: float
    prompt_length: float


def _sample(weights: np.ndarray, prompts: list[np.ndarray], *, group: int, rng: np.random.Generator):
    """Sample ``group`` responses per prompt, autoregressively; returns per-token feature indices,
    actions, old log-probs and entropies, token-major arrays of shape (n_seq, L, ...)."""
    seqs = [p for p in prompts for _ in range(group)]
    n = len(seqs)
    feats = np.zeros((n, RESPONSE_LEN, 6), dtype=np.int64)
    actions = np.zeros((n, RESPONSE_LEN), dtype=np.int64)
    logp = np.zeros((n, RESPONSE_LEN))
    ent = np.zeros((n, RESPONSE_LEN))
    first = np.array([p[0] for p in seqs])
    last = np.array([p[-1] for p in seqs])
    length = np.array([len(p) for p in seqs])
    prev = np.full(n, BOS)
    for t in range(RESPONSE_LEN):
        feats[:, t] = feature_index(first, last, length, t, prev)
        lp = log_softmax(features(feats[:, t]) @ weights.T)  # (n, V)
        probs = np.exp(lp)
        u = rng.random(n)
        a = np.minimum((np.cumsum(probs, axis=1) < u[:, None]).sum(axis=1), VOCAB - 1)
        actions[:, t] = a
        logp[:, t] = lp[np.arange(n), a]
        ent[:, t] = -(probs * lp).sum(axis=1)
        prev = a
    return seqs, feats, actions, logp, ent


def _token_logp(weights: np.ndarray, feats: np.ndarray, actions: np.ndarray):
    """Log-probs of the taken actions, the full log-softmax and the features, per token (flattened)."""
    x = features(feats.reshape(-1, feats.shape[-1]))
    a = actions.reshape(-1)
    lp = log_softmax(x @ weights.T)
    return lp[np.arange(len(a)), a], lp, x


def train_step(state: TrainState, ref: np.ndarray, *, cfg: TrainConfig, dataset: list[np.ndarray]) -> StepLog:
    """One GRPO step: sample groups, group-normalise advantages, one Adam step per minibatch."""
    idx = state.sampler.next_batch(cfg=cfg, n_prompts=len(dataset))
    prompts = [dataset[i] for i in idx]
    seqs, feats, actions, old_logp, ent = _sample(state.weights, prompts, group=cfg.group_size, rng=state.rng)
    rewards = np.array([reward(p, a) for p, a in zip(seqs, actions)])
    grouped = rewards.reshape(len(prompts), cfg.group_size)
    adv = ((grouped - grouped.mean(axis=1, keepdims=True)) / (grouped.std(axis=1, keepdims=True) + 1e-4)).reshape(-1)

    lr = state.scheduler.lr(cfg)
    beta = state.kl_ctrl.value
    kls, approx_kls, clipfracs, losses, pg_losses, gnorms = [], [], [], [], [], []
    per_mb = len(seqs) // cfg.minibatches
    for mb in range(cfg.minibatches):
        sl = slice(mb * per_mb, (mb + 1) * per_mb)
        f, a = feats[sl], actions[sl]
        logp, lp_full, x = _token_logp(state.weights, f, a)
        ref_logp, _, _ = _token_logp(ref, f, a)
        old = old_logp[sl].reshape(-1)
        A = np.repeat(adv[sl], RESPONSE_LEN)
        log_ratio = logp - old
        ratio = np.exp(log_ratio)
        unclipped = ratio * A
        clipped = np.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * A
        pg_loss = float(-np.mean(np.minimum(unclipped, clipped)))
        d = ref_logp - logp
        k3 = np.exp(d) - d - 1.0
        kl = float(np.mean(k3))
        # d loss / d logp per token, then through the softmax to the logits, then to the weights
        g = np.where(unclipped <= clipped, -A * ratio, 0.0) + beta * (1.0 - np.exp(d))
        g /= len(g)
        probs = np.exp(lp_full)
        dlogits = -probs * g[:, None]
        dlogits[np.arange(len(g)), a.reshape(-1)] += g
        grad = dlogits.T @ x
        gnorm = float(np.sqrt((grad * grad).sum()))
        if gnorm > cfg.max_grad_norm:
            grad *= cfg.max_grad_norm / gnorm
        state.adam.step(state.weights, grad, lr=lr, cfg=cfg)
        kls.append(kl)
        # how far the earlier minibatches of this step moved the policy (old -> current), measured
        # before this minibatch's update: the first minibatch always sees ratio 1
        approx_kls.append(float(np.mean(ratio - 1.0 - log_ratio)))  # k3 estimate of KL(old || new), >= 0
        clipfracs.append(float(np.mean(np.abs(ratio - 1.0) > cfg.clip_eps)))
        losses.append(pg_loss + beta * kl)
        pg_losses.append(pg_loss)
        gnorms.append(gnorm)

    state.scheduler.step_count += 1
    state.step += 1
    kl_step = float(np.mean(kls)) if beta > 0 else 0.0  # penalty off: the framework logs 0
    state.kl_ctrl.update(current_kl=kl_step, n_samples=len(seqs), cfg=cfg)
    return StepLog(
        step=state.step,
        kl=kl_step,
        approx_kl=float(np.mean(approx_kls)),
        clipfrac=float(np.mean(clipfracs)),
        loss=float(np.mean(losses)),
        pg_loss=float(np.mean(pg_losses)),
        reward=float(rewards.mean()),
        entropy=float(ent.mean()),
        grad_norm=float(np.mean(gnorms)),
        lr=lr,
        kl_coef=beta,
        consumed_samples=state.sampler.consumed,
        epoch=state.sampler.consumed / len(dataset),
        prompt_length=float(np.mean([len(p) for p in prompts])),
    )


# ------------------------------------------------------------------------------- checkpointing


def save_checkpoint(state: TrainState, *, root: Path, cfg: TrainConfig) -> Path:
    """NeMo-RL-like ``step_N/`` folder, written to a temporary name and renamed when complete."""
    final = root / f"step_{state.step}"
    tmp = root / f"tmp_step_{state.step}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "policy").mkdir(parents=True)
    np.savez(tmp / "policy" / "weights.npz", weights=state.weights)
    np.savez(tmp / "policy" / "optimizer.npz", m=state.adam.m, v=state.adam.v, t=np.int64(state.adam.t))
    train_state = {
        "scheduler": {"step_count": state.scheduler.step_count},
        "sampler": asdict(state.sampler),
        "rng": state.rng.bit_generator.state,
        "kl_controller": asdict(state.kl_ctrl),
    }
    (tmp / "train_state.json").write_text(json.dumps(train_state))
    info = {
        "step": state.step,
        "total_steps": state.step,
        "consumed_samples": state.sampler.consumed,
        "epoch": state.sampler.epoch,
    }
    (tmp / "training_info.json").write_text(json.dumps(info, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if cfg.keep_last:
        kept = sorted(checkpoint_steps(root))
        for s in kept[: -cfg.keep_last]:
            shutil.rmtree(root / f"step_{s}", ignore_errors=True)
    return final


def checkpoint_steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))


def load_checkpoint(state: TrainState, *, path: Path) -> None:
    """Load every piece of a checkpoint into ``state`` (weights in place: the policy object stays)."""
    w = np.load(path / "policy" / "weights.npz")["weights"]
    state.weights[...] = w
    opt = np.load(path / "policy" / "optimizer.npz")
    state.adam = Adam(opt["m"].copy(), opt["v"].copy(), int(opt["t"]))
    ts = json.loads((path / "train_state.json").read_text())
    state.scheduler = Scheduler(**ts["scheduler"])
    state.sampler = Sampler(**ts["sampler"])
    rng = np.random.default_rng()
    rng.bit_generator.state = ts["rng"]
    state.rng = rng
    state.kl_ctrl = KLController(**ts["kl_controller"])
    state.step = json.loads((path / "training_info.json").read_text())["step"]


# -------------------------------------------------------------------------------------- launch


@dataclass
class LaunchResult:
    """What one process did: the facts the manifest is built from."""

    first_step: int | None = None
    last_step: int | None = None
    resumed_from_step: int | None = None
    reference_from: str = "base"
    """``base`` (snapshot of the base weights), ``checkpoint`` (snapshot of resumed weights: the bug)
    or ``declared-resnapshot`` (the config declares reference resets)."""
    crashed: bool = False
    lost_state: list[str] = field(default_factory=list)
    reference_resets: list[int] = field(default_factory=list)
    """Steps after which the reference was re-snapshotted inside this process (declared interval)."""
    checkpoints_saved: list[int] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)


def launch(
    *,
    cfg: TrainConfig,
    ckpt_root: Path,
    resume_from: int | None,
    stop_after: int | None,
    order: Order,
    lose: list[LostState],
    on_step: Callable[[StepLog], None],
    step_delay: float = 0.0,
) -> LaunchResult:
    """Run one process's share of training: start fresh or resume, train, checkpoint, maybe crash.

    The two resume orderings are literally the two orders of the same three statements.
    """
    dataset = make_dataset(size=cfg.dataset_size, seed=cfg.dataset_seed)
    state = TrainState.fresh(cfg)  # policy = load(base)
    res = LaunchResult(resumed_from_step=resume_from)
    if resume_from is None:
        ref = state.weights.copy()
    elif order == "fixed":
        ref = state.weights.copy()  # ref = copy(policy): a snapshot of the base weights
        load_checkpoint(state, path=ckpt_root / f"step_{resume_from}")
    else:  # NeMo-RL DTensorPolicyWorkerV2: the checkpoint is loaded first, then the reference is taken
        load_checkpoint(state, path=ckpt_root / f"step_{resume_from}")
        ref = state.weights.copy()
        res.reference_from = "checkpoint"
    if resume_from is not None and cfg.reference_reset_on_resume:
        ref = state.weights.copy()  # the config declares reference resets at resume too
        res.reference_from = "declared-resnapshot"
    for part in lose:  # issue-6 faults: one piece of state re-created instead of restored
        if part == "scheduler":
            state.scheduler = Scheduler()
        elif part == "optimizer":
            state.adam = Adam.fresh(state.weights.shape)
        elif part == "sampler":
            state.sampler = Sampler()
        elif part == "kl_controller":
            state.kl_ctrl = KLController.fresh(cfg)
        res.lost_state.append(part)

    last = cfg.total_steps if stop_after is None else min(stop_after, cfg.total_steps)
    while state.step < last:
        log = train_step(state, ref, cfg=cfg, dataset=dataset)
        if res.first_step is None:
            res.first_step = log.step
        res.last_step = log.step
        res.kl.append(log.kl)
        on_step(log)
        if cfg.reference_reset_interval and state.step % cfg.reference_reset_interval == 0:
            ref = state.weights.copy()
            res.reference_resets.append(state.step)
        if cfg.save_period and state.step % cfg.save_period == 0:
            save_checkpoint(state, root=ckpt_root, cfg=cfg)
            res.checkpoints_saved.append(state.step)
        if step_delay:
            time.sleep(step_delay)
    res.crashed = stop_after is not None and stop_after < cfg.total_steps
    return res
