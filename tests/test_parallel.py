"""Parallel and distributed scans (issue 14): a scan on worker processes, on several remote SOURCEs at
once, or on a real Dask cluster gives the report the one-process scan gives, byte for byte; the read
bounds hold per SOURCE in workers; a worker that dies or a read that raises costs one file, never
the scan.

The pool is forced with thresholds of one (``FORCED``): the default thresholds keep small trees in
this process, which is the point of them, and would leave the pool untested. Nothing here asserts a
duration: waits are bounded, and the slow cases end by the bound they test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from klwatch.model import ScanResult
from klwatch.parallel import Execution
from klwatch.pipeline import ScanConfig, scan
from klwatch.report import render_markdown, to_json
from klwatch.sources.limits import ReadLimits
from klwatch.sources.local import Unit, UnitRead, read_unit
from tb_runs import write_run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"
FORCED = Execution(jobs=2, pool_min_units=1, pool_min_bytes=1, pool_min_lineages=1)
"""Two worker processes for any amount of work."""
HERE = Execution(jobs=1)


def _scan(specs: list[str], execution: Execution, **kw: object) -> ScanResult:
    config = kw.pop("config", ScanConfig())
    return scan(specs, config=replace(config, execution=execution), **kw)  # type: ignore[arg-type]


def _report(result: ScanResult) -> str:
    """The JSON report and the markdown one, the clock left out."""
    result.generated_at = "-"
    return to_json(result) + "\n" + render_markdown(result)


def _klwatch(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from klwatch.cli import main; sys.argv[0] = 'klwatch'; main()",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", "GITHUB_ACTIONS": "", **(env or {})})


def _without_clock(text: str) -> str:
    return re.sub(r'"generated_at": "[^"]*"', '"generated_at": "-"', text)


def fixture_tree(root: Path) -> Path:
    """A tree of every kind, with what goes wrong in trees: TensorBoard runs healthy and buggy (several
    event files each), a W&B offline run and an MLflow store copied from the samples, a table, NeMo-RL
    checkpoint folders, a corrupt event file (an error Segment), a dataset of prompts (a warning) and a
    FIFO named like an event file (a warning)."""
    write_run(root / "tb" / "healthy", resumes=[30, 60], buggy=False, seed=1)
    write_run(root / "tb" / "buggy", resumes=[30, 60], buggy=True, seed=2)
    write_run(root / "tb" / "plain", resumes=[], buggy=False, seed=3)
    wandb_run = sorted((SAMPLES / "wandb").rglob("offline-run-*"))[0]
    shutil.copytree(wandb_run, root / "wandb" / wandb_run.name)
    shutil.copy(SAMPLES / "mlflow" / "mlflow.db", root / "mlflow.db")
    (root / "exports").mkdir()
    (root / "exports" / "metrics.csv").write_text("step,train/kl\n" + "".join(f"{s},{0.01 * s}\n" for s in range(1, 30)))
    for step in (30, 60):
        (root / "ckpt" / f"step_{step}").mkdir(parents=True)
        (root / "ckpt" / f"step_{step}" / "training_info.json").write_text(json.dumps({"step": step}))
    (root / "corrupt").mkdir()
    (root / "corrupt" / "events.out.tfevents.1.host").write_bytes(b"no TFRecord stream here, only some text")
    (root / "data").mkdir()
    (root / "data" / "prompts.jsonl").write_text(json.dumps({"prompt": "why?", "answer": "because"}) + "\n")
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "data" / "events.out.tfevents.2.fifo")
    return root


# ------------------------------------------------------------------------- same report


@pytest.mark.parametrize("tree", ["sample_runs", "sample_runs/trl", "sample_runs/negatives"])
def test_a_scan_on_worker_processes_gives_the_report_of_a_scan_in_this_process(tree: str) -> None:
    spec = str(ROOT / tree)
    assert _report(_scan([spec], FORCED)) == _report(_scan([spec], HERE))


def test_a_fixture_tree_with_errors_and_warnings_gives_the_same_report_on_workers(tmp_path: Path) -> None:
    tree = str(fixture_tree(tmp_path / "runs"))
    specs = [tree, f"{tree}#buggy*", str(tmp_path / "missing"), str(tmp_path / "runs" / "tb" / "plain")]
    here, forced = _scan(specs, HERE), _scan(specs, FORCED)
    assert _report(forced) == _report(here)
    # everything the report leaves out is kept too: warnings, errors, segments in order
    assert [(s.spec, s.kinds, s.warnings, s.errors) for s in forced.sources] == \
        [(s.spec, s.kinds, s.warnings, s.errors) for s in here.sources]
    assert [[(g.kind, g.ref, g.error) for g in s.segments] for s in forced.sources] == \
        [[(g.kind, g.ref, g.error) for g in s.segments] for s in here.sources]
    assert any("corrupt event file" in (g.error or "") for g in forced.sources[0].segments)
    assert any("not a regular file" in e.message for e in forced.sources[0].errors) or not hasattr(os, "mkfifo")


def test_jobs_2_on_the_command_line_writes_the_report_of_jobs_1() -> None:
    one = _klwatch("scan", "sample_runs/", "--format", "json", "--jobs", "1")
    two = _klwatch("scan", "sample_runs/", "--format", "json", "--jobs", "2")
    assert one.returncode == two.returncode == 1, (one.stderr, two.stderr)
    assert _without_clock(two.stdout) == _without_clock(one.stdout)
    assert two.stderr == one.stderr


def test_check_takes_jobs_and_answers_as_with_jobs_1() -> None:
    one = _klwatch("check", "sample_runs/tensorboard/", "--jobs", "1")
    two = _klwatch("check", "sample_runs/tensorboard/", "-j", "2")
    assert (two.returncode, two.stdout) == (one.returncode, one.stdout)


# ------------------------------------------------------------------ the pluggable read


@dataclass(frozen=True)
class Marking:
    """A ``read_unit`` as a scan cache is one: a picklable object, run where the unit is read."""

    def __call__(self, unit: Unit, *, root: Path, spec: str) -> UnitRead:
        got = read_unit(unit, root=root, spec=spec)
        for s in got.segments:
            s.meta["read_in"] = os.getpid()
        return got


def test_the_read_unit_given_to_scan_reads_every_unit_in_the_worker_processes(tmp_path: Path) -> None:
    tree = str(fixture_tree(tmp_path / "runs"))
    result = _scan([tree], FORCED, read_unit=Marking())
    pids = {s.meta.get("read_in") for s in result.sources[0].segments}
    assert None not in pids and os.getpid() not in pids
    assert _report(result) == _report(_scan([tree], HERE))


def test_the_read_unit_given_to_scan_is_used_in_this_process_with_jobs_1(tmp_path: Path) -> None:
    tree = str(fixture_tree(tmp_path / "runs"))
    result = _scan([tree], HERE, read_unit=Marking())
    assert {s.meta.get("read_in") for s in result.sources[0].segments} == {os.getpid()}


@dataclass(frozen=True)
class Raising:
    """A ``read_unit`` with a bug for one file."""

    name: str

    def __call__(self, unit: Unit, *, root: Path, spec: str) -> UnitRead:
        if unit.path.name == self.name:
            raise RuntimeError("a bug in the cache")
        return read_unit(unit, root=root, spec=spec)


def test_a_read_unit_that_raises_costs_its_file_an_error_segment_not_the_scan(tmp_path: Path) -> None:
    tree = fixture_tree(tmp_path / "runs")
    result = _scan([str(tree)], FORCED, read_unit=Raising("metrics.csv"))
    [seg] = [s for s in result.sources[0].segments if s.ref == "exports/metrics.csv"]
    assert seg.error == "exports/metrics.csv: RuntimeError: a bug in the cache"
    assert len(result.sources[0].segments) == len(_scan([str(tree)], HERE).sources[0].segments)


@dataclass(frozen=True)
class Crashing:
    """A ``read_unit`` whose worker dies on one file (as a segfault in a reader would): never in the
    test's own process."""

    name: str
    parent: int

    def __call__(self, unit: Unit, *, root: Path, spec: str) -> UnitRead:
        if self.name in unit.path.parts and os.getpid() != self.parent:
            os._exit(3)
        return read_unit(unit, root=root, spec=spec)


def test_a_worker_that_dies_costs_only_the_file_it_was_reading(tmp_path: Path) -> None:
    tree = fixture_tree(tmp_path / "runs")
    here = _scan([str(tree)], HERE)
    result = _scan([str(tree)], FORCED, read_unit=Crashing("buggy", os.getpid()))

    lost = [s for s in result.sources[0].segments if s.error and "ended abruptly" in s.error]
    assert lost and all(s.ref.startswith("tb/buggy/") and s.error.startswith(f"{s.ref}: the worker process") for s in lost)
    # every other file was read as in one process, in the same order
    assert [(s.ref, s.error) for s in result.sources[0].segments if s not in lost] == \
        [(s.ref, s.error) for s in here.sources[0].segments if not s.ref.startswith("tb/buggy/")]
    assert [s.ref for s in result.sources[0].segments] == [s.ref for s in here.sources[0].segments]


def test_a_worker_that_dies_before_the_next_task_is_handed_out_costs_only_its_own_task() -> None:
    """The pool says it broke at the next submit when a worker died before it (a race a busy machine
    wins): that submit's task runs again alone like the others lost with the pool; the scan goes on."""
    from concurrent.futures import wait

    from klwatch.parallel import _in_order, _Pool, _TaskLost

    pool = _Pool(1)
    handed: list = []
    submit = pool.submit

    def spied(fn: object, *args: object) -> object:
        handed.append(submit(fn, *args))  # type: ignore[arg-type]
        return handed[-1]

    pool.submit = spied  # type: ignore[method-assign]

    def make(k: int) -> tuple:
        if k == 1:  # the next task is handed out once the pool has failed the first one: it is broken
            wait(handed[:1], timeout=120)
        return (os._exit, 3) if k == 0 else (abs, -k)

    try:
        got = dict(_in_order(range(3), runner=pool, make=make, timeout_of=lambda k: 120.0))
    finally:
        pool.close()
    assert isinstance(got[0], _TaskLost) and "ended abruptly" in str(got[0])
    assert (got[1], got[2]) == (1, 2)


# ------------------------------------------------------------------------------- bounds


def _tb_fleet(root: Path, runs: int) -> Path:
    for r in range(runs):
        write_run(root / f"run{r:02d}", resumes=[], buggy=False, seed=r, last=40)
    return root


def test_the_byte_bound_holds_for_the_source_as_a_whole_with_the_same_error(tmp_path: Path) -> None:
    fleet = _tb_fleet(tmp_path / "fleet", 8)
    size = max(p.stat().st_size for p in fleet.rglob("events.out.tfevents.*"))
    config = ScanConfig(limits=ReadLimits(max_bytes=int(size * 2.5)))
    here, forced = _scan([str(fleet)], HERE, config=config), _scan([str(fleet)], FORCED, config=config)

    [error] = forced.sources[0].errors
    assert error == here.sources[0].errors[0]
    assert "--max-read-bytes" in error.message and "stopped there: 2 of 8" in error.message
    assert [s.ref for s in forced.sources[0].segments] == [s.ref for s in here.sources[0].segments]


@dataclass(frozen=True)
class Hanging:
    """A ``read_unit`` that blocks on one file without ever looking at the clock (a read stuck in a
    system call): only the SOURCE's deadline can end the wait for it."""

    name: str
    parent: int

    def __call__(self, unit: Unit, *, root: Path, spec: str) -> UnitRead:
        if self.name in unit.path.parts and os.getpid() != self.parent:
            time.sleep(120)  # the pool is killed well before: the scan does not wait for it
        return read_unit(unit, root=root, spec=spec)


def test_the_time_bound_holds_per_source_even_when_a_worker_never_returns(tmp_path: Path) -> None:
    fleet = _tb_fleet(tmp_path / "fleet", 3)
    config = ScanConfig(limits=ReadLimits(max_seconds=3.0))
    result = _scan([str(fleet)], FORCED, config=config, read_unit=Hanging("run01", os.getpid()))

    [error] = result.sources[0].errors
    assert error.message.startswith(f"reading {fleet} took longer than 3 s (at ")
    assert "raise the bound with --max-read-seconds; stopped there:" in error.message
    assert "run01" not in {s.ref.split("/")[0] for s in result.sources[0].segments}


# ------------------------------------------------------------------------------ remote


@pytest.mark.server
def test_two_mlflow_servers_sources_read_at_once_give_what_one_after_the_other_gives(mlflow_server) -> None:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=mlflow_server.url)
    names = []
    for k in range(2):
        name = f"parallel-{k}-{os.getpid()}"
        exp = client.create_experiment(name)
        for part, (first, last) in enumerate([(1, 20), (21, 40)]):
            run = client.create_run(exp, run_name=f"grpo-{k}-part{part}", tags={"group": f"grpo-{k}"},
                                    start_time=1_700_000_000_000 + 300_000 * part)
            client.log_batch(run.info.run_id, metrics=[
                Metric("train/kl_penalty", 0.001 * (s - (first - 1 if k else 0)) + 1e-5, 1_700_000_000_000 + 1000 * s, s)
                for s in range(first, last + 1)])
        names.append(name)
    specs = [f"{mlflow_server.spec}/{n}" for n in names]

    here, together = _scan(specs, HERE), _scan(specs, FORCED)
    assert all(not s.errors for s in together.sources)
    assert _report(together) == _report(here)
    assert {r.lineage.name for r in together.results} == {"grpo-0", "grpo-1"}


@pytest.mark.server
def test_two_wandb_projects_read_at_once_give_what_one_after_the_other_gives(monkeypatch) -> None:
    from wandb_stub import StubRun, WandbStub

    def rows(reset: bool) -> list[dict]:
        return [{"_step": s, "_runtime": float(s), "_timestamp": 1.7e9 + s,
                 "train/kl_penalty": 0.001 * ((s - 20) if reset and s > 20 else s) + 1e-5} for s in range(1, 41)]

    runs = {("team", "a"): [StubRun(id="a1", name="run-a", rows=rows(False), exported_rows=20)],
            ("team", "b"): [StubRun(id="b1", name="run-b", rows=rows(True))]}
    monkeypatch.setenv("KLWATCH_WANDB_TIMEOUT", "10")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    with WandbStub(runs=runs) as stub:
        monkeypatch.setenv("WANDB_BASE_URL", stub.url)
        specs = ["wandb://team/a", "wandb://team/b"]
        together, here = _scan(specs, FORCED), _scan(specs, HERE)
    assert all(not s.errors for s in together.sources), [s.errors for s in together.sources]
    assert _report(together) == _report(here)


# -------------------------------------------------------------------------------- Dask


@pytest.fixture(scope="module")
def dask_scheduler():
    """A real Dask cluster on loopback: its scheduler and one worker of two threads in this process."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
        yield cluster.scheduler_address


@dataclass(frozen=True)
class WhereRead:
    """A ``read_unit`` that notes whether it ran in a Dask worker."""

    def __call__(self, unit: Unit, *, root: Path, spec: str) -> UnitRead:
        from distributed import get_worker

        got = read_unit(unit, root=root, spec=spec)
        try:
            where = get_worker().address
        except ValueError:
            where = None
        for s in got.segments:
            s.meta["dask_worker"] = where
        return got


def test_a_scan_on_a_dask_cluster_reads_every_unit_there_and_gives_the_local_report(
        dask_scheduler: str, tmp_path: Path) -> None:
    tree = str(fixture_tree(tmp_path / "runs"))
    result = _scan([tree, f"{tree}#buggy*"], Execution(dask=dask_scheduler), read_unit=WhereRead())
    assert all(s.meta.get("dask_worker") for src in result.sources for s in src.segments)
    assert _report(result) == _report(_scan([tree, f"{tree}#buggy*"], HERE))


def test_dask_on_the_command_line_writes_the_report_of_a_local_scan(dask_scheduler: str) -> None:
    local = _klwatch("scan", "sample_runs/", "--format", "json", "--jobs", "1")
    on_dask = _klwatch("scan", "sample_runs/", "--format", "json", "--dask", dask_scheduler)
    assert on_dask.returncode == local.returncode == 1, on_dask.stderr
    assert _without_clock(on_dask.stdout) == _without_clock(local.stdout)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_dask_scheduler_is_a_usage_error_naming_it_without_its_credentials() -> None:
    port = _closed_port()
    for address, shown in ((f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}"),
                           (f"tcp://alice:s3cret-pw0rd@127.0.0.1:{port}", f"tcp://***@127.0.0.1:{port}")):
        done = _klwatch("scan", "sample_runs/tensorboard/", "--dask", address, env={"KLWATCH_DASK_TIMEOUT": "2"},
                        timeout=120)
        assert done.returncode == 2, done.stderr
        assert shown in done.stderr and "Dask scheduler" in done.stderr
        assert "s3cret-pw0rd" not in done.stderr + done.stdout
        assert "Traceback" not in done.stderr


def test_a_scan_whose_cluster_cannot_be_reached_is_done_in_this_process_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    monkeypatch.setenv("KLWATCH_DASK_TIMEOUT", "1")
    tree = str(fixture_tree(tmp_path / "runs"))
    with caplog.at_level("WARNING", logger="klwatch"):
        result = _scan([tree], Execution(dask=f"tcp://127.0.0.1:{_closed_port()}"))
    assert _report(result) == _report(_scan([tree], HERE))
    assert any("cannot reach the Dask scheduler" in r.getMessage() for r in caplog.records)


def test_a_cluster_lost_during_the_scan_is_said_and_the_scan_finishes_here_with_the_same_report(
        dask_scheduler: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    import klwatch.parallel as parallel

    real_connect = parallel.connect

    def connect_then_lose(address: str, **kw: object):
        client = real_connect(address, **kw)
        client.close()  # gone before the first task, as a scheduler that died would be
        return client

    monkeypatch.setattr(parallel, "connect", connect_then_lose)
    tree = str(fixture_tree(tmp_path / "runs"))
    with caplog.at_level("WARNING", logger="klwatch"):
        result = _scan([tree], Execution(dask=dask_scheduler))
    assert _report(result) == _report(_scan([tree], HERE))
    [record] = [r for r in caplog.records if r.name == "klwatch"]
    assert f"the Dask cluster at {dask_scheduler} was lost during the scan" in record.getMessage()
