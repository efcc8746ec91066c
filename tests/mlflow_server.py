"""Start a real ``mlflow server`` on a free loopback port for tests (and benchmarks), and stop it.

The server runs in its own process group so that stopping it also stops the uvicorn worker it
spawns; MLflow's background job runner is switched off (it forks a dozen consumers and is not
needed to serve the tracking API), which also makes startup faster on a 2-core machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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
    """A running ``mlflow server``: ``url`` is ``http://127.0.0.1:PORT``."""

    port: int
    db_path: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spec(self) -> str:
        """The klwatch SOURCE naming this server."""
        return f"mlflow://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group we created: server + its worker
            self.proc.wait(timeout=10)
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


def start_mlflow_server(*, workdir: Path, timeout: float = 90.0) -> MlflowServer:
    """Start ``mlflow server`` with a SQLite backend in ``workdir``; return once /health answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    db_path = workdir / "server.db"
    log_path = workdir / "server.log"
    last_error = ""
    for _attempt in range(2):  # a port taken between free_port() and bind: try another once
        port = free_port()
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
                   MLFLOW_TRACKING_URI="", PYTHONUNBUFFERED="1")
        env.pop("MLFLOW_TRACKING_URI")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [str(MLFLOW_BIN), "server", "--backend-store-uri", f"sqlite:///{db_path}",
                 "--default-artifact-root", str(workdir / "artifacts"),
                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        server = MlflowServer(port=port, db_path=db_path, proc=proc, log_path=log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _healthy(server.url):
                return server
            time.sleep(0.1)
        server.stop()
        last_error = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"mlflow server did not start; log tail:\n{last_error}")
