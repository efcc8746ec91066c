"""The resume guard: the reference fingerprint and the streaming KL judge, inside the training process.

Any framework calls it at two places: ``start`` at every launch, once its reference policy is built and
before the first step; ``update`` for every logged KL point (or, for a preference trainer that logs no KL,
every logged step's implicit rewards). ``start`` records the reference's fingerprint at the first launch
and compares it at every resumed one (an exact check, before any compute is spent); ``update`` judges the
first logged points after a resume with the detector ``klwatch scan`` uses (``ReferenceResetDetector``'s
streaming form, or ``PreferenceResetDetector``'s), for when the reference cannot be seen. What a reset
does is the caller's choice: warn, ask the loop to stop (``should_stop``), or raise.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..declarations import reference_schedules
from ..metrics import GUARD_REFERENCE_MATCH, GUARD_RESUME_RESET, GUARD_RESUME_SCORE
from ..model import BoundaryVerdict
from ..preference_reset import PreferenceResetConfig, PreferenceResetDetector
from ..reference_reset import ReferenceResetDetector, StreamingReferenceReset
from ..scan_cache import atomic_write
from .reference import ReferenceCheck, ReferenceRecordError, Weights, compare, fingerprint, load_record, write_record

OnReset = Literal["warn", "stop", "raise"]
ON_RESET: tuple[str, ...] = ("warn", "stop", "raise")

# the names the guard logs under (their home is klwatch.metrics, where the training_guard finding reads them)
REFERENCE_MATCH_METRIC = GUARD_REFERENCE_MATCH
RESUME_RESET_METRIC = GUARD_RESUME_RESET
RESUME_SCORE_METRIC = GUARD_RESUME_SCORE

MAX_HISTORY_BYTES = 64 * 2**20

Point = float | Mapping[str, float]
"""What the guard judges at one logged step: the KL, or a preference trainer's logged metrics."""
_HISTORY_KEY = {False: "kl", True: "metrics"}


def _as_point(value: Point) -> float | dict[str, float]:
    """A KL as a float; a preference trainer's metrics as a dict of their finite numbers."""
    if isinstance(value, Mapping):
        return {str(k): float(v) for k, v in value.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
    return float(value)
log = logging.getLogger("klwatch.guard")


class ReferenceResetError(RuntimeError):
    """Raised by a guard set to ``on_reset="raise"``; ``event`` says what was found."""

    def __init__(self, event: GuardEvent) -> None:
        super().__init__(event.message)
        self.event = event


class ReferenceResetWarning(UserWarning):
    """Issued by a guard set to ``on_reset="warn"`` (or ``"stop"``)."""


@dataclass(frozen=True)
class GuardEvent:
    """What the guard concluded at one step: from the weights (``check``) or from the KL (``verdict``)."""

    step: int
    reset: bool
    message: str
    check: ReferenceCheck | None = None
    verdict: BoundaryVerdict | None = None

    def metrics(self) -> dict[str, float]:
        """The event as tracker metrics, so ``klwatch scan`` and the dashboard see what the guard saw."""
        if self.check is not None:
            return {REFERENCE_MATCH_METRIC: 1.0 if self.check.matches else 0.0}
        assert self.verdict is not None
        return {RESUME_RESET_METRIC: 1.0 if self.reset else 0.0, RESUME_SCORE_METRIC: float(self.verdict.score)}


@dataclass
class ResumeGuard:
    """Record or check the reference at each launch, judge the KL after each resume, act on a reset.

    ``record`` is the fingerprint file (beside the checkpoints, so it travels with them). ``config`` is
    the run's config: a declared reference update (TRL's ``sync_ref_model``, ...) makes a moved reference
    intentional, so its fingerprint is recorded but not compared, and the KL judge calls a drop at a
    declared update ``intentional``. ``write``: whether this process writes the record and the kept
    history (False on a process that checks against a record another one keeps).
    """

    record: Path
    on_reset: OnReset = "warn"
    config: Mapping[str, Any] = field(default_factory=dict)
    check_reference: bool = True
    judge_kl: bool = True
    write: bool = True
    keep_history: bool = False
    """Keep the KL points ``update`` sees in a file beside the record (``history_file``), so a resumed launch
    judges its first points against the earlier launches' without being handed them: for frameworks whose
    checkpoints do not hold the logged metrics (TRL's do: ``trainer_state.json``'s log history)."""
    name: str = "run"
    preference: bool = False
    """A preference trainer (DPO and kin) that logs no KL: ``update`` takes each logged step's implicit
    rewards (a dict), judged by the preference detector with ``detector``'s thresholds."""
    detector: ReferenceResetDetector = field(default_factory=ReferenceResetDetector)
    events: list[GuardEvent] = field(default_factory=list)
    should_stop: bool = False
    """Set by a reset when ``on_reset="stop"``: the training loop should end cleanly."""

    def __post_init__(self) -> None:
        if self.on_reset not in ON_RESET:
            raise ValueError(f"on_reset must be one of {', '.join(ON_RESET)}, not {self.on_reset!r}")
        self.record = Path(self.record)
        self.config = dict(self.config)
        judge = PreferenceResetDetector(config=PreferenceResetConfig(**vars(self.detector.config))) \
            if self.preference else self.detector
        self._stream: StreamingReferenceReset = judge.stream(name=self.name, config=self.config)
        self._resumed = False

    @property
    def history_file(self) -> Path:
        return self.record.with_name(self.record.stem + ".kl.jsonl")

    @property
    def reference_declared_moving(self) -> bool:
        """True when the run's config declares updates of the reference (it moves by design)."""
        return bool(reference_schedules(self.config))

    def start(self, reference: Weights | None, *, step: int, source: str | None = None, revision: str | None = None,
              history: Iterable[tuple[int, Point]] = ()) -> GuardEvent | None:
        """One launch, after the reference is built and before the first step.

        ``step`` is the step training goes on from (0 at the first launch); ``history`` the KL points
        logged before it (the earlier launches'), which the KL judge compares the new ones with;
        ``reference`` the reference's weights (None when the caller cannot see them)."""
        if self.keep_history:
            if self.write:
                self.history_file.parent.mkdir(parents=True, exist_ok=True)
            history = self._kept_history(upto=step) if not history else history
        for s, point in history:
            if s <= step:
                self._stream.update(int(s), _as_point(point))
        if step > 0 and self.judge_kl:
            self._stream.resume(resumed_from_step=step)
            self._resumed = True
        if reference is None or not self.check_reference:
            return None
        if step <= 0:
            if self.write:
                write_record(fingerprint(reference, source=source, revision=revision), self.record)
            return None
        if not self.record.exists():
            log.warning("klwatch: nothing recorded at %s (the guard was not on at the first launch); recording this "
                        "launch's reference, later resumes are checked against it", self.record)
            if self.write:
                write_record(fingerprint(reference, source=source, revision=revision), self.record)
            return None
        try:
            recorded = load_record(self.record)
        except ReferenceRecordError as exc:  # not a reset, and not ours to overwrite: say so, train on
            warnings.warn(f"klwatch: the reference cannot be checked: {exc}", ReferenceResetWarning, stacklevel=2)
            return None
        check = compare(recorded, fingerprint(reference, source=source, revision=revision), record=self.record)
        if not check.matches and self.reference_declared_moving:
            log.info("klwatch: the reference moved since %s, as the run's config declares reference updates; "
                     "not a reset", self.record)
            return None
        if check.matches:
            event = GuardEvent(step=step, reset=False, message=check.describe(), check=check)
        else:
            event = GuardEvent(step=step, reset=True, message=f"klwatch: resumed at step {step}: {check.describe()}",
                               check=check)
        return self._act(event)

    def update(self, step: int, kl: Point) -> GuardEvent | None:
        """One logged KL point (a distance to the reference: flip one logged negated), or for a preference
        trainer the step's logged metrics. Returns the latest resume's verdict with the point that completes
        its window, None otherwise."""
        if not self.judge_kl or kl is None or (not isinstance(kl, Mapping) and not math.isfinite(float(kl))):
            return None
        if isinstance(kl, Mapping) != self.preference:
            raise TypeError("a preference guard takes each step's metrics as a dict, a KL guard one KL value")
        point = _as_point(kl)
        if self.keep_history and self.write:
            with open(self.history_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": int(step), _HISTORY_KEY[self.preference]: point}) + "\n")
        verdict = self._stream.update(int(step), point)  # type: ignore[arg-type]
        if verdict is None or not self._resumed:
            return None
        reset = verdict.verdict == "reference_reset"
        at = verdict.boundary.resumed_from_step
        what = "implicit rewards" if self.preference else "KL"
        message = (f"klwatch: the {what} after the resume from step {at} says {verdict.verdict} "
                   f"(score {verdict.score:.2f}): {verdict.explanation}")
        return self._act(GuardEvent(step=int(step), reset=reset, message=message, verdict=verdict))

    def _kept_history(self, *, upto: int) -> list[tuple[int, Point]]:
        """The KL points earlier launches kept, up to the step this one goes on from; the file is cut back
        to them, since the steps after it are trained again. Lines that do not parse are skipped."""
        path = self.history_file
        if not path.exists():
            return []
        if path.stat().st_size > MAX_HISTORY_BYTES:
            log.warning("klwatch: %s is larger than %d bytes; the KL judge starts without it", path, MAX_HISTORY_BYTES)
            return []
        key = _HISTORY_KEY[self.preference]
        points: list[tuple[int, Point]] = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
                point = (int(rec["step"]), _as_point(rec[key]))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if point[0] <= upto:
                points.append(point)
        if self.write:
            atomic_write(path, "".join(json.dumps({"step": s, key: v}) + "\n" for s, v in points).encode("utf-8"))
        return points

    def _act(self, event: GuardEvent) -> GuardEvent:
        self.events.append(event)
        if not event.reset:
            log.info(event.message)
            return event
        if self.on_reset == "raise":
            raise ReferenceResetError(event)
        if self.on_reset == "stop":
            self.should_stop = True
        warnings.warn(event.message, ReferenceResetWarning, stacklevel=3)
        log.error(event.message)
        return event
