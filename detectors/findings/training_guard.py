"""What klwatch's resume guard inside the training process saw, read back from the run's own logs.

The guard (``klwatch.integrations``) logs its conclusions as metrics at the step it reached them:
``klwatch/reference_match`` 0 when a resumed launch's reference policy hashed differently from the
first launch's (rebuilt from other weights), ``klwatch/resume_reset`` 1 when its KL judge called the
resume a reset. Trackers and loggers may prefix the names (``train/`` from the Hugging Face W&B and
TensorBoard callbacks). A scan reports each as an error finding, so ``klwatch check --fail-on
training_guard`` gates on it and the dashboard marks it even where the logged KL alone says little
(a run stopped by the guard has only a few points after the resume).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..metrics import GUARD_REFERENCE_MATCH, GUARD_RESUME_RESET, GUARD_RESUME_SCORE
from ..model import Finding, LineageResult, Series
from .base import FindingDetector, fmt


@dataclass(frozen=True)
class TrainingGuardConfig:
    """Which of the guard's conclusions become findings."""

    weights: bool = True
    """Report a reference whose fingerprint differed at a resume."""
    kl: bool = True
    """Report a resume the guard's KL judge called a reset."""


def _logged(result: LineageResult, leaf: str) -> tuple[str | None, Series | None]:
    """The guard metric ``leaf`` under whatever prefix the run's loggers gave it, over every piece."""
    names = [n for n in result.lineage.metric_names() if n == leaf or n.endswith("/" + leaf)]
    if not names:
        return None, None
    name = sorted(names, key=len)[0]
    parts = [p[name] for p in result.lineage.pieces if name in p and len(p[name])]
    return (name, Series.concat(parts)) if parts else (name, None)


class TrainingGuard(FindingDetector[TrainingGuardConfig]):
    name = "training_guard"
    config_class = TrainingGuardConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        out: list[Finding] = []
        if self.config.weights:
            name, match = _logged(result, GUARD_REFERENCE_MATCH)
            if match is not None:
                for step in match.steps[np.isfinite(match.values) & (match.values < 0.5)]:
                    out.append(self.finding(
                        step=int(step), severity="error", metrics=[name],
                        message=(f"klwatch's guard in the training process found the reference policy rebuilt from "
                                 f"other weights when the run resumed (logged at step {int(step)}): its fingerprint "
                                 "differs from the one recorded at the first launch. The record beside the "
                                 "checkpoints (klwatch_reference.json) and the training log name the tensors."),
                        data={"metric": name}))
        if self.config.kl:
            name, reset = _logged(result, GUARD_RESUME_RESET)
            score_name, score = _logged(result, GUARD_RESUME_SCORE)
            if reset is not None:
                for step in reset.steps[np.isfinite(reset.values) & (reset.values >= 0.5)]:
                    at = score.values[score.steps == step] if score is not None else np.empty(0)
                    p = float(at[-1]) if len(at) else None
                    out.append(self.finding(
                        step=int(step), severity="error", metrics=[result.metric, name],
                        message=(f"klwatch's guard in the training process judged the KL after a resume a reference "
                                 f"reset (logged at step {int(step)}, score {fmt(p)})."),
                        data={"metric": name, "score": p, "score_metric": score_name}))
        return out
