"""Scans through a real Dask cluster of other processes (issue 26, item 5): a ``dask scheduler`` and two
``dask worker`` processes on loopback, started from the command line as a user starts them, in a
working directory of their own (``dask_processes``).

What an in-process ``LocalCluster`` cannot show, these do: every task pickles, nothing relies on this
process's state, and a relative SOURCE (``sample_runs/``) is read from this process's working
directory, not the workers'. That the two workers did the work is taken from the cluster itself (the
scheduler's task stream) and from the reads (each Segment marked with the process that read it), so
a scan that quietly ran here, or on one worker, fails. Waits are for conditions, never fixed times.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from dask_processes import DaskProcesses, dask_processes
from klwatch.model import ScanResult
from klwatch.parallel import Execution
from klwatch.pipeline import ScanConfig, scan
from klwatch.report import render_markdown, to_json
from klwatch.sources.local import Unit, UnitRead, plan_local, read_unit
from test_parallel import fixture_tree

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
WAIT_S = 600
"""A scan through the cluster on a machine whose cores are busy: bounded, generously."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskProcesses]:
    """A scheduler and two one-thread workers, started in a folder that is not this process's working
    directory; ``tests/`` on their path, as a cluster has its users' code installed (the ``read_unit``
    objects below are unpickled there)."""
    pytest.importorskip("distributed")
    folder = tmp_path_factory.mktemp("dask-processes")
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH", "")]))
    with dask_processes(folder, workers=2, cwd=folder / "elsewhere", env={"PYTHONPATH": path}) as started:
        yield started


def _client(cluster: DaskProcesses):  # noqa: ANN202 - distributed is imported only here
    from distributed import Client

    return Client(cluster.address, timeout=120, set_as_default=False)


def _klwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klwatch.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=WAIT_S, env={**os.environ, "COLUMNS": "200", "GITHUB_ACTIONS": ""})


def _without_clock(text: str) -> str:
    return re.sub(r'"generated_at": "[^"]*"', '"generated_at": "-"', text)


def _report(result: ScanResult) -> str:
    """The JSON report and the markdown one, the clock left out."""
    result.generated_at = "-"
    return to_json(result) + "\n" + render_markdown(result)


def test_klwatch_scan_dask_through_scheduler_and_worker_processes_writes_the_local_report_read_on_both(
        cluster: DaskProcesses) -> None:
    from distributed import get_task_stream

    units = len(plan_local(str(ROOT / "sample_runs")).units)
    local = _klwatch("scan", "sample_runs/", "--format", "json", "--jobs", "1", "--no-cache")
    with _client(cluster) as client:
        nannies = client.run(os.getppid)  # each worker process is spawned by its ``dask worker`` nanny
        cwds = set(client.run(os.getcwd).values())
        with get_task_stream(client=client) as stream:
            on_dask = _klwatch("scan", "sample_runs/", "--format", "json", "--no-cache", "--dask", cluster.address)
    assert on_dask.returncode == local.returncode == 1, (on_dask.stderr[-3000:], cluster.log_tails())
    assert _without_clock(on_dask.stdout) == _without_clock(local.stdout)

    # the workers are the processes started above, in a working directory that is not the scan's
    assert sorted(nannies.values()) == sorted(cluster.worker_pids)
    assert str(ROOT) not in cwds
    # every unit was read, and every training run judged, on the cluster; both workers took part
    assert stream.data and all(t["status"] == "OK" for t in stream.data)
    tasks = Counter((str(t["key"]).split("-")[0], t["worker"]) for t in stream.data)
    reads = {w: n for (name, w), n in tasks.items() if name == "read_unit_task"}
    judged = sum(n for (name, _), n in tasks.items() if name == "judge_task")
    assert sum(reads.values()) == units and set(reads) == set(nannies), tasks
    assert judged == len(json.loads(on_dask.stdout)["lineages"]), tasks
    assert {name for name, _ in tasks} == {"read_unit_task", "judge_task"}


def _denied(path: Path, **_: object) -> list:
    """A reader whose ``open`` fails as on a file without read permission (the tests run as root, who
    may read any file)."""
    raise PermissionError(13, "Permission denied", str(path))


@dataclass(frozen=True)
class ReadBy:
    """A ``read_unit`` that marks what it read with the process that read it, and reads one file with a
    reader that cannot open it: an ``OSError`` naming the path the worker was given."""

    unreadable: str

    def __call__(self, unit: Unit, *, root: Path, spec: str) -> UnitRead:
        if unit.path.name == self.unreadable:
            unit = replace(unit, reader=_denied)
        got = read_unit(unit, root=root, spec=spec)
        for s in got.segments:
            s.meta["read_by"] = os.getpid()
        return got


def test_a_relative_source_is_read_from_the_scans_directory_by_both_worker_processes_with_the_local_report(
        cluster: DaskProcesses, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_tree(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    specs, marking = ["runs", "runs#buggy*"], ReadBy("metrics.csv")
    on_dask = scan(specs, config=ScanConfig(execution=Execution(dask=cluster.address)), read_unit=marking)
    here = scan(specs, config=ScanConfig(execution=Execution(jobs=1)), read_unit=marking)
    assert _report(on_dask) == _report(here)

    with _client(cluster) as client:
        worker_pids = set(client.run(os.getpid).values())
    read_by = Counter(s.meta.get("read_by") for src in on_dask.sources for s in src.segments)
    assert set(read_by) == worker_pids and len(worker_pids) == 2, read_by
    # the file that failed is named as the SOURCE named it, not by the absolute path its worker opened
    [failed] = [s for s in on_dask.sources[0].segments if s.ref == "exports/metrics.csv"]
    assert failed.error == "exports/metrics.csv: [Errno 13] Permission denied: 'runs/exports/metrics.csv'"
