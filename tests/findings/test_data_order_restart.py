from __future__ import annotations

import numpy as np
import pytest
from finding_helpers import FAULTS, SCENARIOS, judge, of, planted_step

NAME = "data_order_restart"
BATCH = 64
DATASET = 3200  # 50 steps an epoch


class Sampler:
    """A real epoch-shuffled sampler over a dataset of prompts of random lengths: what it hands out
    decides the batch's mean prompt length. ``shuffle=False`` repeats one order every epoch."""

    def __init__(self, *, seed: int = 3, shuffle: bool = True) -> None:
        self.lengths = np.random.default_rng(seed).integers(20, 400, DATASET)
        self.seed, self.shuffle = seed, shuffle
        self.consumed = 0

    def batch_mean_length(self) -> float:
        epoch, pos = divmod(self.consumed, DATASET)
        order = (np.random.default_rng([self.seed, epoch]).permutation(DATASET) if self.shuffle
                 else np.arange(DATASET))
        self.consumed += BATCH
        return float(self.lengths[order[pos:pos + BATCH]].mean())


def data_run(*, restart: bool, resume: int = 120, total: int = 200, every: int = 1, stop: int | None = None,
             relog_from: int | None = None, counter: str = "train/consumed_samples", shuffle: bool = True,
             lose_to: int = 0, checkpoint_steps=()):
    """Two processes training ``total`` steps; the first stops after ``stop`` (default ``resume``), the
    second resumes from checkpoint ``resume`` with the sampler restored, or rebuilt from scratch when
    ``restart`` (from the sampler state of step ``lose_to``). It logs from ``relog_from`` on (a tracker
    dropping re-logged steps logs later than the resume). Logs a counter and the mean prompt length."""
    stop = resume if stop is None else stop
    procs = []
    snapshot = None
    sampler = Sampler(shuffle=shuffle)
    rows: list[tuple[int, float, float]] = []
    for step in range(1, stop + 1):
        if step == lose_to + 1:
            snapshot_lose = sampler.consumed
        if step == resume + 1:
            snapshot = sampler.consumed
        length = sampler.batch_mean_length()
        rows.append((step, float(sampler.consumed), length))
    if snapshot is None:
        snapshot = sampler.consumed
    procs.append(rows)
    sampler2 = Sampler(shuffle=shuffle)
    sampler2.consumed = (snapshot_lose if lose_to else 0) if restart else snapshot
    rows = []
    for step in range(resume + 1, total + 1):
        length = sampler2.batch_mean_length()
        rows.append((step, float(sampler2.consumed), length))
    first_logged = relog_from if relog_from is not None else resume + 1
    procs.append([r for r in rows if r[0] >= first_logged])
    out = []
    for rows in procs:
        a = np.array(rows)
        keep = (a[:, 0] - a[0, 0]) % every == 0
        a = a[keep]
        values = a[:, 1] / DATASET if counter.endswith("epoch") else a[:, 1]
        out.append({counter: (a[:, 0], values), "train/mean_prompt_length": (a[:, 0], a[:, 2])})
    return judge(out, checkpoint_steps=checkpoint_steps)


def test_rebuilt_sampler_is_an_error_with_counter_and_repeated_prompts():
    [f] = of(data_run(restart=True), NAME)
    assert f.severity == "error" and f.step == 121
    [c] = f.data["counters"]
    assert c["metric"] == "train/consumed_samples" and c["to_start"]
    assert c["after"] == BATCH and c["expected"] == pytest.approx(121 * BATCH)
    [r] = f.data["repeats"]
    # the replayed prompts are the same prompts: their distance is 0 up to rounding
    assert r["metric"] == "train/mean_prompt_length" and r["distance"] < 1e-12 and r["points"] == 6


@pytest.mark.parametrize("every", [1, 10])
@pytest.mark.parametrize("resume", [30, 50, 120])
def test_restored_sampler_is_silent(every, resume):
    assert of(data_run(restart=False, resume=resume, every=every), NAME) == []


def test_rewind_with_restored_sampler_is_silent():
    assert of(data_run(restart=False, resume=100, stop=130, checkpoint_steps=[50, 100]), NAME) == []


def test_dropped_relogged_steps_with_restored_sampler_are_silent():
    # W&B refuses steps 101-130 from the resumed process: its first logged step is 131
    assert of(data_run(restart=False, resume=100, stop=130, relog_from=131, checkpoint_steps=[50, 100]), NAME) == []
    [f] = of(data_run(restart=True, resume=100, stop=130, relog_from=131, checkpoint_steps=[50, 100]), NAME)
    assert f.step == 131 and f.data["counters"][0]["to_start"]


@pytest.mark.parametrize("every", [5, 10])
def test_restart_is_found_when_logging_every_n_steps(every):
    [f] = of(data_run(restart=True, every=every), NAME)
    assert f.severity == "error" and f.data["counters"][0]["to_start"]


def test_hf_fractional_epoch_counter_going_back_to_start_is_found():
    [f] = of(data_run(restart=True, counter="train/epoch"), NAME)
    assert f.data["counters"][0]["metric"] == "train/epoch"
    assert f.data["counters"][0]["after"] == pytest.approx(BATCH / DATASET)


def test_integer_epoch_counter_back_to_zero_is_found_and_its_steps_are_not_a_loss():
    steps1, steps2 = np.arange(1, 141), np.arange(150, 201)
    epoch = lambda s: (s - 1) // 50  # noqa: E731  an integer epoch, 50 steps each
    # the logs of steps 141-149 were lost: continuing at its mean rate would overshoot a whole epoch
    assert of(judge([{"epoch": (steps1, epoch(steps1))}, {"epoch": (steps2, epoch(steps2))}],
                    checkpoint_steps=[149]), NAME) == []
    [f] = of(judge([{"epoch": (steps1, epoch(steps1))}, {"epoch": (steps2, epoch(steps2 - 149))}],
                   checkpoint_steps=[149]), NAME)
    assert f.severity == "error" and f.data["counters"][0]["to_start"]


def test_counter_that_resets_every_epoch_is_not_a_restart():
    # a per-epoch sample count falls to zero every 50 steps; the logs of steps 141-149 were lost, so
    # continuing the count across the resume would cross an epoch boundary
    steps1, steps2 = np.arange(1, 141), np.arange(150, 201)
    count = lambda s: (s % 50) * BATCH  # noqa: E731
    result = judge([{"train/consumed_samples": (steps1, count(steps1))},
                    {"train/consumed_samples": (steps2, count(steps2))}], checkpoint_steps=[149])
    assert of(result, NAME) == []


def test_counter_going_back_partway_is_a_warning():
    [f] = of(data_run(restart=True, lose_to=60, shuffle=True), NAME)
    [c] = f.data["counters"]
    assert not c["to_start"] and c["after"] == pytest.approx(61 * BATCH)
    assert f.severity == "warning" and f.data["repeats"] == []


def test_prompts_repeating_alone_are_an_error_when_no_counter_is_logged():
    result = data_run(restart=True)
    bare = judge([{"train/mean_prompt_length": p["train/mean_prompt_length"]} for p in _processes(result)])
    [f] = of(bare, NAME)
    assert f.severity == "error" and f.data["counters"] == [] and len(f.data["repeats"]) == 1


def test_fixed_order_that_repeats_every_epoch_is_not_a_restart():
    # no shuffle: each epoch starts with the opening prompts, inside the pieces too, so a repeat at a
    # resume on an epoch boundary proves nothing
    assert of(data_run(restart=False, resume=100, shuffle=False), NAME) == []


def _processes(result):
    lineage = result.lineage
    return [{n: (s.steps, s.values) for n, s in p.items() if not n.startswith("_")} for p in lineage.pieces]


def test_fires_on_the_generated_data_restart_at_the_resume(sample, manifest):
    [f] = of(sample("data-restart"), NAME)
    assert f.severity == "error" and f.step == planted_step(manifest("data-restart"), NAME)
    assert f.data["counters"][0]["to_start"]
    assert [r["metric"] for r in f.data["repeats"]] == ["train/mean_prompt_length"]


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if FAULTS.get(s) != NAME])
def test_silent_on_the_other_generated_runs(sample, scenario):
    assert of(sample(scenario), NAME) == []
