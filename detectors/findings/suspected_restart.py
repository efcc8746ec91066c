"""Suspected restart: series change level at one step where no restart was logged.

Every other detector judges the boundaries the core found. A run that was restarted without leaving
a mark the core reads (a table export without a clock, a tracker that resumes in place at the same
steps, a framework that logs no runtime) has no boundary, so a reference reset there would go
unjudged. But a faulty restart moves the series that depend on the lost state *together*: the KL
falls to ~0 and the loss with it; weights that were not restored send reward and entropy back to
their opening levels. A healthy run's series drift, trend and spike, but they rarely shift level
abruptly, in several series, at one step.

The statistic, per series and per step: the shift between the medians of the few points after and
before the step, net of the local trend (the median step-to-step change times the window), in units
of the series' own robust step-to-step noise (log space for positive series). Medians make a
one-step spike count for nothing; the trend term keeps steady growth and decay from looking like
jumps; the run's own noise sets the scale. A step is a candidate when at least ``min_series`` series
shift by ``min_z`` noise units within ``tolerance`` steps of each other (on the sample runs, healthy
steps never had two series beyond 7 at once), or when the reference KL alone collapses (its lowest
point there below ``collapse_fraction`` of its level, by ``collapse_z`` units: the mark of a
reference rebuilt at an unlogged restart, which moves little else). ``ruptures`` (binary
segmentation, l2 cost) then places the change point in those series jointly, and it must agree with
the candidate; the cheap screen runs first so that ``ruptures`` (slow to import) is loaded only for
a run that has a candidate. Left out: counters (per-epoch counters reset on purpose), schedules
(LR, KL coefficient: noiseless, so every kink would count), the run's opening (warm-up), and the KL
when the config declares reference resets. Always a ``warning``: a suspicion, to be confirmed by
declaring the restart (``--restart STEP``) so that its boundary is judged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..metrics import declared_reference_resets
from ..model import Finding, Lineage, LineageResult, Series
from .base import COUNTERS, KL_COEF, LR, FindingDetector, MetricFamily, find_metrics, fmt


@dataclass(frozen=True)
class SuspectedRestartConfig:
    """Thresholds of the suspected-restart detector."""

    window: int = 4
    """Points on each side of a step whose medians are compared."""
    min_z: float = 8.0
    """A series shifts when its trend-corrected level change reaches this many noise units."""
    min_series: int = 2
    """Series that must shift at once for a suspicion."""
    collapse_z: float = 12.0
    """The reference KL alone is enough when it shifts this many noise units ..."""
    collapse_fraction: float = 0.1
    """... its lowest point at the step falling below this fraction of its level before (and not to exactly
    zero: that is a penalty switched off, not a reset) and the next few staying below half of it."""
    tolerance: int = 1
    """Shifts this many points apart count as the same step."""
    skip_opening: int = 8
    """The run's first points are never suspected: everything moves fast at the start ..."""
    skip_opening_fraction: float = 0.1
    """... nor its first tenth (LR warm-up ends there, with a kink in every series it drives)."""
    min_points: int = 20
    """A piece with fewer points than this is not scanned."""
    noise_floor_log: float = 0.01
    """Smallest log-space noise assumed (1%), so a smooth series does not make every wiggle a shift."""
    zero_fraction: float = 0.01
    """Positive values below this fraction of a series' typical value count as zero (the log floor)."""
    exclude: tuple[MetricFamily, ...] = (COUNTERS, LR, KL_COEF)
    """Left out: counters (per-epoch ones reset on purpose) and schedules (LR, KL coefficient), whose
    noise is nil, so every kink of a schedule would count as a shift; their restarts at a logged
    boundary have detectors of their own."""


@dataclass(frozen=True)
class _Shift:
    metric: str
    index: int
    z: float
    before: float
    after: float
    low_after: float
    """The lowest raw value at the step or one beside it (a collapse's first point)."""


class SuspectedRestart(FindingDetector[SuspectedRestartConfig]):
    name = "suspected_restart"
    config_class = SuspectedRestartConfig

    def detect(self, result: LineageResult) -> list[Finding]:
        lineage = result.lineage
        skip = {n for fam in self.config.exclude for n in find_metrics(lineage.metric_names(), family=fam)}
        if lineage.step_axis:
            skip.add(lineage.step_axis)
        if lineage.kl_metric and declared_reference_resets(lineage.config):
            skip.add(lineage.kl_metric)
        out: list[Finding] = []
        for k, piece in enumerate(lineage.pieces):
            out.extend(self._scan_piece(piece, first_piece=(k == 0), skip=skip, lineage=lineage))
        return out

    def _scan_piece(self, piece: dict[str, Series], *, first_piece: bool, skip: set[str],
                    lineage: Lineage) -> list[Finding]:
        cfg = self.config
        signals: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, float]] = {}
        seen: list[np.ndarray] = []
        for name in sorted(piece):
            if name.startswith("_") or name in skip:
                continue
            s = piece[name].take(np.isfinite(piece[name].values))
            if len(s) < cfg.min_points or np.any(np.diff(s.steps) <= 0) or np.ptp(s.values) == 0:
                continue
            if any(len(v) == len(s.values) and np.array_equal(v, s.values) for v in seen):
                continue  # the same quantity logged under two names counts once
            seen.append(s.values)
            x, noise = self._transform(s.values)
            if not np.isfinite(noise) or noise <= 0:
                continue
            signals[name] = (s.steps, s.values, x, noise)
        if len(signals) < 1:
            return []
        shifts = [sh for name, sig in signals.items() for sh in self._shifts(name, sig, first_piece=first_piece)]
        out: list[Finding] = []
        for group in self._groups(shifts, kl_metric=lineage.kl_metric):
            f = self._confirm(group, signals, kl_metric=lineage.kl_metric)
            if f is None:
                continue
            near = [g for g in out if abs(g.data["change_point_index"] - f.data["change_point_index"]) <= self.config.window]
            if not near:
                out.append(f)
            elif len(f.data["series"]) > len(near[0].data["series"]):  # one change point, one finding
                out[out.index(near[0])] = f
        return out

    def _transform(self, v: np.ndarray) -> tuple[np.ndarray, float]:
        cfg = self.config
        if np.all(v >= 0) and np.any(v > 0):
            eps = cfg.zero_fraction * float(np.percentile(v[v > 0], 90))
            x = np.log(v + eps)
            floor = cfg.noise_floor_log
        else:
            x = v.astype(float)
            floor = 1e-6 * float(np.percentile(np.abs(v), 90)) or 1e-12
        d = np.diff(x)
        noise = float(np.median(np.abs(d - np.median(d))) * 1.4826 / np.sqrt(2.0))
        return x, max(noise, floor)

    def _shifts(self, name: str, sig, *, first_piece: bool) -> list[_Shift]:
        cfg = self.config
        steps, raw, x, noise = sig
        w = cfg.window
        start = max(w, max(cfg.skip_opening, int(cfg.skip_opening_fraction * len(x))) if first_piece else w)
        if len(x) - w + 1 <= start:
            return []
        med = np.median(sliding_window_view(x, w), axis=1)  # med[j] = median(x[j:j+w])
        trend = np.median(sliding_window_view(np.diff(x), 2 * w - 1), axis=1)  # over x[i-w:i+w]
        raw_med = np.median(sliding_window_view(raw, w), axis=1)
        idx = np.arange(start, len(x) - w + 1)
        z = np.abs(med[idx] - med[idx - w] - w * trend[idx - w]) / noise
        out = [_Shift(name, int(i), float(zi), float(raw_med[i - w]), float(raw_med[i]),
                      float(np.min(raw[max(i - 1, 0):i + 2])))
               for i, zi in zip(idx, z) if zi >= cfg.min_z]
        # keep the strongest index of each run of consecutive indices (one jump lights up a few)
        best: list[_Shift] = []
        for sh in out:
            if best and sh.index - best[-1].index <= cfg.tolerance:
                if sh.z > best[-1].z:
                    best[-1] = sh
            else:
                best.append(sh)
        return best

    def _collapse(self, sh: _Shift, kl_metric: str | None) -> bool:
        cfg = self.config
        return (sh.metric == kl_metric and sh.z >= cfg.collapse_z and sh.low_after != 0.0
                and abs(sh.low_after) < cfg.collapse_fraction * abs(sh.before)
                and abs(sh.after) < 0.5 * abs(sh.before))

    def _groups(self, shifts: list[_Shift], *, kl_metric: str | None) -> list[list[_Shift]]:
        """Shifts of distinct series within ``tolerance`` of each other: at least ``min_series`` of them,
        or a collapse of the reference KL."""
        cfg = self.config
        groups: list[list[_Shift]] = []
        for sh in sorted(shifts, key=lambda s: s.index):
            if groups and sh.index - groups[-1][0].index <= cfg.tolerance:
                groups[-1].append(sh)
            else:
                groups.append([sh])
        out = []
        for g in groups:
            by_metric: dict[str, _Shift] = {}
            for sh in g:
                if sh.metric not in by_metric or sh.z > by_metric[sh.metric].z:
                    by_metric[sh.metric] = sh
            strong = [sh for sh in by_metric.values() if sh.z >= cfg.min_z]
            if len(strong) >= cfg.min_series or any(self._collapse(sh, kl_metric) for sh in by_metric.values()):
                out.append(list(by_metric.values()))
        return out

    def _confirm(self, group: list[_Shift], signals, *, kl_metric: str | None) -> Finding | None:
        """Place the change point jointly with ruptures; it must agree with the screen."""
        import ruptures as rpt  # slow to import: only for runs with a candidate

        cfg = self.config
        w = cfg.window
        center = int(round(np.median([sh.index for sh in group])))
        names = [sh.metric for sh in group]
        steps = signals[names[0]][0]
        lo = max(0, center - 2 * w)
        columns = []
        for n in names:
            st, _, x, noise = signals[n]
            xi = np.interp(steps[lo: center + 2 * w], st, x)  # same step grid as the first series
            columns.append((xi - np.median(xi)) / noise)
        sig = np.column_stack(columns)
        hi = lo + len(sig)
        if len(sig) < 2 * 2 + 1:
            return None
        bkps = rpt.Binseg(model="l2", min_size=2, jump=1).fit(sig).predict(n_bkps=1)
        cp = lo + int(bkps[0])
        if abs(cp - center) > cfg.tolerance + 1 or not (lo < cp < hi):
            return None
        step = int(steps[cp])
        parts = ", ".join(f"{sh.metric} {fmt(sh.before)} -> {fmt(sh.after)} ({sh.z:.0f} noise units)" for sh in
                          sorted(group, key=lambda s: -s.z))
        collapsed = [sh for sh in group if self._collapse(sh, kl_metric)]
        what = (f"the reference KL collapsed ({parts})" if collapsed and len(group) == 1 else
                f"{len(group)} series changed level at once ({parts})")
        msg = (f"Suspected unlogged restart at step {step}: {what} but no restart was logged there; if the run "
               f"was restarted at this step, declare it with --restart {step} so the resume is judged.")
        return self.finding(step=step, severity="warning", message=msg,
                            data={"step": step, "series": [sh.__dict__ for sh in group],
                                  "kl_collapse": bool(collapsed),
                                  "screen_index": center, "change_point_index": cp})

