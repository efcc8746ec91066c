"""klwatch on the real NeMo-RL corpus (``sample_runs/nemo_rl``), judged against its manifest.

The corpus was written by NeMo-RL's own ``Logger`` (W&B offline, MLflow SQLite, TensorBoard, all three at once),
``CheckpointManager`` and ``get_next_experiment_dir`` around real training on the CPU
(``sample_runs/nemo_rl_corpus``); every launch is a new W&B run and MLflow run of the same name and a new
``logs/<run>/exp_NNN`` folder, and logs a config that differs from the last launch's in ``logger.log_dir``. The
manifest was written from what each process did (its steps, its crash, whether its reference was the base model
or the resumed weights). Every expectation below is read from it:

- whether klwatch scans the whole tree, one tracker's part of it, or one run's folder, every launch of a training
  run lands in exactly one lineage and no lineage holds two runs;
- every boundary, GRPO (from its KL) and DPO (no KL logged: from its implicit rewards, by the preference
  detector), gets the manifest's verdict (``reference_reset`` where the reference was rebuilt from the
  checkpoint), already 3 logged points after the resume; nothing else is flagged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlflow_server import MlflowServer, serving_a_copy

from corpus_checks import (REPO, cut_view_problems, member_refs, no_false_alarm_problems, pair_runs, process_refs,
                           scan_json, verdict_problems)

CORPUS = REPO / "sample_runs" / "nemo_rl"


def manifest() -> dict:
    return json.loads((CORPUS / "manifest.json").read_text())


def rerooted(doc: dict, sub: str, *, trackers: tuple[str, ...]) -> dict:
    """The manifest as a scan of ``CORPUS/sub`` names things: paths relative to that folder, only the runs of
    the trackers it holds."""
    def rel(path: str) -> str:
        return path[len(sub) + 1:] if sub and path.startswith(sub + "/") else path

    runs = []
    for run in doc["runs"]:
        if run["tracker"] not in trackers:
            continue
        procs = [{**p, "event_files": [rel(f) for f in p.get("event_files", [])],
                  **({"run_dir": rel(p["run_dir"])} if "run_dir" in p else {})} for p in run["processes"]]
        runs.append({**run, "processes": procs})
    return {**doc, "runs": runs}


@pytest.fixture(scope="module")
def whole_tree() -> tuple[int, dict]:
    if not (CORPUS / "manifest.json").exists():
        pytest.skip("sample_runs/nemo_rl has no manifest.json (python -m sample_runs.nemo_rl_corpus.generate)")
    return scan_json(CORPUS)


def test_manifest_records_what_each_process_did_with_a_reset_and_a_healthy_run_per_algorithm():
    doc = manifest()
    assert len(doc["nemo_rl"]["commit"]) == 40
    statuses: dict[str, set[str]] = {}
    for name, sc in doc["scenarios"].items():
        statuses.setdefault(sc["algorithm"], set()).add(sc["expected_status"])
        assert list(sc["logged_config_differences"]) in ([], ["logger.log_dir"]), (name, sc["logged_config_differences"])
        for launch, b in zip(sc["launches"][1:], sc["boundaries"]):
            assert launch["reference_from"] == b["reference_from"] in ("base", "checkpoint"), (name, b)
            assert b["step"] == min(launch["logged_steps"]), (name, b)
    assert all({"reference_reset", "ok"} <= s for s in statuses.values()), statuses
    ratchet = [sc for sc in doc["scenarios"].values() if sum(b["expected_verdict"] == "reference_reset"
                                                             for b in sc["boundaries"]) >= 3]
    assert ratchet and any(sc["relogged_steps"] for sc in doc["scenarios"].values())


def test_the_whole_tree_is_read_and_exits_1(whole_tree):
    code, report = whole_tree
    assert code == 1
    assert all(s["error"] is None for s in report["sources"]), report["sources"]
    assert not [lin["name"] for lin in report["lineages"] if lin["status"] == "error"]


def test_every_launch_in_one_lineage_and_no_two_runs_joined(whole_tree):
    _, report = whole_tree
    _, problems = pair_runs(manifest(), report)
    assert not problems, "\n".join(problems)


def test_every_boundary_of_both_algorithms_judged_as_planted_and_nothing_else_flagged(whole_tree):
    _, report = whole_tree
    doc = manifest()
    pairs, _ = pair_runs(doc, report)
    problems = verdict_problems(pairs) + no_false_alarm_problems(manifest(), report)
    assert len(pairs) == len(doc["runs"]) and not problems, "\n".join(problems)


def test_dpo_resets_are_judged_from_the_implicit_rewards_with_the_equal_policy_loss_named(whole_tree):
    _, report = whole_tree
    doc = {**manifest(), "runs": [r for r in manifest()["runs"] if r["algorithm"] == "dpo"]}
    pairs, problems = pair_runs(doc, report)
    assert doc["runs"] and len(pairs) == len(doc["runs"]) and not problems, problems
    assert {run["expected_status"] for run, _ in pairs} == {"reference_reset", "ok"}
    for run, lin in pairs:
        assert lin["metric"] == "klwatch/implicit_reward_margin", run["id"]  # NeMo-RL logs chosen and rejected only
        for b in lin["boundaries"]:
            assert "implicit-reward margin" in b["explanation"].lower(), b
            if b["verdict"] == "reference_reset":
                assert "ln 2" in b["explanation"] and "accuracy 0" in b["explanation"], b["explanation"]


@pytest.mark.parametrize(("sub", "trackers"), [("logs", ("wandb", "tensorboard")), ("mlflow", ("mlflow",))])
def test_each_trackers_part_alone_gives_the_same_runs_and_verdicts(whole_tree, sub, trackers):
    _, report = scan_json(CORPUS / sub)
    doc = rerooted(manifest(), sub, trackers=trackers)
    pairs, problems = pair_runs(doc, report)
    problems += verdict_problems(pairs)
    assert len(pairs) == len(doc["runs"]) and not problems, "\n".join(problems)


def test_one_runs_own_log_folder_gives_the_lineages_the_whole_tree_gives(whole_tree):
    _, tree = whole_tree
    for name in ("nemo-grpo-resume-buggy", "nemo-grpo-ratchet-buggy", "nemo-dpo-resume-buggy"):
        _, alone = scan_json(CORPUS / "logs" / name)
        got = sorted(sorted(f"logs/{name}/{r}" for r in member_refs(lin) if not r.startswith("/")) for lin in alone["lineages"])
        want = sorted(sorted(r for r in member_refs(lin) if r.startswith(f"logs/{name}/"))
                      for lin in tree["lineages"] if any(r.startswith(f"logs/{name}/") for r in member_refs(lin)))
        assert got == want, name
        flagged = sorted((lin["members"][0]["kind"], [b["step"] for b in lin["boundaries"] if b["verdict"] == "reference_reset"])
                         for lin in alone["lineages"])
        in_tree = sorted((lin["members"][0]["kind"], [b["step"] for b in lin["boundaries"] if b["verdict"] == "reference_reset"])
                         for lin in tree["lineages"] if any(r.startswith(f"logs/{name}/") for r in member_refs(lin)))
        assert flagged == in_tree, name


def test_checkpoints_in_results_join_their_runs_from_the_whole_tree(whole_tree):
    """``results/<run>`` beside ``logs/<run>``: each tracker's lineage holds the checkpoints, and a boundary whose
    checkpoint is still on disk (``keep_top_k`` deletes the older ones, as NeMo-RL does) carries it as evidence."""
    _, report = whole_tree
    for run in manifest()["runs"]:
        (lin,) = [lin for lin in report["lineages"] if process_refs(run) <= member_refs(lin)]
        assert run["checkpoint_dir"] in member_refs(lin), run["id"]
        kept = {int(p.name.removeprefix("step_")) for p in (CORPUS / run["checkpoint_dir"]).glob("step_*")}
        got = {b["step"]: b for b in lin["boundaries"]}
        for b in run["boundaries"]:
            if b["resumed_from_step"] in kept:
                assert "checkpoint" in got[b["step"]]["evidence"] and got[b["step"]]["resumed_from_step"] == \
                    b["resumed_from_step"], (run["id"], b["step"])


def test_verdicts_from_at_most_3_logged_points_after_each_resume(tmp_path: Path):
    problems = cut_view_problems(manifest(), CORPUS, tmp_path)
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def nemo_mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with serving_a_copy(CORPUS / "mlflow" / "mlflow.db", workdir=tmp_path_factory.mktemp("nemo-mlflow-server")) as server:
        yield server


@pytest.mark.server
def test_the_mlflow_store_through_a_real_mlflow_server_gives_the_same_runs_and_verdicts(nemo_mlflow_server):
    code, report = scan_json(nemo_mlflow_server.spec)
    doc = rerooted(manifest(), "", trackers=("mlflow",))
    pairs, problems = pair_runs(doc, report)
    problems += verdict_problems([(r, lin) for r, lin in pairs if r["algorithm"] == "grpo"])
    assert code == 1 and len(pairs) == len(doc["runs"]) and not problems, "\n".join(problems)
