"""What every resume-integrity detector shares: the base class, metric-name matching, and the few
statistics they all lean on (robust step-to-step noise, the run's series before/after a boundary).

A detector is configured once, every parameter an explicit keyword in a frozen config dataclass
(ruptures-style: ``LrScheduleRestart(config=LrScheduleRestartConfig(min_jump=0.3))``), then run on
each judged lineage with ``detect(result)``. Configuration is kept apart from computation so the
dashboard can expose the thresholds and tests can pin them.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np

from ..metrics import flatten
from ..model import Boundary, Finding, Lineage, LineageResult, Series

Severity = Literal["error", "warning", "info"]
C = TypeVar("C")


class FindingDetector(ABC, Generic[C]):
    """One resume-integrity detector. Subclasses set ``name`` and ``config_class`` and implement
    ``detect``; a detector never raises on odd data (it returns no finding instead)."""

    name: ClassVar[str]
    config_class: ClassVar[type]

    def __init__(self, *, config: C | None = None) -> None:
        self.config: C = config if config is not None else self.config_class()

    @abstractmethod
    def detect(self, result: LineageResult) -> list[Finding]:
        """Every finding of this detector on one judged training run."""

    def finding(self, *, step: int | None, severity: Severity, message: str, data: dict[str, Any]) -> Finding:
        return Finding(detector=self.name, step=step, severity=severity, message=message,
                       data={k: _plain(v) for k, v in data.items()})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(config={self.config!r})"


def _plain(v: Any) -> Any:
    """JSON-friendly data: numpy scalars and arrays become Python numbers and lists."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


# ------------------------------------------------------------------------------- metric names


@dataclass(frozen=True)
class MetricFamily:
    """How one quantity is named across frameworks: exact names (best first), then any name that ends
    in one of them after a ``/`` or ``.`` prefix, then a last path component matching ``leaf``."""

    names: tuple[str, ...]
    leaf: str | None = None
    exclude: str | None = None


def find_metrics(names: Sequence[str], *, family: MetricFamily) -> list[str]:
    """The logged names of a family, best first (bookkeeping ``_`` names never count)."""
    names = sorted(n for n in names if not n.startswith("_"))
    excl = re.compile(family.exclude, re.I) if family.exclude else None
    ok = [n for n in names if not (excl and excl.search(n))]
    found: list[str] = [m for m in family.names if m in ok]
    for m in family.names:
        for n in ok:
            if n not in found and (n.endswith("/" + m) or n.endswith("." + m)):
                found.append(n)
    if family.leaf:
        leaf = re.compile(family.leaf, re.I)
        for n in ok:
            if n not in found and leaf.fullmatch(re.split(r"[/.]", n)[-1]):
                found.append(n)
    return found


def find_metric(names: Sequence[str], *, family: MetricFamily) -> str | None:
    found = find_metrics(names, family=family)
    return found[0] if found else None


LR = MetricFamily(
    names=("lr", "train/lr", "actor/lr", "train/learning_rate", "learning_rate", "optim/lr",
           "optimizer/lr", "train/lr_0", "critic/lr"),
    leaf=r"(lr|learning_rate|learning-rate)([-_](pg|group)?_?\d+)?|lr-\w+",
)
GRAD_NORM = MetricFamily(
    names=("grad_norm", "train/grad_norm", "actor/grad_norm", "train/gradient_norm", "gradient_norm",
           "optim/grad_norm", "critic/grad_norm"),
    leaf=r"(global_|total_)?grad(ient)?_?norm(_(mean|avg|total))?",
)
LOSS = MetricFamily(
    names=("loss", "train/loss", "actor/pg_loss", "pg_loss", "actor/loss", "train/policy_loss",
           "policy_loss", "train/pg_loss", "loss/policy_avg"),
    leaf=r"(total_|policy_|pg_|actor_)?loss",
    exclude=r"(kl|entropy|value|vf|critic|aux|val/|eval)",
)
COUNTERS = MetricFamily(
    names=("consumed_samples", "train/consumed_samples", "epoch", "train/epoch", "total_steps",
           "train/total_steps", "consumed_tokens", "train/consumed_tokens", "train/num_samples"),
    leaf=r"consumed_(samples|tokens)|epoch|total_steps|samples_seen|num_samples_seen",
)
PROMPT_LENGTH = MetricFamily(
    names=("prompt_length", "train/prompt_length", "prompt_length/mean", "train/prompt_length/mean",
           "prompt_len", "train/prompt_len", "input_length", "num_prompt_tokens"),
    leaf=r"(mean_|avg_)?prompt_(length|len|tokens)(_(mean|avg))?",
    exclude=r"(max|min|clip)",
)
KL_COEF = MetricFamily(
    names=("actor/kl_coef", "critic/kl_coef", "kl_coef", "train/kl_coef", "objective/kl_coef",
           "kl_ctl", "train/kl_ctl", "kl_coeff", "train/kl_beta"),
    leaf=r"kl_(coef|coeff|ctl|ctrl|ctl_value|beta)",
)


def config_mentions(config: dict[str, Any], *, key: str, value: str) -> str | None:
    """The first flattened ``key=value`` of a run's config where the key's last component matches
    ``key`` and the value (as text) matches ``value``; None when there is none."""
    kre, vre = re.compile(key, re.I), re.compile(value, re.I)
    for k, v in flatten(config).items():
        leaf = re.split(r"[/.]", str(k))[-1]
        if kre.search(leaf) and vre.search(str(v)):
            return f"{k}={v}"
    return None


# ------------------------------------------------------------------------------ series access


def finite(s: Series | None) -> Series | None:
    if s is None:
        return None
    s = s.take(np.isfinite(s.values))
    return s if len(s) else None


def piece_series(lineage: Lineage, name: str) -> list[Series | None]:
    """The series of one metric in every piece (None where a piece does not log it)."""
    return [finite(p.get(name)) for p in lineage.pieces]


def before_after(lineage: Lineage, boundary: Boundary, name: str) -> tuple[Series | None, Series | None]:
    """The metric in the nearest earlier piece that logs it, and in the piece the boundary starts."""
    parts = piece_series(lineage, name)
    k = boundary.piece_index
    after = parts[k] if k < len(parts) else None
    before = next((parts[j] for j in range(k - 1, -1, -1) if parts[j] is not None), None)
    return before, after


def history(lineage: Lineage, boundary: Boundary, name: str) -> Series | None:
    """The metric as a function of step over every piece before the boundary, sorted by step, the
    latest logged value winning where a rewind re-logged a step (what the resumed process restored)."""
    parts = [p for p in piece_series(lineage, name)[: boundary.piece_index] if p is not None]
    if not parts:
        return None
    s = Series.concat(parts)
    # last occurrence of each step wins
    rev_steps = s.steps[::-1]
    _, idx = np.unique(rev_steps, return_index=True)
    keep = len(s) - 1 - idx
    keep.sort()
    out = s.take(keep)
    order = np.argsort(out.steps, kind="stable")
    return out.take(order)


def resumes_with_history(lineage: Lineage, name: str, *,
                         min_before: int) -> Iterator[tuple[Boundary, Series, Series]]:
    """Each resume at which the metric can be judged, with its ``history`` before the resume and its
    values in the piece the resume starts: those where both exist and the history has at least
    ``min_before`` points (too few say nothing about how the run would have continued)."""
    for b in lineage.boundaries:
        hist = history(lineage, b, name)
        _, after = before_after(lineage, b, name)
        if hist is not None and after is not None and len(hist) >= min_before:
            yield b, hist, after


def opening(lineage: Lineage, name: str, *, interval: int) -> Series | None:
    """The metric at the run's very start, when the logs hold it: the first piece, if it begins within
    one logging interval of step 0 or 1."""
    if not lineage.pieces:
        return None
    first = finite(lineage.pieces[0].get(name))
    if first is None or first.steps[0] > max(1, interval):
        return None
    return first


def log_interval(parts: Sequence[Series | None]) -> int:
    """The run's logging cadence in steps (1 for every step, N for every N-th)."""
    diffs = [np.diff(p.steps) for p in parts if p is not None and len(p) > 1]
    d = np.concatenate(diffs) if diffs else np.empty(0)
    d = d[d > 0]
    return max(1, int(np.median(d))) if len(d) else 1


def pooled_diff_noise(parts: Sequence[np.ndarray]) -> float:
    """The step-to-step noise of a series, robust to trends and spikes, pooled over pieces (never
    differencing across a boundary): the MAD of first differences around their median, scaled to a
    Gaussian sigma of one point (a difference adds two noises)."""
    d = [np.diff(p[np.isfinite(p)]) for p in parts if len(p) > 2]
    if not d:
        return float("nan")
    dd = np.concatenate(d)
    return float(np.median(np.abs(dd - np.median(dd))) * 1.4826 / np.sqrt(2.0))


def fmt(x: float | None) -> str:
    """Numbers in messages: three significant digits."""
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:.3g}"
