"""Read runs from an MLflow tracking server over its REST API (``mlflow://HOST:PORT[/EXPERIMENT]``).

Why not ``MlflowClient``: it asks for one (run, metric) history per round trip and its default
retry policy (7 retries, exponential backoff, 120 s timeouts) turns an unreachable or hanging
server into minutes of silence. Here every request has an explicit timeout and a bounded number of
retries, and histories are fetched with the fewest round trips that still return every point:

- ``/ajax-api/2.0/mlflow/metrics/get-history-bulk`` returns the FULL history of one metric for up
  to 100 runs at once (capped at 25,000 points per answer, sorted by run id; a capped answer is
  detected and the runs it cut are fetched again one by one). It is what the MLflow UI uses.
- ``/api/2.0/mlflow/metrics/get-history`` (public API) returns one run's full history, paged by
  ``next_page_token`` when the server pages; used for big runs and when the bulk route is missing.
- ``get-history-bulk-interval`` is never used: it SAMPLES the history, which can hide a resume.

The environment MLflow users already set is honoured: ``MLFLOW_TRACKING_TOKEN`` (bearer) or
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (basic auth), ``MLFLOW_TRACKING_INSECURE_TLS``,
``MLFLOW_TRACKING_SERVER_CERT_PATH``, ``MLFLOW_TRACKING_CLIENT_CERT_PATH``, and
``MLFLOW_HTTP_REQUEST_TIMEOUT`` / ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` /
``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` (with klwatch's own, shorter defaults). Nothing here writes
to the server, and no message ever contains a credential.

Credentials go only where they were configured for (issue 13). Those in the environment are sent to
the server of ``MLFLOW_TRACKING_URI`` (same scheme, host and port) when that is set, and to no other:
a SOURCE naming another server is read without them, with one warning naming both servers (never a
credential); when ``MLFLOW_TRACKING_URI`` is not set they go to the servers the operator names on the
command line, as MLflow's own client would. Credentials in a SOURCE's ``user:password@`` go to that
SOURCE's server only. A redirect is never followed (an error names where it pointed): a server cannot
send klwatch, or its credentials, to another host.

A server is untrusted input (issue 12). Every request's time and body are charged to the SOURCE's
read budget (``limits``): bodies are streamed in chunks and the byte bound enforced while reading
(an endless body stops there, a ``Content-Length`` beyond what is left is refused unread); socket
timeouts are capped by the time the SOURCE has left, and when its deadline passes every socket the
client opened is shut down, so a server trickling a byte every few seconds (which no per-read
timeout ends) is cut off there. A ``next_page_token`` that repeats (or pages that bring nothing)
stops with an error naming the server and the endpoint, and histories are asked for with
``max_results`` (without it MLflow 3.4-3.13 answers empty pages with a token that never advances,
mlflow#23916). A reply that is not JSON, or not of MLflow's shape, is an error naming the server.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import numpy as np
import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ReadTimeoutError

from ..model import Segment, Series, SourceError, SourceRead, steps_out_of_range
from ..redact import basic_auth, redact_spec, redact_url, scrub
from .limits import Budget, LimitExceeded, current_budget
from .mlflow_local import PARENT_RUN_TAG, RUN_NAME_TAG, by_start_time, finite_or_nan, parse_param, run_segment

DEFAULT_TIMEOUT_S = 60.0
"""Per read (time without a byte from the server), not per request: a big history may stream long."""
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_BACKOFF_FACTOR = 0.5
MAX_BACKOFF_S = 10.0

BULK_ROUTE = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"
BULK_MAX_POINTS = 25_000  # the server's cap on one bulk answer (MAX_HISTORY_RESULTS)
BULK_MAX_RUNS = 100  # the server's cap on run ids per bulk request
BULK_PACK_POINTS = 20_000  # pack runs into a bulk request while their expected points stay below
SEARCH_PAGE = 1000
HISTORY_PAGE = 25_000
"""``max_results`` of a get-history request (the official client's page size)."""
MAX_EMPTY_PAGES = 3
"""Pages in a row that bring nothing but a new ``next_page_token`` before pagination counts as stuck."""
BODY_CHUNK = 1 << 16
_INT64 = 2 ** 63
PARALLEL_REQUESTS = 4
"""History requests in flight at once: a server with several workers answers them in parallel."""

_RETRY_STATUS = {429, 500, 502, 503, 504}
ENV_CREDENTIALS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


class ServerError(Exception):
    """A request that failed for good; the message names the server and is safe to print."""

    def __init__(self, message: str, *, status: int | None = None, error_code: str | None = None,
                 transport: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.transport = transport
        """True when the server could not be reached or stopped answering: stop asking it."""


@dataclass
class ServerSpec:
    base_url: str
    """``http(s)://host:port``, without credentials: safe to print."""
    experiment: str | None
    username: str | None = None
    password: str | None = None


def parse_spec(spec: str) -> ServerSpec:
    """``mlflow://H:P[/EXP]`` and ``mlflow+http://`` -> http, ``mlflow+https://`` -> https."""
    scheme, sep, rest = spec.partition("://")
    schemes = {"mlflow": "http", "mlflow+http": "http", "mlflow+https": "https"}
    if not sep or scheme not in schemes:
        raise ValueError("an MLflow server is given as mlflow://HOST:PORT[/EXPERIMENT] "
                         "(mlflow+https:// for TLS)")
    parts = urlsplit(f"{schemes[scheme]}://{rest}")
    if not parts.hostname:
        raise ValueError("no host in the MLflow server address")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError("bad port in the MLflow server address") from exc
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    base = f"{parts.scheme}://{host}" + (f":{port}" if port else "")
    exp = unquote(parts.path.lstrip("/")) or None
    return ServerSpec(base_url=base, experiment=exp,
                      username=unquote(parts.username) if parts.username else None,
                      password=unquote(parts.password) if parts.password else None)


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the port defaulted by scheme; None for anything else."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80)


def _shown_origin(origin: tuple[str, str, int]) -> str:
    scheme, host, port = origin
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def env_credentials_allowed(base_url: str) -> tuple[bool, str | None]:
    """Whether the credentials set in the environment may be sent to ``base_url``, and the warning to
    give when they are withheld: they belong to ``MLFLOW_TRACKING_URI``'s server when that is set (a
    SOURCE on the command line, or one a dashboard link names, may point anywhere); without it, to
    the servers the operator names. The warning names servers and variables, never a value."""
    names = [n for n in ENV_CREDENTIALS if os.environ.get(n)]
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not names or not uri:
        return True, None
    configured, here = _origin(uri), _origin(base_url)
    if configured is not None and configured == here:
        return True, None
    kind = uri if uri.isalpha() else (_safe_scheme(uri) or "local")  # "databricks", "file:...", a path
    where = _shown_origin(configured) if configured else f"a {kind} tracking URI, not an http(s) server"
    return False, (f"credentials withheld from mlflow server {base_url}: {' / '.join(names)} "
                   f"{'is' if len(names) == 1 else 'are'} configured for another host, {where} (MLFLOW_TRACKING_URI)")


def _safe_scheme(uri: str) -> str:
    """A URI's scheme, and nothing else of it (the rest may hold a password)."""
    try:
        scheme = urlsplit(uri).scheme
    except ValueError:
        return ""
    return scheme if scheme.replace("+", "").isalnum() else ""


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


class _Sockets:
    """Every socket one client opened, so that the SOURCE's deadline can end a read still waiting on
    one: a trickling server answers each read in time, so no socket timeout ever fires."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self.closed = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            if not self.closed:
                self._socks.add(sock)
                return
        sock.close()
        raise OSError("the SOURCE's read deadline has passed")

    def shutdown_all(self) -> None:
        """Shut every socket down: a read waiting on one returns at once (the request fails)."""
        with self._lock:
            self.closed = True
            socks = list(self._socks)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _DeadlineAdapter(HTTPAdapter):
    """``requests``' adapter whose connections register their sockets with a ``_Sockets``."""

    def __init__(self, sockets: _Sockets) -> None:
        def tracked(base: type[HTTPConnection]) -> type[HTTPConnection]:
            def _new_conn(conn: HTTPConnection) -> socket.socket:
                sock = base._new_conn(conn)
                sockets.add(sock)
                return sock

            return type(f"Tracked{base.__name__}", (base,), {"_new_conn": _new_conn})

        self._pools = {
            "http": type("TrackedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": tracked(HTTPConnection)}),
            "https": type("TrackedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": tracked(HTTPSConnection)}),
        }
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(self._pools)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):  # a SOCKS manager has its own pool classes
            manager.pool_classes_by_scheme = dict(self._pools)
        return manager


class _Dropped(Exception):
    """The connection failed or broke off mid-answer: worth another attempt."""


class RestClient:
    """GET/POST JSON with explicit timeouts, bounded retries with backoff, and clean errors; every
    request within the SOURCE's budget of bytes and time (``current_budget`` when created)."""

    def __init__(self, server: ServerSpec) -> None:
        self.base = server.base_url
        self.where = f"mlflow server {self.base}"
        self.budget: Budget = current_budget()  # worker threads do not see the caller's context
        self.timeout = _env_float("MLFLOW_HTTP_REQUEST_TIMEOUT", DEFAULT_TIMEOUT_S)
        self.connect_timeout = min(DEFAULT_CONNECT_TIMEOUT_S, self.timeout)
        self.retries = max(0, int(_env_float("MLFLOW_HTTP_REQUEST_MAX_RETRIES", DEFAULT_MAX_RETRIES)))
        self.backoff = max(0.0, _env_float("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", DEFAULT_BACKOFF_FACTOR))
        env_ok, self.withheld = env_credentials_allowed(self.base)
        env = os.environ if env_ok else {}
        user = server.username or env.get("MLFLOW_TRACKING_USERNAME")
        password = server.password or env.get("MLFLOW_TRACKING_PASSWORD")
        token = env.get("MLFLOW_TRACKING_TOKEN")
        self._auth = (user, password) if user and password else None
        self._headers = {"User-Agent": "klwatch"}
        if token and not self._auth:
            self._headers["Authorization"] = f"Bearer {token}"
        self.has_credentials = bool(self._auth or token)
        self._secrets = [v for v in (token, password, basic_auth(user, password) if self._auth else None) if v]
        self._verify: bool | str = True
        if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
            self._verify = False
        elif os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
            self._verify = os.environ["MLFLOW_TRACKING_SERVER_CERT_PATH"]
        self._cert = os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH") or None
        self._local = threading.local()  # one keep-alive session per thread (Session is not thread-safe)
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        self.sockets = _Sockets()
        self._watchdog = threading.Timer(max(0.0, self.budget.remaining_seconds()) + 0.05, self.sockets.shutdown_all)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            for prefix in ("http://", "https://"):
                session.mount(prefix, _DeadlineAdapter(self.sockets))
            session.headers.update(self._headers)
            session.auth = self._auth
            session.verify = self._verify
            session.cert = self._cert
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def close(self) -> None:
        """End every request still under way (a worker given up on) and free the connections."""
        self._watchdog.cancel()
        self.sockets.shutdown_all()
        with self._lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    def shown(self, message: str) -> str:
        """``message`` without the credentials this client sends (a server may quote them back in an
        error message, as a header it echoes), nor any other a message should not hold."""
        return scrub(message, self._secrets)

    def get(self, route: str, params: Any) -> dict[str, Any]:
        return self._call("GET", route, params=params)

    def post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", route, json=body)

    def _call(self, method: str, route: str, **kwargs: Any) -> dict[str, Any]:
        """One request with bounded retries (connection failures, 429/5xx); LimitExceeded when the
        SOURCE's bytes or time run out, ServerError for any other failure."""
        attempts = self.retries + 1
        last = ""
        for attempt in range(attempts):
            self.budget.check_time(f"{self.where} {route}")
            if attempt:
                wait = min(MAX_BACKOFF_S, self.backoff * (2 ** (attempt - 1)))
                time.sleep(max(0.0, min(wait, self.budget.remaining_seconds())))
            try:
                status, body = self._request(method, route, **kwargs)
            except _Dropped as exc:
                last = str(exc)
                continue
            if status == 200:
                return self._json(body, route)
            code, msg = _error_of(body)
            if status in (401, 403):
                raise ServerError(self._auth_message(status), status=status, error_code=code)
            last = f"{self.where}: HTTP {status} on {route}" + (f": {msg}" if msg else "")
            if status not in _RETRY_STATUS:
                raise ServerError(last, status=status, error_code=code)
        raise ServerError(f"{last} (gave up after {attempts} attempt{'s' if attempts > 1 else ''})",
                          transport=True)

    def _auth_message(self, status: int) -> str:
        hint = ("the credentials in MLFLOW_TRACKING_TOKEN / MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD "
                "were refused" if self.has_credentials else
                "the environment's credentials were withheld (MLFLOW_TRACKING_URI names another server)"
                if self.withheld else "set MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")
        return f"{self.where}: HTTP {status} {'unauthorized' if status == 401 else 'forbidden'}: {hint}"

    def _request(self, method: str, route: str, **kwargs: Any) -> tuple[int, bytearray]:
        """(status, body) of one attempt; its socket timeouts capped by the time the SOURCE has left."""
        left = self.budget.remaining_seconds()
        timeout = (max(0.001, min(self.connect_timeout, left)), max(0.001, min(self.timeout, left)))
        capped = timeout[1] < self.timeout  # a read timeout then means the SOURCE's deadline
        try:
            resp = self._session().request(method, self.base + route, timeout=timeout, stream=True,
                                           allow_redirects=False, **kwargs)
        except requests.exceptions.SSLError as exc:
            self._check_deadline(route)
            raise ServerError(f"{self.where}: TLS handshake failed ({str(exc)[:200]}); for a private "
                              "CA set MLFLOW_TRACKING_SERVER_CERT_PATH", transport=True) from exc
        except requests.exceptions.ConnectTimeout as exc:
            self._check_deadline(route, timeout[0] < self.connect_timeout)
            raise _Dropped(f"{self.where}: could not connect within {self.connect_timeout:g}s") from exc
        except requests.exceptions.ReadTimeout as exc:
            self._check_deadline(route, capped)
            # A server that hangs once will hang again: asking again only multiplies the wait.
            raise ServerError(f"{self.where}: no answer to {route} within {self.timeout:g}s (the server "
                              "hangs; MLFLOW_HTTP_REQUEST_TIMEOUT sets the limit)", transport=True) from exc
        except requests.exceptions.ConnectionError as exc:
            self._check_deadline(route)
            raise _Dropped(f"{self.where}: cannot connect (nothing listening, or the connection dropped)") from exc
        except requests.exceptions.RequestException as exc:
            self._check_deadline(route)
            raise ServerError(f"{self.where}: request to {route} failed: {type(exc).__name__}",
                              transport=True) from exc
        try:
            if resp.is_redirect:
                raise ServerError(self._redirect_message(route, resp), status=resp.status_code, transport=True)
            return resp.status_code, self._body(resp, route, capped)
        finally:
            resp.close()

    def _redirect_message(self, route: str, resp: requests.Response) -> str:
        """Why a redirect is not followed, naming where it pointed (without its credentials or query)."""
        target = redact_url(urljoin(self.base + route, resp.headers.get("Location", "")))
        return (f"{self.where}: answered {route} with HTTP {resp.status_code}, a redirect to {target}; not followed "
                "(requests and credentials go only to the server given: give the address it redirects to)")

    def _body(self, resp: requests.Response, route: str, capped: bool) -> bytearray:
        """The body, streamed in chunks each charged to the budget as it arrives: an endless body
        stops at the byte bound, a ``Content-Length`` beyond what is left is refused unread."""
        where = f"{self.where} {route}"
        declared = _content_length(resp)
        left = self.budget.limits.max_bytes - self.budget.used
        if declared is not None and declared > left:
            raise LimitExceeded(f"reading {self.budget.what} needs more than {self.budget.limits.max_bytes:,} bytes "
                                f"(at {where}: the server announces a body of {declared:,} bytes); raise the bound "
                                "with --max-read-bytes")
        body = bytearray()
        try:
            for chunk in resp.iter_content(BODY_CHUNK):
                self.budget.charge(len(chunk), where)
                body += chunk
        except requests.exceptions.ContentDecodingError as exc:
            encoding = resp.headers.get("Content-Encoding")
            raise ServerError(f"{self.where}: the answer to {route} cannot be decoded ({encoding})",
                              status=resp.status_code) from exc
        except requests.exceptions.RequestException as exc:
            self._check_deadline(route, capped and _timed_out(exc))
            end = (f"before the {declared:,} bytes it announced" if declared is not None
                   else f"after {len(body):,} bytes")
            raise _Dropped(f"{self.where}: the answer to {route} broke off {end}") from exc
        return body

    def _check_deadline(self, route: str, capped: bool = False) -> None:
        """Raise LimitExceeded when a failure came from the SOURCE's deadline: its sockets shut down,
        or a socket timeout that was the time left (``capped``) and ran out."""
        left = self.budget.remaining_seconds()
        if self.sockets.closed or left <= 0 or (capped and left < 0.5):
            time.sleep(max(0.0, left) + 0.001)  # a timeout may fire a hair before the deadline
            self.budget.check_time(f"{self.where} {route}")

    def _json(self, body: bytearray, route: str) -> dict[str, Any]:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested beyond the parser
            raise ServerError(f"{self.where}: answered {route} with something that is not JSON "
                              "(is this an MLflow tracking server?)", status=200) from exc
        if not isinstance(doc, dict):
            raise ServerError(f"{self.where}: unexpected answer to {route} (not a JSON object)", status=200)
        return doc


def _timed_out(exc: BaseException) -> bool:
    """Whether a failure reading a body was a socket timeout (``requests`` wraps it in a ConnectionError)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (TimeoutError, ReadTimeoutError)):
            return True
        todo += [a for a in e.args if isinstance(a, BaseException)] + [c for c in (e.__cause__, e.__context__) if c]
    return False


def _content_length(resp: requests.Response) -> int | None:
    try:
        n = int(resp.headers.get("Content-Length", ""))
    except ValueError:
        return None
    return n if n >= 0 else None


def _error_of(body: bytearray) -> tuple[str | None, str]:
    """MLflow's ``{"error_code", "message"}``, shortened; never the request (it may hold a token)."""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            return _short(doc.get("error_code")), str(doc.get("message", ""))[:300]
    except (ValueError, RecursionError):
        pass
    text = body[:4096].decode("utf-8", "replace").strip()
    return None, text.splitlines()[0][:200] if text else ""


def _short(v: Any) -> str | None:
    return None if v is None else str(v)[:100]


# --------------------------------------------------------------------------------------------


def _get_existing(api: RestClient, route: str, params: dict[str, str]) -> dict[str, Any] | None:
    """GET ``route``; None when the server answers that the thing asked for does not exist."""
    try:
        return api.get(route, params)
    except ServerError as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST" and exc.status != 404:
            raise
    return None


def _follow_pages(api: RestClient, route: str, ask: Callable[[str | None], dict[str, Any]], *,
                  items: str) -> list[dict[str, Any]]:
    """Every ``items`` entry of a paged answer, following ``next_page_token``; a token that comes
    back again, or pages that bring nothing, stop with an error naming the server and the endpoint
    (a server whose pages never advance would otherwise be asked forever)."""
    out: list[dict[str, Any]] = []
    token: str | None = None
    seen: set[str] = set()
    empty = page = 0
    while True:
        page += 1
        doc = ask(token)
        got = _entries(api, doc, items, route)
        out.extend(got)
        token = doc.get("next_page_token") or None
        if token is None:
            return out
        empty = 0 if got else empty + 1
        if str(token) in seen or empty >= MAX_EMPTY_PAGES:
            why = ("repeats a next_page_token" if str(token) in seen
                   else f"brings nothing but a new token, {empty} in a row")
            raise ServerError(f"{api.where}: pagination of {route} does not advance (page {page} {why}); "
                              f"stopped after {page} requests")
        seen.add(str(token))


def _entries(api: RestClient, doc: dict[str, Any], items: str, route: str) -> list[dict[str, Any]]:
    """``doc[items]``, checked to be a list of objects (a server of another shape is named)."""
    got = doc.get(items, [])
    if not isinstance(got, list) or not all(isinstance(x, dict) for x in got):
        raise ServerError(f"{api.where}: unexpected answer to {route} ({items!r} is not a list of objects)")
    return got


def _search(api: RestClient, route: str, body: dict[str, Any], *, items: str) -> list[dict[str, Any]]:
    """Every ``items`` entry of a paged MLflow search."""
    return _follow_pages(api, route, lambda token: api.post(route, {**body, "page_token": token} if token else body),
                         items=items)


def _experiments(api: RestClient, wanted: str | None) -> list[dict[str, Any]]:
    if wanted is None:
        return _search(api, "/api/2.0/mlflow/experiments/search",
                       {"max_results": SEARCH_PAGE, "view_type": "ACTIVE_ONLY"}, items="experiments")
    doc = _get_existing(api, "/api/2.0/mlflow/experiments/get-by-name", {"experiment_name": wanted})
    if doc is None and wanted.isdigit():
        doc = _get_existing(api, "/api/2.0/mlflow/experiments/get", {"experiment_id": wanted})
    if doc is None:
        raise ServerError(f"mlflow server {api.base}: no experiment named or numbered {wanted!r}"
                          f" (experiments there: {_experiment_names(api)})")
    return [doc["experiment"]]


def _experiment_names(api: RestClient) -> str:
    """The server's active experiments as ``name (id)``, at most 20, for a message; "none" when it has none."""
    there = _experiments(api, None)
    shown = [f"{e.get('name')} ({e.get('experiment_id')})" for e in there[:20]]
    return (", ".join(shown) + (f" and {len(there) - 20} more" if len(there) > 20 else "")) or "none"


def _runs(api: RestClient, exp_ids: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(0, len(exp_ids), 100):
        out += _search(api, "/api/2.0/mlflow/runs/search", {"experiment_ids": exp_ids[i:i + 100],
                       "max_results": SEARCH_PAGE, "run_view_type": "ACTIVE_ONLY"}, items="runs")
    return out


Points = list[tuple[int, float, int]]  # (timestamp ms, value, step)


def _point(api: RestClient, m: dict[str, Any], route: str) -> tuple[int, float, int]:
    """One metric point of an answer; a ServerError (costing that run's metric) when it is not one."""
    try:
        point = int(m.get("timestamp", 0)), float(m.get("value", "nan")), int(m.get("step", 0))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ServerError(f"{api.where}: a metric point in the answer to {route} is not one: {str(m)[:100]}") from exc
    if not (-_INT64 <= point[0] < _INT64 and -_INT64 <= point[2] < _INT64):
        raise ServerError(f"{api.where}: a metric point in the answer to {route} has a step or timestamp "
                          f"beyond 64 bits: {str(m)[:100]}")
    return point


def _history(api: RestClient, run_id: str, key: str) -> Points:
    """One run's full history of one metric, following pages when the server pages."""
    route = "/api/2.0/mlflow/metrics/get-history"

    def ask(token: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"run_id": run_id, "metric_key": key, "max_results": HISTORY_PAGE}
        if token:
            params["page_token"] = token
        return api.get(route, params)

    try:
        metrics = _follow_pages(api, route, ask, items="metrics")
    except ServerError as exc:
        raise ServerError(f"{exc} (metric history of run {run_id} key {key!r})", status=exc.status,
                          error_code=exc.error_code, transport=exc.transport) from exc
    return [_point(api, m, route) for m in metrics]


@dataclass
class _Latest:
    step: int
    timestamp: int
    expected: int


class _Fetcher:
    """Fetch every (run, key) history: bulk where it pays, one by one where it must."""

    def __init__(self, api: RestClient) -> None:
        self.api = api
        self.bulk_ok = True

    def fetch_key(self, key: str, runs: dict[str, _Latest]) -> tuple[dict[str, Points], dict[str, str]]:
        """Histories of ``key`` for ``runs``; per-run errors in the second dict (transport errors
        are raised: a server that stopped answering is not asked for every other run)."""
        got: dict[str, Points] = {}
        errors: dict[str, str] = {}
        single = [r for r, lat in runs.items() if lat.expected > BULK_PACK_POINTS]
        packable = sorted(r for r in runs if r not in single)
        batch: list[str] = []
        load = 0
        batches: list[list[str]] = []
        for rid in packable:
            if batch and (len(batch) >= BULK_MAX_RUNS or load + runs[rid].expected > BULK_PACK_POINTS):
                batches.append(batch)
                batch, load = [], 0
            batch.append(rid)
            load += runs[rid].expected
        if batch:
            batches.append(batch)
        for b in batches:
            if not self.bulk_ok:
                single.extend(b)
                continue
            try:
                done = self._bulk(key, b, runs)
            except ServerError as exc:
                if exc.transport:
                    raise
                if exc.status == 404 and exc.error_code is None:
                    self.bulk_ok = False  # an older server, or a proxy that only passes /api/
                single.extend(b)
                continue
            got.update(done)
            single.extend(r for r in b if r not in done)
        for rid in single:
            try:
                got[rid] = _history(self.api, rid, key)
            except ServerError as exc:
                if exc.transport:
                    raise
                errors[rid] = str(exc)
        return got, errors

    def _bulk(self, key: str, batch: list[str], runs: dict[str, _Latest]) -> dict[str, Points]:
        """The runs whose history the bulk answer holds completely."""
        doc = self.api.get(BULK_ROUTE, [("metric_key", key), ("max_results", BULK_MAX_POINTS)]
                           + [("run_id", r) for r in batch])
        metrics = _entries(self.api, doc, "metrics", BULK_ROUTE)
        per_run: dict[str, Points] = defaultdict(list)
        for m in metrics:
            per_run[str(m.get("run_id"))].append(_point(self.api, m, BULK_ROUTE))
        complete = set(batch)
        if len(metrics) >= BULK_MAX_POINTS:  # capped: runs sorted after the last one were cut
            last = str(metrics[-1].get("run_id"))
            complete = {r for r in batch if r < last}
        out: dict[str, Points] = {}
        for rid in complete:
            pts = per_run.get(rid, [])
            lat = runs[rid]
            # A server with a smaller cap would cut silently: the latest point must be there.
            if not any(p[2] == lat.step and p[0] == lat.timestamp for p in pts):
                continue
            out[rid] = pts
        return out


def _series(points: Points) -> Series:
    if not points:
        return Series(np.empty(0, np.int64), np.empty(0), np.empty(0))
    arr = np.array(points, dtype=np.float64)
    arr = arr[~steps_out_of_range(arr[:, 2])]  # a step no int64 cast keeps (the server's own check is lax)
    order = np.argsort(arr[:, 0], kind="stable")  # the server's order is (timestamp, step, value)
    arr = arr[order]
    return Series(arr[:, 2].astype(np.int64), finite_or_nan(arr[:, 1]), arr[:, 0] / 1000.0)


def read_mlflow_server(spec: str) -> SourceRead:
    """Every active run of an MLflow tracking server (or of one experiment); never raises."""
    safe_spec = redact_spec(spec)
    out = SourceRead(spec=safe_spec)
    current_budget().what = safe_spec  # a bound's message names the SOURCE: never with its credentials
    try:
        server = parse_spec(spec)
    except ValueError as exc:
        out.errors.append(SourceError(safe_spec, f"{safe_spec}: {exc}"))
        return out
    api = RestClient(server)
    if api.withheld:
        out.warnings.append(api.withheld)
    try:
        _read(api, server, out)
    except (ServerError, LimitExceeded) as exc:
        out.errors.append(SourceError(safe_spec, api.shown(str(exc))))
    except Exception as exc:  # an answer of a shape we did not expect: still name the server
        out.errors.append(SourceError(
            safe_spec, api.shown(f"mlflow server {server.base_url}: unexpected answer ({type(exc).__name__}: {exc})")))
    finally:
        api.close()
    return out


def _read(api: RestClient, server: ServerSpec, out: SourceRead) -> None:
    """Every run of the experiments asked for, as Segments into ``out`` (a ServerError ends it)."""
    exps = _experiments(api, server.experiment)
    exp_names = {str(e["experiment_id"]): str(e.get("name", e["experiment_id"])) for e in exps}
    runs = _runs(api, list(exp_names))
    out.kinds.append("mlflow")
    tags_of, keys = _tags_and_latest(runs)
    names = _run_names(api, runs, tags_of)
    histories, run_errors = _histories(api, keys)

    segs: list[Segment] = []
    for run in runs:
        info = run["info"]
        rid = info.get("run_id") or info["run_uuid"]
        tags = tags_of[rid]
        eid = str(info.get("experiment_id"))
        exp_name = exp_names.get(eid, eid)
        err = None
        if run_errors.get(rid):
            err = api.shown(f"{rid}: could not read its metric history: {run_errors[rid][0]}")
        segs.append(run_segment(
            run_id=rid, source=out.spec, run_names=names, tags=tags,
            config={p["key"]: parse_param(p.get("value", "")) for p in run.get("data", {}).get("params", [])},
            series=histories.get(rid, {}), start_ms=info.get("start_time"), end_ms=info.get("end_time"),
            store=f"{server.base_url}#{exp_name}", error=err, experiment=exp_name, experiment_id=eid,
            status=info.get("status"), stage=info.get("lifecycle_stage", "active"), server=server.base_url))
    segs.sort(key=by_start_time)
    out.segments.extend(segs)


def _tags_and_latest(runs: list[dict[str, Any]]
                     ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, _Latest]]]:
    """Run id -> its tags, and metric key -> run id -> the latest point the search answer shows: what
    says which runs to fetch each history for, and whether a bulk answer holds all of one."""
    tags_of: dict[str, dict[str, str]] = {}
    keys: dict[str, dict[str, _Latest]] = defaultdict(dict)
    for run in runs:
        rid = run["info"]["run_id"] if "run_id" in run["info"] else run["info"]["run_uuid"]
        data = run.get("data", {})
        tags_of[rid] = {t["key"]: t.get("value", "") for t in data.get("tags", [])}
        for m in data.get("metrics", []):
            step = int(m.get("step", 0))
            keys[m["key"]][rid] = _Latest(step=step, timestamp=int(m.get("timestamp", 0)),
                                          expected=max(1, step + 1))
    return tags_of, keys


def _run_names(api: RestClient, runs: list[dict[str, Any]], tags_of: dict[str, dict[str, str]]
               ) -> dict[str, str | None]:
    """Run id -> the name the server shows, for the runs read and for any parent run outside the
    experiments read (asked for by id: nested runs are grouped under their parent's name)."""
    names: dict[str, str | None] = {rid: None for rid in tags_of}
    for run in runs:
        info = run["info"]
        rid = info.get("run_id") or info["run_uuid"]
        names[rid] = info.get("run_name") or tags_of[rid].get(RUN_NAME_TAG)
    for rid, tags in tags_of.items():
        parent = tags.get(PARENT_RUN_TAG)
        if parent and parent not in names and "group" not in tags:
            try:
                info = api.get("/api/2.0/mlflow/runs/get", {"run_id": parent})["run"]
                names[parent] = info["info"].get("run_name") or {
                    t["key"]: t["value"] for t in info.get("data", {}).get("tags", [])
                }.get(RUN_NAME_TAG)
            except ServerError as exc:
                if exc.transport:
                    raise
                names[parent] = None
    return names


def _histories(api: RestClient, keys: dict[str, dict[str, _Latest]]
               ) -> tuple[dict[str, dict[str, Series]], dict[str, list[str]]]:
    """Run id -> metric -> its full history, fetched a few keys at a time in parallel, and run id ->
    the errors met fetching its histories."""
    fetcher = _Fetcher(api)
    histories: dict[str, dict[str, Series]] = defaultdict(dict)
    run_errors: dict[str, list[str]] = defaultdict(list)
    pool = ThreadPoolExecutor(max_workers=PARALLEL_REQUESTS, thread_name_prefix="klwatch-mlflow")
    try:
        futures = [(key, pool.submit(fetcher.fetch_key, key, keys[key])) for key in sorted(keys)]
        for key, fut in futures:
            got, errors = fut.result()  # a transport error ends the read: see the finally
            for rid, pts in got.items():
                histories[rid][key] = _series(pts)
            for rid, msg in errors.items():
                run_errors[rid].append(msg)
    finally:
        # Do not wait for requests still in flight to a server that stopped answering: they end
        # at their own timeout; the ones not started yet are dropped.
        pool.shutdown(wait=False, cancel_futures=True)
    return histories, run_errors
