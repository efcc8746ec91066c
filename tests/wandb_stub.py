"""A small W&B server on 127.0.0.1 that answers what the real ``wandb`` client sends.

The real client (``wandb.Api`` and its ``wandb-core`` sidecar) is pointed at it through
``WANDB_BASE_URL``; nothing inside the client is mocked. The operations answered are the ones the
installed client was seen to send for ``Api()``, ``api.runs()``, ``api.run()`` and
``run.scan_history()`` (logged with ``WandbStub.operations``): ``Viewer``, ``GetDefaultEntity``,
``Runs``, ``Run``, ``RunHistoryKeys``, ``RunParquetHistory`` (plus the parquet files it links to),
``HistoryPage``, ``SampledHistoryPage``, and the ``RunSampledHistory``/``RunFullHistory`` queries
behind the sampling ``run.history()``. Runs are given as Python data; the first
``StubRun.exported_rows`` rows of a run are served as a parquet history export, the rest as live
(not yet exported) rows, as the real server does for a run still being written.

Fault modes (``WandbStub(fault=...)``): ``"500"`` answers every request with HTTP 500, ``"hang"``
accepts requests and never answers (until the stub stops), ``"401"`` rejects the API key,
``"hang_history"`` answers everything but history downloads (parquet files, history pages).
``StubRun.broken`` makes only that run's history requests fail with HTTP 500; ``StubRun.endless``
makes its history never end (its last step 10^12, every history page full: a hostile or broken
server), each row padded so that a byte bound is reached quickly.
"""

from __future__ import annotations

import io
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

OPERATION = re.compile(r"\b(?:query|mutation)\s+(\w+)")


@dataclass
class StubRun:
    """One run the stub serves: its history rows (dicts with ``_step``) and metadata."""

    id: str
    name: str
    rows: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    job_type: str | None = None
    state: str = "finished"
    created_at: str = "2026-01-02T03:04:05Z"
    tags: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exported_rows: int = 0
    """How many leading rows are served from the parquet export; the rest are live rows."""
    broken: bool = False
    """Answer this run's history requests with HTTP 500 (a per-run failure)."""
    endless: bool = False
    """A history without end: the last step is 10^12 and every page is full."""

    @property
    def last_step(self) -> int:
        return 10 ** 12 if self.endless else max((r["_step"] for r in self.rows), default=-1)


ENDLESS_PAGE = 2000
"""Rows per history page of an endless run (whatever the client asks for)."""


def endless_rows(lo: int, hi: int, n: int) -> list[dict[str, Any]]:
    """A full page of an endless history from step ``lo``."""
    return [{"_step": s, "train/kl": 0.01, "note": "x" * 200} for s in range(lo, min(hi, lo + min(n, ENDLESS_PAGE)))]


def _flat(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    """The rows as a W&B history export: one column per key (nested keys joined with '.'), ``_step``
    as int64, numbers as float64, anything else as JSON text."""
    rows = [_flat(r) for r in rows]
    keys: list[str] = []
    for row in rows:
        for k in row:
            if k not in keys:
                keys.append(k)
    columns: dict[str, pa.Array] = {}
    for k in keys:
        values = [row.get(k) for row in rows]
        if k == "_step":
            columns[k] = pa.array(values, type=pa.int64())
        elif all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
            columns[k] = pa.array([None if v is None else float(v) for v in values], type=pa.float64())
        else:
            columns[k] = pa.array([None if v is None else json.dumps(v) for v in values], type=pa.string())
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


class WandbStub:
    """Start with ``with WandbStub(runs={("ent", "proj"): [StubRun(...)]}) as stub:``; ``stub.url``."""

    def __init__(
        self,
        *,
        runs: dict[tuple[str, str], list[StubRun]] | None = None,
        fault: str | None = None,
        api_key: str | None = None,
        page_size: int = 2,
    ) -> None:
        self.runs = runs or {}
        self.fault = fault
        self.api_key = api_key
        self.page_size = page_size
        """Runs per ``Runs`` page: small, so that listing a project pages like the real server."""
        self.operations: list[str] = []
        self.unknown: list[str] = []
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "WandbStub":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    # -- data -------------------------------------------------------------------------------

    def _find(self, entity: str, project: str, run_id: str) -> StubRun | None:
        for run in self.runs.get((entity, project), []):
            if run.id == run_id:
                return run
        return None

    @staticmethod
    def _run_node(run: StubRun, full: bool) -> dict[str, Any]:
        last = run.last_step
        node: dict[str, Any] = {
            "projectId": "1",
            "id": f"UnVuOnYx{run.id}",
            "tags": run.tags,
            "name": run.id,
            "displayName": run.name,
            "sweepName": None,
            "state": run.state,
            "group": run.group,
            "jobType": run.job_type,
            "commit": None,
            "readOnly": False,
            "createdAt": run.created_at,
            "heartbeatAt": run.created_at,
            "description": None,
            "notes": None,
            "historyLineCount": len(run.rows),
            "user": {"name": "stub", "username": "stub"},
        }
        if full:
            node["config"] = json.dumps({k: {"value": v, "desc": None} for k, v in run.config.items()})
            node["summaryMetrics"] = json.dumps(run.summary)
            node["systemMetrics"] = "{}"
            node["historyKeys"] = {"lastStep": last, "keys": {}}
        return node

    # -- GraphQL ----------------------------------------------------------------------------

    def graphql(self, op: str, v: dict[str, Any], query: str = "") -> tuple[int, dict[str, Any]]:
        """Answer one operation: (HTTP status, JSON body)."""
        entity, project = v.get("entity"), v.get("project")
        if op in ("Viewer", "GetDefaultEntity"):
            return 200, {"data": {"viewer": {"id": "VXNlcjox", "entity": "ent", "username": "stub",
                                             "email": None, "flags": "{}", "teams": {"edges": []}}}}
        if op == "Runs":
            runs = self.runs.get((entity, project))
            if runs is None:
                return 200, {"data": {"project": None}}
            start = int(v["cursor"]) if v.get("cursor") else 0
            per_page = min(int(v.get("perPage") or 50), self.page_size)
            chunk = runs[start:start + per_page]
            full = "fragment RunFragment on Run" in query
            edges = [{"node": self._run_node(r, full), "cursor": str(start + i + 1)}
                     for i, r in enumerate(chunk)]
            end = start + len(chunk)
            return 200, {"data": {"project": {
                "internalId": "1", "runCount": len(runs), "readOnly": False,
                "runs": {"edges": edges, "pageInfo": {"endCursor": str(end), "hasNextPage": end < len(runs)}},
            }}}
        run_name = v.get("name") or v.get("run") or v.get("runName")
        run = self._find(entity, project, run_name) if entity and project and run_name else None
        if op in ("Run", "RunHistoryKeys", "RunParquetHistory", "HistoryPage", "SampledHistoryPage",
                  "RunSampledHistory", "RunFullHistory"):
            if run is None:
                return 200, {"data": {"project": None if (entity, project) not in self.runs else {"run": None}}}
            if run.broken and op in ("RunParquetHistory", "HistoryPage", "SampledHistoryPage"):
                return 500, {"errors": [{"message": f"stub: history of {run.id} is broken"}]}
        assert run is not None or op not in ("Run",)
        if op == "Run":
            return 200, {"data": {"project": {"run": self._run_node(run, True)}}}  # type: ignore[arg-type]
        if op == "RunHistoryKeys":
            last = run.last_step  # type: ignore[union-attr]
            return 200, {"data": {"project": {"run": {"historyKeys": {"lastStep": last, "keys": {}}}}}}
        if op == "RunParquetHistory":
            assert run is not None
            urls = []
            if run.exported_rows:
                urls.append(f"{self.url}/files/{entity}/{project}/{run.id}/history.parquet")
            live = [{"_step": r["_step"]} for r in run.rows[run.exported_rows:]]
            return 200, {"data": {"project": {"run": {"parquetHistory": {"parquetUrls": urls,
                                                                         "liveData": live}}}}}
        if op in ("HistoryPage", "SampledHistoryPage", "RunSampledHistory", "RunFullHistory"):
            assert run is not None
            return 200, self._history(op, run, v)
        self.unknown.append(op)
        return 200, {"errors": [{"message": f"stub: operation {op!r} not implemented"}], "data": None}

    @staticmethod
    def _history(op: str, run: StubRun, v: dict[str, Any]) -> dict[str, Any]:
        """The history operations: pages of live rows, and what the sampling ``run.history()`` asks."""
        if op == "HistoryPage":
            lo, hi, n = int(v["minStep"]), int(v["maxStep"]), int(v["pageSize"])
            rows = (endless_rows(lo, hi, n) if run.endless else
                    [r for r in run.rows[run.exported_rows:] if lo <= r["_step"] < hi][:n])
            return {"data": {"project": {"run": {"history": [json.dumps(r) for r in rows]}}}}
        if op == "SampledHistoryPage":
            spec = json.loads(v["spec"])
            lo, hi = int(spec.get("minStep", 0)), int(spec.get("maxStep", 1 << 62))
            keys = spec.get("keys") or []
            rows = [{k: r[k] for k in keys if k in r} for r in run.rows[run.exported_rows:]
                    if lo <= r["_step"] < hi and all(k in r for k in keys)]
            return {"data": {"project": {"run": {"sampledHistory": [rows]}}}}
        n = int(v.get("samples") or 500)  # RunSampledHistory, RunFullHistory: the sampling run.history()
        rows = run.rows
        if len(rows) > n:
            stride = len(rows) / n
            rows = [rows[int(i * stride)] for i in range(n)]
        if op == "RunFullHistory":
            return {"data": {"project": {"run": {"history": [json.dumps(r) for r in rows]}}}}
        return {"data": {"project": {"run": {"sampledHistory": [rows]}}}}

    # -- HTTP -------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"stub": self})


class _Handler(BaseHTTPRequestHandler):
    """The stub's HTTP side: GraphQL on POST, parquet history exports on GET, faults first."""

    stub: WandbStub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except ConnectionError:  # the client gave up on this request (its timeout)
            self.close_connection = True

    def _fault(self, history: bool = False) -> bool:
        if self.stub.fault == "hang" or (history and self.stub.fault == "hang_history"):
            self.stub._stop.wait()
            self.close_connection = True  # never answered: the client sees the connection end
            return True
        if self.stub.fault == "500":
            self._send(500, b'{"errors":[{"message":"stub: internal server error"}]}')
            return True
        return False

    def do_GET(self) -> None:  # parquet history exports
        if self._fault(history=True):
            return
        m = re.fullmatch(r"/files/([^/]+)/([^/]+)/([^/]+)/history\.parquet", self.path)
        run = self.stub._find(m.group(1), m.group(2), m.group(3)) if m else None
        if run is None:
            self._send(404, b"not found", "text/plain")
            return
        self.stub.operations.append("GET history.parquet")
        self._send(200, _parquet_bytes(run.rows[: run.exported_rows]), "application/octet-stream")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.startswith("/graphql"):  # client telemetry and the like
            self._send(200, b"{}")
            return
        payload = json.loads(body or b"{}")
        query = payload.get("query") or ""
        m = OPERATION.search(query)
        op = payload.get("operationName") or (m.group(1) if m else "?")
        self.stub.operations.append(op)
        if self._fault(history=op in ("HistoryPage", "SampledHistoryPage")):
            return
        if self.stub.fault == "401" or (self.stub.api_key is not None and not self._key_ok()):
            self._send(401, b'{"errors":[{"message":"stub: invalid API key"}]}')
            return
        status, out = self.stub.graphql(op, payload.get("variables") or {}, query)
        self._send(status, json.dumps(out).encode())

    def _key_ok(self) -> bool:
        import base64

        auth = self.headers.get("Authorization") or ""
        if not auth.startswith("Basic "):
            return False
        user_pass = base64.b64decode(auth[6:]).decode()
        return user_pass.split(":", 1)[-1] == self.stub.api_key
