from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from finding_helpers import SCENARIOS, judge, of

from klwatch.findings.suspected_restart import SuspectedRestart
from klwatch.pipeline import scan

NAME = "suspected_restart"


def one_process_run(*, seed: int, reset_at: int | None = None, weights_lost_at: int | None = None,
                    learned_at: int | None = None, kl_off: bool = False, config: dict | None = None,
                    total: int = 200):
    """A single process (no restart logged) with a reference KL growing from zero, the loss that
    carries it (plus policy-loss noise), an LR schedule, and noisy grad norm, reward and entropy.
    ``reset_at``: the reference is rebuilt there (KL falls to ~0 and regrows). ``weights_lost_at``:
    training starts over from the base model there (reward and entropy go back to their opening
    levels and learn again, KL with them). ``learned_at``: a healthy leap there (reward up, entropy down,
    by as much as a lost-weights restart moves them, but away from the opening). ``kl_off``: no KL
    penalty (KL logged as 0)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, total + 1)
    anchor = np.where(steps >= reset_at, reset_at - 1, 0) if reset_at else np.zeros(total)
    age = steps - (np.where(steps >= weights_lost_at, weights_lost_at - 1, 0) if weights_lost_at else 0)
    anchor = np.maximum(anchor, steps - age)
    kl = 0.08 * (1 - np.exp(-(steps - anchor) / 25.0)) * np.exp(rng.normal(0, 0.15, total))
    kl = np.zeros(total) if kl_off else kl
    loss = 0.1 * kl + rng.normal(0, 4e-4, total)
    lr = np.where(steps <= 10, 1e-4 * steps / 10, 1e-4 * (0.55 + 0.45 * np.cos(np.pi * steps / total)))
    gn = 0.5 * np.exp(rng.normal(0, 0.2, total))
    reward = 0.2 + 0.5 * (1 - np.exp(-age / 40.0)) + rng.normal(0, 0.03, total)
    entropy = 1.8 - 0.8 * (1 - np.exp(-age / 40.0)) + rng.normal(0, 0.03, total)
    if learned_at:
        reward = reward + np.where(steps >= learned_at, 0.45, 0.0)
        entropy = entropy * np.where(steps >= learned_at, 0.5, 1.0)
    series = {"train/kl_penalty": kl, "train/loss": loss, "train/lr": lr, "train/grad_norm": gn,
              "train/reward": reward, "train/entropy": entropy}
    return judge([{n: (steps, v) for n, v in series.items()}], config=config, seed=seed)


@pytest.mark.parametrize("seed", range(5))
def test_unlogged_reference_reset_is_a_suspected_restart_at_its_step(seed):
    result = one_process_run(seed=seed, reset_at=121)
    assert result.lineage.boundaries == []
    [f] = of(result, NAME)
    assert f.severity == "warning" and abs(f.step - 121) <= 1
    assert f.data["kl_collapse"] and "--restart" in f.message


@pytest.mark.parametrize("seed", range(5))
def test_unlogged_restart_that_lost_the_weights_moves_several_series_and_is_suspected(seed):
    result = one_process_run(seed=seed, weights_lost_at=121, kl_off=True)
    assert result.status == "kl_disabled"
    [f] = of(result, NAME)
    assert abs(f.step - 121) <= 1 and not f.data["kl_collapse"]
    assert {s["metric"] for s in f.data["series"]} >= {"train/reward", "train/entropy"}


@pytest.mark.parametrize("seed", range(5))
def test_reward_and_entropy_leaping_away_from_the_opening_at_one_step_is_not_suspected(seed):
    """The same two state families, shifting as far at one step, but away from where the run started: the
    policy learned something, it did not lose its weights."""
    result = one_process_run(seed=seed, learned_at=121, kl_off=True)
    assert of(result, NAME) == []


@pytest.mark.parametrize("seed", range(10))
def test_healthy_single_process_is_silent(seed):
    assert of(one_process_run(seed=seed), NAME) == []


def test_reference_resets_declared_in_config_are_not_suspected():
    assert of(one_process_run(seed=0, reset_at=121, config={"reference_reset_interval": 120}), NAME) == []


@pytest.mark.parametrize("seed", range(3))
def test_a_kl_collapse_at_a_step_the_declared_reference_schedule_touches_is_not_suspected(seed):
    """The hook for declared schedules: an update after step 120 shows from 121 on."""
    result = one_process_run(seed=seed, reset_at=121)
    assert SuspectedRestart().detect(result, reference_schedule_steps={60, 120, 180}) == []


@pytest.mark.parametrize("seed", range(3))
def test_a_kl_collapse_off_the_declared_reference_schedule_is_still_suspected(seed):
    result = one_process_run(seed=seed, reset_at=121)
    [f] = SuspectedRestart().detect(result, reference_schedule_steps={50, 100, 150})
    assert abs(f.step - 121) <= 1 and f.data["kl_collapse"]


def test_an_empty_declared_schedule_overrides_a_config_keyword_that_declares_nothing_at_this_step():
    """Once the schedule is known, the config's mere mention of resets no longer drops the KL."""
    result = one_process_run(seed=0, reset_at=121, config={"reference_reset_interval": 50})
    [f] = SuspectedRestart().detect(result, reference_schedule_steps=set())
    assert abs(f.step - 121) <= 1


def _as_table(result, path: Path) -> Path:
    """Every metric of a judged run in one wide table with no clock and no process column: the run's
    restarts are no longer in the logs (what a history export looks like)."""
    rows: dict[int, dict[str, float]] = {}
    for piece in result.lineage.pieces:
        for name, s in piece.items():
            if not name.startswith("_"):
                for st, v in zip(s.steps.tolist(), s.values.tolist()):
                    rows.setdefault(st, {})[name] = v
    frame = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    frame.index.name = "step"
    frame.to_csv(path)
    return path


@pytest.mark.parametrize("scenario", ["resume-buggy", "ratchet-buggy"])
def test_generated_buggy_resumes_exported_without_restart_marks_are_suspected(sample, manifest, tmp_path, scenario):
    table = _as_table(sample(scenario), tmp_path / f"{scenario}.csv")
    [result] = scan([str(table)]).results
    assert result.lineage.boundaries == []
    resets = [b["step"] for b in manifest(scenario)["boundaries"] if b["expected_verdict"] == "reference_reset"]
    assert [f.step for f in of(result, NAME)] == resets


@pytest.mark.parametrize("scenario", ["continuous", "resume-fixed", "lr-restart", "data-restart"])
def test_generated_runs_without_a_collapse_exported_the_same_way_are_silent(sample, tmp_path, scenario):
    table = _as_table(sample(scenario), tmp_path / f"{scenario}.csv")
    [result] = scan([str(table)]).results
    assert of(result, NAME) == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_silent_on_the_generated_runs_whose_restarts_are_logged(sample, scenario):
    assert of(sample(scenario), NAME) == []


def _shifts_as_before(det: SuspectedRestart, *, name: str, sig, first_piece: bool, opening, kl_metric):
    """The screen as it was computed before the statistic was kept on the signal: the statistic and both
    sliding medians computed again here, a ``_Shift`` tried at every index (the old computation)."""
    from klwatch.findings.suspected_restart import _Shift
    from klwatch.stats import sliding_median

    cfg = det.config
    x, raw, w = sig.x, sig.raw, cfg.window
    start = max(w, max(cfg.skip_opening, int(cfg.skip_opening_fraction * len(x))) if first_piece else w)
    if len(x) - w + 1 <= start:
        return []
    d = det._statistic(x=x)
    med = sliding_median(x, w)
    raw_med = sliding_median(raw, w)
    open_x = None if opening is None else float(np.median(det._transform_like(values=opening, sig=sig)))
    idx = np.arange(start, len(x) - w + 1)
    z = np.abs(d[idx - w]) / sig.scale
    zp = np.abs(d[idx - w]) / sig.point_noise
    keep = (z >= cfg.min_z) | ((zp >= min(cfg.collapse_z, cfg.zero_collapse_z)) if name == kl_metric else False)
    found = [_Shift(metric=name, family=sig.family, state=sig.state, index=int(i), z=float(zi), z_point=float(zpi),
                    before=float(raw_med[i - w]), after=float(raw_med[i]),
                    low_after=float(np.min(raw[max(i - 1, 0):i + 2])),
                    direction=det._direction(before=float(med[i - w]), after=float(med[i]), opening=open_x))
             for i, zi, zpi, k in zip(idx, z, zp, keep) if k]
    best: list = []
    for sh in found:
        if best and sh.index - best[-1].index <= cfg.tolerance:
            if sh.z > best[-1].z:
                best[-1] = sh
        else:
            best.append(sh)
    return best


@pytest.mark.parametrize("family", ["kl", "reward", "completions", "entropy"])
@pytest.mark.parametrize("seed", range(12))
def test_the_screen_gives_the_shifts_the_old_computation_gave(family, seed):
    """The statistic and its sliding median are computed once per signal and the raw medians are reused on
    a linear scale: every shift, its numbers and its direction, as the old screen found them (series with
    jumps, collapses to exactly 0, quantised values, float32 values, and plain noise)."""
    from klwatch.model import Series

    det = SuspectedRestart()
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 3000))
    steps = np.arange(1, n + 1)
    kind = seed % 4
    if kind == 0:  # a level that jumps at a few places
        v = 1.0 + np.cumsum(np.where(rng.random(n) < 0.01, rng.normal(0, 2, n), 0)) ** 2 + rng.normal(0, 0.02, n)
    elif kind == 1:  # a KL collapsing to exactly 0 and regrowing
        age = steps - np.where(steps >= n // 2, n // 2, 0)
        v = 0.05 * (1 - np.exp(-age / 30)) * np.exp(rng.normal(0, 0.1, n))
    elif kind == 2:  # a fraction of 16 completions
        v = rng.integers(0, 17, n) / 16
    else:  # noise logged as float32
        v = (0.3 + rng.normal(0, 0.01, n)).astype(np.float32)
    s = Series(steps, v, None)
    sig = det._signal(s=s, family=family, state=True)
    if sig is None:
        return
    opening = v[:4] if seed % 3 else None
    for first_piece in (True, False):
        for kl_metric in ("m", None):
            got = det._shifts(name="m", sig=sig, first_piece=first_piece, opening=opening, kl_metric=kl_metric)
            want = _shifts_as_before(det, name="m", sig=sig, first_piece=first_piece, opening=opening,
                                     kl_metric=kl_metric)
            assert got == want
            assert [type(v) for sh in got for v in sh.__dict__.values()] == \
                [type(v) for sh in want for v in sh.__dict__.values()]


def _transform_as_before(det: SuspectedRestart, *, v: np.ndarray, family: str):
    from klwatch.findings.suspected_restart import DISTINCT_DECIMALS, TYPICAL_PERCENTILE
    from klwatch.stats import floored_log

    cfg = det.config
    v = v.astype(float)
    typical = float(np.percentile(np.abs(v), TYPICAL_PERCENTILE)) or 1.0
    distinct = np.unique(np.round(v / typical, DISTINCT_DECIMALS))
    positive = bool(np.all(v >= 0) and np.any(v > 0))
    fraction = bool(np.all(v >= 0) and np.all(v <= 1)) and family not in cfg.log_families
    if positive and not fraction and len(distinct) > cfg.few_values and family not in cfg.linear_families:
        eps = cfg.zero_fraction * float(np.percentile(v[v > 0], TYPICAL_PERCENTILE))
        return floored_log(v, eps), cfg.noise_floor_log, eps
    gaps = np.diff(distinct) * typical
    quantum = float(np.min(gaps)) if len(gaps) else 0.0
    return v, max(quantum, cfg.noise_floor_linear * typical), None


@pytest.mark.parametrize("family", ["kl", "entropy", "reward", "completions", "grad_norm"])
@pytest.mark.parametrize("seed", range(10))
def test_the_scale_a_series_is_read_on_is_the_old_computations(family, seed):
    """``_transform`` reuses the typical magnitude as the log floor's level when every value is above 0
    (the two percentiles are then of the same numbers): the same scale, floor and eps, bit for bit."""
    det = SuspectedRestart()
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 2000))
    v = [rng.gamma(2.0, 0.01, n), np.where(rng.random(n) < 0.1, 0.0, rng.gamma(2.0, 0.01, n)),
         rng.normal(0, 1, n), rng.integers(0, 17, n) / 16, 1 + rng.integers(0, 5, n) * 1e-12,
         rng.gamma(2.0, 30.0, n).astype(np.float32)][seed % 6]
    got, want = det._transform(v=v, family=family), _transform_as_before(det, v=v, family=family)
    assert got[0].tobytes() == want[0].tobytes()
    assert got[1:] == want[1:]
