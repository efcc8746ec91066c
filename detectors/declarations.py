"""Reference updates a run declares on purpose, read as each framework means them.

A boundary whose KL drop a declared schedule explains is ``intentional`` (SPEC), never
``reference_reset``. A declaration is read from the keys a framework actually uses, with their
meaning: a switch, a period, a mixing weight, and whether the boundary's step is one the schedule
touches. A key whose name merely contains "ref" and "sync" declares nothing: TRL logs
``ref_model_sync_steps: 512`` and ``ref_model_mixup_alpha: 0.6`` in every config, with syncing off.

Read here:

- **TRL** (``GRPOConfig``, ``DPOConfig``, ``RLOOConfig``): only ``sync_ref_model: true`` turns syncing on;
  then after every ``ref_model_sync_steps`` optimizer steps the reference becomes
  ``alpha * policy + (1 - alpha) * reference`` with ``alpha = ref_model_mixup_alpha``
  (``SyncRefModelCallback.on_step_end``), so the KL falls fully only when alpha is 1. ``beta: 0``
  means there is no reference at all.
- **klwatch's own keys**, for any framework (log them in the run's config, nested or dotted):
  ``klwatch.reference_reset_interval`` (N: the reference is re-taken after every N steps),
  ``klwatch.reference_reset_offset`` (k: ... after steps k, k + N, ...), ``klwatch.reference_reset_steps``
  (explicit steps, a list or "100,200"), ``klwatch.reference_reset_on_resume`` (true: re-taken at every
  resume by design), ``klwatch.reference_mixup_alpha`` (the mixing weight, default 1).
  The same names without the ``klwatch.`` prefix say the same.
- **SPEC's names** ``reference_reset_interval`` and ``ref_update_interval`` keep their meaning: a period.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any


TRL_SWITCH, TRL_PERIOD, TRL_ALPHA = "sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha"
KLWATCH_PREFIX = "klwatch."
PERIOD_ALIASES = ("reference_reset_interval", "ref_update_interval")
OWN_KEYS = ("reference_reset_offset", "reference_reset_steps", "reference_reset_on_resume", "reference_mixup_alpha")
FULL_RESET_ALPHA = 0.99
"""A mixing weight at or above this replaces the reference outright."""
WHOLE_NUMBER_TOLERANCE = 1e-9
"""A period logged as a float (``512.0``) is a whole number of steps within this."""


@dataclass(frozen=True)
class ReferenceSchedule:
    """When a run updates its reference on purpose, and how strongly."""

    source: str
    """Who declared it: "trl", "klwatch" or "cli"."""
    keys: tuple[str, ...]
    """The config entries it was read from, as ``key=value`` (for explanations)."""
    period: int | None = None
    offset: int = 0
    steps: tuple[int, ...] = ()
    on_resume: bool = False
    alpha: float = 1.0

    def touches(self, lo: int, hi: int) -> int | None:
        """The first scheduled update at a step in ``[lo, hi]`` (an update after step s shows from s + 1)."""
        hits = [s for s in self.steps if lo <= s <= hi]
        if self.period:
            k = max(0, math.ceil((lo - self.offset) / self.period))
            s = self.offset + k * self.period
            if s <= hi and s >= max(lo, 1):
                hits.append(s)
        return min(hits) if hits else None

    @property
    def full(self) -> bool:
        return self.alpha >= FULL_RESET_ALPHA

    def describe(self) -> str:
        return ", ".join(self.keys)


@dataclass(frozen=True)
class Explanation:
    """A schedule that explains a boundary, and the step it touched (None: at the resume itself)."""

    schedule: ReferenceSchedule
    step: int | None
    why: str = field(default="")


def _leaf(key: str) -> str:
    return re.split(r"[./]", key)[-1].lower()


def _bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"true", "1", "yes", "on"}:
        return True
    if isinstance(value, str) and value.strip().lower() in {"false", "0", "no", "off", "none", "null", ""}:
        return False
    return None


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            return None
        return v if math.isfinite(v) else None
    return None


def _period(value: object) -> int | None:
    v = _number(value)
    return int(round(v)) if v is not None and v >= 1 and abs(v - round(v)) < WHOLE_NUMBER_TOLERANCE else None


def _steps(value: object) -> tuple[int, ...]:
    items: list[object]
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str):
        items = [p for p in re.split(r"[,\s\[\]]+", value) if p]
    else:
        items = [value]
    out = [_period(v) for v in items]
    return tuple(sorted({s for s in out if s is not None}))


def _trl(flat: dict[str, object]) -> ReferenceSchedule | None:
    by_leaf: dict[str, tuple[str, object]] = {}
    for key, value in flat.items():
        if key.lower().startswith(KLWATCH_PREFIX):
            continue
        by_leaf.setdefault(_leaf(key), (key, value))
    if TRL_SWITCH not in by_leaf or _bool(by_leaf[TRL_SWITCH][1]) is not True:
        return None
    beta = by_leaf.get("beta")
    if beta is not None and _number(beta[1]) == 0:
        return None  # no reference model at all
    period = _period(by_leaf[TRL_PERIOD][1]) if TRL_PERIOD in by_leaf else None
    if period is None:
        return None
    alpha = _number(by_leaf[TRL_ALPHA][1]) if TRL_ALPHA in by_leaf else None
    alpha = 1.0 if alpha is None else min(max(alpha, 0.0), 1.0)
    keys = tuple(f"{k}={v}" for k, v in (by_leaf[n] for n in (TRL_SWITCH, TRL_PERIOD, TRL_ALPHA) if n in by_leaf))
    return ReferenceSchedule("trl", keys, period=period, alpha=alpha)


def _klwatch(flat: dict[str, object]) -> ReferenceSchedule | None:
    own = {k.lower()[len(KLWATCH_PREFIX):]: (k, v) for k, v in flat.items() if k.lower().startswith(KLWATCH_PREFIX)}
    for k, v in flat.items():  # the same names without the prefix say the same (no other key uses them)
        if _leaf(k) in OWN_KEYS and not k.lower().startswith(KLWATCH_PREFIX):
            own.setdefault(_leaf(k), (k, v))
    aliases = {_leaf(k): (k, v) for k, v in flat.items() if _leaf(k) in PERIOD_ALIASES and not k.lower().startswith(KLWATCH_PREFIX)}
    used: list[tuple[str, object]] = []
    period = None
    for source in (own.get("reference_reset_interval"), *(aliases.get(a) for a in PERIOD_ALIASES)):
        if source is not None and (p := _period(source[1])) is not None:
            period = p
            used.append(source)
            break
    offset = 0
    if period is not None and "reference_reset_offset" in own:
        o = _number(own["reference_reset_offset"][1])
        if o is not None and o >= 0:
            offset = int(o)
            used.append(own["reference_reset_offset"])
    steps = _steps(own["reference_reset_steps"][1]) if "reference_reset_steps" in own else ()
    if steps:
        used.append(own["reference_reset_steps"])
    on_resume = "reference_reset_on_resume" in own and _bool(own["reference_reset_on_resume"][1]) is True
    if on_resume:
        used.append(own["reference_reset_on_resume"])
    if period is None and not steps and not on_resume:
        return None
    alpha = 1.0
    if "reference_mixup_alpha" in own and (a := _number(own["reference_mixup_alpha"][1])) is not None:
        alpha = min(max(a, 0.0), 1.0)
        used.append(own["reference_mixup_alpha"])
    return ReferenceSchedule("klwatch", tuple(f"{k}={v}" for k, v in used), period=period, offset=offset,
                             steps=steps, on_resume=on_resume, alpha=alpha)


def reference_schedules(config: dict, *, cli_steps: tuple[int, ...] = ()) -> list[ReferenceSchedule]:
    """Every reference schedule the run's config (and ``--intentional-reset``) declares."""
    flat = flatten(config) if config else {}
    found = [s for s in (_trl(flat), _klwatch(flat)) if s is not None]
    if cli_steps:
        found.append(ReferenceSchedule("cli", (f"--intentional-reset {' '.join(map(str, cli_steps))}",),
                                       steps=tuple(sorted(set(cli_steps)))))
    return found


def explain_boundary(schedules: list[ReferenceSchedule], *, step: int, resumed_from: int | None,
                     last_before: int | None) -> Explanation | None:
    """The schedule that explains a resume boundary at ``step`` (first logged step after it), if any.

    The reference the first post-resume points are measured against was taken at the resume
    (``on_resume``) or by a scheduled update at a step between the resume point and the step
    before ``step``. ``--intentional-reset`` names the step itself or the resume point.
    """
    lo = resumed_from if resumed_from is not None else last_before
    if lo is None:
        lo = step - 1
    for s in schedules:
        if s.source == "cli":
            hit = next((x for x in s.steps if abs(x - step) <= 1 or x == resumed_from or lo <= x <= step - 1), None)
            if hit is not None:
                return Explanation(s, hit, f"it was declared with --intentional-reset {hit}")
            continue
        if s.on_resume:
            return Explanation(s, None, f"the run's config declares a reference update at every resume ({s.describe()})")
        hit = s.touches(lo, step - 1)
        if hit is not None:
            return Explanation(s, hit, f"the run's config schedules a reference update at step {hit} ({s.describe()})")
    return None


def schedule_note(schedules: list[ReferenceSchedule], *, step: int) -> str | None:
    """For a reset a declared schedule does not explain: say why, so the user sees it was considered."""
    for s in schedules:
        if s.source != "cli" and (s.period or s.steps):
            what = f"every {s.period} steps" if s.period else f"at steps {', '.join(map(str, s.steps[:6]))}"
            return f"The config declares reference updates {what} ({s.describe()}), but none falls at this resume (step {step})."
    return None


def touched_steps(schedules: list[ReferenceSchedule], *, lo: int, hi: int) -> set[int]:
    """Steps in ``[lo, hi]`` right after a scheduled update (where the KL may fall on purpose)."""
    out: set[int] = set()
    for s in schedules:
        out.update(x + 1 for x in s.steps if lo <= x + 1 <= hi)
        if s.period:
            x = s.offset + max(0, math.ceil((lo - 1 - s.offset) / s.period)) * s.period
            while x + 1 <= hi:
                if x >= 1 and x + 1 >= lo:
                    out.add(x + 1)
                x += s.period
    return out


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in config.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def config_number(config: dict[str, Any], *, leaf: str) -> float | None:
    """The finite number a run's config gives under a key whose last component is ``leaf`` (nested or
    prefixed, a string as MLflow keeps params): the first such key, or None."""
    for key, value in flatten(config).items():
        if _leaf(key) == leaf.lower() and not key.lower().startswith(KLWATCH_PREFIX):
            return _number(value)
    return None


def config_mentions(config: dict[str, Any], *, key: str, value: str) -> str | None:
    """The first flattened ``key=value`` of a run's config where the key's last component matches
    ``key`` and the value (as text) matches ``value``; None when there is none."""
    kre, vre = re.compile(key, re.I), re.compile(value, re.I)
    for k, v in flatten(config).items():
        leaf = re.split(r"[/.]", str(k))[-1]
        if kre.search(leaf) and vre.search(str(v)):
            return f"{k}={v}"
    return None
