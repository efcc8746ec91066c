"""Start the dashboard for real (``klwatch dashboard`` -> ``streamlit run``, or ``streamlit run
dashboard/app.py`` itself) on a free port, and stop it; and what a port is listening on."""

from __future__ import annotations

import ipaddress
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
def running_server(cmd: list[str], *, port: int, log: Path, timeout: float = 60.0, cwd: Path = REPO,
                   env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``cmd`` (a Streamlit server on ``port``) and yield its URL once /_stcore/health answers on
    127.0.0.1; the server is stopped on exit."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{cmd[:5]} exited with {proc.returncode}: {log.read_text()[-2000:]}")
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


@contextmanager
def running_dashboard(sources: list[str], *, log: Path, timeout: float = 60.0, klwatch: list[str] | None = None,
                      cwd: Path = REPO, env: dict[str, str] | None = None, address: str | None = "127.0.0.1",
                      extra: list[str] | None = None) -> Iterator[str]:
    """Yield the app's URL once /_stcore/health answers; the server is stopped on exit. ``klwatch`` is
    the command to run (default: this Python's ``-m klwatch.cli``; the wheel test gives its venv's);
    ``address`` None leaves ``--address`` to its default; ``extra`` are more options (``--allow-add``)."""
    port = free_port()
    # The README's command, `klwatch dashboard`, which execs `streamlit run dashboard/app.py` headless.
    cmd = [*(klwatch or [sys.executable, "-m", "klwatch.cli"]), "dashboard", "--port", str(port),
           *(["--address", address] if address is not None else []), *(extra or []), *sources]
    with running_server(cmd, port=port, log=log, timeout=timeout, cwd=cwd, env=env) as url:
        yield url


@contextmanager
def running_streamlit(app_args: list[str], *, log: Path, cwd: Path = REPO, timeout: float = 60.0,
                      env: dict[str, str] | None = None, options: list[str] | None = None) -> Iterator[tuple[str, int]]:
    """The README's other launch line, ``streamlit run dashboard/app.py -- SOURCE...``, run from ``cwd``
    (headless, so no browser opens; ``options`` are more ``--section.option=value``): the URL on
    127.0.0.1 and the port."""
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", "dashboard/app.py" if cwd == REPO else str(REPO / "dashboard" / "app.py"),
           "--server.headless=true", f"--server.port={port}", *(options or []), "--", *app_args]
    with running_server(cmd, port=port, log=log, timeout=timeout, cwd=cwd, env=env) as url:
        yield url, port


def _address(hex_addr: str) -> str:
    """An address as /proc/net/tcp{,6} prints it (little-endian 32-bit words) in the usual notation."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_addresses(port: int) -> set[str]:
    """Every local address a TCP socket LISTENs on at ``port`` in this network namespace (Linux /proc)."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr, _, port_hex = local.partition(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: TCP_LISTEN
                found.add(_address(addr))
    return found


def outward_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(addr).is_loopback else addr
