"""The resume guard inside a TRL (or any Hugging Face ``Trainer``) run: three lines catch a reference reset
at the first step after a resume instead of after hours of compute.

    from klwatch.integrations.trl import guard_resumes
    guard_resumes(trainer, on_reset="stop")
    trainer.train(resume_from_checkpoint=True)

At the first launch the guard records a fingerprint of the reference policy (TRL's separate
``ref_model``, or with PEFT the base weights with the adapter off, plus TRL's frozen ``ref`` adapter when
it made one) in ``<output_dir>/klwatch_reference.json``. At every resumed launch it hashes the reference
again before the first step: a reference rebuilt from the resumed weights (the checkpoint passed as the
model, trl #3179; a continued adapter copied into ``ref``) differs. From the first logged KL points after
the resume it also judges the boundary as ``klwatch scan`` does. Each conclusion is logged to the run's
trackers (``klwatch/reference_match``, ``klwatch/resume_reset``, ``klwatch/resume_reset_score``) through
the run's own reporting callbacks, so ``scan`` and the dashboard see it.

A ``DPOTrainer`` logs no KL: its judge reads the implicit rewards (``rewards/chosen``, ``rewards/rejected``,
``rewards/margins``) with the preference detector; with ``precompute_ref_log_probs`` there is no reference
model to hash, and that judge alone guards the run. ``KTOTrainer`` and ``RLOOTrainer`` log ``kl``.
``sync_ref_model=True`` moves the reference by design: never a reset. ``beta=0`` has no reference: the
guard stays off. ``on_reset="raise"`` stops before any step; ``"stop"`` sets ``should_training_stop``,
which the Trainer honours at the end of the step in progress.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("klwatch.integrations.trl needs transformers: pip install 'klwatch[trl]'") from exc

from ..metrics import NEGATED_KL_METRICS, kl_candidates, preference_metrics
from .guard import GuardEvent, OnReset, Point, ResumeGuard
from .reference import Weights

RECORD_NAME = "klwatch_reference.json"
log = logging.getLogger("klwatch.guard")


def reference_weights(trainer: Any) -> tuple[Weights | None, str | None, str | None]:
    """The reference policy TRL computes the KL against, as name -> tensor, with where it was loaded from
    (path or hub id) and its revision when known; (None, None, None) when the trainer has none."""
    unwrap = getattr(getattr(trainer, "accelerator", None), "unwrap_model", lambda m: m)
    ref = getattr(trainer, "ref_model", None)
    if ref is not None:
        ref = unwrap(ref)
        if any(hasattr(p, "ds_id") for p in ref.parameters()):  # DeepSpeed ZeRO-3: each rank holds empty stubs
            log.warning("klwatch: the reference is partitioned by DeepSpeed ZeRO-3, so its weights cannot be hashed "
                        "without gathering them; only the KL judge guards this run")
            return None, None, None
        config = getattr(ref, "config", None)
        return ref.state_dict(), getattr(config, "_name_or_path", None), getattr(config, "_commit_hash", None)
    model = unwrap(trainer.model)
    adapters = getattr(model, "peft_config", None)
    if not adapters:
        return None, None, None
    # PEFT: the reference is the base with the adapters off, or TRL's frozen copy of a loaded adapter ("ref")
    uses_ref = "ref" in adapters
    others = [a for a in adapters if not (uses_ref and a == "ref")]

    def of_adapter(name: str, adapter: str) -> bool:
        return f".{adapter}." in name or name.endswith(f".{adapter}")

    weights = {k: v for k, v in model.state_dict().items() if not any(of_adapter(k, a) for a in others)}
    first = next(iter(adapters.values()))
    source = getattr(first, "base_model_name_or_path", None)
    if uses_ref and source:
        source = f"{source} with the 'ref' adapter TRL copied from the adapter the model was loaded with"
    revision = getattr(first, "revision", None)
    return weights, source, revision


def default_record(args: Any) -> Path:
    """``<output_dir>/klwatch_reference.json``; one per rank when several processes train (each hashes the
    reference it holds: a copy, or its own shards under FSDP)."""
    world = int(getattr(args, "world_size", 1) or 1)
    name = RECORD_NAME if world == 1 else RECORD_NAME.replace(".json", f".rank{int(args.process_index)}.json")
    return Path(args.output_dir) / name


PREFERENCE_CONFIGS = ("DPOConfig",)
"""TRL configs of trainers that log no KL but implicit rewards against a frozen reference."""


def judges_preference(args: Any) -> bool:
    """Whether a trainer with these arguments logs implicit rewards instead of a KL (TRL's DPO and its
    subclasses)."""
    return any(c.__name__ in PREFERENCE_CONFIGS for c in type(args).__mro__)


def _run_config(args: Any) -> dict[str, Any]:
    """The training arguments the guard reads: declared reference updates (``sync_ref_model``, ...)."""
    try:
        return {k: v for k, v in args.to_dict().items()
                if isinstance(v, (bool, int, float, str)) or v is None or (k == "loss_type" and isinstance(v, list))}
    except Exception:  # noqa: BLE001 - an odd args object: no declarations
        return {}


class ResumeGuardCallback(TrainerCallback):
    """A ``TrainerCallback`` running a ``ResumeGuard`` for ``trainer`` (see the module docstring)."""

    def __init__(self, trainer: Any, *, on_reset: OnReset = "warn", record: str | Path | None = None,
                 check_reference: bool = True, judge_kl: bool = True, kl_metric: str | None = None) -> None:
        self.trainer = trainer
        args = trainer.args
        self.enabled = getattr(args, "beta", None) != 0.0
        """False for a run without a reference (``beta=0``): nothing to guard."""
        self.guard = ResumeGuard(record=Path(record) if record else default_record(args),
                                 on_reset=on_reset, config=_run_config(args), check_reference=check_reference,
                                 judge_kl=judge_kl, name=str(getattr(args, "run_name", None) or "run"),
                                 preference=judges_preference(args) and kl_metric is None)
        self.kl_metric = kl_metric
        self._pending: dict[str, float] = {}

    @property
    def events(self) -> list[GuardEvent]:
        return self.guard.events

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not self.enabled:
            log.info("klwatch: beta=0, no reference policy: the resume guard is off")
            return control
        weights, source, revision = reference_weights(self.trainer)
        step = int(state.global_step)
        history = [(int(h["step"]), v) for h in state.log_history if "step" in h
                   for v in [self._point_of(h)] if v is not None]
        event = self.guard.start(weights, step=step, source=source, revision=revision, history=history)
        self._handle(event, control)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if not self.enabled or not logs:
            return control
        point = self._point_of(logs)
        if point is not None:
            self._handle(self.guard.update(int(state.global_step), point), control)
        if self._pending:
            self._emit(args, state, control)
        return control

    def _point_of(self, logs: dict[str, Any]) -> Point | None:
        """What the guard judges in one log: the KL, or a preference trainer's implicit rewards."""
        if not self.guard.preference:
            return self._kl_of(logs)
        numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return numbers if preference_metrics(list(numbers)) else None

    def _kl_of(self, logs: dict[str, Any]) -> float | None:
        if self.kl_metric is None:
            found = kl_candidates([k for k, v in logs.items() if isinstance(v, (int, float))])
            if not found:
                return None
            self.kl_metric = found[0]
        value = logs.get(self.kl_metric)
        if not isinstance(value, (int, float)):
            return None
        return -float(value) if self.kl_metric in NEGATED_KL_METRICS else float(value)

    def _handle(self, event: GuardEvent | None, control: Any) -> None:
        if event is None:
            return
        self._pending.update(event.metrics())
        if self.guard.should_stop:
            control.should_training_stop = True

    def _emit(self, args: Any, state: Any, control: Any) -> None:
        """Log the guard's metrics at this step through the run's own tracker callbacks (W&B, MLflow,
        TensorBoard, ...), whatever their order relative to this one, and into the trainer's log history."""
        metrics, self._pending = self._pending, {}
        if not getattr(state, "is_world_process_zero", True):
            return
        state.log_history.append({**metrics, "step": int(state.global_step)})
        for cb in _tracker_callbacks(self.trainer):
            try:
                cb.on_log(args, state, control, logs=dict(metrics))
            except Exception as exc:  # noqa: BLE001 - a tracker's failure must not stop training
                log.warning("klwatch: could not log the guard's verdict through %s: %s", type(cb).__name__, exc)


def _tracker_callbacks(trainer: Any) -> list[Any]:
    """The trainer's reporting callbacks (``report_to``): the ones transformers maps tracker names to."""
    try:
        from transformers.integrations import INTEGRATION_TO_CALLBACK
    except ImportError:  # pragma: no cover
        return []
    kinds = tuple({c for c in INTEGRATION_TO_CALLBACK.values() if isinstance(c, type)})
    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, kinds)]


def guard_resumes(trainer: Any, *, on_reset: OnReset = "warn", record: str | Path | None = None,
                  check_reference: bool = True, judge_kl: bool = True,
                  kl_metric: str | None = None) -> ResumeGuardCallback:
    """Add a ``ResumeGuardCallback`` to ``trainer`` and return it (its ``events`` say what it found)."""
    callback = ResumeGuardCallback(trainer, on_reset=on_reset, record=record, check_reference=check_reference,
                                   judge_kl=judge_kl, kl_metric=kl_metric)
    trainer.add_callback(callback)
    return callback
