"""An attacker with nothing but a link, in a real headless Chromium (issue 13).

`klwatch dashboard` serves a TensorBoard fleet, an MLflow store whose run name, experiment name and
param are markdown and HTML pointing at a trap server, and an MLflow server given with a password
(unreachable); MLflow and W&B credentials are in its environment. Hostile links then name other
folders, ``/etc``, an MLflow server on loopback (a recorder), and markdown/HTML payloads. Every page
they open must read nothing outside the launch sources, make the browser fetch nothing from anywhere
but the app, show no planted secret, and the recorder must never be contacted.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import pytest

from chromium import ARGS, CHROMIUM, WAIT_MS, needs_chromium, settled
from dashboard_runs import write_fleet, write_mlflow_store, write_run
from dashboard_server import free_port, running_dashboard
from klwatch.dashboard.safety import WORD_JOINER
from klwatch.pipeline import scan

pytestmark = needs_chromium

PASSWORD = "Pl4nted-Passw0rd-7731"
SECRETS = {"MLFLOW_TRACKING_TOKEN": "Pl4nted-Token-7731", "MLFLOW_TRACKING_PASSWORD": "Pl4nted-Pw-Env-7731",
           "WANDB_API_KEY": "Pl4nted-Wandb-Key-7731"}
PRIVATE_RUN = "private-run-0xDEADBEEF"


class Recorder:
    """A loopback HTTP server that records every connection and request made to it: the attacker's
    image host, or an MLflow server a link names."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.requests.append((self.command, self.path, dict(self.headers)))
                self.send_response(404)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request: object, client_address: object) -> bool:
                recorder.connections += 1
                return True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trap() -> Iterator[Recorder]:
    with Recorder() as r:
        yield r


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with Recorder() as r:
        yield r


def _page_requests(page, origin: str) -> tuple[list[str], list[str]]:
    """Start recording every request and websocket the page opens; (requests, sockets) fill as it runs."""
    requests: list[str] = []
    sockets: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("websocket", lambda ws: sockets.append(ws.url))
    return requests, sockets


def _load(page, url: str) -> None:
    """Open ``url`` and wait until the run view has drawn its chart and the script run is over."""
    page.goto(url, timeout=WAIT_MS)
    page.locator(".st-key-run_view h2").wait_for(timeout=WAIT_MS)
    page.locator(".st-key-run_chart .js-plotly-plot").wait_for(timeout=WAIT_MS)
    settled(page)


def _assert_nothing_leaked_or_fetched(page, origin: str, requests: list[str], sockets: list[str]) -> None:
    html = page.content()
    for secret in [PASSWORD, *SECRETS.values()]:
        assert secret not in html, secret
    assert "alice" not in html and PRIVATE_RUN not in html and "root:x:0:0" not in html
    own = (origin, "data:", "blob:", "about:")
    assert [u for u in requests if not u.startswith(own)] == []
    ws_origin = origin.replace("http://", "ws://", 1)
    assert sockets and all(u.startswith(ws_origin) for u in sockets), sockets
    srcs = page.eval_on_selector_all("img, image, iframe, video, audio, source, link[href]",
                                     "els => els.map(e => e.src || e.href?.baseVal || e.href || '')")
    assert [s for s in srcs if s and not s.startswith(own)] == []
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    assert [h for h in hrefs if not h.startswith(origin)] == []


def test_hostile_links_read_nothing_fetch_nothing_and_leak_nothing(tmp_path: Path, trap: Recorder,
                                                                    recorder: Recorder) -> None:
    from playwright.sync_api import sync_playwright

    name = f"![x]({trap.url}/name.png) <img src={trap.url}/name-img.png> [click](javascript:alert(1)) :red[x]"
    store = write_mlflow_store(tmp_path / "ml", run_name=name, experiment=f"<img src={trap.url}/exp.png>",
                               param=f"![p]({trap.url}/param.png)")
    fleet = write_fleet(tmp_path / "tb")
    private = tmp_path / "private"
    write_run(private, name=PRIVATE_RUN, resumes=[41], buggy=True, steps=80, extra=False)
    secret_source = f"mlflow://alice:{PASSWORD}@127.0.0.1:{free_port()}"  # nothing listens there
    (key,) = [r.lineage.id for r in scan([str(store)]).results]
    links = [
        {"src": ["/etc", str(private), f"mlflow://127.0.0.1:{recorder.url.rsplit(':', 1)[1]}",
                 f"![x]({trap.url}/src.png)", f"<img src={trap.url}/src-img.png>", "[l](javascript:alert(1))",
                 f"{private}#*", "/etc/passwd"], "run": key},
        {"src": str(private), "run": key},
        {"src": f"mlflow://127.0.0.1:{recorder.url.rsplit(':', 1)[1]}/0", "run": f"<img src={trap.url}/run.png>"},
    ]
    env = {**os.environ, **SECRETS}
    env.pop("KLWATCH_DASHBOARD_ALLOW_ADD", None)
    sources = [str(fleet), str(store), secret_source]
    with running_dashboard(sources, log=tmp_path / "dashboard.log", env=env, timeout=90) as origin, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1200}, accept_downloads=True)
            requests, sockets = _page_requests(page, origin)
            for query in links:
                _load(page, f"{origin}/?{urlencode(query, doseq=True)}")
                text = page.inner_text("body").replace(WORD_JOINER, "")
                assert "Ignored from the link" in text, query
                if query["run"] == key:  # the hostile run is open: its name shows as the text it is
                    assert f"![x]({trap.url}/name.png) <img src={trap.url}/name-img.png>" in text
                else:
                    assert "from the link is not in these sources" in text
                assert "mlflow://***@127.0.0.1:" in text  # the launch source with a password, named redacted
                _assert_nothing_leaked_or_fetched(page, origin, requests, sockets)
            with page.expect_download(timeout=WAIT_MS) as download:
                page.get_by_role("button", name="Download JSON report").click()
            report = Path(download.value.path()).read_text()
            assert PASSWORD not in report and not any(s in report for s in SECRETS.values())
            assert {lin["name"] for lin in json.loads(report)["lineages"]} >= {name, "grpo-resume-buggy"}
            _assert_nothing_leaked_or_fetched(page, origin, requests, sockets)
        finally:
            browser.close()
    assert trap.connections == 0 and trap.requests == []  # no viewer's browser fetched the planted images
    assert recorder.connections == 0 and recorder.requests == []  # the server named by a link: never contacted
    log = (tmp_path / "dashboard.log").read_text()
    assert PASSWORD not in log and not any(s in log for s in SECRETS.values())
