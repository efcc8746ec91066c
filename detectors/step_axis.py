"""The framework's own step axis: trackers restart their step with every launch, the global step does not.

W&B's ``_step`` starts again at 0 in every new run; the framework's global step (a metric like
``train/global_step``) continues across restarts, which is what stitching, boundaries and the report
need. Which names count as a step axis is ``metrics.STEP_AXIS_METRICS``.
"""

from __future__ import annotations

import numpy as np

from .metrics import STEP_AXIS_METRICS
from .model import Segment, Series, steps_out_of_range


def step_axis_metric(segment: Segment) -> str | None:
    for m in STEP_AXIS_METRICS:
        s = segment.series.get(m)
        if s is not None and len(s) and not np.any(steps_out_of_range(s.values)):
            return m  # a global step that is not a step (inf, 1e30) is no axis: the tracker's step stays
    return None


def to_framework_steps(segment: Segment, axis: str) -> Segment:
    """Re-express every series of a segment on the framework's global step.

    Trackers count their own steps (W&B ``_step`` restarts with every new run); the framework's
    global step continues across restarts, which is what stitching and the report need. A row whose
    tracker step has no global step logged takes the last global step logged before it.
    """
    gs = segment.series[axis]
    order = np.argsort(gs.steps, kind="stable")
    tracker_steps = gs.steps[order]
    global_steps = np.round(gs.values[order]).astype(np.int64)
    new_series: dict[str, Series] = {}
    for name, s in segment.series.items():
        idx = np.searchsorted(tracker_steps, s.steps, side="right") - 1
        keep = idx >= 0
        mapped = global_steps[np.clip(idx, 0, None)]
        new_series[name] = Series(mapped[keep], s.values[keep],
                                  None if s.wall_times is None else s.wall_times[keep])
    out = Segment(**{**segment.__dict__, "series": new_series})
    out.meta = {**segment.meta, "step_axis": axis}
    return out
