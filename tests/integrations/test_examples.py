"""The NeMo-RL and verl resume-guard examples run as documented, on stand-ins for the workers' weights
(those frameworks need GPUs here): each rank's shards recorded then checked, the driver's KL judge
keeping its own history across launches."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from examples.resume_guard import nemo_rl, verl
from klwatch.integrations import ReferenceResetError, ReferenceResetWarning
from synthetic import KLRun, kl_values


def _shards(rank: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rank)
    return {"model.layers.0.mlp.up_proj.weight": rng.normal(size=(4, 8)) * scale,
            "model.embed_tokens.weight": rng.normal(size=(10, 8)) * scale}


def test_nemo_rl_steps_come_from_its_checkpoint_paths():
    assert nemo_rl.resumed_step(None) == 0
    assert nemo_rl.resumed_step("/results/grpo/step_40/policy/weights") == 40


def test_nemo_rl_each_rank_checks_its_own_shards_and_a_rebuilt_reference_raises(tmp_path):
    for rank in (0, 1):
        nemo_rl.guard_worker_reference(_shards(rank), weights_path=None, checkpoint_dir=tmp_path, rank=rank,
                                       model_name="Qwen/Qwen2.5-1.5B")
    assert sorted(p.name for p in tmp_path.glob("klwatch_reference.rank*.json")) == [
        "klwatch_reference.rank0.json", "klwatch_reference.rank1.json"]
    resumed = f"{tmp_path}/step_40/policy/weights"
    guard = nemo_rl.guard_worker_reference(_shards(1), weights_path=resumed, checkpoint_dir=tmp_path, rank=1,
                                           model_name="Qwen/Qwen2.5-1.5B")
    assert guard.events[0].check.matches
    with pytest.raises(ReferenceResetError, match="rank0"):
        nemo_rl.guard_worker_reference(_shards(0, scale=1.001), weights_path=resumed, checkpoint_dir=tmp_path, rank=0,
                                       model_name=resumed)


def test_the_driver_kl_guard_catches_a_reset_from_the_points_it_kept(tmp_path):
    first, second = kl_values(KLRun(amplitude=0.05, tau=25.0, noise=0.1, every=1, resumes=[120], buggy=[True],
                                    last_step=160), np.random.default_rng(2))
    launch1 = nemo_rl.driver_kl_guard(tmp_path, step=0)
    for s, kl in zip(*first):
        launch1.update(int(s), float(kl))
    launch2 = nemo_rl.driver_kl_guard(tmp_path, step=120)
    with pytest.warns(ReferenceResetWarning):
        for s, kl in zip(*second):
            launch2.update(int(s), float(kl))
            if launch2.should_stop:
                break
    assert launch2.events[-1].verdict.verdict == "reference_reset"


def test_verl_resumes_from_its_tracker_file_and_checks_each_ranks_shards(tmp_path):
    assert verl.latest_step(tmp_path) == 0
    triples = [(name, shard, object()) for name, shard in _shards(0).items()]  # (name, local shard, ShardSpec)
    verl.guard_ref_worker(((n, s) for n, s, _ in triples), checkpoint_root=tmp_path, rank=0, model_path="base/")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("60\n")
    assert verl.latest_step(tmp_path) == 60
    ok = verl.guard_ref_worker(((n, s) for n, s, _ in triples), checkpoint_root=tmp_path, rank=0, model_path="base/")
    assert ok.events[0].check.matches
    moved = [(n, s + 1e-6) for n, s, _ in triples]
    with pytest.raises(ReferenceResetError, match="global_step_60"):
        verl.guard_ref_worker(moved, checkpoint_root=tmp_path, rank=0,
                              model_path=f"{tmp_path}/global_step_60/actor/huggingface")


def test_a_verl_run_declaring_its_reference_retaken_at_each_resume_is_never_stopped(tmp_path):
    config = {"trainer": {"project_name": "p"}, "klwatch": {"reference_reset_on_resume": True}}
    first, second = kl_values(KLRun(amplitude=0.05, tau=25.0, noise=0.1, every=1, resumes=[120], buggy=[True],
                                    last_step=160), np.random.default_rng(4))
    launch1 = verl.trainer_kl_guard(tmp_path, config=config)
    for s, kl in zip(*first):
        launch1.update(int(s), float(kl))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("120")
    launch2 = verl.trainer_kl_guard(tmp_path, config=config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceResetWarning)
        for s, kl in zip(*second):
            launch2.update(int(s), float(kl))
    [event] = launch2.events
    assert event.verdict.verdict == "intentional" and not event.reset and not launch2.should_stop
