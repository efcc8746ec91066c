"""Shared pytest fixtures (keep generic: one fixture per shared real component)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from mlflow_server import MlflowServer, launch_mlflow_server, start_mlflow_server
from webhook_receiver import Receiver

_background: dict[str, MlflowServer] = {}

# Property tests judge behaviour, not speed: no per-example deadline and no "too slow" health check,
# which a busy machine would trip. In CI the examples are derandomized, so a run is repeatable.
settings.register_profile("klwatch", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("klwatch-ci", parent=settings.get_profile("klwatch"), derandomize=True, database=None)
settings.load_profile("klwatch-ci" if os.environ.get("CI") else "klwatch")


@pytest.fixture(autouse=True)
def private_scan_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own, empty scan cache (``KLWATCH_CACHE_DIR``, inherited by the klwatch processes it
    starts): a test never writes the user's cache, nor sees what another test's scans left there."""
    folder = tmp_path_factory.mktemp("scan-cache")
    monkeypatch.setenv("KLWATCH_CACHE_DIR", str(folder))
    return folder


def pytest_collection_finish(session: pytest.Session) -> None:
    """Boot the mlflow server in the background as soon as we know a selected test needs it:
    its ~10 s start then overlaps the tests that run before."""
    if any("mlflow_server" in getattr(item, "fixturenames", ()) for item in session.items):
        workdir = Path(tempfile.mkdtemp(prefix="klwatch-test-mlflow-server-"))
        _background["mlflow"] = launch_mlflow_server(workdir=workdir)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    server = _background.pop("mlflow", None)
    if server is not None:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One real ``mlflow server`` (SQLite backend, free loopback port) for the whole session."""
    server = _background.get("mlflow")
    if server is not None and server.wait_ready(timeout=90):
        yield server  # stopped in pytest_sessionfinish
        return
    if server is not None:
        server.stop()
    server = start_mlflow_server(workdir=tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on 127.0.0.1 that records every POST (``Receiver(fail_first=n)`` for retries)."""
    r = Receiver().start()
    yield r
    r.stop()
