"""Issue 25, 2: one invocation, one fleet. The local SOURCEs given as separate arguments (a shell glob over a
run's launch folders, a list of W&B run folders of one run id, a list of event files) are stitched together
and give the training runs their common parent gives: before, each was a run of its own, judged ``ok``, where
the parent showed the reset."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from klwatch.model import ScanResult
from klwatch.parallel import Execution
from klwatch.pipeline import ScanConfig, scan
from klwatch.read_cache import LocalReadCache
from klwatch.sources.pool import local_pool

SAMPLES = Path(__file__).resolve().parents[2] / "sample_runs"
FORCED = Execution(jobs=2, pool_min_units=1, pool_min_bytes=1, pool_min_lineages=1)


def shape(result: ScanResult) -> list[tuple[str, str, str, list[tuple[int, str]]]]:
    """What a user reads of a scan: each run's id, name and status, and every resume's step and verdict."""
    return [(r.lineage.id, r.lineage.name, r.status, [(v.boundary.step, v.verdict) for v in r.verdicts])
            for r in result.results]


def each(folder: Path, pattern: str) -> list[str]:
    """What the shell gives for ``folder/pattern``: the matches, sorted."""
    return sorted(str(p) for p in folder.glob(pattern))


@pytest.mark.parametrize("parent, pattern", [
    (SAMPLES / "trl" / "tensorboard" / "resume-buggy" / "runs", "*"),  # TRL's runs/<date>_<host>, a folder per launch
    (SAMPLES / "tensorboard" / "resume-buggy", "events.out.tfevents.*"),  # the event files of one run
    (SAMPLES / "trl" / "wandb" / "resume" / "wandb", "offline-run-*"),  # W&B run folders, two per run id
    (SAMPLES / "trl" / "tensorboard", "*"),  # a fleet's run folders
])
def test_separate_sources_give_the_runs_their_common_parent_gives(parent: Path, pattern: str) -> None:
    whole = scan([str(parent)])
    listed = scan(each(parent, pattern))
    assert shape(listed) == shape(whole)
    assert any(r.status == "reference_reset" for r in whole.results)
    assert [s.spec for s in listed.sources] == each(parent, pattern)  # each SOURCE still reported on its own


def test_a_glob_over_launch_folders_is_one_run_with_its_reset_not_two_ok_runs() -> None:
    launches = each(SAMPLES / "trl" / "tensorboard" / "resume-buggy" / "runs", "*")
    assert len(launches) == 2
    (run,) = scan(launches).results
    assert run.status == "reference_reset"


def test_worker_processes_and_the_watchers_cache_pool_the_same_way() -> None:
    launches = each(SAMPLES / "trl" / "tensorboard" / "resume-buggy" / "runs", "*")
    alone = shape(scan(launches))
    assert shape(scan(launches, config=ScanConfig(execution=FORCED))) == alone
    cache = LocalReadCache()
    assert shape(scan(launches, read=cache.read)) == alone
    assert shape(scan(launches, read=cache.read)) == alone  # a second poll, from the cache


def test_a_folder_and_a_folder_inside_it_are_read_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard" / "resume-buggy", runs / "resume-buggy")
    shutil.copytree(SAMPLES / "tensorboard" / "resume-fixed", runs / "resume-fixed")
    both = scan([str(runs), str(runs / "resume-buggy")])
    assert shape(both) == shape(scan([str(runs)]))
    assert not both.sources[1].errors  # its files were read with the folder it lies in: no "no runs found"


def test_a_source_with_a_pattern_or_on_a_server_keeps_its_runs_to_itself(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for p in (a, b):
        Path(p).mkdir()
    pool = local_pool([a, f"{b}#grpo-*", "mlflow://127.0.0.1:5000", str(tmp_path / "missing")])
    assert pool is None  # one local SOURCE without a pattern that exists: nothing to pool
    pool = local_pool([a, b, f"{b}#grpo-*"])
    assert pool is not None and pool.members == (a, b) and pool.root == tmp_path


def test_relative_sources_are_pooled_under_their_relative_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for p in ("runs/a", "runs/b", "other"):
        (tmp_path / p).mkdir(parents=True)
    pool = local_pool(["runs/a", "runs/b"])
    assert pool is not None and pool.spec == "runs"
    pool = local_pool(["runs/a", "other"])
    assert pool is not None and pool.spec == "."
