"""Start a real ``mlflow server`` on a free loopback port for tests (and benchmarks), and stop it.

The server runs in its own process group so that stopping it also stops the uvicorn worker it
spawns; MLflow's background job runner is switched off (it forks a dozen consumers and is not
needed to serve the tracking API), which also makes startup faster on a 2-core machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MLFLOW_BIN = Path(sys.executable).parent / "mlflow"


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class MlflowServer:
    """A launched ``mlflow server``: ``url`` is ``http://127.0.0.1:PORT``."""

    port: int
    workdir: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spec(self) -> str:
        """The klwatch SOURCE naming this server."""
        return f"mlflow://127.0.0.1:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.workdir / "server.db"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    def wait_ready(self, *, timeout: float = 90.0) -> bool:
        """Block until /health answers; False if the server died or did not come up in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if _healthy(self.url):
                return True
            time.sleep(0.1)
        return False

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server and its worker (the process group we created); no graceful drain."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=3)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=5)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def launch_mlflow_server(*, workdir: Path, workers: int = 1) -> MlflowServer:
    """Start ``mlflow server`` (SQLite backend ``workdir/server.db``) and return at once; call
    ``wait_ready`` before use. A ``server.db`` already in ``workdir`` is served as it is."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", PYTHONUNBUFFERED="1")
    with open(workdir / "server.log", "ab") as log:
        proc = subprocess.Popen(
            [str(MLFLOW_BIN), "server", "--backend-store-uri", f"sqlite:///{workdir / 'server.db'}",
             "--default-artifact-root", str(workdir / "artifacts"),
             "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)],
            cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )
    return MlflowServer(port=port, workdir=workdir, proc=proc)


def start_mlflow_server(*, workdir: Path, workers: int = 1, timeout: float = 90.0) -> MlflowServer:
    """Launch and wait until /health answers (a port taken meanwhile: one more try)."""
    tail = ""
    for _attempt in range(2):
        server = launch_mlflow_server(workdir=workdir, workers=workers)
        if server.wait_ready(timeout=timeout):
            return server
        server.stop()
        tail = server.log_tail()
    raise RuntimeError(f"mlflow server did not start; log tail:\n{tail}")


@contextmanager
def serving_a_copy(store: Path, *, workdir: Path) -> Iterator[MlflowServer]:
    """A real ``mlflow server`` on a copy of the SQLite ``store`` (the server may migrate its schema), stopped on
    leaving: how a committed tracker store is read back through the server's REST API."""
    shutil.copy(store, workdir / "server.db")
    server = start_mlflow_server(workdir=workdir)
    try:
        yield server
    finally:
        server.stop()
