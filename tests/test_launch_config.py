"""What a relaunch of one training run changes in its config (klwatch.launch_config)."""

from __future__ import annotations

from klwatch.launch_config import checkpoint_in, compare_configs, configs_agree, launch_valued, model_move, same_folder

NEMO = {"policy": {"model_name": "Qwen/Qwen2.5-1.5B", "tokenizer": {"name": "Qwen/Qwen2.5-1.5B"}},
        "loss_fn": {"reference_policy_kl_penalty": 0.01}, "checkpointing": {"checkpoint_dir": "results/grpo"},
        "logger": {"log_dir": "logs/exp_001", "wandb": {"name": "grpo-dev-logger"}}}


def _with(config: dict, path: str, value: object) -> dict:
    import copy

    out = copy.deepcopy(config)
    *head, last = path.split(".")
    node = out
    for part in head:
        node = node[part]
    node[last] = value
    return out


def test_nemo_rl_log_dir_per_launch_does_not_split_a_run():
    diff = compare_configs(NEMO, _with(NEMO, "logger.log_dir", "logs/exp_002"))
    assert diff.agree and diff.per_launch == ("logger.log_dir",) and diff.launch_folders == ("logger.log_dir",)


def test_a_per_launch_folder_under_any_key_name_does_not_split_a_run():
    a, b = {"trainer": {"out": "/runs/Dec01_13-05-59_node7"}}, {"trainer": {"out": "/runs/Dec02_09-00-01_node3"}}
    assert configs_agree(a, b)
    assert launch_valued("logs/exp_001", "logs/exp_002") and launch_valued("tb/1796320613.1995046", "tb/1796320615.99")
    assert not launch_valued("results/grpo-a", "results/grpo-b")


def test_another_base_model_splits_even_though_the_key_names_a_path():
    diff = compare_configs(NEMO, _with(NEMO, "policy.model_name", "meta-llama/Llama-3.2-1B"))
    assert not diff.agree and diff.splitting[0][0] == "policy.model_name"
    assert "policy.model_name" in diff.describe_split()


def test_beta_and_logging_steps_split():
    assert not configs_agree(NEMO, _with(NEMO, "loss_fn.reference_policy_kl_penalty", 0.05))
    assert not configs_agree({"logging_steps": 1}, {"logging_steps": 3})


def test_a_model_moved_into_the_earlier_launchs_checkpoint_joins_as_evidence():
    earlier = {"model_name_or_path": "/models/base", "output_dir": "/work/out/grpo", "beta": 0.1}
    later = {"model_name_or_path": "out/grpo/checkpoint-6", "output_dir": "/work/out/grpo", "beta": 0.1}
    diff = compare_configs(earlier, later)
    assert diff.agree
    (move,) = diff.model_moves
    assert move.checkpoint_step == 6 and move.of_earlier_launch and "checkpoint-6" in move.describe()
    assert model_move(earlier, later) == move


def test_every_frameworks_checkpoint_folder_is_recognised():
    assert checkpoint_in("out/checkpoint-40") == ("out", 40)
    assert checkpoint_in("results/grpo/step_6/policy/weights") == ("results/grpo", 6)
    assert checkpoint_in("ckpts/exp/global_step_12/actor/huggingface") == ("ckpts/exp", 12)
    assert checkpoint_in("ckpt/_actor/global_step30") == ("ckpt/_actor", 30)
    assert checkpoint_in("/models/Qwen2.5-7B") is None


def test_a_ratchet_of_buggy_resumes_moves_from_checkpoint_to_checkpoint():
    move = model_move({"model_name_or_path": "out/checkpoint-4"}, {"model_name_or_path": "out/checkpoint-8"})
    assert move is not None and move.of_earlier_launch and move.checkpoint_step == 8


def test_a_checkpoint_no_config_names_is_a_move_only_where_the_steps_resume_from_it():
    move = model_move({"model_name_or_path": "/models/base"}, {"model_name_or_path": "/elsewhere/checkpoint-6"})
    assert move is not None and not move.of_earlier_launch
    assert move.fits(7, 1) and move.fits(9, 3) and not move.fits(30, 1) and not move.fits(5, 1)


def test_one_model_named_two_ways_is_the_same_model():
    hub = {"model_name_or_path": "Qwen/Qwen2.5-0.5B"}
    cache = {"model_name_or_path": "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc123"}
    assert configs_agree(hub, cache)
    assert configs_agree({"model_name_or_path": "/lustre/u/models/llama-8b"}, {"model_name_or_path": "/mnt/models/llama-8b"})


def test_one_folder_named_from_two_working_directories():
    assert same_folder("results/grpo", "/work/x/results/grpo")
    assert same_folder("/a/clone1/sample_runs/results/grpo", "/b/clone2/sample_runs/results/grpo")
    assert not same_folder("results/grpo", "results/dpo") and not same_folder("/a/models", "/b/models")


def test_a_launch_word_inside_a_run_name_is_not_a_launch_folder():
    assert launch_valued("logs/attempt1/tb", "logs/attempt2/tb") and launch_valued("x/run-resume-2", "x/run-resume-3")
    assert not launch_valued("logs/grpo-resume-correct/exp_002", "logs/grpo-resume-buggy/exp_002")


def test_settings_that_look_like_numbered_names_still_split():
    for key, a, b in (("actor_rollout_ref.actor.kl_loss_type", "k1", "k3"), ("policy.precision", "bfloat16", "float16"),
                      ("data.prompt_file", "data/v1/train.jsonl", "data/v2/train.jsonl"),
                      ("dataset", "20240101-math", "20240601-code"), ("ref_update_steps", 100, 200),
                      ("lora_rank", 0, 32), ("load_in_4bit", False, True),
                      ("per_device_train_batch_size", 4, 8)):
        assert not configs_agree({key: a}, {key: b}), key


def test_a_hostile_model_path_never_raises():
    huge = "out/checkpoint-" + "9" * 5000
    assert checkpoint_in(huge) is None
    assert not configs_agree({"model_name_or_path": "/models/base"}, {"model_name_or_path": huge})
    assert configs_agree({"model_name_or_path": "C:/runs/out\\\\checkpoint-10"}, {"model_name_or_path": "C:/runs/out\\\\checkpoint-10"})
    assert checkpoint_in("C:/runs/out\\\\checkpoint-10") == ("runs/out", 10)  # written half each way


def test_openrlhf_hf_checkpoints_and_local_copies_of_a_hub_model():
    assert checkpoint_in("./ckpt/checkpoints_ppo/global_step30_hf")[1] == 30
    assert configs_agree({"model.path": "Qwen/Qwen2.5-0.5B-Instruct"}, {"model.path": "/root/models/Qwen2.5-0.5B-Instruct"})
    assert not configs_agree({"model.path": "Qwen/Qwen2.5-0.5B-Instruct"}, {"model.path": "/root/models/Qwen2.5-7B-Instruct"})


def test_which_trackers_a_launch_reports_to_is_its_own():
    assert configs_agree({"report_to": ["tensorboard"]}, {"report_to": ["tensorboard", "wandb"]})
    assert configs_agree({"logger": {"wandb_enabled": False}}, {"logger": {"wandb_enabled": True}})
