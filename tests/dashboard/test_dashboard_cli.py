"""``klwatch dashboard``: the Streamlit invocation it execs (the browser test runs it for real)."""

from __future__ import annotations

import sys
from pathlib import Path

from typer.testing import CliRunner

from klwatch import dashboard_cli
from klwatch.cli import app

REPO = Path(__file__).resolve().parents[2]


def test_the_command_runs_the_dashboard_app_headless_without_usage_stats() -> None:
    cmd = dashboard_cli.streamlit_command(sources=["runs/", "wandb://team/rl#grpo-*"], port=8765, address="127.0.0.1")
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert Path(cmd[4]) == REPO / "dashboard" / "app.py" and Path(cmd[4]).is_file()
    assert "--server.headless=true" in cmd and "--browser.gatherUsageStats=false" in cmd
    assert "--server.port=8765" in cmd and "--server.address=127.0.0.1" in cmd
    assert cmd[cmd.index("--") + 1:] == ["runs/", "wandb://team/rl#grpo-*"]  # the app's own arguments


def test_without_sources_it_opens_the_repository_sample_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # not from the working directory: from beside the dashboard package
    assert dashboard_cli.default_sources() == [str(REPO / "sample_runs")]


def test_dashboard_is_a_klwatch_command() -> None:
    result = CliRunner().invoke(app, ["dashboard", "--help"])
    assert result.exit_code == 0
    assert "--port" in result.output and "sample_runs" in result.output
