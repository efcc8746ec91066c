"""``wandb://`` sources through the real ``wandb.Api`` against a local stub of the W&B server.

The stub (tests/wandb_stub.py) answers the GraphQL operations and file downloads the installed
client really sends; nothing in the client is mocked. Faults (HTTP 500, a hang, a rejected key,
nothing listening) must come back as clear errors within bounded time.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from wandb_stub import StubRun, WandbStub

from klwatch.sources import read_source
from klwatch.sources.limits import ReadLimits
from klwatch.sources.wandb_api import read_wandb_api

pytestmark = pytest.mark.server

KEY = "k" * 40


def _rows(n: int, *, offset: int = 0) -> list[dict]:
    return [{"_step": s, "_runtime": 0.5 * s, "_timestamp": 1.76e9 + 2.0 * s,
             "train/kl_penalty": 0.01 + math.sin(s / 50) * 1e-3, "train": {"reward": s / 10},
             "note": "text", "done": False} for s in range(offset, offset + n)]


def _runs() -> dict[tuple[str, str], list[StubRun]]:
    return {("team", "rl"): [
        StubRun(id="r1", name="grpo-7b", rows=_rows(1200), config={"lr": 1e-6, "model": {"size": 7}},
                group="grpo-7b", job_type="train", tags=["grpo"], state="finished",
                created_at="2026-01-02T03:04:05", summary={"train/kl_penalty": 0.5}, exported_rows=700),
        StubRun(id="r2", name="grpo-7b", rows=_rows(30, offset=1200), group="grpo-7b", state="running"),
        StubRun(id="r3", name="broken", rows=_rows(5), broken=True),
    ]}


@pytest.fixture(scope="module", autouse=True)
def wandb_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep the client's cache and settings in the test's folder, before wandb-core starts."""
    root = tmp_path_factory.mktemp("wandb-api")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_CACHE_DIR", str(root / "cache"))
        mp.setenv("WANDB_CONFIG_DIR", str(root / "config"))
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("KLWATCH_WANDB_TIMEOUT", "20")
        mp.setenv("KLWATCH_WANDB_RETRIES", "1")
        yield


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[WandbStub]:
    with WandbStub(runs=_runs()) as server:
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        monkeypatch.setenv("WANDB_API_KEY", KEY)
        yield server


def _faulty(monkeypatch: pytest.MonkeyPatch, fault: str) -> WandbStub:
    monkeypatch.setenv("KLWATCH_WANDB_TIMEOUT", "1")
    server = WandbStub(runs=_runs(), fault=fault).__enter__()
    monkeypatch.setenv("WANDB_BASE_URL", server.url)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    return server


def test_full_history_and_metadata_of_every_run(stub: WandbStub) -> None:
    out = read_wandb_api("wandb://team/rl")
    assert out.errors == [] and out.kinds == ["wandb-api"]
    by_ref = {s.ref: s for s in out.segments}
    assert sorted(by_ref) == ["r1", "r2", "r3"]
    seg = by_ref["r1"]
    assert seg.error is None
    assert (seg.kind, seg.run_id, seg.name, seg.group, seg.store) == (
        "wandb-api", "r1", "grpo-7b", "grpo-7b", "wandb://team/rl")
    rows = _rows(1200)
    kl = seg.series["train/kl_penalty"]
    assert kl.steps.tolist() == list(range(1200))  # every row: more than the 500 history() samples
    assert kl.values.tolist() == [r["train/kl_penalty"] for r in rows]
    assert kl.wall_times.tolist() == [r["_timestamp"] for r in rows]
    assert seg.series["train.reward"].values.tolist() == [r["train"]["reward"] for r in rows]
    assert seg.series["_runtime"].values.tolist() == [r["_runtime"] for r in rows]
    assert "note" not in seg.series and "done" not in seg.series
    assert seg.config == {"lr": 1e-6, "model": {"size": 7}}
    assert seg.tags == {"grpo": ""}
    assert seg.start_time == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc).timestamp()
    assert seg.meta["state"] == "finished" and seg.meta["summary"] == {"train/kl_penalty": 0.5}
    assert by_ref["r2"].series["train/kl_penalty"].steps.tolist() == list(range(1200, 1230))
    assert by_ref["r2"].meta["state"] == "running"
    # the exported part came from the parquet export, the rest page by page; nothing sampled
    assert "GET history.parquet" in stub.operations and "HistoryPage" in stub.operations
    assert not {"RunSampledHistory", "RunFullHistory"} & set(stub.operations)
    assert stub.unknown == []


def test_a_run_that_cannot_be_read_is_an_error_segment_naming_it(stub: WandbStub) -> None:
    out = read_wandb_api("wandb://team/rl")
    [bad] = [s for s in out.segments if s.ref == "r3"]
    assert bad.error is not None and "r3" in bad.error and "broken" in bad.error and "HTTP 500" in bad.error
    assert bad.series == {}
    assert all(s.error is None for s in out.segments if s.ref != "r3")


def test_run_id_selects_one_run(stub: WandbStub) -> None:
    out = read_source("wandb://team/rl/r2")
    assert out.errors == []
    [seg] = out.segments
    assert seg.ref == "r2" and len(seg.series["train/kl_penalty"]) == 30
    assert "Runs" not in stub.operations


def test_unknown_project_run_and_bad_spec_are_errors(stub: WandbStub) -> None:
    [err] = read_wandb_api("wandb://team/nope").errors
    assert "team/nope" in err.message and "not found" in err.message
    [err] = read_wandb_api("wandb://team/rl/zzz").errors
    assert "team/rl/zzz" in err.message and "not found" in err.message
    [err] = read_wandb_api("wandb://team").errors
    assert "wandb://ENTITY/PROJECT" in err.message


@pytest.mark.parametrize(("fault", "says"), [
    ("500", "answered HTTP 500"),
    ("hang", "did not answer within 1 s"),
    ("401", "rejected the credentials"),
])
def test_server_faults_are_clear_errors_in_bounded_time(monkeypatch: pytest.MonkeyPatch, fault: str,
                                                        says: str) -> None:
    server = _faulty(monkeypatch, fault)
    try:
        start = time.monotonic()
        out = read_wandb_api("wandb://team/rl")
        elapsed = time.monotonic() - start
    finally:
        server.stop()
    assert out.segments == []
    [err] = out.errors
    assert says in err.message and server.url in err.message
    assert elapsed < 60  # the stub never answers: only klwatch's bounds end the read


def test_history_download_that_hangs_fails_that_run_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _faulty(monkeypatch, "hang_history")
    try:
        start = time.monotonic()
        out = read_wandb_api("wandb://team/rl/r1")
        elapsed = time.monotonic() - start
    finally:
        server.stop()
    assert out.errors == []
    [seg] = out.segments
    assert seg.error is not None and "r1" in seg.error and "did not answer" in seg.error
    assert elapsed < 60  # the stub never answers: only klwatch's bounds end the read


def _unreachable(monkeypatch: pytest.MonkeyPatch, userinfo: str = "") -> int:
    """WANDB_BASE_URL naming a loopback port nothing listens on (``userinfo`` ends in ``@``); the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("KLWATCH_WANDB_TIMEOUT", "2")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://{userinfo}127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    return port


def test_unreachable_server_and_missing_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    port = _unreachable(monkeypatch)
    [err] = read_wandb_api("wandb://team/rl").errors
    assert "cannot reach W&B server" in err.message and str(port) in err.message
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    [err] = read_wandb_api("wandb://team/rl").errors
    assert "WANDB_API_KEY" in err.message and "no W&B credentials" in err.message
    assert os.environ.get("WANDB_API_KEY") is None


def test_watchdog_gives_up_when_the_clients_own_timeouts_are_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's own (long) wandb timeouts are left alone; the watchdog still bounds the scan."""
    from wandb.sdk import wandb_setup

    settings = wandb_setup.singleton().settings
    monkeypatch.setattr(settings, "x_graphql_timeout_seconds", 600.0)
    monkeypatch.setattr(settings, "x_file_transfer_timeout_seconds", 600.0)
    server = _faulty(monkeypatch, "hang_history")
    try:
        start = time.monotonic()
        out = read_wandb_api("wandb://team/rl/r1")
        elapsed = time.monotonic() - start
    finally:
        server.stop()
    [err] = out.errors
    assert "stopped answering while reading run r1" in err.message and server.url in err.message
    assert elapsed < 60  # the stub never answers: only klwatch's bounds end the read


# -- the SOURCE's bounds (issue 12) ---------------------------------------------------------------


def _endless_runs() -> dict[tuple[str, str], list[StubRun]]:
    return {("team", "rl"): [StubRun(id="e1", name="endless", rows=[{"_step": 0, "train/kl": 0.1}], endless=True)]}


def _bounded(monkeypatch: pytest.MonkeyPatch, server: WandbStub, **limits: float) -> tuple[object, float, int]:
    """read_source of the stub within ``limits``, the client's own timeouts far beyond the test:
    (the read, seconds it took, peak bytes Python allocated)."""
    import tracemalloc

    monkeypatch.setenv("KLWATCH_WANDB_TIMEOUT", "600")
    monkeypatch.setenv("WANDB_BASE_URL", server.url)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    tracemalloc.start()
    start = time.monotonic()
    try:
        out = read_source("wandb://team/rl", limits=ReadLimits(**limits))
        return out, time.monotonic() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_server_that_never_answers_is_cut_off_at_the_source_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    with WandbStub(runs=_runs(), fault="hang") as server:
        out, elapsed, _ = _bounded(monkeypatch, server, max_seconds=3)
    [err] = out.errors
    assert server.url in err.message and "took longer than 3 s" in err.message and "--max-read-seconds" in err.message
    assert out.segments == [] and 2.5 < elapsed < 60


def test_endless_history_stops_at_the_byte_bound_in_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    with WandbStub(runs=_endless_runs()) as server:
        out, elapsed, peak = _bounded(monkeypatch, server, max_bytes=5_000_000, max_seconds=120)
    [err] = out.errors
    assert server.url in err.message and "needs more than 5,000,000 bytes" in err.message
    assert "run e1" in err.message and "--max-read-bytes" in err.message
    assert elapsed < 60 and peak < 200_000_000


def test_endless_history_is_cut_off_at_the_source_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    with WandbStub(runs=_endless_runs()) as server:
        out, elapsed, _ = _bounded(monkeypatch, server, max_seconds=3)
    [err] = out.errors
    assert server.url in err.message and "took longer than 3 s" in err.message
    assert 2.5 < elapsed < 60


def test_the_password_in_wandb_base_url_is_never_in_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server may be given with ``user:password@`` in WANDB_BASE_URL: messages name it without them."""
    port = _unreachable(monkeypatch, "bob:hunter2-planted@")
    [err] = read_wandb_api("wandb://team/rl").errors
    assert err.message.startswith(f"cannot reach W&B server http://***@127.0.0.1:{port}")
    assert "hunter2-planted" not in err.message and KEY not in err.message


@pytest.mark.parametrize("status", [302, 307])
def test_a_redirect_to_another_origin_is_refused_and_nothing_reaches_it(monkeypatch: pytest.MonkeyPatch,
                                                                       status: int) -> None:
    """The W&B client follows redirects: a server answering /graphql with one to another host would have it
    send its requests (the key among them) there. Refused before the client is made, naming where it pointed."""
    import hostile_servers as hs

    with hs.HostileServer(lambda req, conn, stop: hs.send_json(conn, 200, {"data": {}})) as elsewhere, \
            hs.HostileServer(hs.redirect_answer(f"http://127.0.0.1:{elsewhere.port}/graphql?k=v", status)) as server:
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.port}")
        monkeypatch.setenv("WANDB_API_KEY", KEY)
        monkeypatch.setenv("KLWATCH_WANDB_TIMEOUT", "2")
        read = read_source("wandb://team/grpo")
    assert not elsewhere.requests, [(r.method, r.path) for r in elsewhere.requests]
    [error] = read.errors
    assert f"HTTP {status}, a redirect to http://127.0.0.1:{elsewhere.port}/graphql?***; not followed" in error.message
    assert KEY not in error.message and all("authorization" not in r.headers for r in server.requests)
