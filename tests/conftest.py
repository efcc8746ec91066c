"""Shared pytest fixtures (keep generic: one fixture per shared real component)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mlflow_server import MlflowServer, start_mlflow_server


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One real ``mlflow server`` (SQLite backend, free loopback port) for the whole session."""
    server = start_mlflow_server(workdir=tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server
    finally:
        server.stop()
