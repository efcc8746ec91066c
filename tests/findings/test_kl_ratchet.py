from __future__ import annotations

import numpy as np
import pytest
from finding_helpers import SCENARIOS, judge, of

from klwatch.findings import KlRatchet, KlRatchetConfig

NAME = "kl_ratchet"


def ratchet_run(*, resumes: list[int], buggy: list[bool], total: int = 200, seed: int = 0, config: dict | None = None,
                key: str = "train/kl_penalty", sign: float = 1.0):
    """One process per stretch; at a buggy resume the reference is the resumed policy, so the KL
    grows again from zero; at a correct one it continues."""
    rng = np.random.default_rng(seed)
    bounds = [0, *resumes, total]
    anchor = 0
    procs = []
    for k in range(len(bounds) - 1):
        if k > 0 and buggy[k - 1]:
            anchor = bounds[k]
        steps = np.arange(bounds[k] + 1, bounds[k + 1] + 1)
        kl = 0.06 * (1 - np.exp(-(steps - anchor) / 20.0)) * np.exp(rng.normal(0, 0.1, len(steps)))
        procs.append({key: (steps, sign * kl)})
    return judge(procs, config=config, seed=seed, with_kl=False)


def test_several_resets_give_one_info_summary_of_the_drift():
    result = ratchet_run(resumes=[50, 100, 150], buggy=[True, True, True])
    assert [v.verdict for v in result.verdicts] == ["reference_reset"] * 3
    [f] = of(result, NAME)
    assert f.severity == "info" and f.step == 151
    assert f.data["reset_steps"] == [51, 101, 151]
    assert f.data["kl_before_resets"] == pytest.approx([v.kl_before for v in result.verdicts])
    assert f.data["cumulative_kl"] == pytest.approx(sum(f.data["kl_before_resets"]) + f.data["kl_since_last_reset"])
    assert f.data["understatement"] > 2.5  # four stretches of about the same KL each
    assert "51, 101, 151" in f.message


def test_a_kl_logged_negated_is_summarised_as_a_distance():
    plain = ratchet_run(resumes=[50, 100, 150], buggy=[True, True, True])
    negated = ratchet_run(resumes=[50, 100, 150], buggy=[True, True, True], key="ppo_actor/kl_rewards/avg", sign=-1.0)
    assert negated.lineage.kl_negated
    [p], [n] = of(plain, NAME), of(negated, NAME)
    assert n.data["reset_steps"] == p.data["reset_steps"]
    assert n.data["max_logged_kl"] == pytest.approx(p.data["max_logged_kl"]) and n.data["max_logged_kl"] > 0
    assert n.data["kl_since_last_reset"] == pytest.approx(p.data["kl_since_last_reset"])


def test_a_single_reset_is_not_a_ratchet():
    result = ratchet_run(resumes=[50, 100], buggy=[True, False])
    assert [v.verdict for v in result.verdicts] == ["reference_reset", "ok"]
    assert of(result, NAME) == []


def test_correct_resumes_give_no_summary():
    assert of(ratchet_run(resumes=[50, 100, 150], buggy=[False] * 3), NAME) == []


def test_declared_resets_are_summarised_only_when_asked():
    result = ratchet_run(resumes=[50, 100], buggy=[True, True], config={"ref_update_interval": 50})
    assert {v.verdict for v in result.verdicts} == {"intentional"}
    assert of(result, NAME) == []
    [f] = KlRatchet(config=KlRatchetConfig(include_intentional=True)).detect(result)
    assert f.data["reset_steps"] == [51, 101]


def test_summarises_the_generated_ratchet(sample, manifest):
    result = sample("ratchet-buggy")
    resets = [b["step"] for b in manifest("ratchet-buggy")["boundaries"] if b["expected_verdict"] == "reference_reset"]
    assert len(resets) >= 2
    [f] = of(result, NAME)
    assert f.data["reset_steps"] == resets and f.severity == "info"
    assert f.data["cumulative_kl"] > f.data["max_logged_kl"]


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "ratchet-buggy"])
def test_silent_on_the_generated_runs_with_at_most_one_reset(sample, scenario):
    assert of(sample(scenario), NAME) == []
