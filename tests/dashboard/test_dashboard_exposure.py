"""Where the dashboard listens (issue 13): every launch path the README gives binds 127.0.0.1 only,
and a Streamlit started so that it listens on every interface serves no data without the operator's
opt-in. Read off the kernel's socket table (/proc/net/tcp{,6}), and by connecting to the machine's
outward address."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from chromium import ARGS, CHROMIUM, WAIT_MS, settled
from dashboard_runs import write_run
from dashboard_server import listening_addresses, outward_address, running_dashboard, running_streamlit

pytestmark = [pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")]
PRIVATE_RUN = "private-run-0xBADC0DE"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    write_run(root, name=PRIVATE_RUN, resumes=[41], buggy=True, steps=80, extra=False)
    return root


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KLWATCH_DASHBOARD_PUBLIC"}


def _assert_this_machine_only(port: int) -> None:
    assert listening_addresses(port) == {"127.0.0.1"}
    outward = outward_address()
    if outward is not None:  # what another machine would try: refused
        with pytest.raises(OSError), socket.create_connection((outward, port), timeout=5):
            pass


def test_klwatch_dashboard_listens_on_this_machine_only(runs: Path, tmp_path: Path) -> None:
    with running_dashboard([str(runs)], log=tmp_path / "dashboard.log", address=None, env=_env()) as url:
        _assert_this_machine_only(int(url.rsplit(":", 1)[1]))


def test_streamlit_run_from_the_repository_listens_on_this_machine_only(runs: Path, tmp_path: Path) -> None:
    # the README's line, as written: `streamlit run dashboard/app.py -- runs/` from the checkout
    with running_streamlit([str(runs)], log=tmp_path / "streamlit.log", env=_env()) as (_, port):
        _assert_this_machine_only(port)


def test_streamlit_run_from_anywhere_else_listens_on_this_machine_only(runs: Path, tmp_path: Path) -> None:
    # the app's own .streamlit/config.toml, beside its script, applies wherever Streamlit is started from
    with running_streamlit([str(runs)], log=tmp_path / "streamlit.log", cwd=tmp_path, env=_env()) as (_, port):
        _assert_this_machine_only(port)


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_a_streamlit_on_every_interface_serves_nothing_without_the_opt_in(runs: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    # every interface asked for on the command line, without the opt-in
    with running_streamlit([str(runs)], log=tmp_path / "streamlit.log", cwd=tmp_path, env=_env(),
                           options=["--server.address=0.0.0.0"]) as (url, port), sync_playwright() as pw:
        assert listening_addresses(port) & {"0.0.0.0", "::"}  # what the checks above would have caught
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page()
            page.goto(url, timeout=WAIT_MS)
            page.get_by_text("listens on every network interface").wait_for(timeout=WAIT_MS)
            settled(page)
            assert "KLWATCH_DASHBOARD_PUBLIC=1" in page.inner_text("body")
            assert PRIVATE_RUN not in page.content()
        finally:
            browser.close()

