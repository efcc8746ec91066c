"""MLflow tracking servers: a real ``mlflow server`` fed by the real client, and small HTTP stubs
for the faults a real server will not produce on demand (500s, hangs, refused credentials)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import hostile_servers as hs
import pytest

from klwatch.sources import mlflow_server as ms
from klwatch.sources import read_source
from klwatch.sources.limits import ReadLimits
from mlflow_server import MlflowServer, free_port

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def no_tracking_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where credentials go depends on MLFLOW_TRACKING_URI: the tests set it when they mean to."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

T0 = 1_760_000_000_000  # ms
SECRET = "s3cr3t-t0ken-never-printed"


@dataclass
class Logged:
    server: MlflowServer
    ids: dict[str, str]
    exp_ids: dict[str, str]


@pytest.fixture(scope="module")
def logged(mlflow_server: MlflowServer) -> Logged:
    """Runs logged through the server by the real client."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    c = MlflowClient(tracking_uri=mlflow_server.url)
    exp = c.create_experiment("grpo-server")
    other = c.create_experiment("sft-server")
    ids: dict[str, str] = {}

    r = c.create_run(exp, run_name="grpo-7b", start_time=T0)
    rid = ids["resumed"] = r.info.run_id
    c.log_batch(rid, params=[Param("lr", "1e-06"), Param("steps", "15"), Param("fsdp", "false")])
    c.log_batch(rid, metrics=[Metric("train/kl_penalty", 0.01 * s, T0 + 1000 * s, s) for s in range(1, 11)])
    # the same run resumed from its step-5 checkpoint: steps 6..15 are logged again, later
    c.log_batch(rid, metrics=[Metric("train/kl_penalty", 0.0001 * s, T0 + 90_000 + 1000 * s, s)
                              for s in range(6, 16)])
    c.log_batch(rid, metrics=[Metric("loss", float("nan"), T0 + 10, 0), Metric("loss", 1.5, T0 + 20, 1)])
    c.set_terminated(rid, end_time=T0 + 200_000)

    for i, (first, last) in enumerate([(1, 20), (21, 40)]):  # a new tracker run per restart
        part = c.create_run(exp, run_name=f"grpo-1b-part{i}", start_time=T0 + 300_000 * (i + 1),
                            tags={"group": "grpo-1b"})
        ids[f"part{i}"] = part.info.run_id
        c.log_batch(part.info.run_id, metrics=[
            Metric("kl", 0.001 * s, T0 + 300_000 * (i + 1) + s, s) for s in range(first, last + 1)])

    child = c.create_run(exp, run_name="eval-child", tags={"mlflow.parentRunId": rid}, start_time=T0 + 5)
    ids["child"] = child.info.run_id
    c.log_metric(child.info.run_id, "acc", 0.5, timestamp=T0 + 6, step=3)

    sft = c.create_run(other, run_name="sft", start_time=T0 - 1000)
    ids["sft"] = sft.info.run_id
    c.log_batch(sft.info.run_id, metrics=[Metric("loss", 1.0 / s, T0 + s, s) for s in range(1, 200)])

    gone = c.create_run(exp, run_name="deleted")
    c.log_metric(gone.info.run_id, "kl", 1.0, step=0)
    c.delete_run(gone.info.run_id)
    return Logged(server=mlflow_server, ids=ids, exp_ids={"grpo-server": exp, "sft-server": other})


def client_histories(url: str, exp_ids: list[str]) -> dict[tuple[str, str], list[tuple[int, str, int]]]:
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=url)
    out = {}
    for run in c.search_runs(exp_ids):
        for key in run.data.metrics:
            out[(run.info.run_id, key)] = sorted(
                (m.timestamp, "nan" if math.isnan(m.value) else repr(m.value), m.step)
                for m in c.get_metric_history(run.info.run_id, key))
    return out


def our_histories(read) -> dict[tuple[str, str], list[tuple[int, str, int]]]:
    out = {}
    for s in read.segments:
        for key, ser in s.series.items():
            pts = [(int(round(t * 1000)), "nan" if math.isnan(v) else repr(float(v)), int(st))
                   for t, v, st in zip(ser.wall_times, ser.values, ser.steps)]
            assert [p[0] for p in pts] == sorted(p[0] for p in pts), (s.name, key)  # time order
            out[(s.run_id, key)] = sorted(pts)
    return out


def test_server_histories_equal_the_clients_for_every_run(logged: Logged) -> None:
    read = read_source(logged.server.spec)
    assert not read.errors and read.kinds == ["mlflow"]
    assert not any(s.error for s in read.segments)
    expected = client_histories(logged.server.url, list(logged.exp_ids.values()))
    assert our_histories(read) == expected
    assert {s.run_id for s in read.segments} >= {logged.ids[k] for k in ("resumed", "part0", "sft")}
    assert logged.ids["child"] in {s.run_id for s in read.segments}


def test_server_resumed_run_keeps_the_rewind_and_run_metadata(logged: Logged) -> None:
    read = read_source(logged.server.spec + "/grpo-server")
    named = {s.name: s for s in read.segments}
    seg = named["grpo-7b"]
    kl = seg.series["train/kl_penalty"]
    assert kl.steps.tolist() == list(range(1, 11)) + list(range(6, 16))
    assert kl.wall_times[10] == (T0 + 96_000) / 1000.0
    assert math.isnan(seg.series["loss"].values[0])
    assert seg.kind == "mlflow" and seg.ref == seg.run_id == logged.ids["resumed"]
    assert seg.config == {"lr": 1e-06, "steps": 15, "fsdp": False}
    assert seg.start_time == T0 / 1000.0 and seg.meta["status"] == "FINISHED"
    assert seg.store == f"{logged.server.url}#grpo-server" and seg.meta["experiment"] == "grpo-server"
    assert named["grpo-1b-part0"].group == named["grpo-1b-part1"].group == "grpo-1b"
    assert named["eval-child"].group == "grpo-7b"
    assert "deleted" not in named and "sft" not in named


def test_server_experiment_by_name_or_id_reads_only_that_experiment(logged: Logged) -> None:
    by_name = read_source(f"{logged.server.spec}/sft-server")
    by_id = read_source(f"{logged.server.spec}/{logged.exp_ids['sft-server']}")
    plus_http = read_source(f"mlflow+http://127.0.0.1:{logged.server.port}/sft-server")
    for read in (by_name, by_id, plus_http):
        assert not read.errors
        assert [s.run_id for s in read.segments] == [logged.ids["sft"]]
        assert read.segments[0].series["loss"].steps.tolist() == list(range(1, 200))


def test_unknown_experiment_is_an_error_naming_the_server(logged: Logged) -> None:
    read = read_source(f"{logged.server.spec}/no-such-experiment")
    assert not read.segments and len(read.errors) == 1
    assert f"127.0.0.1:{logged.server.port}" in read.errors[0].message
    assert "no-such-experiment" in read.errors[0].message
    # issue 25, 7: and lists the experiments that are there, so the user can name one
    assert "experiments there: " in read.errors[0].message
    assert "grpo-server (" in read.errors[0].message and "sft-server (" in read.errors[0].message


def test_small_pages_and_capped_bulk_answers_still_give_every_run_and_point(
        logged: Logged, monkeypatch) -> None:
    """With tiny pages and a tiny bulk cap the real server pages its run lists and cuts its
    history answers; every run and every point must still arrive."""
    monkeypatch.setattr(ms, "SEARCH_PAGE", 2)
    monkeypatch.setattr(ms, "BULK_MAX_POINTS", 7)
    monkeypatch.setattr(ms, "BULK_PACK_POINTS", 30)
    read = read_source(logged.server.spec)
    assert not read.errors
    assert our_histories(read) == client_histories(logged.server.url, list(logged.exp_ids.values()))


def test_without_the_bulk_route_histories_come_one_by_one(logged: Logged, monkeypatch) -> None:
    monkeypatch.setattr(ms, "BULK_ROUTE", "/ajax-api/2.0/mlflow/metrics/no-such-route")
    read = read_source(logged.server.spec)
    assert not read.errors
    assert our_histories(read) == client_histories(logged.server.url, list(logged.exp_ids.values()))


# -- faults ---------------------------------------------------------------------------------------


@dataclass
class Stub:
    port: int
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    @property
    def spec(self) -> str:
        return f"mlflow://127.0.0.1:{self.port}"


@pytest.fixture
def http_stub() -> Iterator[Callable[[Callable[[BaseHTTPRequestHandler, Stub], None]], Stub]]:
    """``start(answer)`` runs a loopback HTTP server whose handler calls ``answer(handler, stub)``."""
    servers: list[ThreadingHTTPServer] = []
    release = threading.Event()

    def start(answer: Callable[[BaseHTTPRequestHandler, Stub], None]) -> Stub:
        stub = Stub(port=0)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                stub.requests.append((self.command, self.path, dict(self.headers)))
                answer(self, stub)

            do_GET = do_POST = _handle

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        httpd.release = release  # type: ignore[attr-defined]
        stub.port = httpd.server_address[1]
        servers.append(httpd)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return stub

    yield start
    release.set()
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def send_json(h: BaseHTTPRequestHandler, status: int, doc: dict) -> None:
    body = json.dumps(doc).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def test_nothing_listening_is_an_error_in_bounded_time() -> None:
    port = free_port()
    t = time.monotonic()
    read = read_source(f"mlflow://127.0.0.1:{port}")  # default retries and backoff
    assert time.monotonic() - t < 60  # bounded: retries with backoff, never a wait without end
    assert not read.segments and len(read.errors) == 1
    msg = read.errors[0].message
    assert f"127.0.0.1:{port}" in msg and "cannot connect" in msg


def test_server_answering_500_is_retried_a_bounded_number_of_times(http_stub, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0.05")
    stub = http_stub(lambda h, s: send_json(h, 500, {"error_code": "INTERNAL_ERROR", "message": "db gone"}))
    read = read_source(stub.spec)
    assert not read.segments and len(read.errors) == 1
    msg = read.errors[0].message
    assert f"127.0.0.1:{stub.port}" in msg and "HTTP 500" in msg and "db gone" in msg
    assert len(stub.requests) == 3  # the first try and two retries, then it gives up


def test_hanging_server_times_out_with_a_clear_message(http_stub, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")

    def hang(h: BaseHTTPRequestHandler, s: Stub) -> None:
        h.server.release.wait()  # type: ignore[attr-defined]  # until the test is over

    stub = http_stub(hang)
    t = time.monotonic()
    read = read_source(stub.spec)
    assert time.monotonic() - t < 60  # the server never answers: only the 1 s timeout ends the read
    assert not read.segments and len(read.errors) == 1
    msg = read.errors[0].message
    assert f"127.0.0.1:{stub.port}" in msg and "within 1s" in msg
    assert len(stub.requests) == 1  # a hang is not asked again


def _auth_stub(h: BaseHTTPRequestHandler, s: Stub) -> None:
    """401 unless the right bearer token is sent; then an empty but valid tracking server."""
    if h.headers.get("Authorization") != f"Bearer {SECRET}":
        send_json(h, 401, {"error_code": "UNAUTHENTICATED", "message": "bad token"})
    elif "experiments/search" in h.path:
        send_json(h, 200, {"experiments": [{"experiment_id": "0", "name": "Default"}]})
    else:
        send_json(h, 200, {})


def test_wrong_token_is_an_error_that_does_not_print_the_token(http_stub, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET + "-wrong")
    stub = http_stub(_auth_stub)
    read = read_source(stub.spec)
    assert not read.segments and len(read.errors) == 1
    msg = read.errors[0].message
    assert "401" in msg and f"127.0.0.1:{stub.port}" in msg and "refused" in msg
    assert SECRET not in msg
    assert len(stub.requests) == 1  # wrong credentials are not retried


def test_right_token_is_sent_as_a_bearer_header(http_stub, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    stub = http_stub(_auth_stub)
    read = read_source(stub.spec)
    assert not read.errors and read.segments == [] and read.kinds == ["mlflow"]
    assert all(hdr.get("Authorization") == f"Bearer {SECRET}" for _, _, hdr in stub.requests)


def test_username_and_password_are_sent_as_basic_auth(http_stub, monkeypatch) -> None:
    import base64

    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    stub = http_stub(lambda h, s: send_json(h, 403, {"error_code": "PERMISSION_DENIED", "message": "no"}))
    read = read_source(stub.spec)
    assert len(read.errors) == 1 and "403" in read.errors[0].message
    assert SECRET not in read.errors[0].message
    expected = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
    assert stub.requests[0][2].get("Authorization") == expected


def test_an_http_server_that_is_not_mlflow_is_an_error(http_stub) -> None:
    def html(h: BaseHTTPRequestHandler, s: Stub) -> None:
        body = b"<html>hello</html>"
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    stub = http_stub(html)
    read = read_source(stub.spec)
    assert len(read.errors) == 1 and "not JSON" in read.errors[0].message


@pytest.mark.parametrize("spec, base, exp", [
    ("mlflow://host:5000", "http://host:5000", None),
    ("mlflow://host:5000/my%20exp", "http://host:5000", "my exp"),
    ("mlflow+https://mlflow.example.com/12", "https://mlflow.example.com", "12"),
    ("mlflow+http://10.0.0.1:80/a/b", "http://10.0.0.1:80", "a/b"),
])
def test_server_address_forms(spec: str, base: str, exp: str | None) -> None:
    parsed = ms.parse_spec(spec)
    assert (parsed.base_url, parsed.experiment) == (base, exp)


def test_credentials_in_the_address_never_reach_the_report(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    port = free_port()
    read = read_source(f"mlflow://bob:{SECRET}@127.0.0.1:{port}")
    assert read.errors and all(SECRET not in e.message and SECRET not in e.spec for e in read.errors)
    assert SECRET not in read.spec


# -- hostile servers (issue 12): bounded time and bytes per SOURCE, a clear error naming the server --


def bounded_read(spec: str, **limits: float) -> tuple[object, float, int]:
    """read_source within ``limits``: (the read, seconds it took, peak bytes Python allocated)."""
    import tracemalloc

    tracemalloc.start()
    t = time.monotonic()
    try:
        read = read_source(spec, limits=ReadLimits(**limits))
        return read, time.monotonic() - t, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def one_error(read) -> str:
    messages = [e.message for e in read.errors] + [s.error for s in read.segments if s.error]
    assert len(messages) == 1, messages
    return messages[0]


@pytest.fixture
def patient_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-read timeouts far beyond the test: only the SOURCE's bounds may end a hostile read."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "600")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0.05")


def test_search_whose_page_token_never_advances_stops_naming_server_and_endpoint(patient_client) -> None:
    with hs.HostileServer(hs.mlflow_routes(**{hs.RUNS: hs.same_token_answer(hs.ONE_RUN)})) as server:
        read, took, _ = bounded_read(server.spec, max_seconds=60)
    msg = one_error(read)
    assert f"mlflow server http://127.0.0.1:{server.port}: pagination of {hs.RUNS} does not advance" in msg
    assert "repeats a next_page_token" in msg
    assert server.count(hs.RUNS) == 2 and took < 30


def test_search_whose_pages_bring_only_new_tokens_stops(patient_client) -> None:
    answer = hs.fresh_token_answer({"experiments": []})
    with hs.HostileServer(hs.mlflow_routes(**{hs.EXPERIMENTS: answer})) as server:
        read, took, _ = bounded_read(server.spec, max_seconds=60)
    msg = one_error(read)
    assert f"127.0.0.1:{server.port}" in msg and f"pagination of {hs.EXPERIMENTS} does not advance" in msg
    assert server.count(hs.EXPERIMENTS) == ms.MAX_EMPTY_PAGES and took < 30


def test_history_whose_page_token_never_advances_costs_that_run_naming_server_and_endpoint(patient_client) -> None:
    """As MLflow #23916 answers get-history without max_results: no metrics, the same token forever."""
    loop = hs.same_token_answer({"metrics": []})
    with hs.HostileServer(hs.mlflow_routes(**{hs.HISTORY: loop})) as server:
        read, took, _ = bounded_read(server.spec, max_seconds=60)
    msg = one_error(read)
    assert msg.startswith("r1: could not read its metric history: ")
    assert f"mlflow server http://127.0.0.1:{server.port}: pagination of {hs.HISTORY} does not advance" in msg
    assert "run r1 key 'kl'" in msg
    assert server.count(hs.HISTORY) == 2 and took < 30
    assert all("max_results=25000" in r.path for r in server.requests if r.route == hs.HISTORY)


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "status-line"])
def test_trickling_server_is_cut_off_at_the_source_deadline(patient_client, headers_too: bool) -> None:
    answer = hs.trickle_answer(2.0, headers_too=headers_too)  # a byte every 2 s: no read ever times out
    with hs.HostileServer(hs.mlflow_routes(**{hs.EXPERIMENTS: answer})) as server:
        read, took, _ = bounded_read(f"mlflow://bob:{SECRET}@127.0.0.1:{server.port}", max_seconds=3)
    msg = one_error(read)
    assert "took longer than 3 s" in msg and "--max-read-seconds" in msg
    assert f"http://127.0.0.1:{server.port} {hs.EXPERIMENTS}" in msg
    assert SECRET not in msg and SECRET not in read.spec
    assert 2.5 < took < 30


def test_server_that_never_answers_is_cut_off_at_the_source_deadline(patient_client) -> None:
    with hs.HostileServer(hs.mlflow_routes(**{hs.EXPERIMENTS: hs.silent_answer()})) as server:
        read, took, _ = bounded_read(server.spec, max_seconds=2)
    msg = one_error(read)
    assert "took longer than 2 s" in msg and f"127.0.0.1:{server.port}" in msg
    assert took < 30 and server.count(hs.EXPERIMENTS) == 1


def test_endless_body_stops_at_the_byte_bound_in_bounded_memory(patient_client) -> None:
    with hs.HostileServer(hs.mlflow_routes(**{hs.EXPERIMENTS: hs.endless_answer()})) as server:
        read, took, peak = bounded_read(server.spec, max_bytes=4_000_000, max_seconds=60)
    msg = one_error(read)
    assert "needs more than 4,000,000 bytes" in msg and "--max-read-bytes" in msg
    assert f"http://127.0.0.1:{server.port} {hs.EXPERIMENTS}" in msg
    assert took < 30 and peak < 64_000_000  # the body is dropped at the bound, not kept growing


@pytest.mark.parametrize("kind", ["bytes", "deep"])
def test_garbage_json_is_an_error_naming_the_server(patient_client, kind: str) -> None:
    with hs.HostileServer(hs.mlflow_routes(**{hs.EXPERIMENTS: hs.garbage_answer(kind)})) as server:
        read, took, _ = bounded_read(server.spec, max_seconds=60)
    msg = one_error(read)
    assert msg == (f"mlflow server http://127.0.0.1:{server.port}: answered {hs.EXPERIMENTS} with something "
                   "that is not JSON (is this an MLflow tracking server?)")
    assert took < 30


def test_content_length_beyond_the_byte_bound_is_refused_unread(patient_client) -> None:
    with hs.HostileServer(hs.mlflow_routes(**{hs.EXPERIMENTS: hs.short_body_answer(10 ** 12)})) as server:
        read, took, peak = bounded_read(server.spec, max_bytes=1_000_000, max_seconds=60)
    msg = one_error(read)
    assert "the server announces a body of 1,000,000,000,000 bytes" in msg and "--max-read-bytes" in msg
    assert f"127.0.0.1:{server.port}" in msg and took < 30 and peak < 64_000_000


def test_huge_content_length_with_a_short_body_is_an_error_naming_the_server(patient_client) -> None:
    with hs.HostileServer(hs.mlflow_routes(**{hs.EXPERIMENTS: hs.short_body_answer(10 ** 9)})) as server:
        read, took, peak = bounded_read(server.spec, max_seconds=60)
    msg = one_error(read)
    assert msg.startswith(f"mlflow server http://127.0.0.1:{server.port}: the answer to {hs.EXPERIMENTS} "
                          "broke off before the 1,000,000,000 bytes it announced")
    assert "gave up after 2 attempts" in msg and server.count(hs.EXPERIMENTS) == 2
    assert took < 30 and peak < 64_000_000


# -- credentials go only where they were configured for (issue 13) ---------------------------------


def _auth_headers(server: hs.HostileServer) -> list[str | None]:
    return [r.headers.get("authorization") for r in server.requests]


def test_the_environments_token_goes_only_to_the_tracking_uris_server(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    with hs.HostileServer(hs.mlflow_routes()) as recorder:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example.com")
        elsewhere = read_source(recorder.spec)
        sent_elsewhere = _auth_headers(recorder)
        recorder.requests.clear()
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{recorder.port}/")
        configured = read_source(recorder.spec)
    assert sent_elsewhere and sent_elsewhere == [None] * len(sent_elsewhere)
    assert not elsewhere.errors and len(elsewhere.segments) == 1  # read, without the credentials
    [warning] = elsewhere.warnings
    assert warning == (f"credentials withheld from mlflow server http://127.0.0.1:{recorder.port}: "
                       "MLFLOW_TRACKING_TOKEN is configured for another host, https://mlflow.example.com:443 "
                       "(MLFLOW_TRACKING_URI)")
    assert _auth_headers(recorder) == [f"Bearer {SECRET}"] * len(recorder.requests)
    assert not configured.warnings and not configured.errors


@pytest.mark.parametrize("uri", ["http://localhost:{port}", "https://127.0.0.1:{port}", "http://127.0.0.1:1",
                                 "databricks", "sqlite:///mlflow.db"])
def test_basic_auth_from_the_environment_is_withheld_from_any_other_server(monkeypatch, uri: str) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    with hs.HostileServer(hs.mlflow_routes()) as recorder:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(port=recorder.port))
        read = read_source(recorder.spec)
    assert recorder.requests and _auth_headers(recorder) == [None] * len(recorder.requests)
    [warning] = read.warnings
    assert "withheld" in warning and "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD" in warning
    assert SECRET not in warning and "mlflow.db" not in warning


def test_credentials_in_the_address_go_to_that_server_whatever_the_tracking_uri(monkeypatch) -> None:
    import base64

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example.com")
    with hs.HostileServer(hs.mlflow_routes()) as recorder:
        read = read_source(f"mlflow://bob:{SECRET}@127.0.0.1:{recorder.port}")
    expected = "Basic " + base64.b64encode(f"bob:{SECRET}".encode()).decode()
    assert not read.errors and not read.warnings  # nothing from the environment to withhold
    assert _auth_headers(recorder) == [expected] * len(recorder.requests)


@pytest.mark.parametrize("how", ["userinfo", "env token"])
def test_a_redirect_is_never_followed_so_credentials_stay_with_the_server_given(monkeypatch, how: str) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    if how == "env token":
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    with hs.HostileServer(hs.mlflow_routes()) as recorder:
        target = f"http://localhost:{recorder.port}{hs.EXPERIMENTS}?token=abc"
        with hs.HostileServer(hs.redirect_answer(target, status=307)) as redirector:
            spec = redirector.spec if how == "env token" else f"mlflow://bob:{SECRET}@127.0.0.1:{redirector.port}"
            read = read_source(spec)
    assert recorder.requests == [] and len(redirector.requests) == 1  # asked once, never followed
    msg = one_error(read)
    assert msg == (f"mlflow server http://127.0.0.1:{redirector.port}: answered {hs.EXPERIMENTS} with HTTP 307, "
                   f"a redirect to http://localhost:{recorder.port}{hs.EXPERIMENTS}?***; not followed (requests and "
                   "credentials go only to the server given: give the address it redirects to)")
    assert SECRET not in msg


def test_a_server_echoing_the_credentials_it_was_sent_does_not_get_them_into_a_message(monkeypatch) -> None:
    import base64

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    with hs.HostileServer(hs.echo_headers_answer(500)) as echo:
        by_token = one_error(read_source(echo.spec))
        by_password = one_error(read_source(f"mlflow://bob:{SECRET}@127.0.0.1:{echo.port}"))
    assert "Bearer ***" in by_token and "Basic ***" in by_password  # the server did echo them
    basic = base64.b64encode(f"bob:{SECRET}".encode()).decode()
    assert all(SECRET not in m and basic not in m for m in (by_token, by_password))
