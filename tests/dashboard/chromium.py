"""The real headless Chromium the browser tests drive (Debian's, through Playwright), and waiting for a
Streamlit page to settle."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 90_000  # generous: the CI machine may be busy; a normal run takes well under a minute in all

needs_chromium = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (scripts/setup.sh --test installs it)"),
]


def settled(page) -> None:
    """Wait until the script run is over (Streamlit shows its 'running' widget meanwhile). Called once
    the page shows what the run drew, so the run has started; no fixed pause is needed."""
    page.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=WAIT_MS)
