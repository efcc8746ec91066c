"""A webhook receiver on 127.0.0.1 for the alert tests (the ``receiver`` fixture in conftest.py)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict
    status: int
    at: float


@dataclass
class Receiver:
    """A webhook receiver on loopback that records every POST and fails the first ``fail_first``;
    ``delay`` seconds pass between reading a POST (it is recorded then, as a receiver that acts on it)
    and answering it, as a slow webhook does. Requests are served in parallel."""

    fail_first: int = 0
    fail_status: int = 500
    delay: float = 0.0
    requests: list[Request] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def delivered(self) -> list[Request]:
        return [r for r in self.requests if r.status == 200]

    def start(self) -> "Receiver":
        recv = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    status = recv.fail_status if len(recv.requests) < recv.fail_first else 200
                    recv.requests.append(Request(self.path, dict(self.headers), json.loads(body), status, time.time()))
                if recv.delay:
                    time.sleep(recv.delay)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

            def handle(self) -> None:
                try:
                    super().handle()
                except (BrokenPipeError, ConnectionResetError):  # the client was killed while we slept
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
