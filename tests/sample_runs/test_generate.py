"""The sample generator's training loop and resume orderings behave as the manifest claims.

These run the real loop (in process for speed) and, once, the real generator with the TensorBoard
writer, so the committed sample runs can be trusted as ground truth for klwatch's own tests.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sample_runs import generate, grpo  # noqa: E402

CFG = grpo.TrainConfig(total_steps=30, save_period=5)


def run_launches(tmp_path: Path, *, cfg: grpo.TrainConfig, launches: list[dict]) -> list[grpo.StepLog]:
    logs: list[grpo.StepLog] = []
    for launch in launches:
        grpo.launch(cfg=cfg, ckpt_root=tmp_path, on_step=logs.append, **{"order": "fixed", "lose": [], **launch})
    return logs


def test_fixed_order_resume_reproduces_the_continuous_run_exactly(tmp_path: Path) -> None:
    continuous = run_launches(tmp_path / "a", cfg=CFG, launches=[{"resume_from": None, "stop_after": None}])
    resumed = run_launches(tmp_path / "b", cfg=CFG, launches=[
        {"resume_from": None, "stop_after": 20},
        {"resume_from": 20, "stop_after": None, "order": "fixed"},
    ])
    assert [s.step for s in resumed] == list(range(1, 31))
    assert resumed == continuous  # every logged field, bit for bit


def test_buggy_order_makes_the_first_post_resume_kl_near_zero_and_regrow(tmp_path: Path) -> None:
    logs = run_launches(tmp_path, cfg=CFG, launches=[
        {"resume_from": None, "stop_after": 20},
        {"resume_from": 20, "stop_after": None, "order": "buggy"},
    ])
    kl = {s.step: s.kl for s in logs}
    assert kl[1] < 0.01 * kl[20]  # KL starts at ~0 ...
    assert kl[20] > 0.01  # ... and has grown clearly by the crash
    assert kl[21] < 0.01 * kl[20]  # the reference was re-snapshotted from the resumed weights
    assert kl[30] > 10 * kl[21]  # and the KL grows again from the new anchor


def test_checkpoint_round_trips_the_full_training_state(tmp_path: Path) -> None:
    cfg = replace(CFG, kl_ctrl="adaptive")
    state = grpo.TrainState.fresh(cfg)
    ref = state.weights.copy()
    dataset = grpo.make_dataset(size=cfg.dataset_size, seed=cfg.dataset_seed)
    for _ in range(7):
        grpo.train_step(state, ref, cfg=cfg, dataset=dataset)
    grpo.save_checkpoint(state, root=tmp_path, cfg=cfg)

    loaded = grpo.TrainState.fresh(cfg)
    grpo.load_checkpoint(loaded, path=tmp_path / "step_7")
    assert loaded.step == 7
    np.testing.assert_array_equal(loaded.weights, state.weights)
    np.testing.assert_array_equal(loaded.adam.m, state.adam.m)
    np.testing.assert_array_equal(loaded.adam.v, state.adam.v)
    assert loaded.adam.t == state.adam.t == 14  # two minibatch updates per step
    assert loaded.scheduler == state.scheduler
    assert loaded.sampler == state.sampler and loaded.sampler.consumed == 7 * cfg.prompts_per_step
    assert loaded.kl_ctrl == state.kl_ctrl and loaded.kl_ctrl.value != cfg.kl_coef
    assert loaded.rng.bit_generator.state == state.rng.bit_generator.state
    info = json.loads((tmp_path / "step_7" / "training_info.json").read_text())
    assert info["step"] == 7 and info["consumed_samples"] == 7 * cfg.prompts_per_step
    # and the next step from the loaded state is the same step
    a = grpo.train_step(state, ref, cfg=cfg, dataset=dataset)
    b = grpo.train_step(loaded, ref, cfg=cfg, dataset=dataset)
    assert a == b


@pytest.mark.parametrize(
    ("lose", "check"),
    [
        (["scheduler"], lambda before, after, cfg: after.lr == pytest.approx(cfg.lr / cfg.warmup_steps)
         and before.lr > 2 * after.lr),
        (["sampler"], lambda before, after, cfg: after.consumed_samples == cfg.prompts_per_step),
        (["kl_controller"], lambda before, after, cfg: after.kl_coef == cfg.kl_coef != before.kl_coef),
        # fresh Adam moments: the first update is ~lr*sign(g), a far larger policy step per unit of LR²
        (["optimizer"], lambda before, after, cfg: after.approx_kl / after.lr**2 > 5 * before.approx_kl / before.lr**2),
    ],
)
def test_lost_state_at_resume_shows_in_the_logged_series(tmp_path: Path, lose, check) -> None:
    cfg = replace(CFG, kl_ctrl="adaptive")
    logs = run_launches(tmp_path, cfg=cfg, launches=[
        {"resume_from": None, "stop_after": 20},
        {"resume_from": 20, "stop_after": None, "lose": lose},
    ])
    by_step = {s.step: s for s in logs}
    assert check(by_step[20], by_step[21], cfg)


def test_policy_change_metrics_measure_the_earlier_minibatches_of_the_step() -> None:
    """approx-KL and clip fraction compare each minibatch's policy with the rollout policy, before that
    minibatch's update: with one minibatch there is nothing to measure, with more the earlier updates show."""
    dataset = grpo.make_dataset(size=CFG.dataset_size, seed=CFG.dataset_seed)
    for minibatches in (1, 2, 4):
        cfg = replace(CFG, minibatches=minibatches)
        state = grpo.TrainState.fresh(cfg)
        ref = state.weights.copy()
        logs = [grpo.train_step(state, ref, cfg=cfg, dataset=dataset) for _ in range(6)]
        assert all(0.0 <= s.clipfrac <= 1.0 for s in logs)
        if minibatches == 1:
            # the rollout policy and the first minibatch's policy are the same weights, computed twice:
            # their k3 estimate is 0 up to rounding (a few ulps with some BLAS builds), and no token clips
            assert all(abs(s.approx_kl) < 1e-12 and s.clipfrac == 0 for s in logs)
        else:
            assert all(s.approx_kl > 0.0 for s in logs)  # k3 is nonnegative, and the policy did move


def test_a_resume_with_fresh_adam_moments_takes_a_first_step_like_the_runs_very_first(tmp_path: Path) -> None:
    """Zero moments make Adam's normalised step m/sqrt(v) = ±1, as at the run's first update; a warm
    optimizer's is far smaller, so the approx-KL per unit of LR² jumps back to the opening value."""
    def size(logs: list[grpo.StepLog]) -> dict[int, float]:
        return {s.step: s.approx_kl / s.lr**2 for s in logs}

    lost = size(run_launches(tmp_path / "lost", cfg=CFG, launches=[
        {"resume_from": None, "stop_after": 20}, {"resume_from": 20, "stop_after": None, "lose": ["optimizer"]}]))
    kept = size(run_launches(tmp_path / "kept", cfg=CFG, launches=[
        {"resume_from": None, "stop_after": 20}, {"resume_from": 20, "stop_after": None}]))
    steady = float(np.median([kept[s] for s in range(10, 21)]))
    assert lost[1] > 5 * steady  # the run's own first update
    assert lost[21] > 5 * steady and lost[21] > 5 * kept[21] and lost[21] > 0.5 * lost[1]
    assert kept[21] < 2 * steady


def logged_kl(path: Path) -> dict[int, float]:
    """``train/kl_penalty`` by step from one event file, read with TensorBoard's own loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    out = {}
    for event in EventFileLoader(str(path)).Load():
        for v in event.summary.value:
            if v.tag == "train/kl_penalty":
                value = v.simple_value if v.HasField("simple_value") else tensor_util.make_ndarray(v.tensor).item()
                out[event.step] = value
    return out


def test_generator_writes_event_files_per_process_and_a_manifest_of_what_it_did(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    generate.main(["--out", str(out), "--scenarios", "resume-buggy,resume-fixed", "--trackers", "tensorboard",
                   "--steps", "18", "--step-delay", "0", "--restart-gap", "0.2", "--quiet"])
    manifest = json.loads((out / "manifest.json").read_text())
    runs = {r["scenario"]: r for r in manifest["runs"]}
    assert set(runs) == {"resume-buggy", "resume-fixed"}
    for name, verdict in (("resume-buggy", "reference_reset"), ("resume-fixed", "ok")):
        run = runs[name]
        assert run["expected_status"] == verdict
        [b] = run["boundaries"]
        assert b["expected_verdict"] == verdict
        assert b["step"] == b["resumed_from_step"] + 1
        files = [f for p in run["processes"] for f in p["event_files"]]
        assert len(files) == 2 and all((out / f).is_file() for f in files)  # one event file per process
        assert run["processes"][1]["started_at"] > run["processes"][0]["ended_at"]
        ckpts = sorted((out / run["checkpoint_dir"]).glob("step_*/training_info.json"))
        assert ckpts and b["resumed_from_step"] in run["checkpoint_steps_kept"]
    for name, ratio in (("resume-buggy", lambda r: r < 0.01), ("resume-fixed", lambda r: r > 0.3)):
        run = runs[name]
        [b] = run["boundaries"]
        before, after = (logged_kl(out / p["event_files"][0]) for p in run["processes"])
        assert max(before) == b["resumed_from_step"] and min(after) == b["step"]
        assert before[max(before)] == pytest.approx(b["kl_last_before"], rel=1e-6)  # float32 in the file
        assert after[b["step"]] == pytest.approx(b["kl_first_after"], rel=1e-6, abs=1e-12)
        assert ratio(after[b["step"]] / before[max(before)])


def test_committed_manifest_agrees_with_the_committed_logs() -> None:
    """What manifest.json claims at every boundary is what the committed event files and MLflow
    store hold (read back with TensorBoard's loader and SQLite, read-only)."""
    import sqlite3

    root = REPO / "sample_runs"
    manifest = json.loads((root / "manifest.json").read_text())
    con = sqlite3.connect(f"file:{root / 'mlflow' / 'mlflow.db'}?mode=ro", uri=True)
    checked = 0
    for run in manifest["runs"]:
        if run["tracker"] == "tensorboard":
            pieces = [sorted(logged_kl(root / p["event_files"][0]).items()) for p in run["processes"]]
        elif run["tracker"] == "mlflow" and run["layout"] == "new-run":
            pieces = [con.execute("SELECT step, value FROM metrics WHERE run_uuid=? AND key=? ORDER BY timestamp, step",
                                  (p["run_id"], run["kl_metric"])).fetchall() for p in run["processes"]]
        else:
            continue
        assert [p[0][0] for p in pieces] == [p["first_step"] for p in run["processes"]]
        assert [p[-1][0] for p in pieces] == [p["last_step"] for p in run["processes"]]
        for i, b in enumerate(run["boundaries"]):
            assert pieces[i][-1][1] == pytest.approx(b["kl_last_before"], rel=1e-6)
            assert pieces[i + 1][0][1] == pytest.approx(b["kl_first_after"], rel=1e-6, abs=1e-12)
            if b["expected_verdict"] == "reference_reset":
                assert pieces[i + 1][0][1] < 0.01 * pieces[i][-1][1]
            if b["expected_verdict"] == "ok":
                assert pieces[i + 1][0][1] > 0.3 * pieces[i][-1][1]
        checked += 1
    con.close()
    assert checked >= 13


def test_a_tracker_whose_writer_package_is_missing_is_skipped_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    """Issue 25, 4: without tensorboardX (the README's plain install) the generator says what to install and
    writes what it can; before, a ModuleNotFoundError traceback from inside a launch."""
    import os
    import subprocess

    hidden = tmp_path / "hide"
    (hidden / "tensorboardX").mkdir(parents=True)
    (hidden / "tensorboardX" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": str(hidden)}
    proc = subprocess.run([sys.executable, str(REPO / "sample_runs" / "generate.py"), "--out", str(tmp_path / "runs"),
                           "--scenarios", "resume-fixed", "--trackers", "tensorboard,mlflow", "--steps", "12",
                           "--step-delay", "0", "--restart-gap", "0.2", "--quiet"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "skipping tensorboard: the tensorboardX package is not installed (pip install 'klwatch[examples]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert {r["tracker"] for r in json.loads((tmp_path / "runs" / "manifest.json").read_text())["runs"]} == {"mlflow"}


def test_the_examples_install_what_the_generator_imports() -> None:
    """The example workflow's setup and the pytest example's docstring install the ``examples`` extra, which holds
    every package the generator's writers import beyond klwatch's own dependencies."""
    import tomllib

    import yaml

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    needed = {m for mods in generate.TRACKER_MODULES.values() for m in mods if m not in core}
    assert needed and needed <= {d.split(">")[0].split("=")[0] for d in project["optional-dependencies"]["examples"]}
    wf = yaml.safe_load((REPO / "examples" / "github-actions" / "klwatch-resume-test.yml").read_text())
    setup = next(s for s in wf["jobs"]["resume-test"]["steps"] if s.get("id") == "setup")
    # klwatch itself comes from the action there: the setup installs the extra's packages, not klwatch
    assert all(p.split(">")[0] in setup["run"] for p in project["optional-dependencies"]["examples"])
    assert "pip install -e '.[examples]'" in (REPO / "examples" / "pytest_resume_test.py").read_text()
