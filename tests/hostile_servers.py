"""Broken and hostile HTTP servers on 127.0.0.1, for the faults a real server will not produce on
demand (issue 12): pagination that never advances, a body trickled a byte every few seconds, a body
without end, JSON that is not JSON, a ``Content-Length`` the body never reaches, a server that never
answers; and for issue 13, a server that echoes the request's headers (credentials included) in its
error message, and one that redirects elsewhere. Each request's headers are recorded, so any of them
is a recorder of what credentials it was sent.

``HostileServer(answer)`` accepts connections and hands each parsed request to ``answer(request,
conn)``, which writes raw bytes to the socket: nothing in HTTP is assumed of the answer. Each
connection is closed after its answer; ``stop`` (or leaving the ``with`` block) releases every
answer still waiting and closes the listener. The ``*_answer`` factories below build the answers the
tests use; ``mlflow_routes`` serves a tiny MLflow tracking API so that one endpoint can misbehave
while the rest answers as MLflow does.
"""

from __future__ import annotations

import json
import random
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    """What the client sent: method, path (with query) and body."""

    method: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    """Header names lower-cased."""

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]


Answer = Callable[[Request, socket.socket, threading.Event], None]


@dataclass
class HostileServer:
    """A loopback TCP server that answers every request with ``answer``; ``requests`` logs them."""

    answer: Answer
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stopped = threading.Event()
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                req = _read_request(self.request)
                if req is None:
                    return
                server.requests.append(req)
                try:
                    server.answer(req, self.request, server.stopped)
                except OSError:  # the client gave up (its bound): nothing more to write
                    pass

        self._tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._tcp.daemon_threads = True
        self.port = int(self._tcp.server_address[1])
        self._thread = threading.Thread(target=self._tcp.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def spec(self) -> str:
        return f"mlflow://127.0.0.1:{self.port}"

    def count(self, route: str) -> int:
        return sum(1 for r in self.requests if r.route == route)

    def __enter__(self) -> "HostileServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopped.set()
        self._tcp.shutdown()
        self._tcp.server_close()


def _read_request(conn: socket.socket) -> Request | None:
    """One HTTP/1.1 request (headers, then ``Content-Length`` bytes of body); None when the client
    went away first."""
    conn.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path = lines[0].split(" ")[:2]
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(fields.get("content-length", 0))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return Request(method=method, path=path, body=body, headers=fields)


def head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()] + ["Connection: close", "", ""]
    return "\r\n".join(lines).encode()


def send_json(conn: socket.socket, status: int, doc: Any) -> None:
    body = json.dumps(doc).encode()
    conn.sendall(head(status, {"Content-Type": "application/json", "Content-Length": str(len(body))}) + body)


# -- a tiny MLflow tracking API ------------------------------------------------------------------

EXPERIMENTS = "/api/2.0/mlflow/experiments/search"
RUNS = "/api/2.0/mlflow/runs/search"
HISTORY = "/api/2.0/mlflow/metrics/get-history"
BULK = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"

ONE_EXPERIMENT = {"experiments": [{"experiment_id": "0", "name": "Default"}]}
ONE_RUN = {"runs": [{"info": {"run_id": "r1", "experiment_id": "0", "run_name": "grpo", "start_time": "1760000000000",
                              "status": "FINISHED", "lifecycle_stage": "active"},
                     "data": {"metrics": [{"key": "kl", "value": 0.1, "timestamp": "1760000003000", "step": "3"}]}}]}


def mlflow_routes(**overrides: Answer) -> Answer:
    """An MLflow server with one experiment and one run logging ``kl`` at steps 1-3 (its bulk route
    missing, as on an old server), where ``overrides[route]`` answers that route instead."""
    def answer(req: Request, conn: socket.socket, stop: threading.Event) -> None:
        if req.route in overrides:
            overrides[req.route](req, conn, stop)
        elif req.route == EXPERIMENTS:
            send_json(conn, 200, ONE_EXPERIMENT)
        elif req.route == RUNS:
            send_json(conn, 200, ONE_RUN)
        elif req.route == HISTORY:
            send_json(conn, 200, {"metrics": [{"key": "kl", "value": 0.1 * s, "step": str(s),
                                               "timestamp": str(1760000000000 + 1000 * s)} for s in (1, 2, 3)]})
        else:
            conn.sendall(head(404, {"Content-Type": "text/html", "Content-Length": "9"}) + b"Not Found")
    return answer


# -- hostile answers ------------------------------------------------------------------------------


def same_token_answer(doc: dict[str, Any], token: str = "eyJvZmZzZXQiOiAwfQ==") -> Answer:
    """``doc`` with a ``next_page_token`` that never changes (MLflow #23916 answers get-history
    without ``max_results`` this way, with no metrics)."""
    return lambda req, conn, stop: send_json(conn, 200, {**doc, "next_page_token": token})


def fresh_token_answer(doc: dict[str, Any]) -> Answer:
    """``doc`` with a new ``next_page_token`` every time: pages that never end."""
    counter = iter(range(1 << 62))
    return lambda req, conn, stop: send_json(conn, 200, {**doc, "next_page_token": f"t{next(counter)}"})


def trickle_answer(interval: float, *, headers_too: bool = False) -> Answer:
    """A valid answer sent one byte every ``interval`` seconds: each read of the client is answered
    in time, so only a bound on the whole source ends it. ``headers_too`` trickles the status line."""
    body = json.dumps(ONE_EXPERIMENT).encode()
    whole = head(200, {"Content-Type": "application/json", "Content-Length": str(len(body))}) + body

    def answer(req: Request, conn: socket.socket, stop: threading.Event) -> None:
        start = 0 if headers_too else len(whole) - len(body)
        conn.sendall(whole[:start])
        for i in range(start, len(whole)):
            conn.sendall(whole[i:i + 1])
            if stop.wait(interval):
                return
    return answer


def endless_answer() -> Answer:
    """A chunked body that never ends, as fast as the client takes it."""
    piece = b'{"experiment_id": "0", "name": "' + b"x" * 4000 + b'"}, '
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"

    def answer(req: Request, conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
                     + b'4\r\n{"ex\r\n')
        while not stop.is_set():
            conn.sendall(chunk * 16)
    return answer


def garbage_answer(kind: str) -> Answer:
    """A 200 ``application/json`` answer that is not JSON: ``bytes`` (random, seeded) or ``deep``
    (100,000 nested brackets, past any recursive parser)."""
    body = random.Random(12).randbytes(20_000) if kind == "bytes" else b"[" * 100_000

    def answer(req: Request, conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head(200, {"Content-Type": "application/json", "Content-Length": str(len(body))}) + body)
    return answer


def short_body_answer(length: int) -> Answer:
    """A ``Content-Length`` of ``length`` and a body that stops after a few bytes (the connection closes)."""
    def answer(req: Request, conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head(200, {"Content-Type": "application/json", "Content-Length": str(length)})
                     + b'{"experiments": [')
    return answer


def echo_headers_answer(status: int = 500) -> Answer:
    """An MLflow-shaped error whose message quotes every header of the request (an Authorization
    header included), as a careless or hostile server may."""
    def answer(req: Request, conn: socket.socket, stop: threading.Event) -> None:
        first = sorted(req.headers.items(), key=lambda kv: kv[0] != "authorization")  # within the quoted part
        said = "; ".join(f"{k}: {v}" for k, v in first)
        send_json(conn, status, {"error_code": "INTERNAL_ERROR", "message": f"{req.method} {req.path} with {said}"})
    return answer


def redirect_answer(location: str, status: int = 302) -> Answer:
    """A redirect to ``location`` (another server: where a client must not carry credentials)."""
    def answer(req: Request, conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head(status, {"Location": location, "Content-Length": "0"}))
    return answer


def silent_answer() -> Answer:
    """Read the request, never answer (until the server stops)."""
    return lambda req, conn, stop: stop.wait()
