"""A tiny, real policy-gradient learner with a KL penalty to a frozen reference (numpy only).

Why: the negative cases need KL series that behave the way a healthy RL run's KL does — exactly 0
at the first step (the policy *is* the reference), growing as the policy moves, then fluctuating
around a level set by the penalty — and that come from an actual optimisation whose whole state can
be checkpointed and restored bit for bit, so a correct resume is provably correct.

The learner: a softmax policy over ``n_actions`` logits, the reference a frozen copy of the initial
("base") logits. Each step samples a batch of actions, scores them with a noisy reward whose
preferred action can oscillate (``drift_amp``/``drift_period``: the task pulls the policy back
toward the reference now and then, which makes the KL dip), takes REINFORCE with group-normalised
advantages minus ``kl_coef`` × the exact KL gradient, and one Adam step under a warm-up + cosine LR.
The logged KL is TRL's/NeMo-RL's k3 estimator over the batch, so it is noisy like theirs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PolicyConfig:
    """Everything that defines a training run; two runs with one config are the same run."""

    n_actions: int = 6
    batch: int = 64
    kl_coef: float = 0.05
    lr: float = 0.08
    warmup_steps: int = 6
    total_steps: int = 60
    seed: int = 0
    drift_amp: float = 0.0
    drift_period: float = 12.0
    drift_phase: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


class TinyPolicy:
    """One training run's state: logits, frozen reference, Adam moments, RNG, step counter."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        base = np.random.default_rng(10_000 + config.seed)
        self.reference = base.normal(0.0, 0.3, config.n_actions)  # the "base model"
        self.theta = self.reference.copy()
        self.m = np.zeros(config.n_actions)
        self.v = np.zeros(config.n_actions)
        self.step = 0  # optimizer steps taken
        self.rng = np.random.default_rng(config.seed)
        self._pref = base.normal(0.0, 1.0, config.n_actions)  # what the task rewards

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to 10% (the HF/TRL default shape)."""
        c = self.config
        if step <= c.warmup_steps:
            return c.lr * step / c.warmup_steps
        frac = (step - c.warmup_steps) / max(1, c.total_steps - c.warmup_steps)
        return c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    def train_step(self) -> dict[str, float]:
        """One optimizer step; returns what a framework logs for it (measured before the update)."""
        c = self.config
        self.step += 1
        p = _softmax(self.theta)
        q = _softmax(self.reference)
        wave = c.drift_amp * math.sin(2 * math.pi * self.step / c.drift_period + c.drift_phase)
        pref = self._pref * (1.0 - wave)  # wave near 1: the task wants the reference back
        actions = self.rng.choice(c.n_actions, size=c.batch, p=p)
        rewards = pref[actions] + self.rng.normal(0.0, 0.5, c.batch)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        onehot = np.eye(c.n_actions)[actions]
        pg = (adv[:, None] * (onehot - p)).mean(axis=0)
        log_ratio = np.log(p) - np.log(q)
        kl_exact = float((p * log_ratio).sum())
        kl_grad = p * (log_ratio - kl_exact)
        grad = pg - c.kl_coef * kl_grad  # ascent direction
        r = q[actions] / p[actions]
        kl_k3 = float(np.mean(r - 1.0 - np.log(r)))
        lr = self.lr_at(self.step)
        self.m = 0.9 * self.m + 0.1 * grad
        self.v = 0.999 * self.v + 0.001 * grad**2
        m_hat = self.m / (1 - 0.9**self.step)
        v_hat = self.v / (1 - 0.999**self.step)
        self.theta = self.theta + lr * m_hat / (np.sqrt(v_hat) + 1e-8)
        pg_loss = float(-(adv * np.log(p[actions])).mean())
        return {
            "kl": kl_k3,
            "loss": pg_loss + c.kl_coef * kl_k3,
            "reward": float(rewards.mean()),
            "learning_rate": lr,
            "grad_norm": float(np.linalg.norm(grad)),
            "entropy": float(-(p * np.log(p)).sum()),
        }

    def evaluate(self, n: int = 512) -> dict[str, float]:
        """Greedy-free evaluation: the expected task reward under the current policy."""
        p = _softmax(self.theta)
        return {"reward": float((p * self._pref).sum()), "accuracy": float(p[np.argmax(self._pref)])}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: weights, optimizer moments, step and RNG (not the reference:
        a correct resume rebuilds the reference from the base model, never from the checkpoint)."""
        return {"theta": self.theta.tolist(), "m": self.m.tolist(), "v": self.v.tolist(),
                "step": self.step, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.theta = np.asarray(state["theta"], dtype=float)
        self.m = np.asarray(state["m"], dtype=float)
        self.v = np.asarray(state["v"], dtype=float)
        self.step = int(state["step"])
        self.rng.bit_generator.state = state["rng"]


def trajectory(config: PolicyConfig) -> list[dict[str, float]]:
    """The whole run in memory (no logging): used to plan where a process stops."""
    policy = TinyPolicy(config)
    return [policy.train_step() for _ in range(config.total_steps)]
