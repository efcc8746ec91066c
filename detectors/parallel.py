"""Where a scan's work runs: this process, a pool of worker processes, or a Dask cluster (issue 14).

A scan's report does not depend on where it ran. The grain of local reading is the ``Unit`` of
``klwatch.sources.local`` (an event file, a table, a W&B run folder, an MLflow store, the parent of
checkpoint folders); the grain of judging is one training run (``pipeline.judge_lineage``).
Discovery and stitching stay in this process; unit reads and judgements are handed out as tasks
and their results taken back *in the order they were handed out*, so every SourceRead and the list
of results are built exactly as the one-process scan builds them.

Bounds (``ReadLimits``) stay per SOURCE: each unit task carries its SOURCE's limits, the bytes
already used and the SOURCE's deadline, and reads within them in its worker (a bound passed there
gives the same message as in this process); the bytes it read are charged here to the SOURCE's
budget, in order, so the byte bound holds for the SOURCE as a whole; and the wait for a task is cut
at the SOURCE's deadline, whatever the worker is doing.

A Dask worker has a working directory of its own (``dask worker`` started elsewhere, on another
machine): it is sent each unit's path made absolute from this process's working directory, so a
relative SOURCE is read where the scan was started; the texts it writes from those paths (an
``OSError``'s file name) are given back as the SOURCE named them. The cluster's workers must see the
files at those absolute paths.

A worker that dies (a segfault in a reader, the OOM killer) costs the unit it was reading: the units
in flight when the pool broke are read again one at a time in a fresh worker, and the one that
kills its worker again becomes an error Segment naming its file. A reader's exception is the
unit's error, as in one process.

``distributed`` is imported only for ``--dask``; this module imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model import Lineage, LineageResult, SourceError, SourceRead
from .redact import redact_spec, scrub, spec_secrets
from .source_names import REMOTE_PREFIXES
from .sources import read_source, split_pattern
from .sources.limits import Budget, LimitExceeded, ReadLimits, reading

log = logging.getLogger("klwatch")

POOL_MIN_UNITS = 256
"""Units (files, run folders, stores) that are worth a process pool whatever their size, and
``POOL_MIN_BYTES`` the bytes that are worth one whatever their number. A pool costs ~0.7 s of CPU
before its first task (the fork server's interpreter importing numpy, scipy and the readers; each
worker is then forked from it), and with two cores it pays back only half of the reading it takes
over: small units read in ~4 ms each (sample_runs' 150 units, 6 MB, take ~0.6 s), event files at
~25 MB/s. So a pool is started for ~1.5 s of reading or more: 256 small units, or 48 MiB. Below
that the scan stays in this process (``benchmarks/bench_parallel.py`` measures both sides)."""
POOL_MIN_BYTES = 48 << 20
POOL_MIN_LINEAGES = 128
"""Training runs to judge before a pool is started for judging alone (one already started for the
reads is used whatever their number): judging one takes ~10 ms (a sample run) to ~30 ms (4,000
steps), so 128 are the ~1.5 s of work that pays for starting one."""
REMOTE_AT_ONCE = 4
"""Remote SOURCEs (W&B API, MLflow servers) read at the same time: their reads wait on the network,
so a few threads overlap them; more would only load the servers (each reader already fetches in
parallel where its API allows)."""
DASK_CONNECT_TIMEOUT_S = 10.0
"""How long connecting to a Dask scheduler may take (``KLWATCH_DASK_TIMEOUT`` overrides it)."""
GRACE_S = 2.0
"""How long past a SOURCE's deadline a unit task is waited for: a worker meeting the bound itself
says where it was; one that does not answer by then is given up."""


def default_jobs() -> int:
    """``--jobs`` when not given: the machine's core count."""
    return os.cpu_count() or 1


def dask_connect_timeout() -> float:
    """Seconds a connection to a Dask scheduler may take (``KLWATCH_DASK_TIMEOUT``, else 10)."""
    try:
        return max(0.1, float(os.environ.get("KLWATCH_DASK_TIMEOUT", DASK_CONNECT_TIMEOUT_S)))
    except ValueError:
        return DASK_CONNECT_TIMEOUT_S


@dataclass(frozen=True)
class Execution:
    """How a scan runs, kept apart from what it finds: the report is the same whatever these are."""

    jobs: int = 1
    """Worker processes for local reads and judging (``--jobs``); 1 reads and judges in this process,
    one SOURCE after another, as klwatch always did."""
    dask: str | None = None
    """Address of a Dask scheduler (``--dask``) that reads the units and judges the runs instead."""
    pool_min_units: int = POOL_MIN_UNITS
    pool_min_bytes: int = POOL_MIN_BYTES
    pool_min_lineages: int = POOL_MIN_LINEAGES
    """Below these a scan stays in this process however many ``jobs`` (see ``POOL_MIN_UNITS``)."""
    remote_at_once: int = REMOTE_AT_ONCE

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {self.jobs}")

    @property
    def in_process(self) -> bool:
        """Today's path: everything in this process, one SOURCE at a time."""
        return self.jobs == 1 and not self.dask


class ClusterUnreachable(Exception):
    """The Dask scheduler could not be reached (the message names it, never with credentials)."""


class _ClusterLost(Exception):
    """The Dask cluster went away during a scan: the scan is done again in this process."""


def shown_address(address: str) -> str:
    """A scheduler address as it may be shown: no userinfo, no query values."""
    return redact_spec(address)


def connect(address: str, *, timeout: float | None = None) -> Any:
    """A ``distributed.Client`` of the scheduler at ``address``, connected within ``timeout`` seconds;
    ``ClusterUnreachable`` naming it otherwise."""
    timeout = dask_connect_timeout() if timeout is None else timeout
    shown = shown_address(address)
    try:
        from distributed import Client
    except ImportError as exc:
        raise ClusterUnreachable(f"--dask {shown}: the distributed package is not installed "
                                 "(pip install 'klwatch[dask]')") from exc
    try:  # a malformed address is refused before a Client exists (one that fails late complains at exit)
        from distributed.comm import resolve_address

        resolve_address(address)
    except (ValueError, OSError) as exc:
        raise ClusterUnreachable(f"--dask {shown} is not an address of a Dask scheduler that can be reached "
                                 f"({_clean(str(exc), address)})") from exc
    try:
        return Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ClusterUnreachable(f"cannot reach the Dask scheduler at {shown} within {timeout:g} s "
                                 f"({_clean(str(exc), address)})") from exc
    except Exception as exc:  # a malformed address, a scheduler that answers something else
        raise ClusterUnreachable(f"cannot use the Dask scheduler at {shown}: "
                                 f"{type(exc).__name__}: {_clean(str(exc), address)}") from exc


def check_cluster(address: str, *, timeout: float | None = None) -> None:
    """Connect to the scheduler and leave: ``ClusterUnreachable`` before any work when it cannot be used."""
    client = connect(address, timeout=timeout)
    with contextlib.suppress(Exception):
        client.close()


def _clean(text: str, address: str) -> str:
    """``text`` without the address's credentials (an error may quote the address)."""
    return scrub(text, [address, *spec_secrets(address)])


# ------------------------------------------------------------------------------------ tasks


@dataclass(frozen=True)
class UnitTask:
    """One unit to read in a worker, with its SOURCE's bounds as they stand when it is handed out."""

    unit: Any  # sources.local.Unit
    root: Any  # pathlib.Path
    spec: str
    read_unit: Any  # sources.local.ReadUnit: picklable (a module-level function, or an object)
    limits: ReadLimits
    what: str
    used: int
    """Bytes the SOURCE had used when the task was handed out."""
    deadline: float
    """The SOURCE's deadline, as ``time.time()`` (the wall clock: workers are other processes)."""


@dataclass
class UnitOutcome:
    """What a unit task gives back: the unit's read and the bytes it cost, or the bound it passed."""

    read: Any = None  # sources.local.UnitRead
    used: int = 0
    limit: str | None = None


def read_unit_task(task: UnitTask) -> UnitOutcome:
    """Read one unit within its SOURCE's bounds (in a worker process, a Dask worker, or here). Never
    raises: a reader's failure is already the unit's error Segment, a pluggable ``read_unit`` that
    raises becomes one, and a passed bound is returned with its message."""
    from .sources.local import unit_failed

    budget = Budget(task.limits, what=task.what)
    budget.used = task.used
    budget.deadline = time.monotonic() + (task.deadline - time.time())
    with reading(budget):
        try:
            got = task.read_unit(task.unit, root=task.root, spec=task.spec)
        except LimitExceeded as exc:
            return UnitOutcome(used=budget.used - task.used, limit=str(exc))
        except Exception as exc:  # noqa: BLE001 - a read_unit bug costs its unit, not the scan
            got = unit_failed(task.unit, root=task.root, spec=task.spec, message=f"{type(exc).__name__}: {exc}")
    return UnitOutcome(read=got, used=budget.used - task.used)


def judge_task(lineage: Lineage, config: Any) -> LineageResult:
    """Judge one training run (in a worker) and keep what the scan keeps of it: ``pipeline.judge_kept``
    (a result thinned there costs less to send back)."""
    from .pipeline import judge_kept

    return judge_kept(lineage, config=config)


# ---------------------------------------------------------------------------------- runners


class _Broken(Exception):
    """The process pool broke: every task in flight was lost with it."""


class _TaskLost(Exception):
    """This task's worker died (or the cluster gave up on it); the message says so."""


class _TimedOut:
    """The wait for a task was cut at its deadline."""


class _Skipped:
    """The task was not handed out (its SOURCE stopped, or its deadline had passed)."""


TIMED_OUT, SKIPPED = _TimedOut(), _Skipped()


class _Here:
    """Runs each task in this process when its result is asked for (one at a time)."""

    window = 1
    elsewhere = False
    """Whether the tasks may run in another working directory (see ``_Dask.elsewhere``)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        return lambda: fn(*args)

    def result(self, fut: Callable[[], Any], timeout: float | None) -> Any:
        return fut()

    def close(self) -> None:
        pass


WORKER_PRELOAD = ("klwatch.parallel", "klwatch.pipeline", "klwatch.findings", "klwatch.sources.local",
                  "klwatch.sources.tensorboard", "klwatch.sources.tables", "klwatch.sources.wandb_log",
                  "klwatch.sources.mlflow_local", "klwatch.sources.checkpoints", "scipy.special")
"""What a worker needs, imported once by the fork server that workers are forked from, instead of by
every worker (~0.7 s of CPU each: numpy, scipy, the readers)."""


def _start_context() -> Any:
    """Workers are started by a fork server where the platform has one (Linux, macOS), else spawned:
    either way from a process that runs no other thread, so a lock held by one of this process's
    threads (the progress bar, a remote read) can never be inherited locked. Tasks pickle as under
    spawn."""
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(WORKER_PRELOAD))
        return ctx
    return multiprocessing.get_context("spawn")


class _Pool:
    """A ``ProcessPoolExecutor`` whose workers start clean (``_start_context``), rebuilt when a
    worker dies."""

    elsewhere = False
    """Its workers are this process's children, started in its working directory."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.window = 4 * jobs
        """Tasks handed out ahead of the one waited for: enough to keep every worker busy, few enough
        that a SOURCE's bound stops the reading soon after it passes."""
        self._stuck = False
        self._pool = self._new(jobs)

    @staticmethod
    def _new(jobs: int) -> Any:
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(max_workers=jobs, mp_context=_start_context())

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The task's future; a future failed as broken when the pool broke since the last result was
        taken (the executor says so at the next submit), so the wait for it recovers as for any other."""
        from concurrent.futures import Future
        from concurrent.futures.process import BrokenProcessPool

        try:
            return self._pool.submit(fn, *args)
        except BrokenProcessPool as exc:
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            return failed

    def result(self, fut: Any, timeout: float | None) -> Any:
        from concurrent.futures.process import BrokenProcessPool

        try:
            return fut.result(timeout=timeout)
        except BrokenProcessPool as exc:
            raise _Broken() from exc
        except TimeoutError:
            self._stuck = True  # a worker may be stuck in that task: do not wait for it at the end
            raise

    def recover(self) -> None:
        """A fresh pool after a worker died (the broken one's processes are gone or going)."""
        _stop(self._pool, kill=True)
        self._pool = self._new(self.jobs)

    def solo(self, fn: Callable[..., Any], *args: Any, timeout: float | None) -> Any:
        """Run one task alone in a fresh worker: ``_TaskLost`` when it kills that worker too."""
        from concurrent.futures.process import BrokenProcessPool

        pool = self._new(1)
        kill = False
        try:
            return pool.submit(fn, *args).result(timeout=timeout)
        except BrokenProcessPool as exc:
            raise _TaskLost("the worker process reading it ended abruptly (it crashed or was killed)") from exc
        except TimeoutError:
            kill = True
            raise
        finally:
            _stop(pool, kill=kill)

    def close(self) -> None:
        _stop(self._pool, kill=self._stuck)


def _stop(pool: Any, *, kill: bool) -> None:
    """Shut a process pool down; with ``kill``, end its processes rather than wait for a stuck one."""
    if not kill:
        pool.shutdown(wait=True, cancel_futures=True)
        return
    pool.shutdown(wait=False, cancel_futures=True)
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            proc.kill()


class _Dask:
    """Tasks on a Dask cluster through a connected ``distributed.Client``."""

    elsewhere = True
    """Its workers have working directories of their own (``dask worker`` started in another folder, on
    another machine): a relative path is sent to them made absolute (``_sent``)."""

    def __init__(self, client: Any, *, address: str) -> None:
        self.client = client
        self.address = address
        try:
            threads = sum((client.nthreads() or {}).values())
        except Exception as exc:  # noqa: BLE001 - a client whose scheduler is already gone
            raise _ClusterLost(_clean(f"{type(exc).__name__}: {exc}", address)) from exc
        self.window = max(8, 4 * threads)
        """Tasks handed out ahead: enough for every thread of the cluster."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return self.client.submit(fn, *args, pure=False)
        except Exception as exc:  # noqa: BLE001 - a closed client, a lost scheduler
            raise _ClusterLost(_clean(f"{type(exc).__name__}: {exc}", self.address)) from exc

    def result(self, fut: Any, timeout: float | None) -> Any:
        try:
            return fut.result(timeout=timeout)
        except TimeoutError:
            if self.client.status not in ("running", "connecting"):
                raise _ClusterLost("the scheduler stopped answering") from None
            fut.cancel()
            raise
        except Exception as exc:  # our tasks never raise: this is the cluster's (KilledWorker, a lost scheduler)
            if self.client.status not in ("running", "connecting"):
                raise _ClusterLost(_clean(f"{type(exc).__name__}: {exc}", self.address)) from exc
            raise _TaskLost(_clean(f"the Dask cluster could not run it ({type(exc).__name__}: {exc})",
                                   self.address)) from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def _in_order(items: Iterable[Any], *, runner: Any, make: Callable[[Any], tuple[Any, ...] | None],
              timeout_of: Callable[[Any], float | None]) -> Iterator[tuple[Any, Any]]:
    """Hand ``make(item)`` (a task function and its arguments, or None to skip it) to ``runner`` for
    each item, up to ``runner.window`` ahead, and yield ``(item, outcome)`` in the items' order.
    ``make`` is called when an item is handed out, after the outcomes before it were taken (so it sees
    a SOURCE stopped by them). An outcome is the task's result, ``SKIPPED``, ``TIMED_OUT`` or a
    ``_TaskLost``."""
    todo = iter(items)
    pending: deque[tuple[Any, Any]] = deque()

    def fill() -> None:
        for item in todo:
            call = make(item)
            pending.append((item, runner.submit(*call) if call is not None else None))
            if len(pending) >= runner.window:
                return

    fill()
    while pending:
        item, fut = pending.popleft()
        if fut is None:
            yield item, SKIPPED
            fill()
            continue
        try:
            outcome = runner.result(fut, timeout_of(item))
        except _Broken:
            yield from _isolate([(item, fut), *pending], runner=runner, make=make, timeout_of=timeout_of)
            pending.clear()
            fill()
            continue
        except TimeoutError:
            outcome = TIMED_OUT
        except _TaskLost as exc:
            outcome = exc
        yield item, outcome
        fill()


def _isolate(lost: list[tuple[Any, Any]], *, runner: Any, make: Callable[[Any], tuple[Any, ...] | None],
             timeout_of: Callable[[Any], float | None]) -> Iterator[tuple[Any, Any]]:
    """After the pool broke: the tasks that finished keep their results; each one lost with the pool
    runs again alone in a fresh worker, so only the one that kills its worker again is lost."""
    runner.recover()
    for item, fut in lost:
        if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
            yield item, fut.result()
            continue
        call = make(item)
        if call is None:
            yield item, SKIPPED
            continue
        try:
            yield item, runner.solo(*call, timeout=timeout_of(item))
        except TimeoutError:
            yield item, TIMED_OUT
        except _TaskLost as exc:
            yield item, exc


# ---------------------------------------------------------------------------------- workers


class Workers:
    """Where one scan's tasks run: a Dask cluster when given, else a process pool started the first
    time enough work asks for one (and kept for the rest of the scan), else this process."""

    def __init__(self, execution: Execution) -> None:
        self.execution = execution
        self._pool: _Pool | None = None
        self._dask: _Dask | None = None
        if execution.dask:
            self._dask = _Dask(connect(execution.dask), address=execution.dask)

    def runner(self, tasks: int, *, worth_a_pool: bool) -> Any:
        """The runner for ``tasks`` tasks: the cluster, the pool already started, a pool started now
        when the work is ``worth_a_pool``, or this process."""
        if self._dask is not None:
            return self._dask
        if self._pool is None and self.execution.jobs > 1 and tasks > 1 and worth_a_pool:
            self._pool = _Pool(min(self.execution.jobs, tasks))
        return self._pool or _Here()

    def close(self) -> None:
        for r in (self._pool, self._dask):
            if r is not None:
                r.close()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------ reads


def read_one(spec: str, *, limits: ReadLimits, read_unit: Any = None) -> SourceRead:
    """One SOURCE (``#PATTERN`` removed) read in this process: ``read_source``, with local units read
    by ``read_unit`` when one is given."""
    if read_unit is None or is_remote(spec):
        return read_source(spec, limits=limits)
    from .sources.local import read_local

    with reading(Budget(limits, what=redact_spec(spec))):
        try:
            return read_local(spec, read_unit=read_unit)
        except LimitExceeded as exc:
            return SourceRead(spec=spec, errors=[SourceError(spec, str(exc))])
        except Exception as exc:  # noqa: BLE001 - as read_source: a reader bug must not take the scan down
            return SourceRead(spec=spec, errors=[SourceError(spec, f"{type(exc).__name__}: {exc}")])


def is_remote(spec: str) -> bool:
    """A SOURCE read over the network (W&B API, MLflow server) rather than from local files."""
    return spec.startswith(REMOTE_PREFIXES)


@dataclass
class _Local:
    """A local SOURCE being read through tasks: its plan, its budget, and how far it got."""

    plan: Any  # sources.local.LocalPlan
    budget: Budget
    looked: float
    """Seconds the look for units took (they count against the SOURCE's time bound)."""
    started: bool = False
    stopped: bool = False
    done: int = 0


def read_all(specs: Sequence[str], *, limits: ReadLimits, workers: Workers, read_unit: Any,
             progress: Callable[[str], None] | None = None, remote_at_once: int = REMOTE_AT_ONCE,
             keep: Callable[[list[Any]], list[Any]] | None = None) -> list[tuple[SourceRead, str | None]]:
    """Every SOURCE read, each with its ``#PATTERN``, as ``pipeline.read_sources`` gives them: remote ones a
    few at a time in threads, local ones looked through here and their units read by ``workers``; ``keep``
    (``pipeline.keep_pieces``) gives what a read holds of each unit's (remote SOURCE's) Segments."""
    from .sources.local import plan_local
    from .sources.pool import pooling

    parts = [split_pattern(spec) for spec in specs]
    remote = [i for i, (base, _) in enumerate(parts) if is_remote(base)]
    reads: dict[int, SourceRead] = {}
    threads = ThreadPoolExecutor(max_workers=max(1, min(remote_at_once, len(remote))),
                                 thread_name_prefix="klwatch-remote") if remote else None
    try:
        remote_futures = {i: threads.submit(read_source, parts[i][0], limits=limits) for i in remote} if threads else {}
        local: dict[int, _Local] = {}
        with pooling(specs):  # the local SOURCEs are read as one fleet (``sources.pool``)
            for i, (base, _) in enumerate(parts):
                if i in remote_futures:
                    continue
                if progress:
                    progress(specs[i])
                budget = Budget(limits, what=redact_spec(base))
                started = time.monotonic()
                with reading(budget):
                    try:
                        plan = plan_local(base)
                    except Exception as exc:  # noqa: BLE001 - as read_source
                        reads[i] = SourceRead(spec=base, errors=[SourceError(base, f"{type(exc).__name__}: {exc}")])
                        continue
                local[i] = _Local(plan=plan, budget=budget, looked=time.monotonic() - started)
        _read_units(local, workers=workers, read_unit=read_unit, progress=progress, specs=specs, keep=keep)
        from .sources.local import finish_local

        for i, state in local.items():
            reads[i] = finish_local(state.plan)
        for i, fut in remote_futures.items():
            if progress:
                progress(specs[i])
            reads[i] = fut.result()
            reads[i].segments = reads[i].segments if keep is None else keep(reads[i].segments)
    finally:
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
    out = []
    for i, spec in enumerate(specs):
        reads[i].spec = spec
        out.append((reads[i], parts[i][1]))
    return out


def _worth_a_pool(units: Sequence[Any], *, execution: Execution) -> bool:
    """Whether reading ``units`` is enough work to start a pool for (``POOL_MIN_UNITS``): many
    units, or few that hold many bytes (found with a bounded look at their sizes)."""
    if execution.jobs <= 1 or len(units) < 2:
        return False
    if len(units) >= execution.pool_min_units:
        return True
    total = 0
    for unit in units:
        total += _unit_bytes(unit, cap=execution.pool_min_bytes - total)
        if total >= execution.pool_min_bytes:
            return True
    return False


def _unit_bytes(unit: Any, *, cap: int, max_files: int = 2000) -> int:
    """About how many bytes reading ``unit`` means: a file's size, the files' sizes inside a run
    folder or store (at most ``max_files`` looked at, stopping at ``cap``); checkpoint folders hold
    model weights that are never read, so they count nothing."""
    from .sources.limits import walk

    if unit.kind == "checkpoints":
        return 0
    try:
        st = os.stat(unit.path)
        if not stat.S_ISDIR(st.st_mode):
            return st.st_size if stat.S_ISREG(st.st_mode) else 0
        total = seen = 0
        for folder, _, files in walk(unit.path):
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(folder, name))
                    total += st.st_size if stat.S_ISREG(st.st_mode) else 0
                seen += 1
                if seen >= max_files or total >= cap:
                    return total
        return total
    except OSError:
        return 0


def _read_units(local: dict[int, _Local], *, workers: Workers, read_unit: Any,
                progress: Callable[[str], None] | None, specs: Sequence[str],
                keep: Callable[[list[Any]], list[Any]] | None = None) -> None:
    """Read the units of every local SOURCE through ``workers``, adding each unit's read to its
    SOURCE in order and stopping a SOURCE at its bound as ``read_local`` does."""
    from .sources.local import add_unit_read, stop_at_bound, unit_failed

    items = [(i, k) for i, state in local.items() for k in range(len(state.plan.units))]
    if not items:
        return
    to_read = [(local[i].plan, local[i].plan.units[k]) for i, k in items]
    pending = getattr(read_unit, "__self__", None)
    if hasattr(pending, "will_read"):  # a scan cache: count only what it will really read (changed files)
        to_read = [(plan, u) for plan, u in to_read if pending.will_read(u, root=plan.read_root, spec=plan.read_spec)]
    runner = workers.runner(len(items), worth_a_pool=_worth_a_pool([u for _, u in to_read],
                                                                   execution=workers.execution))

    def make(item: tuple[int, int]) -> tuple[Any, ...] | None:
        i, k = item
        state = local[i]
        if state.stopped:
            return None
        if not state.started:  # the SOURCE's clock: the look for units, then from its first unit on
            state.started = True
            state.budget.deadline = time.monotonic() + state.budget.limits.max_seconds - state.looked
        left = state.budget.remaining_seconds()
        if left < 0:
            return None
        plan = state.plan
        unit, root = _sent(plan.units[k], plan.read_root) if runner.elsewhere else (plan.units[k], plan.read_root)
        return (read_unit_task, UnitTask(unit=unit, root=root, spec=plan.read_spec, read_unit=read_unit,
                                         limits=state.budget.limits, what=state.budget.what,
                                         used=state.budget.used, deadline=time.time() + left))

    def timeout_of(item: tuple[int, int]) -> float:
        return max(0.0, local[item[0]].budget.remaining_seconds()) + GRACE_S

    shown: int | None = None
    for (i, k), outcome in _in_order(items, runner=runner, make=make, timeout_of=timeout_of):
        state = local[i]
        if state.stopped:
            continue
        if progress and shown != i:
            progress(specs[i])
            shown = i
        plan, unit = state.plan, state.plan.units[k]
        try:
            if outcome is SKIPPED or outcome is TIMED_OUT:
                state.budget.check_time(str(unit.path))
                raise LimitExceeded(f"reading {state.budget.what} took longer than "  # a clock hair short of it
                                    f"{state.budget.limits.max_seconds:g} s (at {unit.path}); "
                                    "raise the bound with --max-read-seconds")
            if isinstance(outcome, _TaskLost):
                got = unit_failed(unit, root=plan.read_root, spec=plan.read_spec, message=str(outcome))
            else:
                if runner.elsewhere:
                    outcome = _as_given(outcome, unit)
                if outcome.limit is not None:
                    raise LimitExceeded(outcome.limit)
                state.budget.charge(outcome.used, str(unit.path))  # the SOURCE's bytes, in order
                got = outcome.read
        except LimitExceeded as exc:
            stop_at_bound(plan, str(exc), done=k, unit=unit)
            state.stopped = True
            continue
        add_unit_read(plan, unit, got if keep is None else dataclasses.replace(got, segments=keep(got.segments)))


def _sent(unit: Any, root: Path) -> tuple[Any, Path]:
    """``unit`` and ``root`` as a worker with a working directory of its own must get them: absolute,
    taken from this process's working directory, so it opens the files this process names (a relative
    SOURCE such as ``runs/`` would otherwise be looked for where ``dask worker`` was started). The refs
    it gives back are the same: both paths moved alike. (A W&B run folder's ``store``, an identity for
    stitching that no report shows, is then absolute; it is so for every such Segment of the scan.)"""
    return dataclasses.replace(unit, path=unit.path.absolute()), root.absolute()


def _as_given(outcome: UnitOutcome, unit: Any) -> UnitOutcome:
    """What a worker read through ``_sent`` paths, its texts naming the files as the SOURCE named them
    (an ``OSError``'s file name, where a bound passed), as a read in this process names them."""
    opened, given = str(unit.path.absolute()), str(unit.path)
    if opened == given:
        return outcome

    def named(text: str) -> str:
        return text.replace(opened, given)

    if outcome.limit is not None:
        outcome.limit = named(outcome.limit)
    if outcome.read is not None:
        outcome.read.warnings = [named(w) for w in outcome.read.warnings]
        for seg in outcome.read.segments:
            seg.error = named(seg.error) if seg.error else seg.error
            seg.warnings = [named(w) for w in seg.warnings]
    return outcome


# ---------------------------------------------------------------------------------- judging


def judge_all(lineages: Iterable[Lineage], *, config: Any, workers: Workers) -> Iterator[LineageResult]:
    """Every training run judged, in order: in the pool or on the cluster when there are enough
    (``len`` of them, or the ``expected`` count of ``pipeline.Planned``). Each run is built when it
    is handed out, so only the runs in flight are held whole."""
    todo = iter(lineages)
    first = next(todo, None)
    if first is None:
        return
    count = len(lineages) if isinstance(lineages, Sized) else getattr(lineages, "expected", None) or 1
    runner = workers.runner(count, worth_a_pool=count >= workers.execution.pool_min_lineages)
    items = itertools.chain([first], todo)
    for lin, outcome in _in_order(items, runner=runner, make=lambda lin: (judge_task, lin, config),
                                  timeout_of=lambda lin: None):
        if isinstance(outcome, _TaskLost):
            outcome = LineageResult(lin, lin.kl_metric, "error", error=f"judging it failed: {outcome}")
            if config.chart_points is not None:
                from .fleet_memory import keep_for_reports

                outcome = keep_for_reports(outcome, points=config.chart_points)
        yield outcome


def scan_on_workers(specs: Sequence[str], *, config: Any, progress: Callable[[str], None] | None = None,
                    read: Callable[[str], SourceRead] | None = None, read_unit: Any = None,
                    judge_cache: Any = None) -> Any:
    """``pipeline.scan`` on workers: the reads (unless ``read`` reads each SOURCE itself, as the
    watcher's cache does, in this process), stitching here, then the judging. A Dask cluster that
    cannot be reached, or is lost during the scan, is said (a ``klwatch`` log warning) and the scan
    is done in this process's pool instead: the report is the same."""
    from .pipeline import judge_reads, keep_pieces, read_sources, scan_store
    from .sources.local import read_unit as plain_read_unit

    execution: Execution = config.execution
    try:
        with Workers(execution) as workers, scan_store(config) as store:
            judge = functools.partial(judge_all, config=config, workers=workers)
            if judge_cache is not None:
                judge = functools.partial(judge_cache.judge_through, config=config, judge=judge)
            if read is not None:
                return judge_reads(read_sources(specs, progress=progress, read=read), config=config, judge=judge)
            reads = read_all(specs, limits=config.limits, workers=workers, read_unit=read_unit or plain_read_unit,
                             progress=progress, remote_at_once=execution.remote_at_once,
                             keep=None if store is None else functools.partial(keep_pieces, store))
            return judge_reads(reads, config=config, judge=judge, store=store)
    except (ClusterUnreachable, _ClusterLost) as exc:
        if not execution.dask:
            raise
        why = str(exc) if isinstance(exc, ClusterUnreachable) else \
            f"the Dask cluster at {shown_address(execution.dask)} was lost during the scan ({exc})"
        log.warning("%s; scanning in this process instead", why)
        from dataclasses import replace

        here = replace(config, execution=replace(execution, dask=None))
        return scan_on_workers(specs, config=here, progress=progress, read=read, read_unit=read_unit,
                               judge_cache=judge_cache)
