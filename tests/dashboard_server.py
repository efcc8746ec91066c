"""Start the dashboard for real (``klwatch dashboard`` -> ``streamlit run``) on a free 127.0.0.1 port, and stop it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never goes through a proxy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_dashboard(sources: list[str], *, log: Path, timeout: float = 60.0, klwatch: list[str] | None = None,
                      cwd: Path = REPO, env: dict[str, str] | None = None) -> Iterator[str]:
    """Yield the app's URL once /_stcore/health answers; the server is stopped on exit. ``klwatch`` is
    the command to run (default: this Python's ``-m klwatch.cli``; the wheel test gives its venv's)."""
    port = free_port()
    # The README's command, `klwatch dashboard`, which execs `streamlit run dashboard/app.py` headless.
    cmd = [*(klwatch or [sys.executable, "-m", "klwatch.cli"]), "dashboard", "--port", str(port),
           "--address", "127.0.0.1", *sources]
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"klwatch dashboard exited with {proc.returncode}: {log.read_text()[-2000:]}")
                try:
                    with _direct.open(f"{url}/_stcore/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"streamlit did not answer in {timeout:.0f} s: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
