"""Checkpoint folders as resume evidence: NeMo-RL, Hugging Face / TRL and verl layouts."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import yaml

from klwatch.sources import read_source
from klwatch.sources.checkpoints import read_checkpoint_dir
from klwatch.sources.local import ReadError


class _Trap:
    """Unpickling this creates a file: proof that nothing was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def plant_pickles(folder: Path, marker: Path) -> None:
    """What real checkpoints hold next to their JSON: pickles that must never be loaded."""
    for name in ("training_args.bin", "rng_state.pth", "data.pt", "optimizer.pt"):
        (folder / name).write_bytes(pickle.dumps(_Trap(marker)))


def make_nemo_rl(root: Path, marker: Path, *, steps: list[int], run_name: str = "grpo-qwen-7b") -> Path:
    for step in steps:
        d = root / f"step_{step}"
        (d / "policy" / "weights").mkdir(parents=True)
        (d / "training_info.json").write_text(json.dumps(
            {"step": step, "consumed_samples": step * 64, "total_valid_tokens": step * 1000,
             "val_reward": 0.5, "nested": {"x": 1}}))
        (d / "config.yaml").write_text(yaml.safe_dump(
            {"grpo": {"max_num_steps": 100}, "loss_fn": {"reference_policy_kl_penalty": 0.01},
             "logger": {"wandb_enabled": True, "wandb": {"project": "rl", "name": run_name}}}))
        plant_pickles(d / "policy" / "weights", marker)
    (root / "tmp_step_99").mkdir()  # an interrupted save: not a checkpoint
    (root / "latest_checkpoint_status.json").write_text(json.dumps(
        {"last_checkpoint_step": max(steps), "last_successful_ckpt_save_completion": 1760000000.5}))
    return root


def trainer_state(step: int) -> dict:
    log = []
    for s in range(1, step + 1):
        log.append({"step": s, "epoch": s / 100, "kl": 0.001 * s, "loss": 1.0 / s, "reward": 0.1 * s,
                    "learning_rate": 1e-6})
    log.append({"step": step, "epoch": step / 100, "train_runtime": 12.5, "total_flos": 1e12,
                "note": "text is skipped"})
    return {"global_step": step, "epoch": step / 100, "max_steps": 100, "log_history": log,
            "num_input_tokens_seen": step * 512, "best_metric": None, "is_world_process_zero": True}


def make_hf(root: Path, marker: Path, *, steps: list[int]) -> Path:
    for step in steps:
        d = root / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps(trainer_state(step)))
        (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
        plant_pickles(d, marker)
    return root


def make_verl(root: Path, marker: Path, *, steps: list[int]) -> Path:
    for step in steps:
        d = root / f"global_step_{step}" / "actor"
        d.mkdir(parents=True)
        plant_pickles(d.parent, marker)
    (root / "latest_checkpointed_iteration.txt").write_text(f"{max(steps)}\n")
    return root


def test_nemo_rl_checkpoints_give_steps_name_config_and_per_checkpoint_info(tmp_path: Path) -> None:
    marker = tmp_path / "UNPICKLED"
    root = make_nemo_rl(tmp_path / "results" / "checkpoints", marker, steps=[20, 10, 30])
    (seg,) = read_checkpoint_dir(root, ref="results/checkpoints", source=str(tmp_path))
    assert seg.kind == "checkpoints" and seg.ref == "results/checkpoints"
    assert seg.checkpoint_steps == [10, 20, 30]
    assert seg.name == "grpo-qwen-7b"  # from the run's own config
    assert seg.config["loss_fn"]["reference_policy_kl_penalty"] == pytest.approx(0.01)
    infos = seg.meta["checkpoints"]
    assert [c["step"] for c in infos] == [10, 20, 30]
    assert [c["consumed_samples"] for c in infos] == [640, 1280, 1920]
    assert all(c["layout"] == "nemo-rl" and "nested" not in c for c in infos)
    mtime = (root / "step_20" / "training_info.json").stat().st_mtime
    assert infos[1]["mtime"] == mtime
    assert seg.meta["latest_checkpoint_step"] == 30
    assert not seg.warnings and not marker.exists()


def test_hugging_face_checkpoints_give_the_newest_log_history_as_series(tmp_path: Path) -> None:
    marker = tmp_path / "UNPICKLED"
    root = make_hf(tmp_path / "trl-out", marker, steps=[5, 15, 10])
    (seg,) = read_checkpoint_dir(root, ref="trl-out", source=str(tmp_path))
    assert seg.checkpoint_steps == [5, 10, 15]
    assert seg.name == "trl-out"  # nothing in the JSON names the run: the folder does
    assert seg.meta["log_history_from"] == "checkpoint-15"
    kl = seg.series["kl"]
    assert kl.steps.tolist() == list(range(1, 16))
    assert kl.values.tolist() == pytest.approx([0.001 * s for s in range(1, 16)])
    assert kl.wall_times is None
    assert {"kl", "loss", "reward", "learning_rate", "epoch", "train_runtime"} <= set(seg.series)
    assert "note" not in seg.series and "step" not in seg.series
    info = seg.meta["checkpoints"][0]
    assert info["layout"] == "huggingface" and info["global_step"] == 5
    assert info["num_input_tokens_seen"] == 5 * 512
    assert info["mtime"] == (root / "checkpoint-5" / "trainer_state.json").stat().st_mtime
    assert not seg.warnings and not marker.exists()


def test_verl_checkpoints_give_steps_and_the_latest_iteration(tmp_path: Path) -> None:
    marker = tmp_path / "UNPICKLED"
    root = make_verl(tmp_path / "checkpoints" / "proj" / "gsm8k-grpo", marker, steps=[50, 100])
    os.utime(root / "global_step_50", (1_700_000_000, 1_700_000_000))
    (seg,) = read_checkpoint_dir(root, ref="gsm8k-grpo", source=str(tmp_path))
    assert seg.checkpoint_steps == [50, 100]
    assert seg.name == "gsm8k-grpo"
    assert seg.meta["latest_checkpoint_step"] == 100
    assert seg.meta["checkpoints"][0]["mtime"] == 1_700_000_000
    assert not seg.warnings and not marker.exists()


def test_bad_json_is_a_warning_naming_the_file_and_the_rest_is_read(tmp_path: Path) -> None:
    marker = tmp_path / "UNPICKLED"
    root = make_nemo_rl(tmp_path / "ckpts", marker, steps=[10, 20])
    (root / "step_20" / "training_info.json").write_text('{"step": 20, "consumed_')
    hf = make_hf(tmp_path / "hf", marker, steps=[4, 8])
    (hf / "checkpoint-8" / "trainer_state.json").write_bytes(b"\xff\xfe not json")

    (seg,) = read_checkpoint_dir(root, ref="ckpts", source=str(tmp_path))
    assert seg.checkpoint_steps == [10, 20]
    assert seg.meta["checkpoints"][0]["consumed_samples"] == 640
    assert len(seg.warnings) == 1 and "ckpts/step_20/training_info.json" in seg.warnings[0]

    (seg,) = read_checkpoint_dir(hf, ref="hf", source=str(tmp_path))
    assert seg.checkpoint_steps == [4, 8]
    assert len(seg.warnings) == 1 and "hf/checkpoint-8/trainer_state.json" in seg.warnings[0]
    assert seg.meta["log_history_from"] == "checkpoint-4"  # the newest readable one
    assert seg.series["kl"].steps.tolist() == [1, 2, 3, 4]
    assert not marker.exists()


def test_a_folder_without_checkpoints_is_a_read_error(tmp_path: Path) -> None:
    (tmp_path / "step_x").mkdir()
    with pytest.raises(ReadError):
        read_checkpoint_dir(tmp_path, ref=".", source=str(tmp_path))


def test_discovery_finds_each_layout_as_one_checkpoints_segment(tmp_path: Path) -> None:
    marker = tmp_path / "UNPICKLED"
    make_nemo_rl(tmp_path / "nemo" / "checkpoints", marker, steps=[10, 20])
    make_hf(tmp_path / "trl", marker, steps=[3])
    make_verl(tmp_path / "verl" / "proj" / "exp1", marker, steps=[7])
    read = read_source(str(tmp_path))
    assert read.kinds == ["checkpoints"] and not read.errors
    got = {s.ref: (s.name, s.checkpoint_steps) for s in read.segments}
    assert got == {"nemo/checkpoints": ("grpo-qwen-7b", [10, 20]), "trl": ("trl", [3]),
                   "verl/proj/exp1": ("exp1", [7])}
    assert not marker.exists()


def test_a_yaml_alias_bomb_in_a_config_is_refused_with_a_warning_and_the_rest_is_read(tmp_path: Path) -> None:
    """Nine levels of nine aliases: 9**9 strings once walked (GBs), a few hundred bytes on disk."""
    marker = tmp_path / "UNPICKLED"
    root = make_nemo_rl(tmp_path / "ckpts", marker, steps=[10, 20])
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    (root / "step_20" / "config.yaml").write_text("\n".join(lines) + "\n")

    (seg,) = read_checkpoint_dir(root, ref="ckpts", source=str(tmp_path))

    assert seg.checkpoint_steps == [10, 20]
    assert seg.config["loss_fn"] == {"reference_policy_kl_penalty": 0.01}  # step_10's config, the newest readable
    assert seg.warnings == ["ckpts/step_20/config.yaml: YAML alias *a0 at line 2: aliases are refused (they can "
                            "expand without bound); skipped"]


@pytest.mark.parametrize("name, why", [
    ("config.yaml", "YAML nested deeper than 100 levels at line 1: refused; skipped"),
    ("training_info.json", "cannot read JSON (nested too deeply); this checkpoint's details are skipped"),
])
def test_a_file_nested_too_deeply_is_a_warning_naming_it_and_the_checkpoint_is_still_read(
        tmp_path: Path, name: str, why: str) -> None:
    marker = tmp_path / "UNPICKLED"
    root = make_nemo_rl(tmp_path / "ckpts", marker, steps=[10])
    (root / "step_10" / name).write_text("[" * 100_000 + "]" * 100_000)
    (seg,) = read_checkpoint_dir(root, ref="ckpts", source=str(tmp_path))
    assert seg.checkpoint_steps == [10]
    assert seg.warnings == [f"ckpts/step_10/{name}: {why}"]
