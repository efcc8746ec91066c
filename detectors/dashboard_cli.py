"""``klwatch dashboard [SOURCE...]``: start the Streamlit dashboard (the same app as
``streamlit run dashboard/app.py``), by default on the repository's ``sample_runs/``.

It only launches Streamlit; the app itself (``dashboard/app.py``) reads the SOURCEs given after ``--``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .cli_common import err
from .report import EXIT_USAGE


def app_path() -> Path:
    """The dashboard page, wherever ``klwatch.dashboard`` is installed (a checkout's ``dashboard/``
    folder in an editable install, ``site-packages/klwatch/dashboard`` from a wheel)."""
    from . import dashboard

    return Path(dashboard.__file__).resolve().parent / "app.py"


def default_sources() -> list[str]:
    """``sample_runs/`` of the checkout the dashboard lives in, else in the working directory."""
    here = app_path().parent.parent / "sample_runs"
    return [str(here if here.is_dir() else Path.cwd() / "sample_runs")]


def streamlit_command(*, sources: list[str], port: int, address: str) -> list[str]:
    """The ``streamlit run`` invocation: headless (no browser opened), no usage statistics sent."""
    return [sys.executable, "-m", "streamlit", "run", str(app_path()),
            "--server.headless=true", "--browser.gatherUsageStats=false", "--client.toolbarMode=viewer",
            f"--server.port={port}", f"--server.address={address}",
            "--", *sources]


def dashboard_command(
    sources: Annotated[Optional[list[str]], typer.Argument(
        help="Local paths, wandb://ENTITY/PROJECT, mlflow://HOST:PORT (default: sample_runs/).",
        show_default=False)] = None,
    port: Annotated[int, typer.Option("--port", "-p", min=1, max=65535, help="Port to serve on.")] = 8501,
    address: Annotated[str, typer.Option("--address", help="Address to bind (0.0.0.0 to share on the network).")] = "127.0.0.1",
) -> None:
    """Open the Streamlit dashboard: every training run, every resume boundary, the KL around it."""
    path = app_path()
    if not path.is_file():
        err.print(f"[red]error[/] the dashboard app is missing: {path}")
        raise typer.Exit(EXIT_USAGE)
    specs = list(sources or default_sources())
    err.print(f"klwatch dashboard on http://{'localhost' if address in ('127.0.0.1', '0.0.0.0') else address}:{port} "
              f"reading {', '.join(specs)} (Ctrl+C to stop)", highlight=False)
    cmd = streamlit_command(sources=specs, port=port, address=address)
    if os.name == "posix":  # become the server: Ctrl+C and kill reach Streamlit itself, no orphan left behind
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(cmd[0], cmd)
    try:
        code = subprocess.call(cmd)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
