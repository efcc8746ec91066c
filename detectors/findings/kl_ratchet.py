"""KL ratchet summary: for a run whose reference was reset at several resumes, how far the anchor moved.

When the reference is rebuilt from the resumed weights at every restart, the logged KL only ever
measures the distance travelled *since the last restart*: it falls to ~0 at each resume and grows
again, so its curve looks healthy in any one stretch while the policy drifts further and further
from the base model the penalty was meant to hold it to. This is a summary, not a detection (the
reference-reset detector already judged each boundary): it adds up what each stretch had reached
before its reset. KL divergences do not add exactly, but each stretch's KL is the distance from that
stretch's anchor, so the sum is the natural scale of the total drift, and its ratio to the largest KL
ever logged says how much the logged curve understates it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import Finding, LineageResult, Series
from .base import FindingDetector, fmt


LAST_POINTS = 5
"""The KL reached since the last reset is the median of the run's last this many points (one spike
does not set it)."""


@dataclass(frozen=True)
class KlRatchetConfig:
    """When the summary is given."""

    min_resets: int = 2
    """Report only runs with at least this many boundaries judged ``reference_reset``."""
    include_intentional: bool = False
    """Count resets the run declares (``intentional``) too: the anchor moves just the same."""


class KlRatchet(FindingDetector[KlRatchetConfig]):
    name = "kl_ratchet"
    config_class = KlRatchetConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        cfg = self.config
        kinds = {"reference_reset"} | ({"intentional"} if cfg.include_intentional else set())
        resets = sorted((v for v in result.verdicts if v.verdict in kinds and v.kl_before is not None),
                        key=lambda v: v.boundary.step)
        if len(resets) < cfg.min_resets or result.metric is None:
            return []
        reached = [float(v.kl_before) for v in resets]  # type: ignore[arg-type]
        values = Series.concat([p for p in result.lineage.kl_pieces() if p is not None]).values
        tail = values[np.isfinite(values)]
        last = float(np.median(tail[-LAST_POINTS:])) if len(tail) else 0.0
        peak = float(np.max(tail)) if len(tail) else 0.0
        total = float(sum(reached) + max(last, 0.0))
        steps = [v.boundary.step for v in resets]
        ratio = total / peak if peak > 0 else float("nan")
        msg = (f"The KL anchor ratcheted forward at {len(resets)} resets (steps {', '.join(map(str, steps))}): the "
               f"KL had reached {', '.join(fmt(x) for x in reached)} before each, so with the {fmt(last)} since the "
               f"last one the policy has drifted about {fmt(total)} from the base model in KL terms, "
               f"{ratio:.1f}x the largest KL the run ever logged ({fmt(peak)}); judge this run's KL against the "
               f"base model, not the logged curve.")
        return [self.finding(step=steps[-1], severity="info", message=msg,
                             data={"metric": result.metric, "reset_steps": steps, "kl_before_resets": reached,
                                   "kl_since_last_reset": last, "cumulative_kl": total, "max_logged_kl": peak,
                                   "understatement": ratio}, metrics=[result.metric])]
