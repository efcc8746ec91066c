"""``klwatch compare CONTROL RESUMED``: the seed's reproduction test must tell the generator's buggy
resume from its fixed one against the same continuous control, across trackers, and stay quiet on
noise (independent seeds, float32 storage, one outlier)."""

from __future__ import annotations

import json
import shutil
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from klwatch.cli import app
from klwatch.comparison import CompareConfig, compare_runs, compare_series, first_resume, kl_series, log_ratio
from klwatch.model import Series
from klwatch.pipeline import ScanConfig, scan
from tb_runs import write_run

REPO = Path(__file__).resolve().parents[1]


def curve(steps: np.ndarray, *, ref: int = 0, noise: float = 0.0, seed: int = 0, amp: float = 0.1, tau: float = 15.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = amp * (1 - np.exp(-(steps - ref) / tau))
    return base * np.exp(rng.normal(0.0, noise, len(steps))) if noise else base


STEPS = np.arange(1, 81)


def control_and(resumed_values: np.ndarray, *, noise_seed: int = 0, noise: float = 0.15) -> tuple[Series, Series]:
    return Series(STEPS, curve(STEPS, noise=noise, seed=noise_seed)), Series(STEPS, resumed_values)


# ------------------------------------------------------------------------------------ pure function


def test_an_exact_reproduction_agrees():
    c = Series(STEPS, curve(STEPS, noise=0.15))
    cmp = compare_series(c, Series(STEPS, c.values.copy()), resume_step=41)
    assert cmp.verdict == "agree" and cmp.part_step is None and cmp.max_ratio == pytest.approx(1.0, abs=1e-12)
    assert cmp.n_pre == 40 and cmp.n_post == 40


def test_a_reference_reset_parts_at_the_resume_with_its_gap():
    c = Series(STEPS, curve(STEPS, noise=0.15))
    buggy = c.values.copy()
    post = STEPS > 40
    buggy[post] = curve(STEPS[post], ref=40, noise=0.15, seed=1)
    cmp = compare_series(c, Series(STEPS, buggy), resume_step=41)
    assert cmp.verdict == "parted" and cmp.part_step == 41
    assert cmp.resumed_at == pytest.approx(buggy[40]) and cmp.control_at == pytest.approx(c.values[40])
    assert cmp.gap == pytest.approx(buggy[40] - c.values[40]) and cmp.ratio < 0.2
    assert cmp.p_value is not None and cmp.p_value < 0.01
    assert "reference was likely rebuilt" in cmp.explanation


@pytest.mark.parametrize("seed", range(8))
def test_an_independent_seed_with_the_same_curve_agrees(seed):
    """Not equality: two runs of one config with different seeds differ by their noise everywhere."""
    c = Series(STEPS, curve(STEPS, noise=0.15, seed=100 + seed))
    r = Series(STEPS, curve(STEPS, noise=0.15, seed=200 + seed))
    assert compare_series(c, r, resume_step=41).verdict == "agree"


@pytest.mark.parametrize("seed", range(8))
def test_a_reset_is_found_even_between_independent_seeds(seed):
    c = Series(STEPS, curve(STEPS, noise=0.15, seed=100 + seed))
    r_vals = curve(STEPS, noise=0.15, seed=200 + seed)
    r_vals[STEPS > 40] = curve(STEPS[STEPS > 40], ref=40, noise=0.15, seed=300 + seed)
    cmp = compare_series(c, Series(STEPS, r_vals), resume_step=41)
    assert cmp.verdict == "parted" and 41 <= cmp.part_step <= 43


def test_float32_storage_of_one_side_is_not_a_parting():
    """TensorBoard stores float32, MLflow float64: the same numbers, rounded differently."""
    c = curve(STEPS, noise=0.05)
    cmp = compare_series(Series(STEPS, c.astype(np.float32).astype(np.float64)), Series(STEPS, c), resume_step=41)
    assert cmp.verdict == "agree" and abs(cmp.max_ratio - 1.0) < 1e-6


def test_a_single_outlier_after_the_resume_is_not_a_parting():
    c = curve(STEPS, noise=0.02)
    r = c.copy()
    r[50] *= 0.01
    cmp = compare_series(Series(STEPS, c), Series(STEPS, r), resume_step=41)
    assert cmp.verdict == "agree" and cmp.max_gap_step == 51


def test_a_late_divergence_is_reported_where_it_starts():
    c = curve(STEPS, noise=0.02)
    r = c.copy()
    r[STEPS >= 60] *= 0.1
    cmp = compare_series(Series(STEPS, c), Series(STEPS, r), resume_step=41)
    assert cmp.verdict == "parted" and cmp.part_step == 60 and cmp.ratio == pytest.approx(0.1)


def test_a_rewound_resume_is_compared_on_what_the_resumed_process_logged():
    """Steps 31-40 logged twice: first by the crashed process (kept as is), then by the buggy resume."""
    c = curve(STEPS, noise=0.02)
    first = np.arange(1, 41)
    again = np.arange(31, 81)
    steps = np.concatenate([first, again])
    vals = np.concatenate([c[:40], curve(again, ref=30, noise=0.02)])
    cmp = compare_series(Series(STEPS, c), Series(steps, vals), resume_step=31)
    assert cmp.verdict == "parted" and cmp.part_step == 31 and cmp.n_pre == 30


def test_too_few_common_steps_after_the_resume_is_insufficient():
    c = curve(STEPS)
    cmp = compare_series(Series(STEPS, c), Series(STEPS[:41], c[:41]), resume_step=41)
    assert cmp.verdict == "insufficient"


def test_runs_that_differ_before_the_resume_are_warned_about():
    c = curve(STEPS, noise=0.01)
    cmp = compare_series(Series(STEPS, c), Series(STEPS, c * 3), resume_step=41, config=CompareConfig())
    assert any("already differ before the resume" in w for w in cmp.warnings)


# ------------------------------------------------------------------------------ two training runs


def test_compare_runs_reads_a_negated_kl_as_a_distance_and_says_what_makes_the_pair_doubtful(tmp_path):
    """CONTROL logs the KL negated (as a reward term) under another name and resumed once; RESUMED logs
    the same KL (same seed) as a distance. Read through Lineage.kl_pieces they are the same curve."""
    write_run(tmp_path / "control", resumes=[40], buggy=False, metric="ppo_actor/kl_rewards/avg", kl_scale=-0.05)
    write_run(tmp_path / "fixed", resumes=[40], buggy=False)
    write_run(tmp_path / "buggy", resumes=[40], buggy=True)
    [control], [fixed], [buggy] = (scan([str(tmp_path / name)], config=ScanConfig(findings=False)).results
                                   for name in ("control", "fixed", "buggy"))
    assert control.lineage.kl_negated and (kl_series(control).values > 0).all()
    assert first_resume(fixed) == first_resume(buggy) == 41
    agree = compare_runs(control, fixed, resume_step=41)
    assert agree.verdict == "agree" and agree.max_ratio == pytest.approx(1.0, rel=1e-6)
    assert agree.warnings == ["CONTROL control has resumes of its own (steps 41): it is not a continuous run",
                              "the runs log KL under different names: ppo_actor/kl_rewards/avg (CONTROL) vs "
                              "train/kl_penalty (RESUMED)"]
    parted = compare_runs(control, buggy, resume_step=41)
    assert parted.verdict == "parted" and parted.part_step == 41 and parted.ratio < 0.2


# ---------------------------------------------------------------------------- the generator's runs


def klwatch(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def generate(out: Path, scenarios: str, trackers: str, *extra: str) -> dict:
    subprocess.run([sys.executable, str(REPO / "sample_runs" / "generate.py"), "--out", str(out), "--scenarios",
                    scenarios, "--trackers", trackers, "--step-delay", "0", "--restart-gap", "0.3", "--quiet", *extra],
                   check=True, cwd=REPO, capture_output=True)
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def tb_runs(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("gen")
    return out, generate(out, "continuous,resume-fixed,resume-buggy", "tensorboard")


def _boundary(manifest: dict, scenario: str, tracker: str) -> int:
    run = next(r for r in manifest["runs"] if r["scenario"] == scenario and r["tracker"] == tracker)
    return run["boundaries"][0]["step"]


def test_generator_fixed_resume_agrees_and_buggy_resume_parts_at_its_boundary(tb_runs):
    out, manifest = tb_runs
    tb = out / "tensorboard"
    fixed = klwatch("compare", f"{tb}#*continuous", f"{tb}#*resume-fixed", "--format", "json")
    assert fixed.exit_code == 0, fixed.stderr
    doc = json.loads(fixed.stdout)
    assert doc["schema"] == "klwatch.compare/1" and doc["verdict"] == "agree"
    assert doc["resume_step"] == _boundary(manifest, "resume-fixed", "tensorboard")
    assert doc["max_ratio"] == pytest.approx(1.0, abs=1e-6)  # the same seed reproduces the control exactly

    buggy = klwatch("compare", f"{tb}#*continuous", f"{tb}#*resume-buggy", "--format", "json")
    assert buggy.exit_code == 1, buggy.stderr
    doc = json.loads(buggy.stdout)
    step = _boundary(manifest, "resume-buggy", "tensorboard")
    assert doc["verdict"] == "parted" and doc["part_step"] == step == doc["resume_step"]
    assert doc["resumed_at"] < 0.01 * doc["control_at"] and doc["gap"] < 0
    assert doc["control"]["name"].endswith("continuous") and doc["resumed"]["name"].endswith("resume-buggy")


def test_table_output_names_the_parting_step(tb_runs):
    tb = tb_runs[0] / "tensorboard"
    res = klwatch("compare", tb / "continuous", tb / "resume-buggy")
    assert res.exit_code == 1
    step = _boundary(tb_runs[1], "resume-buggy", "tensorboard")
    assert "parted" in res.stdout and re.search(rf"parts at step\s+│ {step}: resumed", res.stdout)


def test_from_step_overrides_the_resume_and_a_run_without_resume_needs_it(tb_runs):
    tb = tb_runs[0] / "tensorboard"
    res = klwatch("compare", tb / "continuous", tb / "continuous")
    assert res.exit_code == 2 and "--from-step" in res.stderr
    res = klwatch("compare", tb / "continuous", tb / "continuous", "--from-step", "30", "-f", "json")
    assert res.exit_code == 0 and json.loads(res.stdout)["resume_step"] == 30


def test_a_source_that_is_not_exactly_one_run_is_bad_usage(tb_runs):
    tb = tb_runs[0] / "tensorboard"
    many = klwatch("compare", tb, f"{tb}#*resume-fixed")
    said = " ".join(many.stderr.split())
    assert many.exit_code == 2 and "training runs (" in said and "#PATTERN" in said
    assert all(name in said for name in ("continuous", "resume-buggy", "resume-fixed"))
    none = klwatch("compare", f"{tb}#nothing-*", f"{tb}#*resume-fixed")
    assert none.exit_code == 2 and "no training run matches #nothing-*" in " ".join(none.stderr.split())
    missing = klwatch("compare", tb_runs[0] / "missing", f"{tb}#*resume-fixed")
    assert missing.exit_code == 3 and "missing" in missing.stderr
    fmt = klwatch("compare", tb / "continuous", tb / "resume-fixed", "--format", "yaml")
    assert fmt.exit_code == 2


def test_control_in_tensorboard_resumed_in_mlflow(tb_runs, tmp_path_factory):
    """Across trackers: the generator's MLflow flavour of the same config (verl-style names, float64
    storage, an adaptive KL controller) is close to the TensorBoard control but not equal; the fixed
    resume must still agree with it and the buggy one part from it. The MLflow runs are generated
    here with the same config as the TensorBoard control (the committed samples keep MLflow small)."""
    out = tmp_path_factory.mktemp("gen-cross")
    generate(out, "resume-fixed,resume-buggy", "mlflow", "--layouts", "new-run")
    (out / "tensorboard").mkdir()
    shutil.copytree(tb_runs[0] / "tensorboard" / "continuous", out / "tensorboard" / "continuous")
    manifest = json.loads((out / "manifest.json").read_text())
    control, db = out / "tensorboard" / "continuous", out / "mlflow" / "mlflow.db"
    fixed = klwatch("compare", control, f"{db}#resume-fixed.new-run", "-f", "json")
    assert fixed.exit_code == 0, fixed.stderr + fixed.stdout
    doc = json.loads(fixed.stdout)
    assert doc["resumed"]["trackers"] == ["mlflow"] and doc["control"]["trackers"][0] == "tensorboard"
    assert doc["max_ratio"] != pytest.approx(1.0, abs=1e-6)  # not equal: robust to noise, not only to equality
    buggy = klwatch("compare", control, f"{db}#resume-buggy.new-run", "-f", "json")
    assert buggy.exit_code == 1, buggy.stderr
    assert json.loads(buggy.stdout)["part_step"] == _boundary(manifest, "resume-buggy", "mlflow")


# ------------------------------------------------------------------------- values at the float range


def extreme_pair(folder: Path) -> tuple[Path, Path]:
    """A control logging ~1e-300 and a resumed run jumping between 1e-300 and 1e300: gaps of hundreds
    of log units, a tolerance whose ratio is past what a float holds."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, values in (("control", [1e-300] * 80), ("resumed", [1e300 if i % 2 else 1e-300 for i in range(80)])):
        path = folder / f"{name}.csv"
        path.write_text("step,train/kl_penalty\n" + "".join(f"{s},{v!r}\n" for s, v in enumerate(values, 1)))
        paths.append(path)
    return paths[0], paths[1]


def test_kl_values_at_the_float_range_give_a_verdict_not_an_overflow(tmp_path):
    control, resumed = extreme_pair(tmp_path)
    c, r = (kl_series(scan([str(p)]).results[0]) for p in (control, resumed))
    cmp = compare_series(c, r, resume_step=41)
    assert cmp.verdict in ("agree", "parted") and cmp.explanation and cmp.max_ratio == float("inf")
    assert log_ratio(1e6) == float("inf") and log_ratio(0.0) == pytest.approx(1.0)


def test_the_json_verdict_is_valid_json_when_ratios_overflow(tmp_path):
    control, resumed = extreme_pair(tmp_path)
    res = klwatch("compare", control, resumed, "--from-step", "41", "--format", "json")
    assert res.exit_code in (0, 1)

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in the verdict")

    doc = json.loads(res.stdout, parse_constant=refuse)
    assert doc["tolerance_ratio"] is None and doc["max_ratio"] is None and doc["tolerance"] > 700
    table = klwatch("compare", control, resumed, "--from-step", "41")
    assert table.exit_code == res.exit_code and "xinf" in table.stdout
