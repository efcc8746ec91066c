"""The dashboard's data layer: the pipeline's results, cached on the source's files, re-judged cheaply."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from klwatch.dashboard import data
from klwatch.model import Finding
from klwatch.pipeline import ScanConfig, scan
from klwatch.reference_reset import ReferenceResetConfig
from klwatch.report import to_dict

from dashboard_runs import write_fleet, write_paused_run, write_run


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fleet(tmp_path_factory.mktemp("fleet"))


def test_the_exported_report_is_the_cli_report(fleet_dir: Path) -> None:
    exported = to_dict(data.load_fleet([str(fleet_dir)], config=ScanConfig(), findings=True).scan)
    expected = to_dict(scan([str(fleet_dir)]))
    assert exported["schema"] == "klwatch.report/1"
    assert exported["sources"] == expected["sources"]
    assert exported["lineages"] == expected["lineages"]
    flagged = [lin for lin in exported["lineages"] if lin["status"] == "reference_reset"]
    assert [lin["name"] for lin in flagged] == ["grpo-resume-buggy"]
    assert [b["step"] for b in flagged[0]["boundaries"]] == [41, 81]


def test_the_fleet_skips_findings_but_the_opened_run_has_them(fleet_dir: Path) -> None:
    fleet = data.load_fleet([str(fleet_dir)], config=ScanConfig())
    full = {r.lineage.id: r for r in scan([str(fleet_dir)]).results}
    assert fleet.status_counts() == {"ok": 2, "reference_reset": 1}
    for key, r in fleet.runs.items():
        assert r.findings == []
        assert [(v.boundary.step, v.verdict) for v in r.verdicts] == [
            (v.boundary.step, v.verdict) for v in full[r.lineage.id].verdicts]
        assert [v.score for v in r.verdicts] == pytest.approx([v.score for v in full[r.lineage.id].verdicts], abs=1e-9)
        opened = data.judged_run(fleet, key, config=ScanConfig())
        assert opened.status == r.status
        assert [(f.detector, f.step, f.message) for f in opened.findings] == [
            (f.detector, f.step, f.message) for f in full[r.lineage.id].findings]
    assert any(full[r.lineage.id].findings for r in fleet.scan.results), "the fleet should give some finding"


def test_fleet_table_has_one_row_per_run_with_the_worst_boundary(fleet_dir: Path) -> None:
    table = data.fleet_table(data.load_fleet([str(fleet_dir)], config=ScanConfig())).set_index("run")
    buggy = table.loc["grpo-resume-buggy"]
    assert buggy["status"] == "reference_reset"
    assert buggy["segments"] == 3 and buggy["resumes"] == 2 and buggy["last step"] == 120
    assert buggy["worst score"] >= ReferenceResetConfig().reset_score
    assert buggy["KL after"] < 0.5 * buggy["KL before"]
    assert buggy["at step"] in (41, 81)
    cont = table.loc["grpo-continuous"]
    assert cont["resumes"] == 0 and cont["status"] == "ok"
    assert table.loc["grpo-resume-fixed", "KL after"] > 0.5 * table.loc["grpo-resume-fixed", "KL before"]


def test_what_the_page_derives_from_the_fleet_is_kept_per_fleet_and_findings_and_follows_a_change(tmp_path: Path) -> None:
    """A rerun on an unchanged fleet derives nothing again (the 1,000-run page's clicks), yet the table,
    the pickers' names and the picture follow what changes them: findings coming in, thresholds moved,
    a source's files, the Reload button."""
    root = write_fleet(tmp_path / "runs")
    config = ScanConfig()
    fleet = data.load_fleet([str(root)], config=config)
    table, picture = data.fleet_table_cached(fleet, {}), data.fleet_picture_cached(fleet, thresholds=config.reference_reset)
    again = data.load_fleet([str(root)], config=config)
    assert data.fleet_table_cached(again, {}) is table
    assert data.fleet_picture_cached(again, thresholds=config.reference_reset) is picture
    assert data.run_choices_cached(again, {}, secrets=[]) is data.run_choices_cached(fleet, {}, secrets=[])

    fixed = next(k for k, r in fleet.runs.items() if r.lineage.name == "grpo-resume-fixed")
    found = {k: [] for k in fleet.keys} | {fixed: [Finding("lr_schedule_restart", 41, "warning", "the LR schedule restarted")]}
    with_findings = data.fleet_table_cached(fleet, found).set_index("run")
    assert with_findings.loc["grpo-resume-fixed", "status"] == data.OK_WITH_FINDINGS
    assert data.run_choices_cached(fleet, found, secrets=[])[fixed].endswith(f"({data.OK_WITH_FINDINGS})")

    strict = dataclasses.replace(config, reference_reset=ReferenceResetConfig(reset_score=0.999, ok_score=0.49))
    assert data.fleet_table_cached(data.load_fleet([str(root)], config=strict), {}) is not table

    write_run(root, name="grpo-late", resumes=[], buggy=False, seed=9)
    assert "grpo-late" in set(data.fleet_table_cached(data.load_fleet([str(root)], config=config), {})["run"])
    data.clear_caches()
    assert data.fleet_table_cached(data.load_fleet([str(root)], config=config), {}) is not table


def test_boundary_points_give_the_kl_ratio_at_every_resume(fleet_dir: Path) -> None:
    points = data.boundary_points(data.load_fleet([str(fleet_dir)], config=ScanConfig()))
    assert len(points) == 4  # two resumes in each of the two resumed runs
    reset = points[points["verdict"] == "reference_reset"]
    assert set(reset["run"]) == {"grpo-resume-buggy"}
    assert (reset["ratio"] < 0.2).all()
    assert (points[points["verdict"] == "ok"]["ratio"] > 0.5).all()


def test_new_thresholds_rejudge_without_reading_again(tmp_path: Path) -> None:
    # Overwrite the event files with garbage of the same size and mtime: the fingerprint cannot see it,
    # so only a cached read can still give verdicts; touching a file then forces a real read.
    root = write_run(tmp_path, name="grpo-resume-buggy", resumes=[41, 81], buggy=True, seed=4).parent
    spec = str(root)
    first = data.load_fleet([spec], config=ScanConfig())
    assert [r.status for r in first.scan.results] == ["reference_reset"]
    files = sorted(root.rglob("events.out.tfevents.*"))
    for f in files:
        st = f.stat()
        f.write_bytes(b"\x00" * st.st_size)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    strict = ScanConfig(reference_reset=dataclasses.replace(ReferenceResetConfig(), min_low_points=10))
    again = data.load_fleet([spec], config=strict)
    # re-judged: 10 low points cannot fit in the window, so nothing is a reset, and nothing is known to be well
    assert [r.status for r in again.scan.results] == ["inconclusive"]
    assert {v.verdict for r in again.scan.results for v in r.verdicts} == {"inconclusive"}
    os.utime(files[0])  # a file changed: the next load reads the (now broken) files again
    reread = data.load_fleet([spec], config=strict)
    assert any(s.error for r in reread.scan.results for s in r.lineage.segments) or any(
        s.errors for s in reread.scan.sources)


def _verdicts(results: list) -> list[tuple[str, list[tuple[int, str]]]]:
    return [(r.status, [(v.boundary.step, v.verdict) for v in r.verdicts]) for r in results]


def test_moved_thresholds_give_what_the_cli_gives_even_where_stitching_depends_on_them(tmp_path: Path) -> None:
    # Routine pauses inside one event file stay boundaries only where the thresholds judge the KL reset
    # there: a slider moved must re-stitch too, whatever the cache holds from the thresholds before.
    spec = str(write_paused_run(tmp_path, name="paused", pauses=[41, 81]).parent)
    strict = ScanConfig(reference_reset=dataclasses.replace(ReferenceResetConfig(), min_low_points=10))
    shown = {}
    for name, config in (("default", ScanConfig()), ("strict", strict), ("default again", ScanConfig())):
        shown[name] = _verdicts(data.load_fleet([spec], config=config).scan.results)
        assert shown[name] == _verdicts(scan([spec], config=config).results)
    assert shown["default"] == [("reference_reset", [(41, "reference_reset"), (81, "reference_reset")])]
    assert shown["strict"] == [("ok", [])]  # not a restart under these thresholds: no boundary at all


def test_an_unreadable_source_keeps_its_error_and_the_others_load(fleet_dir: Path, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-runs")
    fleet = data.load_fleet([missing, str(fleet_dir)], config=ScanConfig())
    bad, good = fleet.scan.sources
    assert bad.errors and missing in bad.errors[0].message
    assert not good.errors and len(fleet.scan.results) == 3


def test_a_pattern_that_matches_nothing_is_reported_without_touching_the_cached_read(fleet_dir: Path) -> None:
    spec = f"{fleet_dir}#nothing-like-this-*"
    fleet = data.load_fleet([spec], config=ScanConfig())
    assert fleet.scan.results == []
    said = fleet.scan.sources[0].unmatched
    assert said and "no training run matches #nothing-like-this-*" in said and "grpo-resume-buggy" in said
    assert fleet.scan.sources[0].errors == []  # bad usage, not a read failure
    read, _ = data.read_cached(spec, data.fingerprint(spec))
    assert read.errors == []  # the cached read is shared by every session: never mutated
    only = data.load_fleet([f"{fleet_dir}#*buggy*"], config=ScanConfig())
    assert [r.lineage.name for r in only.scan.results] == ["grpo-resume-buggy"]


def test_fingerprint_follows_files_and_remote_sources_expire(tmp_path: Path) -> None:
    write_run(tmp_path, name="a", resumes=[], buggy=False, steps=10, extra=False)
    before = data.fingerprint(str(tmp_path))
    assert data.fingerprint(str(tmp_path)) == before
    write_run(tmp_path, name="b", resumes=[], buggy=False, steps=10, extra=False)
    assert data.fingerprint(str(tmp_path)) != before
    assert data.fingerprint(f"{tmp_path}#a*") == data.fingerprint(str(tmp_path))
    t = 1_000_000.0
    remote = "wandb://team/project"
    assert data.fingerprint(remote, now=t) == data.fingerprint(remote, now=t + 1)
    assert data.fingerprint(remote, now=t) != data.fingerprint(remote, now=t + data.REMOTE_TTL_SECONDS)


def test_same_run_id_in_two_sources_gets_two_keys(fleet_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(fleet_dir, copy)
    fleet = data.load_fleet([str(fleet_dir), str(copy)], config=ScanConfig())
    assert len(fleet.keys) == 6 and len(set(fleet.keys)) == 6
    assert set(fleet.source_of) == {str(fleet_dir), str(copy)}
    for spec in (str(fleet_dir), str(copy)):  # each source's three runs, each under its own key
        assert len({k for k, s in zip(fleet.keys, fleet.source_of) if s == spec}) == 3
    assert len(fleet.runs) == 6


def test_no_run_beyond_the_point_budget_is_opened_by_itself(fleet_dir: Path) -> None:
    fleet = data.load_fleet([str(fleet_dir)], config=ScanConfig())
    sizes = {k: data.lineage_points(r.lineage) for k, r in fleet.runs.items()}
    flagged = next(k for k, r in fleet.runs.items() if r.status == "reference_reset")
    assert data.auto_open(fleet, findings={}) == flagged
    assert data.auto_open(fleet, findings={}, budget=min(sizes.values()) - 1) is None
    assert data.auto_open(fleet, findings={}, budget=sizes[flagged]) == flagged


def test_runs_of_one_name_are_labelled_with_their_tracker(fleet_dir: Path, tmp_path: Path) -> None:
    from dashboard_runs import write_mlflow_store

    write_run(tmp_path / "tb", name="same-name", resumes=[], buggy=False, steps=20)
    write_mlflow_store(tmp_path / "ml", run_name="same-name")
    fleet = data.load_fleet([str(tmp_path / "tb"), str(tmp_path / "ml")], config=ScanConfig())
    labels = sorted(data.run_labels(fleet).values())
    assert len(set(labels)) == 2 and labels[0].startswith("same-name · mlflow")
    assert labels[1].startswith("same-name · tensorboard")


def test_a_tracker_link_is_only_an_http_url_without_credentials() -> None:
    from klwatch.model import Lineage, Segment

    def lin(**seg: object) -> Lineage:
        return Lineage(id="x", name="x", segments=[Segment(source="s", ref="r", **seg)])  # type: ignore[arg-type]

    assert data.tracker_link(lin(kind="wandb-offline", run_id="ab12", meta={"entity": "me", "project": "p q"})) == (
        "W&B run", "https://wandb.ai/me/p%20q/runs/ab12")
    assert data.tracker_link(lin(kind="wandb-api", run_id="ab", meta={"url": "https://u:pw@wandb.ai/e/p/runs/ab"})) == (
        "W&B run", "https://wandb.ai/e/p/runs/ab")
    assert data.tracker_link(lin(kind="wandb-api", run_id="ab", meta={"url": "javascript:alert(1)"})) is None
    assert data.tracker_link(lin(kind="wandb-api", run_id="ab", meta={"url": 'https://x.y/a" onclick="x'})) is None
    assert data.tracker_link(lin(kind="mlflow", run_id="r1", store="http://mlflow.local:5000#exp",
                                 meta={"experiment_id": "3"})) == ("MLflow run", "http://mlflow.local:5000/#/experiments/3/runs/r1")
    assert data.tracker_link(lin(kind="mlflow", run_id="r1", store="/tmp/mlruns", meta={"experiment_id": "3"})) is None
    assert data.tracker_link(lin(kind="tensorboard")) is None


def test_dozens_of_resumes_or_differing_configs_make_a_lineage_implausible() -> None:
    from klwatch.model import Boundary, Lineage, Segment

    segs = [Segment(kind="wandb-offline", ref=f"r{i}", source="s", config={"beta": 0.04, "run_dir": f"/r{i}"})
            for i in range(3)]
    lin = Lineage(id="x", name="x", segments=segs)
    assert data.implausible(lin) == []  # per-launch keys (paths) may differ
    lin.boundaries = [Boundary(step=10 * i, resumed_from_step=None, evidence=["new_tracker_run"], piece_index=i)
                      for i in range(1, 30)]
    segs[2].config = {"beta": 0.1}
    assert data.implausible(lin) == ["29 resumes in one run",
                                     "its tracker pieces logged different configs (1 join(s) between differing configs)"]
