"""``klwatch dashboard``: the Streamlit invocation it execs (the browser test runs it for real)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from typer.testing import CliRunner

from klwatch import dashboard_cli
from klwatch.cli import app

REPO = Path(__file__).resolve().parents[2]


def test_the_command_runs_the_dashboard_app_headless_without_usage_stats() -> None:
    cmd = dashboard_cli.streamlit_command(sources=["runs/", "wandb://team/rl#grpo-*"], port=8765, address="127.0.0.1")
    assert cmd[:5] == [sys.executable, "-P", "-m", "streamlit", "run"]  # -P: the working directory never shadows
    assert Path(cmd[5]) == REPO / "dashboard" / "app.py" and Path(cmd[5]).is_file()
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


def test_the_allow_list_goes_to_the_app_before_the_sources() -> None:
    cmd = dashboard_cli.streamlit_command(sources=["runs/"], port=8765, address="127.0.0.1",
                                          allow_add=["/data/team", "mlflow://tracking:5000"])
    assert cmd[cmd.index("--") + 1:] == ["--allow-add", "/data/team", "--allow-add", "mlflow://tracking:5000", "runs/"]


def _launch(monkeypatch, args: list[str]) -> tuple[object, list[list[str]]]:
    """Run ``klwatch dashboard ARGS`` up to the point where it would become the Streamlit server."""
    execs: list[list[str]] = []

    def fake_execv(path: str, argv: list[str]) -> None:
        execs.append(list(argv))
        raise SystemExit(0)

    monkeypatch.setattr(dashboard_cli.os, "execv", fake_execv)
    monkeypatch.setenv("KLWATCH_DASHBOARD_PUBLIC", "0")  # recorded, so the variable is restored afterwards
    monkeypatch.delenv("KLWATCH_DASHBOARD_PUBLIC")
    return CliRunner().invoke(app, ["dashboard", *args]), execs


def test_listening_on_the_network_is_warned_about_and_opted_in(monkeypatch, tmp_path: Path) -> None:
    secret = "mlflow://alice:Pl4nted-Passw0rd@tracking:5000"
    result, execs = _launch(monkeypatch, ["--address", "0.0.0.0", str(tmp_path), secret])
    assert result.exit_code == 0, result.output
    assert "reachable from the network" in result.stderr and "A link can choose among these sources" in result.stderr
    assert "Pl4nted-Passw0rd" not in result.output + result.stderr and "mlflow://***@tracking:5000" in result.stderr
    assert "--server.address=0.0.0.0" in execs[0] and os.environ.get("KLWATCH_DASHBOARD_PUBLIC") == "1"
    assert execs[0][-1] == secret  # the app itself is given the source as the operator wrote it


def test_by_default_it_listens_on_this_machine_only_without_a_warning(monkeypatch, tmp_path: Path) -> None:
    result, execs = _launch(monkeypatch, [str(tmp_path)])
    assert result.exit_code == 0 and "reachable from the network" not in result.stderr
    assert "--server.address=127.0.0.1" in execs[0] and "KLWATCH_DASHBOARD_PUBLIC" not in os.environ


def test_an_allow_list_entry_that_is_not_a_folder_or_host_is_a_usage_error(monkeypatch, tmp_path: Path) -> None:
    result, execs = _launch(monkeypatch, ["--allow-add", str(tmp_path / "missing"), str(tmp_path)])
    assert result.exit_code == 2 and "not a folder" in result.stderr and not execs
    result, execs = _launch(monkeypatch, ["--allow-add", str(tmp_path), str(tmp_path)])
    assert result.exit_code == 0 and execs[0][execs[0].index("--") + 1:] == ["--allow-add", str(tmp_path), str(tmp_path)]


def test_a_source_that_does_not_exist_is_a_usage_error_before_streamlit_starts(monkeypatch, tmp_path: Path) -> None:
    """Issue 25, 7: the dashboard started on a path that is not there (``--allow-add`` refused one already)."""
    result, execs = _launch(monkeypatch, [str(tmp_path / "no-such-runs")])
    assert result.exit_code == 2 and not execs
    assert f"no such file or folder: {tmp_path / 'no-such-runs'}" in " ".join(result.stderr.split())
    result, execs = _launch(monkeypatch, ["http://localhost:5000"])
    assert result.exit_code == 2 and not execs and "give mlflow://HOST:PORT" in " ".join(result.stderr.split())
    result, execs = _launch(monkeypatch, [str(tmp_path), "mlflow://127.0.0.1:1"])  # a server is not checked here
    assert result.exit_code == 0 and execs
