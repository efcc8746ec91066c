"""Suspected restart: the run's *state* jumps back at one step where no restart was logged.

Every other detector judges the boundaries the core found. A run that was restarted without leaving
a mark the core reads (a table export without a clock, a tracker that resumes in place at the same
steps, a framework that logs no runtime) has no boundary, so a reference reset there would go
unjudged. A faulty restart loses state, and lost state shows in the series that depend on it: a
reference rebuilt from the resumed weights sends the KL to ~0 (and the loss that carries it); weights
that were not restored send reward and entropy (and whatever the policy drives: completion lengths,
clip ratios) back toward their opening levels, together.

A healthy run changes level too, and real GRPO runs do it often: completions reach
``max_completion_length`` (every ``completions/*`` key and the clipped ratio move at once, a format
reward that needs the closing tag falls), rewards saturate (``reward_std`` to 0 and
``frac_reward_zero_std`` to 1 together), entropy collapses. So a suspicion needs all of:

1. **Families, not series.** Series that measure one thing move together, so they count once: every
   key under one prefix (``completions/*``, ``clip_ratio/*``, ``timing_s/*``) is one family, and known
   equivalents are grouped (``reward``, ``reward_std``, ``rewards/<fn>/*``, ``frac_reward_zero_std``,
   ``critic/score/*``). At least ``min_families`` families must shift within ``tolerance`` points.
2. **State.** At least one shifted family is a *state* family (KL, entropy, loss, grad norm,
   reward) through one of its state series (a reward *mean*, not its spread): the policy's outputs
   (lengths, clip ratios, token counts) and the reward spread only support.
3. **Direction.** A restart returns toward the opening; a natural regime change moves away from it.
   At least one shifted weight family (reward, entropy) must cover at least half its way back to the
   run's opening level (``return_fraction``), and no shifted family may move away from the opening
   (only the spiky grad norm is exempt).
4. **Calibration.** The statistic, per series and per index: the median of the ``window`` points after
   minus the median of the ``window`` before, net of the local trend (the median step-to-step change
   times the window). It is standardised by its *own* robust spread over the piece (1.4826 MAD of the
   statistic), so ``min_z`` is in units of how much the statistic itself wanders on this series,
   not of per-point noise (the statistic's null spread is ~1.8 per-point noise units, and it is tried
   at every index of every series).
5. **Scale.** A series bounded in [0, 1] or with at most ``few_values`` distinct values is compared on a
   linear scale with a floor of one quantum (its smallest gap between values: 1/G for a fraction of G
   completions); a log scale is used only for positive unbounded series (KL, lengths, grad norm), with
   a 1 % floor. A log of a fraction near 0 would turn one completion in 32 into a jump.

Or, alone: the reference KL **collapses** (its lowest point at the step below ``collapse_fraction`` of
its level before, the next few below half of it but not all 0, by ``collapse_z`` units of its one-point
noise, or by ``zero_collapse_z`` when that lowest point is exactly 0.0, as real TRL logs it at the first
step against a reference rebuilt from the policy): a reference rebuilt at an unlogged restart moves
little else. A collapse at a step a declared reference schedule touches is no
suspicion (``detect(..., reference_schedule_steps=...)``; by default the steps the run's own
declared schedule touches, read by ``klwatch.declarations``).

``ruptures`` (binary segmentation, l2 cost) then places the change point in the shifted series
jointly, and it must agree with the screen; the cheap screen runs first so that ``ruptures`` (slow to
import) is loaded only for a run that has a candidate. Left out: counters and cumulative series
(per-epoch counters reset on purpose; a running total has no level), schedules (LR, KL coefficient:
noiseless, so every kink would count), and the run's opening (warm-up). Always a ``warning``: a
suspicion, to be confirmed by declaring the restart (``--restart STEP``) so that its boundary is judged.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from ..declarations import reference_schedules, touched_steps
from ..model import Finding, Lineage, LineageResult, Series
from ..metrics import COUNTERS, GRAD_NORM, KL_COEF, LOSS, LR, MetricFamily, find_metrics, kl_candidates
from ..stats import floored_log, pooled_diff_noise, robust_sigma, sliding_median
from .base import FindingDetector, fmt

KL, ENTROPY, REWARD = "kl", "entropy", "reward"
STATE_FAMILIES = (KL, ENTROPY, "loss", "grad_norm", REWARD)
"""Families whose level is training state: the reference (KL), the weights (entropy, reward), the
optimizer (loss, grad norm)."""

TYPICAL_PERCENTILE = 90
"""A series' typical magnitude is this percentile of |value|: robust to a few spikes, and not the
median, which is 0 for a series mostly at 0."""

DISTINCT_DECIMALS = 9
"""Values that agree to this many decimals of the typical magnitude count as one distinct value
(float noise in logging does not make a quantised series continuous)."""

COLLAPSE_STAYS_BELOW = 0.5
"""After a KL collapse the level stays below this fraction of the level before (see ``collapse_fraction``)."""

MIN_SEGMENT = 2
"""The fewest points ``ruptures`` puts on either side of the change point it places."""

CUMULATIVE_RISING = 0.9
"""A never-decreasing series that rises at this fraction of its points or more is a running total."""

_NAMESPACES = re.compile(r"^((train|training|trainer|actor|critic|policy|rollout|objective|env)[/.])+", re.I)
"""Prefixes that say who logged a key, not what it measures (``train/`` of the W&B callback,
verl's ``actor/``): stripped before a key's family is read from its prefix."""
_REWARD_PART = re.compile(r"^(rewards?|scores?|returns?)$|^(reward|score|return)_", re.I)
_REWARD_KEY = re.compile(r"(^|[/._])frac_reward_zero_std$|^(reward|score)s?([_/.]|$)", re.I)
_SPREAD_LEAF = re.compile(r"(std|var|zero_std|max|min|spread)$", re.I)
_ENTROPY_LEAF = re.compile(r"entropy", re.I)


@dataclass(frozen=True)
class SuspectedRestartConfig:
    """Thresholds of the suspected-restart detector."""

    window: int = 4
    """Points on each side of a step whose medians are compared."""
    trend_points: int = 16
    """Points around a step whose median step-to-step change is the local trend."""
    min_z: float = 8.0
    """A series shifts when its trend-corrected level change reaches this many robust SDs of the
    statistic itself (on this series, over the piece)."""
    min_families: int = 2
    """Families that must shift at once for a suspicion (series of one family count once)."""
    collapse_z: float = 12.0
    """The reference KL alone is enough when it shifts this many units of its one-point noise (not of the
    statistic's spread: a run whose reference is rebuilt every few steps is *mostly* collapses and
    regrowth, which inflates that spread; the depth conditions below keep this rule specific) ..."""
    zero_collapse_z: float = 4.0
    """... or this many, when its lowest point there is exactly 0: the policy *equals* its reference, which
    happens at the first step against a reference just rebuilt from it (and at step 1), never in a
    healthy run's middle (real TRL logs ``kl`` 0.0 there) ..."""
    collapse_fraction: float = 0.1
    """... its lowest point at the step falling below this fraction of its level before, and the next few
    staying below half of it but not at exactly zero (a penalty switched off, not a reset; one point at
    exactly 0 is the first step against a reference rebuilt from the policy itself)."""
    return_fraction: float = 0.5
    """A family returns toward the opening when its shift covers at least this fraction of its distance
    from the opening level: |after - opening| < (1 - this) * |before - opening|."""
    away_fraction: float = 0.5
    """A family moves away from the opening when its distance from the opening grows by at least this
    fraction of its shift: a natural regime change, which vetoes the suspicion."""
    direction_families: tuple[str, ...] = (REWARD, ENTROPY)
    """Families whose return toward the opening marks weights that were not restored."""
    veto_exempt: tuple[str, ...] = ("grad_norm",)
    """Families whose moving away from the opening vetoes nothing (the grad norm spikes in both)."""
    opening_points: int = 4
    """The opening level of a series: the median of its first points in the run's first piece."""
    tolerance: int = 1
    """Shifts this many points apart count as the same step."""
    skip_opening: int = 8
    """The run's first points are never suspected: everything moves fast at the start ..."""
    skip_opening_fraction: float = 0.1
    """... nor its first tenth (LR warm-up ends there, with a kink in every series it drives)."""
    min_points: int = 20
    """A piece with fewer points than this is not scanned."""
    few_values: int = 20
    """A series with at most this many distinct values is read on a linear scale with a quantum floor."""
    log_families: tuple[str, ...] = (KL, ENTROPY, "grad_norm")
    """Positive unbounded quantities read on a log scale even when their values stay below 1."""
    linear_families: tuple[str, ...] = (REWARD, "loss")
    """Read on a linear scale whatever their values: a reward or a loss has no natural zero to take
    ratios from (a reward near 0 on a log scale turns one success in 32 into a jump)."""
    noise_floor_log: float = 0.01
    """Smallest spread assumed on a log scale (1%), so a smooth series does not make every wiggle a shift."""
    noise_floor_linear: float = 1e-6
    """Smallest spread assumed on a linear scale, as a fraction of the series' typical magnitude."""
    zero_fraction: float = 0.01
    """Positive values below this fraction of a series' typical value count as zero (the log floor)."""
    exclude: tuple[MetricFamily, ...] = (COUNTERS, LR, KL_COEF)
    """Left out: counters (per-epoch ones reset on purpose) and schedules (LR, KL coefficient), whose
    noise is nil, so every kink of a schedule would count as a shift; their restarts at a logged
    boundary have detectors of their own."""


@dataclass(frozen=True)
class _Signal:
    """One series ready for the screen: its steps, raw and transformed values, the statistic's robust
    spread (its unit), and its family."""

    steps: np.ndarray
    raw: np.ndarray
    x: np.ndarray
    scale: float
    family: str
    state: bool
    log_eps: float | None
    """The zero floor added before the log, or None on a linear scale."""
    point_noise: float
    """The series' robust step-to-step noise of one point (the unit of the KL-collapse rule)."""
    d: np.ndarray
    """The statistic (``SuspectedRestart._statistic`` of ``x``), computed once for the spread and the screen."""
    med: np.ndarray
    """``sliding_median(x, window)``, which the statistic is made of and the screen reads again."""


@dataclass(frozen=True)
class _Shift:
    metric: str
    family: str
    state: bool
    index: int
    z: float
    z_point: float
    """The same shift in units of one point's noise."""
    before: float
    after: float
    low_after: float
    """The lowest raw value at the step or one beside it (a collapse's first point)."""
    direction: str
    """'toward' the opening, 'away' from it, or '' (neither, or no opening known)."""


class SuspectedRestart(FindingDetector[SuspectedRestartConfig]):
    name = "suspected_restart"
    config_class = SuspectedRestartConfig

    def detect(self, result: LineageResult, *,
               reference_schedule_steps: Collection[int] | None = None) -> list[Finding]:
        """Suspected restarts in every piece of the run.

        ``reference_schedule_steps``: the steps a declared reference schedule touches (an update after
        step s shows from s + 1); a KL-only collapse there is no suspicion. None (the default): the
        schedule is unknown, and a config that declares reference resets at all drops the KL."""
        lineage = result.lineage
        skip = {n for fam in self.config.exclude for n in find_metrics(lineage.metric_names(), family=fam)}
        if lineage.step_axis:
            skip.add(lineage.step_axis)
        if reference_schedule_steps is None:  # the run's own declarations (detectors.declarations)
            steps = [int(x) for p in lineage.pieces for ser in p.values() if len(ser) for x in (ser.steps[0], ser.steps[-1])]
            schedules = reference_schedules(lineage.config)
            reference_schedule_steps = touched_steps(schedules, lo=min(steps), hi=max(steps)) if steps and schedules else ()
            if any(sch.on_resume for sch in schedules):  # re-taken at every resume: a collapse there is declared
                reference_schedule_steps = set(reference_schedule_steps) | {int(next(iter(p.values())).steps[0])
                                                                            for p in lineage.pieces[1:] if p and len(next(iter(p.values())))}
        scheduled = frozenset(int(x) for x in reference_schedule_steps)
        families = self._families(lineage=lineage)
        openings = self._openings(lineage=lineage, skip=skip)
        out: list[Finding] = []
        for k, piece in enumerate(lineage.pieces):
            out.extend(self._scan_piece(piece=piece, first_piece=(k == 0), skip=skip, lineage=lineage,
                                        families=families, openings=openings, scheduled=scheduled))
        return out

    # ------------------------------------------------------------------------------ families

    def _families(self, *, lineage: Lineage) -> dict[str, tuple[str, bool]]:
        """Each metric's family and whether it is a state series of a state family."""
        names = [n for n in lineage.metric_names() if not n.startswith("_")]
        kl = set(kl_candidates(names))
        if lineage.kl_metric:
            kl.add(lineage.kl_metric)
        loss = set(find_metrics(names, family=LOSS)) - kl
        grad = set(find_metrics(names, family=GRAD_NORM))
        out: dict[str, tuple[str, bool]] = {}
        for n in names:
            out[n] = family_of(name=n, kl=kl, loss=loss, grad_norm=grad)
        return out

    def _openings(self, *, lineage: Lineage, skip: set[str]) -> dict[str, np.ndarray]:
        """Each metric's first points in the run's first piece (raw values: the level it started at)."""
        if not lineage.pieces:
            return {}
        out: dict[str, np.ndarray] = {}
        for name, s in lineage.pieces[0].items():
            if name.startswith("_") or name in skip:
                continue
            v = s.values[np.isfinite(s.values)]
            if len(v) >= self.config.opening_points:
                out[name] = v[: self.config.opening_points]
        return out

    # ------------------------------------------------------------------------------ screen

    def _scan_piece(self, *, piece: dict[str, Series], first_piece: bool, skip: set[str], lineage: Lineage,
                    families: dict[str, tuple[str, bool]], openings: dict[str, np.ndarray],
                    scheduled: frozenset[int]) -> list[Finding]:
        cfg = self.config
        signals: dict[str, _Signal] = {}
        seen: list[np.ndarray] = []
        for name in sorted(piece):
            if name.startswith("_") or name in skip:
                continue
            s = piece[name]
            finite = np.isfinite(s.values)
            if not finite.all():
                s = s.take(finite)
            if len(s) < cfg.min_points or np.any(np.diff(s.steps) <= 0) or np.ptp(s.values) == 0:
                continue
            if _cumulative(v=s.values) and name != lineage.kl_metric:
                continue  # a running total (tokens seen, FLOPs) has no level to shift
            if any(len(v) == len(s.values) and np.array_equal(v, s.values) for v in seen):
                continue  # the same quantity logged under two names counts once
            seen.append(s.values)
            family, state = families.get(name, (name, False))
            sig = self._signal(s=s, family=family, state=state)
            if sig is not None:
                signals[name] = sig
        if not signals:
            return []
        shifts = [sh for name, sig in signals.items()
                  for sh in self._shifts(name=name, sig=sig, first_piece=first_piece, opening=openings.get(name),
                                         kl_metric=lineage.kl_metric)]
        out: list[Finding] = []
        for group, collapsed in self._groups(shifts=shifts, kl_metric=lineage.kl_metric, signals=signals,
                                             scheduled=scheduled):
            f = self._confirm(group=group, signals=signals, collapsed=collapsed)
            if f is None:
                continue
            near = [g for g in out if abs(g.data["change_point_index"] - f.data["change_point_index"]) <= cfg.window]
            if not near:
                out.append(f)
            elif len(f.data["series"]) > len(near[0].data["series"]):  # one change point, one finding
                out[out.index(near[0])] = f
        return out

    def _transform(self, *, v: np.ndarray, family: str) -> tuple[np.ndarray, float, float | None]:
        """The scale a series is compared on, the smallest spread assumed on it, and the zero floor of
        the log (None: linear). See the module docstring, point 5."""
        cfg = self.config
        v = v.astype(float)
        typical = float(np.percentile(np.abs(v), TYPICAL_PERCENTILE)) or 1.0
        distinct = np.unique(np.round(v / typical, DISTINCT_DECIMALS))
        positive = bool(np.all(v >= 0) and np.any(v > 0))
        fraction = bool(np.all(v >= 0) and np.all(v <= 1)) and family not in cfg.log_families
        if positive and not fraction and len(distinct) > cfg.few_values and family not in cfg.linear_families:
            above = v > 0
            # every value above 0: v[v > 0] is |v| itself, whose percentile is ``typical``
            level = typical if above.all() else float(np.percentile(v[above], TYPICAL_PERCENTILE))
            eps = cfg.zero_fraction * level
            return floored_log(v, eps), cfg.noise_floor_log, eps
        gaps = np.diff(distinct) * typical
        quantum = float(np.min(gaps)) if len(gaps) else 0.0
        return v, max(quantum, cfg.noise_floor_linear * typical), None

    def _statistic(self, *, x: np.ndarray) -> np.ndarray:
        """d[j] for j = 0 .. len(x) - 2w: the trend-corrected median shift at index j + w. The trend is
        the median step-to-step change over ``trend_points`` points around the step (fewer near the
        piece's ends): a median of many changes is steady, and still ignores the jump itself."""
        return self._statistic_and_median(x=x)[0]

    def _statistic_and_median(self, *, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``_statistic`` and the sliding median of ``window`` points it is made of."""
        w = self.config.window
        med = sliding_median(x, w)  # med[j] = median(x[j:j+w])
        n = len(x) - 2 * w + 1
        dx = np.diff(x)
        trend = sliding_median(dx, 2 * w - 1)[:n]  # over x[i-w:i+w]
        h = max(self.config.trend_points // 2, w)
        if h > w and len(dx) >= 2 * h - 1:
            wide = sliding_median(dx, 2 * h - 1)  # wide[k]: over x[k:k+2h]
            i = np.arange(w, w + n)
            ok = (i - h >= 0) & (i - h < len(wide))
            trend = trend.copy()
            trend[ok] = wide[i[ok] - h]
        return med[w:w + n] - med[:n] - w * trend, med

    def _signal(self, *, s: Series, family: str, state: bool) -> _Signal | None:
        x, floor, eps = self._transform(v=s.values, family=family)
        if len(x) < 2 * self.config.window + 1:
            return None
        d, med = self._statistic_and_median(x=x)
        spread = robust_sigma(d)
        noise = max(pooled_diff_noise([x]), floor)
        scale = max(spread, floor)
        if not (np.isfinite(scale) and scale > 0 and np.isfinite(noise)):
            return None
        return _Signal(steps=s.steps, raw=s.values, x=x, scale=scale, family=family, state=state, log_eps=eps,
                       point_noise=noise, d=d, med=med)

    def _shifts(self, *, name: str, sig: _Signal, first_piece: bool, opening: np.ndarray | None,
                kl_metric: str | None) -> list[_Shift]:
        cfg = self.config
        x, raw, w = sig.x, sig.raw, cfg.window
        start = max(w, max(cfg.skip_opening, int(cfg.skip_opening_fraction * len(x))) if first_piece else w)
        if len(x) - w + 1 <= start:
            return []
        d, med = sig.d, sig.med
        # the raw values' medians are those of x when x is the raw series itself (a linear scale)
        raw_med = med if np.array_equal(x, raw) and x.dtype == raw.dtype else sliding_median(raw, w)
        open_x = None
        if opening is not None:
            open_x = float(np.median(self._transform_like(values=opening, sig=sig)))
        idx = np.arange(start, len(x) - w + 1)
        z = np.abs(d[idx - w]) / sig.scale
        zp = np.abs(d[idx - w]) / sig.point_noise
        keep = (z >= cfg.min_z) | ((zp >= min(cfg.collapse_z, cfg.zero_collapse_z)) if name == kl_metric else False)
        at = np.flatnonzero(keep)  # only the kept indices become Python objects
        found = [
            _Shift(metric=name, family=sig.family, state=sig.state, index=i, z=zi, z_point=zpi,
                   before=float(raw_med[i - w]), after=float(raw_med[i]),
                   low_after=float(np.min(raw[max(i - 1, 0):i + 2])),
                   direction=self._direction(before=float(med[i - w]), after=float(med[i]), opening=open_x))
            for i, zi, zpi in zip(idx[at].tolist(), z[at].tolist(), zp[at].tolist())]
        # keep the strongest index of each run of consecutive indices (one jump lights up a few)
        best: list[_Shift] = []
        for sh in found:
            if best and sh.index - best[-1].index <= cfg.tolerance:
                if sh.z > best[-1].z:
                    best[-1] = sh
            else:
                best.append(sh)
        return best

    def _transform_like(self, *, values: np.ndarray, sig: _Signal) -> np.ndarray:
        """Opening values on the scale of ``sig`` (log when the piece was read on a log scale)."""
        if sig.log_eps is None:
            return values.astype(float)
        return floored_log(values, sig.log_eps)

    def _direction(self, *, before: float, after: float, opening: float | None) -> str:
        """'toward' when the shift takes the series most of its way back to the opening, 'away' when it
        takes it further from the opening, '' otherwise."""
        cfg = self.config
        if opening is None or not np.isfinite(opening):
            return ""
        gap_before, gap_after, step = abs(before - opening), abs(after - opening), abs(after - before)
        if gap_after < (1 - cfg.return_fraction) * gap_before:
            return "toward"
        if step > 0 and gap_after - gap_before >= cfg.away_fraction * step:
            return "away"
        return ""

    # ------------------------------------------------------------------------------ rules

    def _collapse(self, *, sh: _Shift, kl_metric: str | None) -> bool:
        cfg = self.config
        bar = cfg.zero_collapse_z if sh.low_after == 0.0 else cfg.collapse_z
        return (sh.metric == kl_metric and sh.z_point >= bar and sh.after != 0.0
                and abs(sh.low_after) < cfg.collapse_fraction * abs(sh.before)
                and abs(sh.after) < COLLAPSE_STAYS_BELOW * abs(sh.before))

    def _scheduled(self, *, sh: _Shift, sig: _Signal, scheduled: frozenset[int]) -> bool:
        """A declared reference update lands at this shift: between the logged points around it."""
        if not scheduled:
            return False
        tol = self.config.tolerance
        lo = int(sig.steps[max(sh.index - 1 - tol, 0)])
        hi = int(sig.steps[min(sh.index + tol, len(sig.steps) - 1)])
        return any(lo <= s <= hi for s in scheduled)

    def _suspicious(self, *, by_family: dict[str, list[_Shift]]) -> bool:
        """The families rule (module docstring, points 1-3)."""
        cfg = self.config
        if len(by_family) < cfg.min_families:
            return False
        if not any(sh.state and fam in STATE_FAMILIES for fam, shifts in by_family.items() for sh in shifts):
            return False
        back = any(sh.state and sh.direction == "toward"
                   for fam in cfg.direction_families for sh in by_family.get(fam, []))
        if not back:
            return False
        for fam, shifts in by_family.items():
            if fam in cfg.veto_exempt:
                continue
            lead = max(shifts, key=lambda s: (s.state, s.z))
            if lead.direction == "away":
                return False
        return True

    def _groups(self, *, shifts: list[_Shift], kl_metric: str | None, signals: dict[str, _Signal],
                scheduled: frozenset[int]) -> list[tuple[list[_Shift], bool]]:
        """Shifts within ``tolerance`` of each other that make a suspicion, each with whether it is a
        KL collapse."""
        cfg = self.config
        clusters: list[list[_Shift]] = []
        for sh in sorted(shifts, key=lambda s: s.index):
            if clusters and sh.index - clusters[-1][0].index <= cfg.tolerance:
                clusters[-1].append(sh)
            else:
                clusters.append([sh])
        out: list[tuple[list[_Shift], bool]] = []
        for g in clusters:
            by_metric: dict[str, _Shift] = {}
            for sh in g:
                if sh.metric not in by_metric or sh.z > by_metric[sh.metric].z:
                    by_metric[sh.metric] = sh
            by_family: dict[str, list[_Shift]] = {}
            for sh in by_metric.values():
                if sh.z >= cfg.min_z:  # a KL kept for the collapse rule alone is no family shift
                    by_family.setdefault(sh.family, []).append(sh)
            collapsed = any(self._collapse(sh=sh, kl_metric=kl_metric) and not self._scheduled(sh=sh, sig=signals[sh.metric], scheduled=scheduled)
                            for sh in by_metric.values())
            if collapsed or self._suspicious(by_family=by_family):
                out.append((list(by_metric.values()), collapsed))
        return out

    def _confirm(self, *, group: list[_Shift], signals: dict[str, _Signal], collapsed: bool) -> Finding | None:
        """Place the change point jointly with ruptures; it must agree with the screen."""
        import ruptures as rpt  # slow to import: only for runs with a candidate

        cfg = self.config
        w = cfg.window
        center = int(round(np.median([sh.index for sh in group])))
        names = [sh.metric for sh in group]
        steps = signals[names[0]].steps
        # a lone KL collapse is placed within one window each side: a reference rebuilt every few
        # steps leaves a sawtooth, whose neighbouring teeth would draw the change point away
        half = w if collapsed and len(group) == 1 else 2 * w
        lo = max(0, center - half)
        columns = []
        for n in names:
            sig = signals[n]
            xi = np.interp(steps[lo: center + half], sig.steps, sig.x)  # same step grid as the first series
            columns.append((xi - np.median(xi)) / sig.scale)
        sig = np.column_stack(columns)
        hi = lo + len(sig)
        if len(sig) < 2 * MIN_SEGMENT + 1:
            return None
        bkps = rpt.Binseg(model="l2", min_size=MIN_SEGMENT, jump=1).fit(sig).predict(n_bkps=1)
        cp = lo + int(bkps[0])
        if abs(cp - center) > cfg.tolerance + 1 or not (lo < cp < hi):
            return None
        step = int(steps[cp])
        parts = ", ".join(f"{sh.metric} {fmt(sh.before)} -> {fmt(sh.after)} ("
                          + (f"{sh.z_point:.0f} noise units" if collapsed and sh.family == KL else f"{sh.z:.0f} SDs")
                          + (", back toward its opening" if sh.direction == "toward" else "") + ")"
                          for sh in sorted(group, key=lambda s: -s.z))
        fams = sorted({sh.family for sh in group})
        what = (f"the reference KL collapsed ({parts})" if collapsed and len(group) == 1 else
                f"{len(group)} series in {len(fams)} families ({', '.join(fams)}) changed level at once ({parts})")
        msg = (f"Suspected unlogged restart at step {step}: {what} but no restart was logged there; if the run "
               f"was restarted at this step, declare it with --restart {step} so the resume is judged.")
        return self.finding(step=step, severity="warning", message=msg,
                            data={"step": step, "series": [sh.__dict__ for sh in group], "families": fams,
                                  "kl_collapse": bool(collapsed),
                                  "screen_index": center, "change_point_index": cp},
                            metrics=[sh.metric for sh in group])


def family_of(*, name: str, kl: Collection[str], loss: Collection[str], grad_norm: Collection[str]) -> tuple[str, bool]:
    """A metric's family and whether it is a *state* series (module docstring, points 1-2).

    ``kl``, ``loss`` and ``grad_norm``: the run's names of those quantities."""
    if name in kl:
        return KL, True
    if name in grad_norm:
        return "grad_norm", True
    if name in loss:
        return "loss", True
    rest = _NAMESPACES.sub("", name)
    parts = re.split(r"[/.]", rest)
    leaf = parts[-1]
    if _ENTROPY_LEAF.search(leaf):
        return ENTROPY, True
    if _REWARD_KEY.search(rest) or any(_REWARD_PART.search(p) for p in parts[:-1]):
        # a reward's mean is state; its spread, extremes and zero-spread fraction only support
        spread = bool(_SPREAD_LEAF.search(leaf)) or "zero_std" in leaf
        return REWARD, not spread
    # one prefix, one family (only "/" separates: TRL's "profiling/Time taken: GRPOTrainer._prepare_inputs"
    # holds dots in a leaf)
    return rest.split("/", 1)[0], False


def _cumulative(*, v: np.ndarray) -> bool:
    """A running total: never decreasing, and increasing at nearly every point."""
    d = np.diff(v)
    return bool(len(d) and np.all(d >= 0) and np.mean(d > 0) >= CUMULATIVE_RISING)
