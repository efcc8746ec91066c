"""Resume-integrity detectors beyond the KL reference reset (issue 6).

At a resume, every piece of state that should carry over can fail to: the LR scheduler, the
optimizer's moments, the data sampler's position, the adaptive KL controller; the tracker can lose
the steps around it; a restart can go unlogged altogether. Each detector has a module of its own and
reports ``Finding``s (SPEC: ``findings``), which ``klwatch check --fail-on DETECTOR,...`` can gate on.

``run_findings`` is the one entry point the pipeline calls (``klwatch.pipeline.judge_lineage``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..model import Finding, LineageResult
from .base import FindingDetector
from .data_order_restart import DataOrderRestart, DataOrderRestartConfig
from .kl_coef_reset import KlCoefReset, KlCoefResetConfig
from .kl_ratchet import KlRatchet, KlRatchetConfig
from .lost_steps import LostSteps, LostStepsConfig
from .lr_schedule_restart import LrScheduleRestart, LrScheduleRestartConfig
from .optimizer_state_lost import OptimizerStateLost, OptimizerStateLostConfig
from .suspected_restart import SuspectedRestart, SuspectedRestartConfig
from .training_guard import TrainingGuard, TrainingGuardConfig

DETECTORS: dict[str, type[FindingDetector]] = {
    cls.name: cls
    for cls in (LrScheduleRestart, OptimizerStateLost, DataOrderRestart, KlCoefReset, LostSteps,
                SuspectedRestart, KlRatchet, TrainingGuard)
}
"""Every finding detector by its name (the name ``--fail-on`` and the report use)."""

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def run_findings(result: LineageResult, *, only: Iterable[str] | None = None,
                 configs: Mapping[str, object] | None = None) -> list[Finding]:
    """Every finding of every detector (or of those named in ``only``) on one judged training run,
    ordered by step then severity. ``configs`` maps a detector name to its config object.

    A detector that fails on odd data yields one ``warning`` naming it; the others still run."""
    names = list(DETECTORS) if only is None else list(only)
    unknown = [n for n in names if n not in DETECTORS]
    if unknown:
        raise ValueError(f"unknown finding detector(s): {', '.join(unknown)} (known: {', '.join(DETECTORS)})")
    out: list[Finding] = []
    for name in names:
        cfg = (configs or {}).get(name)
        detector = DETECTORS[name](config=cfg)
        try:
            out.extend(detector.detect(result))
        except Exception as exc:  # one detector's bug must not hide the others' findings
            out.append(Finding(name, None, "warning", f"the {name} detector failed on this run: "
                                                      f"{type(exc).__name__}: {exc}"))
    out.sort(key=lambda f: (f.step if f.step is not None else -1, _SEVERITY_ORDER[f.severity], f.detector))
    return out


__all__ = [
    "DETECTORS", "run_findings", "FindingDetector",
    "LrScheduleRestart", "LrScheduleRestartConfig", "OptimizerStateLost", "OptimizerStateLostConfig",
    "DataOrderRestart", "DataOrderRestartConfig", "KlCoefReset", "KlCoefResetConfig",
    "LostSteps", "LostStepsConfig", "SuspectedRestart", "SuspectedRestartConfig",
    "KlRatchet", "KlRatchetConfig", "TrainingGuard", "TrainingGuardConfig",
]
