"""A real Dask cluster on loopback for tests and benchmarks: a ``dask scheduler`` and ``dask worker``
processes, the command-line entry points ``distributed`` ships, started as a user starts them.

Why real processes: an in-process ``LocalCluster`` shares this process's modules, working directory
and objects, so it cannot show what only a cluster of other processes shows (a task that does not
pickle, state kept in this process, a path read from this process's working directory).

Every process runs in a session of its own, so stopping the cluster ends each one with the processes
it started (a worker's nanny and the worker it spawns). Ports are chosen by the OS (``--port 0``,
dashboards on ``127.0.0.1:0``: the scheduler and workers bind an HTTP server even with
``--no-dashboard``) and the scheduler's address is read from its ``--scheduler-file``; every wait is
for a condition (the file written, the workers registered), bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DASK_CLI = Path(sys.executable).parent / "dask"
"""The ``dask`` command of this environment (``dask scheduler``, ``dask worker``: distributed's
``dask_cli`` entry points; the old ``dask-scheduler`` scripts are gone from recent releases)."""
START_TIMEOUT_S = 180.0
"""Long enough for a machine whose cores are busy with other work: each process imports distributed."""
IDLE_TIMEOUT = "1800s"
"""A scheduler left behind by a killed test run ends after this long without tasks (its workers follow
it: ``--death-timeout``)."""


def _dask_command(*args: str) -> list[str]:
    """``dask ARGS`` through this environment's entry point (or ``python -m dask`` without one)."""
    if DASK_CLI.exists():
        return [str(DASK_CLI), *args]
    return [sys.executable, "-m", "dask", *args]


@dataclass
class DaskProcesses:
    """A started cluster: its scheduler's ``address``, its processes and where their logs are."""

    folder: Path
    address: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def worker_pids(self) -> set[int]:
        """The ``dask worker`` processes (each one the nanny of the worker process it spawns)."""
        return {p.pid for p in self.procs[1:]}

    def start(self, name: str, args: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        log = self.folder / f"{name}.log"
        with open(log, "ab") as out:
            self.procs.append(subprocess.Popen(_dask_command(*args), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=env, start_new_session=True))
        self.logs.append(log)

    def log_tails(self, chars: int = 1500) -> str:
        """The end of every process's log, for a failure's message."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in self.logs if p.exists())

    def stop(self, *, grace: float = 30.0) -> None:
        """End every process group: SIGTERM (the scheduler and workers close cleanly), then SIGKILL for
        what is still there after ``grace`` seconds."""
        for proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            _signal_group(proc, signal.SIGKILL)  # the group's stragglers (a worker its nanny left behind)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _wait_for_address(cluster: DaskProcesses, scheduler_file: Path, *, timeout: float) -> str:
    """The scheduler's address, once its file is written whole (it is not written atomically)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.procs[0].poll() is not None:
            raise RuntimeError(f"dask scheduler exited ({cluster.procs[0].returncode}):\n{cluster.log_tails()}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            return str(json.loads(scheduler_file.read_text())["address"])
        time.sleep(0.05)
    raise TimeoutError(f"no scheduler file after {timeout:g} s:\n{cluster.log_tails()}")


def _wait_for_workers(cluster: DaskProcesses, workers: int, *, timeout: float) -> None:
    """Return once the scheduler has ``workers`` workers (a client asks it, as a scan's would)."""
    from distributed import Client

    with Client(cluster.address, timeout=timeout, set_as_default=False) as client:
        try:
            client.wait_for_workers(workers, timeout=timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"{workers} workers not registered within {timeout:g} s:\n"
                               f"{cluster.log_tails()}") from exc


def start_dask_processes(folder: Path, *, workers: int, cwd: Path | None = None,
                         timeout: float = START_TIMEOUT_S, env: dict[str, str] | None = None) -> DaskProcesses:
    """A scheduler and ``workers`` workers of one thread each on 127.0.0.1, their files (scheduler
    file, logs, ``--local-directory``) in ``folder``, their working directory ``cwd`` (default
    ``folder``); returns once every worker is registered. Stopped again if it cannot start."""
    folder.mkdir(parents=True, exist_ok=True)
    cwd = cwd or folder
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    scheduler_file = folder / "scheduler.json"
    cluster = DaskProcesses(folder=folder)
    try:
        cluster.start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                    "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file),
                                    "--idle-timeout", IDLE_TIMEOUT], cwd=cwd, env=env)
        cluster.address = _wait_for_address(cluster, scheduler_file, timeout=timeout)
        for k in range(workers):
            cluster.start(f"worker-{k}", ["worker", cluster.address, "--name", f"worker-{k}", "--nthreads", "1",
                                          "--host", "127.0.0.1", "--no-dashboard", "--dashboard-address", "127.0.0.1:0",
                                          "--local-directory", str(folder / f"worker-{k}"),
                                          "--death-timeout", "120"], cwd=cwd, env=env)
        _wait_for_workers(cluster, workers, timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def dask_processes(folder: Path, *, workers: int, cwd: Path | None = None, timeout: float = START_TIMEOUT_S,
                   env: dict[str, str] | None = None) -> Iterator[DaskProcesses]:
    """``start_dask_processes``, stopped on leaving whatever happened."""
    cluster = start_dask_processes(folder, workers=workers, cwd=cwd, timeout=timeout, env=env)
    try:
        yield cluster
    finally:
        cluster.stop()
