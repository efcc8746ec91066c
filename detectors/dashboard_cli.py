"""``klwatch dashboard [SOURCE...]``: start the Streamlit dashboard (the same app as
``streamlit run dashboard/app.py``), by default on the repository's ``sample_runs/``.

It only launches Streamlit; the app itself (``dashboard/app.py``) reads the SOURCEs given after ``--``
and nothing else (a link chooses among them; ``--allow-add`` lets people add sources under the roots
and hosts it names). It listens on 127.0.0.1 unless ``--address`` says otherwise; any other address
is warned about on stderr and opted in for the app (``KLWATCH_DASHBOARD_PUBLIC=1``), which otherwise
refuses to serve data on every interface.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from .cli_common import err
from .dashboard.safety import ALLOW_ADD_FLAG, PUBLIC_ENV, AllowList, is_loopback
from .redact import redact_spec
from .source_names import REMOTE_PREFIXES, split_pattern
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


def streamlit_command(*, sources: list[str], port: int, address: str, allow_add: Sequence[str] = ()) -> list[str]:
    """The ``streamlit run`` invocation: headless (no browser opened), no usage statistics sent; the
    app's own arguments after ``--`` (its allow-list first, then the SOURCEs)."""
    allow = [arg for entry in allow_add for arg in (ALLOW_ADD_FLAG, entry)]
    # -P: the working directory is not put on the import path, so a folder named klwatch/ there (the clone,
    # seen from its parent) cannot shadow the installed package
    return [sys.executable, "-P", "-m", "streamlit", "run", str(app_path()),
            "--server.headless=true", "--browser.gatherUsageStats=false", "--client.toolbarMode=viewer",
            f"--server.port={port}", f"--server.address={address}",
            "--", *allow, *sources]


def network_warning(*, address: str, port: int, sources: Sequence[str], allow_add: Sequence[str]) -> str:
    """What the operator must know before a dashboard is reachable from other machines."""
    where = ", ".join(redact_spec(s) for s in sources)
    added = (f"; a person may also add sources under {', '.join(redact_spec(a) for a in allow_add)}" if allow_add
             else "; it cannot make the dashboard read any other path or host")
    return (f"warning: the dashboard listens on {address}:{port} and is reachable from the network, without a login: "
            f"anyone who can reach this machine sees every run in {where} and can download its report. A link can "
            f"choose among these sources and their runs{added}. To share it with a team, keep it on 127.0.0.1 "
            "behind a reverse proxy with authentication (README: 'Sharing the dashboard safely').")


def dashboard_command(
    sources: Annotated[Optional[list[str]], typer.Argument(
        help="Local paths, wandb://ENTITY/PROJECT, mlflow://HOST:PORT (default: sample_runs/).",
        show_default=False)] = None,
    port: Annotated[int, typer.Option("--port", "-p", min=1, max=65535, help="Port to serve on.")] = 8501,
    address: Annotated[str, typer.Option("--address", help="Address to bind (default: this machine only; "
                                         "0.0.0.0 shares it on the network, with a warning).")] = "127.0.0.1",
    allow_add: Annotated[Optional[list[str]], typer.Option(
        "--allow-add", help="Let people add sources from the page, under this local folder, mlflow://HOST[:PORT] "
                            "or wandb://ENTITY[/PROJECT] (repeatable; off by default).", show_default=False)] = None,
) -> None:
    """Open the Streamlit dashboard: every training run, every resume boundary, the KL around it."""
    path = app_path()
    if not path.is_file():
        err.print(f"[red]error[/] the dashboard app is missing: {path}")
        raise typer.Exit(EXIT_USAGE)
    allowed = list(allow_add or [])
    try:
        AllowList.parse(allowed)
    except ValueError as exc:
        err.print("[red]error[/] --allow-add " + escape(str(exc)), highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    specs = list(sources or default_sources())
    missing = [s for s in specs if not s.startswith(REMOTE_PREFIXES) and not os.path.exists(
        os.path.expanduser(split_pattern(s)[0]))]
    if missing:  # as --allow-add refuses one: a dashboard on nothing is a usage error, said before it starts
        from .sources.local import what_to_give

        base = split_pattern(missing[0])[0]
        err.print("[red]error[/] " + escape(f"no such file or folder: {redact_spec(base)}"
                                            + what_to_give(Path(base), redact_spec(base))), highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)
    shown = "localhost" if address in ("127.0.0.1", "0.0.0.0") else address
    err.print(escape(f"klwatch dashboard on http://{shown}:{port} reading {', '.join(redact_spec(s) for s in specs)} "
                     "(Ctrl+C to stop)"), highlight=False, soft_wrap=True)
    if not is_loopback(address):
        err.print("[yellow]" + escape(network_warning(address=address, port=port, sources=specs, allow_add=allowed)) + "[/]",
                  highlight=False, soft_wrap=True)
        os.environ[PUBLIC_ENV] = "1"  # the app serves data on every interface only with this opt-in
    cmd = streamlit_command(sources=specs, port=port, address=address, allow_add=allowed)
    if os.name == "posix":  # become the server: Ctrl+C and kill reach Streamlit itself, no orphan left behind
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(cmd[0], cmd)
    try:
        code = subprocess.call(cmd)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
