"""Benchmark: the dashboard on a fleet of 200 runs x 2,000 steps (TensorBoard event files).

    python benchmarks/bench_dashboard.py [--runs 200] [--steps 2000] [--dir DIR] [--repeat 3] [--no-page]
    python benchmarks/bench_dashboard.py --budget [--dir DIR]     # issue 15: 100 runs x 4,000 steps
    python benchmarks/bench_dashboard.py --browser [--dir DIR] [--small-dir DIR]   # issue 26: 1,000 x 4,000

``--budget`` measures what issue 15 asks of a 100 x 4,000 fleet: from the data read to the fleet table
and the first run's figure, and opening a run, uncached vs cached (printed as seconds and a ratio).

``--browser`` measures what issue 26 asks of a 1,000 x 4,000 fleet as a person meets it: a real
``streamlit run dashboard/app.py`` server and Debian's headless Chromium (Playwright), the time from
asking for the page until the status badges and the fleet table with every run are visible (cold: a
fresh server; warm: once the server has read and judged the fleet and its findings are in, in a new
browser with nothing cached and in a new tab of a browser that loaded the page before), and from a
click on a run's row until that run's chart is drawn. Printed as ratios measured in the same run: the
same on a tenth of the fleet (100 runs), and the big fleet against the floor, a bare Streamlit page
showing only the same badges and styled table from the same caches (what Streamlit and the browser
cost whatever the dashboard does).

What a user waits for, layer by layer, on the same files:

- cold load: read + stitch + judge every run (``klwatch.dashboard.data.load_fleet`` with empty caches);
- warm load: the same call again (what every click costs: a fingerprint of the files, cache hits);
- a threshold moved, or the metric changed: re-stitch and re-judge, no read (the read comes from
  the cache; stitching depends on the thresholds too, where a routine pause counts only if the KL
  was reset);
- the fleet view (table, boundary points, fleet picture) and the run view figure of one run, with
  its JSON serialisation (what Streamlit ships to the browser); and a 1,000,000-step run thinned by
  min/max buckets;
- the whole page through Streamlit's AppTest, cold and warm (``--no-page`` skips it);
- the naive alternative: tbparse's SummaryReader over the folder into one pandas frame, which a
  dashboard without caching would redo on every interaction (and that still has no verdict).

Event files are written directly (TFRecord framing, one Event per step holding every tag, as a
Summary may) because tensorboardX's one-call-per-scalar writer would take minutes for 1.6M scalars.
Not a test: the numbers are printed, the target (a fleet of this size loads in seconds) is read off.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from klwatch.dashboard.data import Fleet

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TAGS = ("train/kl_penalty", "train/loss", "train/reward", "train/lr")


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One record as TensorBoard's writers frame it: length, its CRC, the data, its CRC."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


def write_events(path: Path, *, steps: np.ndarray, wall: np.ndarray, values: dict[str, np.ndarray]) -> None:
    """One event file: a version record, then one Event per step with a simple_value per tag."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    out = [tfrecord(event_pb2.Event(wall_time=float(wall[0]), file_version="brain.Event:2").SerializeToString())]
    for i, step in enumerate(steps):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=float(v[i]))
                                             for t, v in values.items()])
        out.append(tfrecord(event_pb2.Event(wall_time=float(wall[i]), step=int(step), summary=summary).SerializeToString()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(out))


def write_fleet(root: Path, *, runs: int, steps: int, seed: int = 0) -> dict[str, int]:
    """``runs`` training runs of ``steps`` steps; half resumed once (a second event file), a quarter of
    all runs with the reference rebuilt at the resume (KL restarts from zero). Returns counts."""
    rng = np.random.default_rng(seed)
    t0 = 1_760_000_000.0
    counts = {"runs": runs, "resumed": 0, "buggy": 0, "files": 0, "scalars": 0}
    for r in range(runs):
        resumed, buggy = r % 2 == 0, r % 4 == 0
        cut = int(rng.integers(steps // 4, 3 * steps // 4)) if resumed else steps + 1
        launches = [(1, cut), (cut, steps + 1)] if resumed else [(1, steps + 1)]
        for k, (a, b) in enumerate(launches):
            s = np.arange(a, b)
            anchor = a - 1 if (buggy and k) else 0
            tau = 150.0 + 50.0 * rng.random()
            kl = 0.05 * (1 - np.exp(-(s - anchor) / tau)) * np.exp(rng.normal(0, 0.08, len(s)))
            values = {"train/kl_penalty": kl, "train/loss": 1 / (1 + s / 400) + rng.normal(0, 0.01, len(s)),
                      "train/reward": 0.2 + s / (4 * steps) + rng.normal(0, 0.02, len(s)),
                      "train/lr": np.full(len(s), 1e-6)}
            wall = t0 + s * 5.0 + k * 7_200.0
            write_events(root / f"grpo-{r:03d}" / f"events.out.tfevents.{int(wall[0])}.bench.{k}",
                         steps=s, wall=wall, values=values)
            counts["files"] += 1
            counts["scalars"] += len(s) * len(values)
        counts["resumed"] += resumed
        counts["buggy"] += buggy
    return counts


def _ensure_fleet(root: Path, *, runs: int, steps: int) -> None:
    """Write the fleet into ``root`` unless it holds one already (a 1,000-run fleet takes minutes to write)."""
    if not any(root.glob("*/events.out.tfevents.*")):
        t, counts = timed(lambda: write_fleet(root, runs=runs, steps=steps))
        print(f"wrote {counts['runs']} runs ({counts['resumed']} resumed, {counts['buggy']} with the reference "  # type: ignore[index]
              f"rebuilt), {counts['files']} event files, {counts['scalars']:,} scalars in {t:.1f} s")  # type: ignore[index]
    size = sum(p.stat().st_size for p in root.rglob("events.out.tfevents.*"))
    print(f"fleet: {root} ({size / 2**20:.1f} MiB)\n")


def timed(fn: Callable[[], object], *, repeat: int = 1) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def page_times(root: Path) -> tuple[float, float, float, float]:
    """(cold, warm rerun, threshold moved, rerun once the background findings are in) seconds for the
    whole page through AppTest, in a fresh process."""
    code = f"""
import os, sys, time, json
sys.path.insert(0, {str(REPO)!r})
os.environ["KLWATCH_DASHBOARD_SOURCES"] = {str(root)!r}
from streamlit.testing.v1 import AppTest
import klwatch.dashboard.data, klwatch.pipeline, plotly, pandas  # imports are not the page's cost
at = AppTest.from_file({str(REPO / "dashboard" / "app.py")!r}, default_timeout=600)
t = time.perf_counter(); at.run(); cold = time.perf_counter() - t
assert not at.exception, at.exception
t = time.perf_counter(); at.run(); warm = time.perf_counter() - t
t = time.perf_counter(); at.slider(key="rr_reset_score").set_value(0.99).run(); moved = time.perf_counter() - t
at.slider(key="rr_reset_score").set_value(0.95).run()
deadline = time.monotonic() + 600  # the fleet's findings judged in the background: a click once they are in
while any("still running" in c.value for c in at.caption) and time.monotonic() < deadline:
    time.sleep(0.5); at.run()
t = time.perf_counter(); at.run(); settled = time.perf_counter() - t
print(json.dumps([cold, warm, moved, settled, len(at.dataframe(key="fleet_table").value)]))
"""
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    cold, warm, moved, settled, rows = json.loads(out.stdout.strip().splitlines()[-1])
    return cold, warm, moved, settled


Row = tuple[str, float, str]


def load_rows(spec: str, *, repeat: int) -> tuple[list[Row], Fleet, float, float]:
    """The data layer, cold then warm: (rows, the fleet, cold seconds, warm seconds)."""
    from klwatch.dashboard import data
    from klwatch.pipeline import ScanConfig
    from klwatch.reference_reset import ReferenceResetConfig

    config = ScanConfig()
    data.clear_caches()
    fleet_config = dataclasses.replace(config, findings=False)  # what the fleet view judges with
    fp = data.fingerprint(spec)
    t_read, _ = timed(lambda: data.read_cached(spec, fp))
    t_judge, _ = timed(lambda: data.scan_cached(spec, fp, data.config_key(fleet_config), fleet_config))
    t_rest, fleet = timed(lambda: data.load_fleet([spec], config=config))  # cache hits + assembly
    t_cold = t_read + t_judge + t_rest
    rows: list[Row] = [("cold load: read + stitch + judge", t_cold, f"read {t_read:.2f} s, stitch + judge {t_judge:.2f} s")]
    t_warm, _ = timed(lambda: data.load_fleet([spec], config=config), repeat=repeat)
    t_fp, _ = timed(lambda: data.fingerprint(spec), repeat=repeat)
    rows.append(("warm load (every click)", t_warm, f"of which the files' fingerprint {t_fp * 1000:.1f} ms"))
    moved = [dataclasses.replace(config, reference_reset=ReferenceResetConfig(reset_score=x)) for x in (0.8, 0.85, 0.9)]
    t_moved = min(timed(lambda c=c: data.load_fleet([spec], config=c))[0] for c in moved)
    rows.append(("a threshold moved: re-stitch + judge", t_moved, "no read"))
    t_metric, _ = timed(lambda: data.load_fleet([spec], config=dataclasses.replace(config, metrics=("train/kl*",))))
    rows.append(("the metric changed: re-stitch + judge", t_metric, "no read"))
    t_export, full = timed(lambda: data.load_fleet([spec], config=config, findings=True))
    n_findings = sum(len(r.findings) for r in full.scan.results)  # type: ignore[union-attr]
    rows.append(("JSON export: + findings for every run", t_export, f"{n_findings} findings; on click only"))
    return rows, fleet, t_cold, t_warm


def view_rows(fleet: Fleet, *, repeat: int) -> list[Row]:
    """The fleet view and the run view of its first flagged run, as Streamlit ships them."""
    from klwatch.dashboard import charts, data
    from klwatch.pipeline import ScanConfig

    config = ScanConfig()
    statuses = fleet.status_counts()
    t_fleet_view, _ = timed(lambda: (data.fleet_table(fleet), charts.fleet_figure(
        data.boundary_points(fleet), thresholds=config.reference_reset).to_json()), repeat=repeat)
    rows: list[Row] = [("fleet view: table + fleet picture", t_fleet_view, f"{len(fleet.keys)} runs: {statuses}")]
    flagged = next((r for r in fleet.scan.results if r.status == "reference_reset"), fleet.scan.results[0])
    names = [n for n in flagged.lineage.metric_names() if n != flagged.metric]
    linked = charts.pick_linked_metrics(names, exclude=[flagged.metric or ""])
    key = fleet.keys[fleet.scan.results.index(flagged)]
    t_opened, _ = timed(lambda: data.judged_run(fleet, key, config=config))
    rows.append(("run view: the opened run's findings", t_opened, "once per run and thresholds"))
    t_fig, fig = timed(lambda: charts.run_figure(flagged, linked=linked), repeat=repeat)
    t_json, payload = timed(lambda: fig.to_json(), repeat=repeat)  # type: ignore[union-attr]
    rows.append(("run view: figure of one run", t_fig + t_json,
                 f"{flagged.lineage.name}, KL + {len(linked)} panels: build {t_fig * 1000:.0f} ms, "
                 f"JSON {t_json * 1000:.0f} ms ({len(payload) / 2**10:.0f} KiB)"))  # type: ignore[arg-type]
    return rows


def big_run_row(*, repeat: int) -> Row:
    """The run view of a 1,000,000-step run whose KL drops to zero at one step."""
    from klwatch.dashboard import charts
    from klwatch.model import Lineage, LineageResult, Segment, Series

    n = 1_000_000
    s = np.arange(1, n + 1)
    v = 0.05 + 0.005 * np.sin(s / 900.0)
    v[654_321] = 0.0
    ser = Series(s, v, 1.7e9 + s * 1.0)
    big = LineageResult(Lineage(id="big", name="big", segments=[Segment(kind="table", ref="big", source="x",
                                                                        series={"kl": ser})],
                                pieces=[{"kl": ser}], piece_segments=[0], kl_metric="kl"), "kl", "ok")
    t_big, bigfig = timed(lambda: charts.run_figure(big), repeat=repeat)
    drawn = len(bigfig.data[0].x)  # type: ignore[union-attr]
    kept = bool(np.any(np.asarray(bigfig.data[0].y) == 0.0))  # type: ignore[union-attr]
    return ("run view: a 1,000,000-step run", t_big,
            f"min/max thinned to {drawn:,} points ({bigfig.data[0].type}); the one-step drop to 0 drawn: {kept}")  # type: ignore[union-attr]


def naive_row(spec: str) -> Row:
    """tbparse's SummaryReader over the folder: what a dashboard without caching redoes on every click."""
    def naive() -> int:
        from tbparse import SummaryReader

        df = SummaryReader(spec, extra_columns={"dir_name", "wall_time"}).scalars
        return len(df.groupby("dir_name"))

    t_naive, groups = timed(naive)
    return ("naive: tbparse over the folder, every click", t_naive,
            f"{groups} folders into one DataFrame; no stitching, no verdict")


def budget_rows(spec: str, *, repeat: int) -> list[Row]:
    """Issue 15's budget, on the same files: from the data read to the fleet table and the first run's
    figure (what a page load costs once the read is done), and opening another run, uncached (its
    findings judged, its figure built and serialised) against cached (the figure from the cache,
    serialised as Streamlit does on every rerun)."""
    import plotly.io

    from klwatch.dashboard import charts, data
    from klwatch.pipeline import ScanConfig

    config = ScanConfig()
    data.clear_caches()
    fp = data.fingerprint(spec)
    t_read, _ = timed(lambda: data.read_cached(spec, fp))

    def first_view() -> tuple[data.Fleet, str | None]:
        fleet = data.load_fleet([spec], config=config)
        found, _ = data.fleet_findings(fleet, config=config)  # starts the background job, never waits
        table = data.fleet_table(fleet, found)
        charts.fleet_figure(data.boundary_points(fleet), thresholds=config.reference_reset).to_json()
        key = data.auto_open(fleet, findings=found)
        assert len(table) == len(fleet.keys)
        if key is not None:
            plotly.io.to_json(_figure(fleet, key), validate=False)  # what Streamlit ships
        return fleet, key

    def _figure(fleet: data.Fleet, key: str):  # type: ignore[no-untyped-def]
        result = data.judged_run(fleet, key, config=config)
        names = [n for n in result.lineage.metric_names() if n != result.metric]
        view = {"linked": tuple(charts.pick_linked_metrics(names, exclude=[result.metric or ""])), "smoothing": 0.0,
                "log_y": False, "x_axis": "step", "x_range": None, "theme": "light", "control": None,
                "compare_from": None}
        spec_i = fleet.source_of[fleet.keys.index(key)]
        return data.figure_cached(key, fleet.fingerprints[spec_i], data.config_key(config), repr(sorted(view.items())),
                                  _result=result, _view=view)

    t_first, (fleet, first) = timed(first_view)
    biggest = max(data.lineage_points(r.lineage) for r in fleet.scan.results)
    rows: list[Row] = [("budget: read the fleet (cold)", t_read, f"{len(fleet.keys)} runs; largest run {biggest:,} points"),
                       ("budget: data read -> fleet table + first run figure", t_first,
                        f"opened {first}; point budget {data.POINT_BUDGET:,}, ≤{charts.PANEL_POINTS:,} points per panel")]
    others = [k for k in fleet.keys if k != first][: max(3, repeat)]

    def open_uncached(k: str) -> int:
        data.run_cached.clear()
        data.figure_cached.clear()
        data._jobs_started.clear()  # noqa: SLF001 - the uncached path: no background result to take
        return len(plotly.io.to_json(_figure(fleet, k), validate=False))

    t_unc = min(timed(lambda k=k: open_uncached(k))[0] for k in others)
    for k in others:
        _figure(fleet, k)
    t_cached, size = timed(lambda: len(plotly.io.to_json(_figure(fleet, others[0]), validate=False)), repeat=repeat)
    fig = _figure(fleet, others[0])
    drawn = max(sum(len(t.x) for t in fig.data if t.yaxis == y) for y in {t.yaxis for t in fig.data if t.yaxis})
    rows.append(("budget: open a run, uncached (findings + figure + JSON)", t_unc, f"best of {len(others)} runs"))
    rows.append(("budget: open a run, cached figure (+ JSON)", t_cached,
                 f"{t_unc / max(t_cached, 1e-9):.1f}x faster than uncached; {size / 2**10:.0f} KiB, "  # type: ignore[operator]
                 f"≤{drawn:,} points in its largest panel"))
    return rows


BROWSER_WAIT_MS = 3_600_000  # a cold read of 16M points on a busy 2-core machine; the timing is read off, not bounded
BARE_PAGE = """
import sys
import streamlit as st
from klwatch.dashboard import charts, data
from klwatch.pipeline import ScanConfig

fleet = data.load_fleet([sys.argv[1]], config=ScanConfig())  # the dashboard's own cached layers
df = data.fleet_table_cached(fleet, {})
st.title("klwatch: resume boundaries")
st.markdown(" ".join(f":gray-badge[{k}: **{n}**]" for k, n in df["status"].value_counts().items()))
st.dataframe(df.style.map(lambda s: f"color: {charts.status_color(s)}; font-weight: 600", subset=["status"]),
             hide_index=True, height=420)
st.caption(f"{len(df)} of {len(df)} training run(s) shown.")
"""
"""The floor: a Streamlit page holding nothing but the same badges and styled table, from the same caches."""


def _usable(page, runs: int) -> None:  # type: ignore[no-untyped-def]
    """Wait until the first usable page is there: the status badges, the fleet table, and its caption
    saying it lists every run (flagged first: the table sorts by status)."""
    import re

    page.locator("[data-testid=stMarkdown]", has_text=re.compile(r"reference_reset: \d")).first.wait_for(
        state="visible", timeout=BROWSER_WAIT_MS)
    page.locator("[data-testid=stDataFrame]").first.wait_for(state="visible", timeout=BROWSER_WAIT_MS)
    page.get_by_text(f"{runs} of {runs} training run(s) shown").wait_for(state="visible", timeout=BROWSER_WAIT_MS)


VIEWPORT = {"width": 1400, "height": 1100}


def _first_page(context, url: str, runs: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """A new tab of ``context`` (a new one: nothing cached; or one that loaded the page before: its
    cache warm): seconds from asking for the page to the first usable page, and the tab."""
    page = context.new_page()
    t = time.perf_counter()
    page.goto(url, timeout=BROWSER_WAIT_MS)
    _usable(page, runs)
    return time.perf_counter() - t, page


def _settled(page) -> float:  # type: ignore[no-untyped-def]
    """Seconds until the script run is over and the fleet's findings (judged in the background) are in."""
    t = time.perf_counter()
    page.wait_for_function("() => !document.body.innerText.includes('Finding detectors are still running')"
                           " && !document.querySelector('[data-testid=stStatusWidget]')", timeout=BROWSER_WAIT_MS,
                           polling=250)
    return time.perf_counter() - t


def _open_times(page, count: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Click ``count`` runs' rows in turn (none opened before): seconds from each click until its chart,
    titled with its name, is drawn."""
    from chromium import click_run_name, fleet_rows

    rows = fleet_rows(page)
    heading = page.locator(".st-key-run_view h2")
    opened = heading.first.inner_text() if heading.count() else ""
    times = []
    for i in [i for i, r in enumerate(rows) if r["run"] not in opened][:count]:
        t = time.perf_counter()
        click_run_name(page, i)
        page.wait_for_function("(name) => [...document.querySelectorAll('.st-key-run_chart .gtitle')]"
                               ".some(t => t.textContent.startsWith(name + ':'))", arg=rows[i]["run"],
                               timeout=BROWSER_WAIT_MS, polling=20)
        times.append(time.perf_counter() - t)
        _settled(page)
    return times


@contextmanager
def _streamlit(app: Path, root: Path) -> Iterator[str]:
    """``streamlit run APP -- ROOT``, headless on a free port, from the repository root (the tests'
    launcher, ``tests/dashboard_server.py``): its URL once it answers."""
    from dashboard_server import free_port, running_server

    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="klwatch-bench-browser-")) / "streamlit.log"
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless=true", f"--server.port={port}",
           "--", str(root)]
    with running_server(cmd, port=port, log=log, timeout=300) as url:
        yield url


def browser_times(app: Path, root: Path, *, runs: int, repeat: int, opens: bool = True) -> dict[str, float]:
    """The page as people meet it: a real ``streamlit run`` server of ``app`` on ``root`` and Debian's
    headless Chromium. Seconds: ``cold`` (a fresh server's first page), ``settle`` (then until the script
    run is over and the fleet's findings are in), ``warm`` (median of ``repeat`` new browsers: the
    server's caches warm, the browser's empty), ``warm_tab`` (median of ``repeat`` new tabs of one
    browser that loaded the page before: both warm), ``open`` (median of ``repeat`` clicks on a row)."""
    from playwright.sync_api import sync_playwright

    from chromium import ARGS, CHROMIUM

    with _streamlit(app, root) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            cold, page = _first_page(browser.new_context(viewport=VIEWPORT), url, runs)
            out = {"cold": cold, "settle": _settled(page)}
            page.context.close()  # type: ignore[attr-defined]
            fresh = []
            for _ in range(repeat):
                took, page = _first_page(browser.new_context(viewport=VIEWPORT), url, runs)
                fresh.append(took)
                _settled(page)
                page.context.close()  # type: ignore[attr-defined]
            context = browser.new_context(viewport=VIEWPORT)
            _settled(_first_page(context, url, runs)[1])  # the browser's cache filled
            tabs = [_first_page(context, url, runs) for _ in range(repeat)]
            for _, tab in tabs:
                _settled(tab)
            out.update(warm=float(np.median(fresh)), warm_tab=float(np.median([t for t, _ in tabs])))
            if opens:
                out["open"] = float(np.median(_open_times(tabs[-1][1], repeat)))
        finally:
            browser.close()
    return out


def browser_report(big: Path, small: Path, *, big_runs: int, small_runs: int, repeat: int) -> None:
    """Issue 26's figures, measured in this run: the dashboard on both fleets with their ratios, and on
    the big one against the floor (a bare page with only the same badges and table)."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "dashboard")]  # the browser tests' helpers
    app = REPO / "dashboard" / "app.py"
    measured = {n: browser_times(app, root, runs=n, repeat=repeat) for n, root in ((small_runs, small), (big_runs, big))}
    bare_dir = Path(tempfile.mkdtemp(prefix="klwatch-bench-bare-"))
    (bare_dir / "bare.py").write_text(BARE_PAGE)
    bare = browser_times(bare_dir / "bare.py", big, runs=big_runs, repeat=repeat, opens=False)
    shutil.rmtree(bare_dir, ignore_errors=True)
    a, b = measured[small_runs], measured[big_runs]
    print(f"{'real streamlit server + headless Chromium':44} {f'{small_runs:,} runs':>10} {f'{big_runs:,} runs':>10}  ratio"
          f"   bare page, {big_runs:,} runs")
    for key, what in (("cold", "first usable page, fresh server"), ("settle", "  then until the findings are in"),
                      ("warm", "first usable page, warm (new browser)"), ("warm_tab", "first usable page, warm (new tab)"),
                      ("open", "open a run (click -> its chart), median")):
        ratio = f"{b[key] / a[key]:4.1f}x" if key != "settle" else "    -"  # findings may be in before the page
        floor = f"{bare[key]:9.2f}s  (dashboard {b[key] / bare[key]:.1f}x)" if key in bare and key != "settle" else ""
        print(f"{what:44} {a[key]:9.2f}s {b[key]:9.2f}s  {ratio}   {floor}")
    print(f"\n{big_runs:,} runs: warm first page {b['warm']:.2f} s in a new browser, {b['warm_tab']:.2f} s in a new tab "
          f"(target <= 5 s); open a run {b['open']:.2f} s (target <= 1 s); machine: {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")


def run_benchmark(root: Path, args: argparse.Namespace) -> None:
    spec = str(root)
    if args.browser:
        small_runs = max(1, args.runs // 10)
        small = args.small_dir or Path(tempfile.mkdtemp(prefix="klwatch-bench-dashboard-small-"))
        _ensure_fleet(small, runs=small_runs, steps=args.steps)
        browser_report(root, small, big_runs=args.runs, small_runs=small_runs, repeat=args.repeat)
        if args.small_dir is None:
            shutil.rmtree(small, ignore_errors=True)
        return
    if args.budget:
        rows = budget_rows(spec, repeat=args.repeat)
        if not args.no_page:
            cold, warm, _, settled = page_times(root)
            rows += [("budget: whole page (AppTest), cold", cold, "fresh process: read, judge, table, first run"),
                     ("budget: whole page (AppTest), rerun", warm, "a click while the fleet's findings are judged"),
                     ("budget: whole page (AppTest), rerun, findings in", settled, "what a click costs server-side")]
        width = max(len(r[0]) for r in rows)
        for name, secs, note in rows:
            print(f"{name.ljust(width)}  {secs:8.3f}  {note}")
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(f"\npeak memory of this process (data layer, no page): {peak:.0f} MiB; machine: {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f}")
        return
    rows, fleet, t_cold, t_warm = load_rows(spec, repeat=args.repeat)
    rows += view_rows(fleet, repeat=args.repeat)
    rows.append(big_run_row(repeat=args.repeat))
    if not args.no_page:
        cold, warm, moved_page, _ = page_times(root)
        rows += [("whole page (AppTest), cold", cold, "fresh process, imports done"),
                 ("whole page (AppTest), rerun", warm, "what a click costs server-side"),
                 ("whole page (AppTest), slider moved", moved_page, "re-judged, page redrawn")]
    rows.append(naive_row(spec))
    t_naive = rows[-1][1]
    width = max(len(r[0]) for r in rows)
    print(f"{'step'.ljust(width)}  {'seconds':>8}  notes")
    for name, secs, note in rows:
        print(f"{name.ljust(width)}  {secs:8.3f}  {note}")
    print(f"\nnaive / cold load: {t_naive / t_cold:.1f}x; naive / warm load: {t_naive / max(t_warm, 1e-9):,.0f}x; "
          f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2_000)
    parser.add_argument("--dir", type=Path, help="write (or reuse) the fleet here instead of a temporary folder")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-page", action="store_true", help="skip the AppTest page timing")
    parser.add_argument("--budget", action="store_true",
                        help="issue 15's budget: a 100 x 4,000 fleet (unless --runs/--steps say otherwise), data read -> "
                             "fleet table + first run, and opening a run cached vs uncached")
    parser.add_argument("--browser", action="store_true",
                        help="issue 26: a real server and headless Chromium on a 1,000 x 4,000 fleet (unless --runs/--steps "
                             "say otherwise) and on a 100-run one (--small-dir): first usable page, cold and warm, and "
                             "opening a run")
    parser.add_argument("--small-dir", type=Path, help="with --browser: write (or reuse) the 100-run fleet here")
    args = parser.parse_args()
    if args.browser and "--runs" not in sys.argv:
        args.runs = 1_000
    if args.browser and "--steps" not in sys.argv:
        args.steps = 4_000
    if args.budget and "--runs" not in sys.argv:
        args.runs = 100
    if args.budget and "--steps" not in sys.argv:
        args.steps = 4_000
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("streamlit").setLevel(logging.ERROR)

    tmp = tempfile.mkdtemp(prefix="klwatch-bench-dashboard-") if args.dir is None else None
    root = Path(tmp) if tmp is not None else args.dir
    try:
        _ensure_fleet(root, runs=args.runs, steps=args.steps)
        run_benchmark(root, args)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
