"""Which series is the reference KL (SPEC.md "Metrics") and the global-step axis."""

from __future__ import annotations

import pytest

from klwatch.metrics import choose_kl_metric, kl_candidates
from klwatch.step_axis import to_framework_steps
from klwatch.model import Segment, Series


@pytest.mark.parametrize("name", ["train/kl_penalty", "kl_penalty", "kl", "train/kl", "objective/kl", "actor/kl_loss",
                                  "actor/reward_kl_penalty", "critic/kl", "train/kl_loss", "train/kl_loss_avg",
                                  "ppo_actor/kl_rewards/avg", "train/actor/kl_loss", "policy/ref_kl"])
def test_recognises_reference_kl_names_of_the_major_frameworks(name):
    assert kl_candidates([name, "loss", "reward"]) == [name]


@pytest.mark.parametrize("name", ["gen_kl_error", "policy_kl_error", "ppo_kl", "approxkl", "policy/approxkl_avg",
                                  "policykl", "actor/ppo_kl", "train/approx_kl", "actor/kl_coef", "kl_ctl/value"])
def test_leaves_out_kl_look_alikes_that_do_not_measure_distance_to_the_reference(name):
    assert kl_candidates([name, "loss"]) == []


def test_reference_kl_wins_over_a_look_alike_logged_beside_it():
    seg = Segment(kind="mlflow", ref="r", source="s", series={
        "actor/ppo_kl": Series([1, 2], [0.1, 0.1]), "actor/kl_loss": Series([1, 2], [0.1, 0.1])})
    assert choose_kl_metric([seg]) == "actor/kl_loss"


def test_user_metric_globs_override_defaults_and_exclusions():
    assert kl_candidates(["my/kl_thing", "kl"], patterns=["my/*"]) == ["my/kl_thing"]
    assert kl_candidates(["ppo_kl"], patterns=["ppo_kl"]) == ["ppo_kl"]


def test_series_move_onto_the_framework_global_step():
    # W&B's _step restarts in a new run; the framework's global step continues
    seg = Segment(kind="wandb-offline", ref="r", source="s", series={
        "train/global_step": Series([0, 1, 2, 3], [41, 42, 43, 44]),
        "kl": Series([0, 1, 2, 3], [0.1, 0.2, 0.3, 0.4], [10.0, 11.0, 12.0, 13.0])})
    out = to_framework_steps(seg, "train/global_step")
    assert out.series["kl"].steps.tolist() == [41, 42, 43, 44]
    assert out.series["kl"].wall_times.tolist() == [10.0, 11.0, 12.0, 13.0]
    assert seg.series["kl"].steps.tolist() == [0, 1, 2, 3]  # the reader's segment is untouched


def test_preference_trainers_implicit_rewards_are_named_per_framework():
    from klwatch.metrics import preference_metrics

    trl = ["train/rewards/chosen", "train/rewards/rejected", "train/rewards/margins", "train/rewards/accuracies",
           "train/loss", "train/logps/chosen"]
    assert preference_metrics(trl) == {"chosen": "train/rewards/chosen", "rejected": "train/rewards/rejected",
                                       "margin": "train/rewards/margins", "accuracy": "train/rewards/accuracies"}
    nemo = ["train/loss", "train/sft_loss", "train/preference_loss", "train/accuracy", "train/rewards_chosen_mean",
            "train/rewards_rejected_mean", "validation/accuracy"]
    assert preference_metrics(nemo) == {"chosen": "train/rewards_chosen_mean", "rejected": "train/rewards_rejected_mean",
                                        "accuracy": "train/accuracy", "loss": "train/preference_loss"}
    openrlhf = ["train/loss", "train/acc", "train/chosen_reward", "train/reject_reward"]
    assert preference_metrics(openrlhf)["rejected"] == "train/reject_reward"


def test_an_accuracy_alone_is_not_a_preference_trainer():
    from klwatch.metrics import preference_metrics

    assert preference_metrics(["train/accuracy", "train/loss", "train/reward"]) == {}


def test_a_glob_prefers_recognised_reference_kl_names_and_leaves_look_alikes_out():
    names = ["train/approxkl", "train/kl_penalty", "train/policy_kl", "train/kl_custom"]
    assert kl_candidates(names, patterns=["*kl*"]) == ["train/kl_penalty", "train/kl_custom"]
    assert kl_candidates(["train/approxkl"], patterns=["*kl*"]) == []
    assert kl_candidates(names, patterns=["train/approxkl"]) == ["train/approxkl"]  # named whole: the user's choice


def test_what_a_glob_matched_is_said_with_the_look_alikes_it_left_out():
    from klwatch.metrics import describe_match

    said = describe_match(["train/approxkl", "train/kl_penalty", "loss"], ["*kl*"], chosen="train/kl_penalty")
    assert said is not None and "matched 2 series (train/approxkl, train/kl_penalty)" in said
    assert "train/approxkl is a KL look-alike" in said and said.endswith("judged train/kl_penalty.")
    assert describe_match(["train/kl_penalty", "loss"], ["*kl*"], chosen="train/kl_penalty") is None
    assert describe_match(["train/kl_penalty"], ["train/kl_penalty"], chosen="train/kl_penalty") is None


def test_a_misspelled_metric_gets_the_closest_logged_names():
    from klwatch.metrics import closest_names

    assert closest_names(["train/kl_penalty", "train/loss"], ["train/kl_penalti"]) == ["train/kl_penalty"]
    assert closest_names(["train/loss"], ["zzz"]) == []
