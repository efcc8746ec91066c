"""Read runs from a W&B server through the real public API: ``wandb://ENTITY/PROJECT[/RUN_ID]``.

Full history only: ``run.scan_history()`` (which wandb-core serves from the run's parquet history
export plus the rows not exported yet), never ``run.history()``, which samples 500 rows and would
hide the one-step KL collapse at a resume. Honours ``WANDB_API_KEY`` and ``WANDB_BASE_URL``; no
message names either (the server is named by ``WANDB_BASE_URL`` without its userinfo or query, and
every message is scrubbed of both: the client's own errors may quote the URL).

Bounded time: left alone the client retries a failing server for many minutes. Unless the user
set them, the wandb-core GraphQL and file-transfer timeouts and retries are set per request
(``KLWATCH_WANDB_TIMEOUT`` seconds, default 30; ``KLWATCH_WANDB_RETRIES`` retries, default 2),
and a watchdog gives up when nothing has come back for longer than a request may take. An
unreachable, failing or hanging server, or rejected credentials, become ``SourceRead.errors`` with
a message naming the server; a run that cannot be read becomes a Segment with ``error`` set; the
reader never raises.

The SOURCE's read budget (``limits``, issue 12) bounds the whole read: its deadline is checked
between requests and rows, and the watchdog gives up at it whatever the client is waiting for; the
rows, configs and summaries the client hands back are charged to its byte bound as they arrive (the
client's own transfers are out of sight: what it decoded is what is counted), so a server whose
history never ends stops at the bound.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urljoin, urlsplit

import numpy as np

from ..model import Segment, Series, SourceError, SourceRead
from ..redact import redact_spec, redact_url, scrub
from .limits import Budget, LimitExceeded, current_budget
from .mlflow_local import finite_or_nan

SPEC = re.compile(r"^wandb://([^/#]+)/([^/#]+)(?:/([^/#]+))?/?$")
KIND = "wandb-api"
_SETTINGS_LOCK = threading.Lock()


def _limits() -> tuple[float, int]:
    """(seconds per request, retries) from the environment."""
    try:
        timeout = float(os.environ.get("KLWATCH_WANDB_TIMEOUT", "30"))
    except ValueError:
        timeout = 30.0
    try:
        retries = int(os.environ.get("KLWATCH_WANDB_RETRIES", "2"))
    except ValueError:
        retries = 2
    return max(timeout, 0.5), max(retries, 0)


def _wait_bounds(timeout: float) -> tuple[float, float]:
    """Back-off between retries: short, and never longer than a request may take."""
    return min(1.0, timeout / 2), min(4.0, timeout)


def request_budget(*, timeout: float, retries: int) -> float:
    """Longest one call may take inside wandb-core: every attempt timing out, plus the waits."""
    return (retries + 1) * timeout + retries * _wait_bounds(timeout)[1] + max(2.0, timeout)


def describe_failure(exc: BaseException, *, url: str, timeout: float) -> str:
    """A person-readable reason for a failed request (the wandb client's messages are not)."""
    status = None
    texts = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        texts.append(str(cur))
        response = getattr(cur, "response", None)
        http_status = getattr(response, "http_status", None)
        if isinstance(http_status, int) and http_status:
            status = status or http_status
        cur = cur.__cause__ or cur.__context__
    text = " | ".join(texts)
    low = text.lower()
    attempts = re.search(r"giving up after (\d+) attempt", text)
    tries = f" ({attempts.group(1)} attempts)" if attempts else ""
    m = re.search(r"HTTP (\d{3})", text)
    if status is None and m:
        status = int(m.group(1))
    if status in (401, 403) or "invalid api key" in low or "unauthorized" in low:
        return (f"W&B server {url} rejected the credentials (HTTP {status or 401}): check WANDB_API_KEY "
                "(and WANDB_BASE_URL)")
    if ("client.timeout" in low or "timeout" in low or "timed out" in low or "did not respond in time" in low
            or "deadline exceeded" in low or isinstance(exc, TimeoutError)):
        return f"W&B server {url} did not answer within {timeout:g} s{tries}: timed out"
    if "connection refused" in low or "no such host" in low or "dial tcp" in low or "connect:" in low:
        return f"cannot reach W&B server {url}: connection refused or host unknown{tries}"
    if status and status >= 500:
        return f"W&B server {url} answered HTTP {status} (server error){tries}"
    if status:
        return f"W&B server {url} answered HTTP {status}: {texts[-1].splitlines()[0][:200]}"
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    return f"W&B server {url}: {type(exc).__name__}: {first[:300]}"


def _base_url() -> str:
    url = os.environ.get("WANDB_BASE_URL")
    if url:
        return url.rstrip("/")
    try:
        from wandb.sdk import wandb_setup

        return str(wandb_setup.singleton().settings.base_url).rstrip("/")
    except Exception:  # noqa: BLE001 - only for messages
        return "https://api.wandb.ai"


_REDIRECTS = (301, 302, 303, 307, 308)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    try:
        port = parts.port or default
    except ValueError:
        port = None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def redirected_elsewhere(url: str, *, timeout: float) -> str | None:
    """Why the W&B server at ``url`` is not read, when it redirects its GraphQL endpoint to another origin:
    the W&B client (wandb-core) follows redirects, so a server could send its requests elsewhere. Asked
    once, without credentials, before the client is made; None when it answers otherwise or not at all
    (the client then says why). A server that redirects only later requests is not caught by this."""
    import requests

    try:
        wait = max(0.1, min(timeout, 10.0, current_budget().remaining_seconds()))
        resp = requests.post(f"{url}/graphql", json={"query": "query Viewer { viewer { id } }", "operationName": "Viewer"},
                             timeout=wait, allow_redirects=False)
    except (requests.RequestException, ValueError):
        return None
    location = resp.headers.get("Location") if resp.status_code in _REDIRECTS else None
    if not location or _origin(urljoin(f"{url}/graphql", location)) == _origin(url):
        return None
    return (f"W&B server {redact_url(url)}: answered /graphql with HTTP {resp.status_code}, a redirect to "
            f"{redact_url(urljoin(url + '/graphql', location))}; not followed (requests and credentials go only to the "
            "server given: set WANDB_BASE_URL to the address it redirects to)")


def _api_key(url: str) -> str | None:
    """WANDB_API_KEY, else what ``wandb login`` stored; never an interactive prompt."""
    key = os.environ.get("WANDB_API_KEY")
    if key:
        return key
    try:
        from wandb.sdk.lib.wbauth import wbnetrc

        return wbnetrc.read_netrc_auth(host=url)
    except Exception:  # noqa: BLE001 - an older/newer client: let wandb.Api look for itself
        return None


def make_api(*, timeout: float, retries: int, api_key: str, lock_wait: float = -1) -> Any:
    """``wandb.Api`` whose wandb-core requests time out and give up in bounded time.

    ``wandb.Api`` copies the global wandb settings when it is created, so the bounds are set on
    those settings just for that moment (settings the user chose are left as they are). Creating it
    asks the server who the key belongs to; while another read waits for that answer, this one waits
    at most ``lock_wait`` seconds (the SOURCE's time left) for its turn.
    """
    import wandb
    from wandb.sdk import wandb_setup

    wait_min, wait_max = _wait_bounds(timeout)
    bounds = {
        "x_graphql_timeout_seconds": timeout,
        "x_graphql_retry_max": retries,
        "x_graphql_retry_wait_min_seconds": wait_min,
        "x_graphql_retry_wait_max_seconds": wait_max,
        "x_file_transfer_timeout_seconds": timeout,
        "x_file_transfer_retry_max": retries,
        "x_file_transfer_retry_wait_min_seconds": wait_min,
        "x_file_transfer_retry_wait_max_seconds": wait_max,
    }
    if not _SETTINGS_LOCK.acquire(timeout=lock_wait):
        raise TimeoutError("timed out waiting for another read of a W&B server to set up its client")
    try:
        settings = wandb_setup.singleton().settings
        saved = {k: getattr(settings, k, None) for k in bounds}
        try:
            for k, v in bounds.items():
                if saved[k] is None and k in type(settings).model_fields:
                    setattr(settings, k, v)
            budget = request_budget(timeout=timeout, retries=retries)
            return wandb.Api(timeout=int(math.ceil(budget)), api_key=api_key)
        finally:
            for k, v in saved.items():
                if k in type(settings).model_fields:
                    setattr(settings, k, v)
    finally:
        _SETTINGS_LOCK.release()


# -- rows -> series -----------------------------------------------------------------------------


def _flatten(row: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if "_type" not in v:  # media, histograms, tables: not scalars
                _flatten(v, key + ".", out)
        else:
            out[key] = v


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def series_from_rows(rows: list[dict[str, Any]]) -> dict[str, Series]:
    """History rows as the API returns them -> one Series per numeric key, rows in the order given.

    Nested dicts are flattened with '.', as the log reader joins nested keys; ``_step`` is the step
    axis and ``_timestamp`` the clock; ``_runtime`` stays a series.
    """
    cols: dict[str, tuple[list[int], list[float]]] = {}
    steps: list[int] = []
    times: list[float] = []
    prev = -1
    for r, row in enumerate(rows):
        flat: dict[str, Any] = {}
        _flatten(row, "", flat)
        step = _number(flat.get("_step"))
        prev = int(step) if step is not None else prev + 1
        steps.append(prev)
        ts = _number(flat.get("_timestamp"))
        times.append(np.nan if ts is None else ts)
        for k, v in flat.items():
            if k in ("_step", "_timestamp"):
                continue
            x = _number(v)
            if x is None:
                continue
            rr, vv = cols.setdefault(k, ([], []))
            rr.append(r)
            vv.append(x)
    step_arr = np.asarray(steps, dtype=np.int64)
    time_arr = np.asarray(times, dtype=np.float64)
    series: dict[str, Series] = {}
    for k, (rr, vv) in cols.items():
        idx = np.asarray(rr, dtype=np.int64)
        wall = time_arr[idx]
        series[k] = Series(step_arr[idx], finite_or_nan(vv), None if np.isnan(wall).all() else wall)
    return series


def _epoch(created_at: Any) -> float | None:
    """W&B's ``createdAt`` (ISO 8601, UTC, with or without ``Z``) -> seconds since the epoch."""
    if not created_at:
        return None
    try:
        dt = datetime.fromisoformat(str(created_at).replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


# -- reading ------------------------------------------------------------------------------------


def _size(obj: Any) -> int:
    """Bytes a row, config or summary took to send, estimated from what the client decoded (its own
    transfers are out of sight): each key, each string, and a number's worth for any other value.
    Without recursion: a server's nesting may be deep."""
    total, todo = 0, [obj]
    while todo:
        o = todo.pop()
        if isinstance(o, dict):
            total += 2 + sum(len(str(k)) for k in o)
            todo.extend(o.values())
        elif isinstance(o, (list, tuple)):
            total += 2
            todo.extend(o)
        else:
            total += len(o) + 2 if isinstance(o, (str, bytes)) else 12
    return total


class _Reader:
    """Does the reading in a worker thread; the caller watches ``progress`` and may give up."""

    def __init__(self, *, spec: str, entity: str, project: str, run_id: str | None, url: str,
                 timeout: float, retries: int, budget: Budget) -> None:
        self.spec, self.entity, self.project, self.run_id = spec, entity, project, run_id
        self.store = f"wandb://{entity}/{project}"
        self.raw_url = url  # for finding its credentials only
        self.url, self.timeout, self.retries = redact_url(url), timeout, retries
        self.budget = budget  # the worker thread does not see the caller's context
        self.stopped = False
        self.lock = threading.Lock()
        self.segments: list[Segment] = []
        self.errors: list[SourceError] = []
        self.progress = time.monotonic()
        self.doing = "connecting"

    def tick(self, doing: str | None = None) -> None:
        self.progress = time.monotonic()
        if doing:
            self.doing = doing

    def shown(self, message: str) -> str:
        """``message`` without the server's credentials (a client's error may quote its URL)."""
        return scrub(message, [self.raw_url])

    def fail(self, message: str, ref: str | None = None) -> None:
        with self.lock:
            self.errors.append(SourceError(self.spec, self.shown(message), ref=ref))

    def run(self) -> None:
        try:
            self._run()
        except LimitExceeded as exc:  # the SOURCE's bound: the read stops here, what was read is kept
            self.bound_passed(exc)
        except Exception as exc:  # noqa: BLE001 - never raise out of a reader
            self.fail(describe_failure(exc, url=self.url, timeout=self.timeout))

    def bound_passed(self, exc: LimitExceeded) -> None:
        """The SOURCE's bound, said once: the watchdog and the worker may both meet it."""
        with self.lock:
            if not self.stopped:
                self.stopped = True
                self.errors.append(SourceError(self.spec, self.shown(f"W&B server {self.url}: {exc}")))

    def charge(self, obj: Any, where: str) -> None:
        """Count what the client handed back against the SOURCE's bytes (and check its time)."""
        self.budget.charge(_size(obj), where)

    def _run(self) -> None:
        key = _api_key(self.raw_url)
        if not key:
            self.fail(f"no W&B credentials for {self.url}: set WANDB_API_KEY (or run `wandb login`)")
            return
        try:
            # no request outlives the SOURCE's deadline by much (a hung one holds the client's setup)
            timeout = max(0.5, min(self.timeout, self.budget.remaining_seconds()))
            api = make_api(timeout=timeout, retries=self.retries, api_key=key,
                           lock_wait=max(0.0, self.budget.remaining_seconds()))
        except Exception as exc:  # noqa: BLE001
            self.fail(describe_failure(exc, url=self.url, timeout=self.timeout))
            return
        self.tick("listing runs")
        path = f"{self.entity}/{self.project}"
        if self.run_id:
            try:
                runs: Any = [api.run(f"{path}/{self.run_id}")]
            except Exception as exc:  # noqa: BLE001
                text = str(exc).lower()
                if "could not find run" in text or "not found" in text:
                    self.fail(f"W&B run {path}/{self.run_id} not found on {self.url}", ref=self.run_id)
                else:
                    self.fail(f"run {path}/{self.run_id}: "
                              + describe_failure(exc, url=self.url, timeout=self.timeout), ref=self.run_id)
                return
        else:
            runs = api.runs(path, lazy=False, per_page=50)
        found = 0
        try:
            for run in runs:  # pages are fetched as the iteration goes
                found += 1
                self.budget.check_time(f"{self.url} run {run.id}")
                self.tick(f"reading run {run.id}")
                seg = self._read_run(run)
                with self.lock:
                    self.segments.append(seg)
        except LimitExceeded:
            raise
        except Exception as exc:  # noqa: BLE001 - listing failed part way
            text = str(exc).lower()
            if "project" in text and ("not find" in text or "not found" in text):
                self.fail(f"W&B project {path} not found on {self.url}")
            else:
                self.fail(f"listing runs of {path}: {describe_failure(exc, url=self.url, timeout=self.timeout)}")
            return
        if not found:
            self.fail(f"W&B project {path} on {self.url} has no runs (or does not exist)")

    def _read_run(self, run: Any) -> Segment:
        seg = Segment(kind=KIND, ref=str(run.id), source=self.spec, run_id=str(run.id),
                      name=getattr(run, "name", None) or None, group=getattr(run, "group", None) or None,
                      store=self.store)
        where = f"{self.url} run {seg.ref}"
        try:
            seg.config = {k: v for k, v in dict(run.config).items() if not str(k).startswith("_wandb")}
            self.charge(seg.config, where)
            seg.tags = {str(t): "" for t in (run.tags or [])}
            seg.start_time = _epoch(getattr(run, "created_at", None))
            seg.meta.update(state=getattr(run, "state", None), job_type=getattr(run, "job_type", None),
                            created_at=getattr(run, "created_at", None), tags=list(run.tags or []),
                            url=getattr(run, "url", None),
                            summary={k: v for k, v in dict(run.summary_metrics).items()
                                     if not str(k).startswith("_wandb")})
            self.charge(seg.meta["summary"], where)
            last = int(run.lastHistoryStep)
            self.tick()
            # pages are step ranges: keep their number bounded when steps are large (e.g. tokens)
            page = max(1000, (last + 1) // 500 + 1)
            rows = []
            for row in run.scan_history(page_size=page, use_cache=False):
                self.charge(row, where)
                rows.append(row)
                self.progress = time.monotonic()
            seg.series = series_from_rows(rows)
            seg.meta["history_rows"] = len(rows)
        except LimitExceeded:
            raise  # the SOURCE's bound, not this run's fault: the read stops
        except Exception as exc:  # noqa: BLE001 - this run only
            name = f" ({seg.name})" if seg.name and seg.name != seg.ref else ""
            seg.error = self.shown(f"run {seg.ref}{name}: {describe_failure(exc, url=self.url, timeout=self.timeout)}")
            seg.series = {}
        return seg


def _watch(worker: threading.Thread, reader: _Reader, *, stall: float, budget: Budget) -> None:
    """Wait for the worker; give up when nothing came back for ``stall`` seconds or the SOURCE's
    deadline passed, whatever the client is waiting for (the worker is left to end on its own)."""
    while worker.is_alive():
        worker.join(max(0.01, min(0.2, budget.remaining_seconds() + 0.01)))
        if not worker.is_alive():
            return
        if time.monotonic() - reader.progress > stall:
            reader.fail(f"W&B server {reader.url} stopped answering while {reader.doing} (nothing for {stall:.0f} s); "
                        "gave up")
            return
        try:
            budget.check_time(f"{reader.url} while {reader.doing}")
        except LimitExceeded as exc:
            reader.bound_passed(exc)
            return


def read_wandb_api(spec: str) -> SourceRead:
    """Every run of ``wandb://ENTITY/PROJECT`` (or the one run ``.../RUN_ID``) as one Segment each."""
    out = SourceRead(spec=spec, kinds=[KIND])
    m = SPEC.match(spec)
    if not m:
        out.errors.append(SourceError(spec, f"bad W&B source {redact_spec(spec)!r}: expected wandb://ENTITY/PROJECT "
                                            "or wandb://ENTITY/PROJECT/RUN_ID"))
        return out
    entity, project, run_id = m.groups()
    timeout, retries = _limits()
    url = _base_url()
    if (moved := redirected_elsewhere(url, timeout=timeout)) is not None:
        out.errors.append(SourceError(spec, moved))
        return out
    budget = current_budget()
    reader = _Reader(spec=spec, entity=entity, project=project, run_id=run_id, url=url, timeout=timeout,
                     retries=retries, budget=budget)
    worker = threading.Thread(target=reader.run, name=f"klwatch-wandb-{entity}-{project}", daemon=True)
    worker.start()
    _watch(worker, reader, stall=request_budget(timeout=timeout, retries=retries) + 2.0, budget=budget)
    with reader.lock:  # a worker given up on may still append later: hand back a snapshot
        out.segments = list(reader.segments)
        out.errors.extend(reader.errors)
    return out
