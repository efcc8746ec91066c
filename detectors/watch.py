"""``klwatch watch``: poll live runs, judge each resume boundary as soon as it can be, alert once.

The watcher in three parts, each in its own module for one reason (this one is the poll and the
command):

- ``klwatch.read_cache.LocalReadCache`` reads each SOURCE, re-reading only what changed on disk
  since the last poll.
- ``klwatch.alert_store.AlertState`` is the watcher's memory, a SQLite file recording each alert
  once, with a pending delivery per sink, before anything is sent, so a watcher killed at any point
  and restarted never records a boundary twice nor loses one (a boundary that arose while it was
  down is judged on the next pass); ``deliver`` sends what is due, to the webhooks in parallel, with
  a persisted, bounded backoff. Delivery is at least once: see ``klwatch.alert_store``.
- ``watch_pass`` is one poll: read, stitch and judge through ``klwatch.pipeline``, record new
  resets, deliver what is due.

A boundary judged ``inconclusive`` (too few points after the resume yet) is simply judged again at
the next poll; only ``reference_reset`` verdicts are alerted.
"""

from __future__ import annotations

import dataclasses
import signal
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional, TextIO

import typer
from rich.markup import escape

from .alert_store import AlertState, DeliveryConfig, Sink, StateLocked, deliver
from .alerts import Alert, alert_from_verdict, webhook_url_problem
from .cli_common import ScanOptions, SourcesArg, err, error_exit, say, why_unwritable, with_scan_options
from .model import ScanResult
from .pipeline import ScanConfig, scan
from .read_cache import LocalReadCache, ReadStats
from .redact import redact_url
from .report import EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, printable, secret_free, undecided

DEFAULT_STATE = ".klwatch-state.db"

# ---------------------------------------------------------------------------------------- pass


@dataclass
class PassReport:
    """What one poll did."""

    result: ScanResult
    new_alerts: list[Alert] = field(default_factory=list)
    delivered: int = 0
    failed: int = 0
    read_stats: dict[str, ReadStats] = field(default_factory=dict)


def watch_pass(specs: list[str], *, config: ScanConfig, cache: LocalReadCache, state: AlertState, sinks: list[Sink],
               dashboard_url: str | None, out: TextIO, delivery: DeliveryConfig = DeliveryConfig(),
               respect_backoff: bool = True) -> PassReport:
    """One poll: read what changed, judge every boundary, record new resets, deliver what is due."""
    result = scan(specs, config=config, read=cache.read)  # the same stitching and verdicts as a scan
    report = PassReport(result=result, read_stats=dict(cache.stats))
    now = time.time()
    for r in result.results:
        source = next((s.source for s in r.lineage.segments if s.source), "")
        for v in r.verdicts:
            if v.verdict != "reference_reset":
                continue
            alert = alert_from_verdict(r, v, source=source)
            if state.record(alert, sinks, now=now):
                report.new_alerts.append(alert)
    report.delivered, report.failed = deliver(state, sinks, dashboard_url=dashboard_url, out=out, config=delivery,
                                              respect_backoff=respect_backoff, warn=_warn)
    return report


# ----------------------------------------------------------------------------------------- CLI


class _Stop(Exception):
    """SIGTERM, raised inside the poll loop so the state file is closed on the way out."""


def _stop(signum: int, frame: Any) -> None:
    """The SIGTERM handler of a long-running watcher (``--once`` keeps the default)."""
    raise _Stop()


@with_scan_options
def watch_command(
    sources: SourcesArg,
    *,
    every: Annotated[float, typer.Option("--every", min=0.05, help="Seconds between polls.")] = 60.0,
    state_path: Annotated[Path, typer.Option("--state", help="SQLite file remembering alerts across restarts.")] = Path(DEFAULT_STATE),
    webhook: Annotated[Optional[list[str]], typer.Option("--webhook", help="POST alerts (Slack-compatible JSON) to URL (repeatable).")] = None,
    dashboard_url: Annotated[Optional[str], typer.Option("--dashboard-url", help="Dashboard base URL for links: BASE?run=<lineage id>.")] = None,
    once: Annotated[bool, typer.Option("--once", help="One pass, then exit (for cron).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="A line per poll on stderr.")] = False,
    options: ScanOptions,
) -> None:
    """Poll live runs; record each newly judged reference reset once and deliver it at least once to
    stdout and every webhook (each POST carries X-Klwatch-Alert-Key, the same for every retry).

    Exit codes with --once: 0 pass done; 2 bad usage or nothing readable; 3 some sources unreadable
    or an alert could not be delivered (it stays pending in --state and is retried next time).
    """
    if not sources:
        error_exit("give at least one SOURCE")
    sinks = _sinks(list(webhook or []))
    # whole results, not thinned ones: the read cache holds every run's pieces between polls anyway, and a
    # thinned one costs a pass over every step of a grown run at each poll
    config = dataclasses.replace(options.config(findings=False), chart_points=None)
    state = _open_state(state_path, sinks)
    return_large_frees()
    if not once:
        signal.signal(signal.SIGTERM, _stop)
        err.print(escape(printable(f"klwatch watch: {len(sources)} source(s) every {every:g}s; state {state_path}; "
                                   "alerts to " + ", ".join(s.label for s in sinks))), highlight=False, soft_wrap=True)
    code = EXIT_OK
    try:
        code = _poll(list(sources), config=config, state=state, sinks=sinks, dashboard_url=dashboard_url,
                     every=every, once=once, verbose=verbose)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        state.close()
    raise typer.Exit(code)


MALLOC_MMAP_THRESHOLD = 4 << 20
"""Arrays of 4 MiB (512k points) or more: those a long run's series are made of. Smaller ones stay in the
heap, reused at once: a poll judging a resume makes many of 1-4 MiB (twice as slow, each mapped afresh)."""


def return_large_frees() -> bool:
    """Have glibc give every allocation of ``MALLOC_MMAP_THRESHOLD`` bytes or more a memory map of its own,
    so it goes back to the system once freed. glibc raises its own threshold (to 32 MiB) at the first large
    free, after which a watched run's arrays come from the heap and, freed as the run grows into larger
    buffers, stay in it: a watcher of 1M-step runs peaked at twice what it holds at its first growth. For
    the watcher's own process (``klwatch watch``), never a training one. False where there is no glibc
    ``mallopt``."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, MALLOC_MMAP_THRESHOLD))  # -3: M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _sinks(urls: list[str]) -> list[Sink]:
    """stdout, then each distinct webhook; a URL that cannot be POSTed to is a usage error at start-up
    (shown redacted), never a crash at the first alert."""
    for i, u in enumerate(urls):
        problem = webhook_url_problem(u)
        if problem:
            which = f"the {_ordinal(i + 1)} of {len(urls)} --webhook values" if len(urls) > 1 else "--webhook"
            error_exit(f"{which} ({redact_url(u)!r}) is not usable: {problem}")
    return [Sink.stdout()] + [Sink.webhook(u) for u in dict.fromkeys(urls)]


def _open_state(state_path: Path, sinks: list[Sink]) -> AlertState:
    """The state file, or exit 2 when another watcher holds it (whatever link it is reached by) or it
    cannot be created or used; warns of deliveries left pending for webhooks not given this time
    (kept, not dropped) and of those dropped because their URL never was usable."""
    try:
        state = AlertState(state_path)
    except StateLocked as exc:
        error_exit(f"{exc}")
    except OSError as exc:  # the same words as scan's and check's output paths
        error_exit(f"cannot use --state {state_path}: {why_unwritable(state_path, exc)}")
    except sqlite3.Error as exc:
        error_exit(f"cannot use --state {state_path}: {exc}")
    dropped = state.abandon_unusable(now=time.time())
    if dropped:
        err.print(f"[yellow]warning[/] {dropped} alert delivery(ies) to a webhook URL that cannot be parsed dropped "
                  "(given to an earlier watcher; they stay recorded in the state file)", highlight=False)
    orphaned = state.pending_elsewhere({s.id for s in sinks})
    if orphaned:
        err.print(f"[yellow]warning[/] {orphaned} alert delivery(ies) pending for webhook(s) not given this time; "
                  "they are kept in the state file until a watcher with that --webhook delivers them", highlight=False)
    return state


def _poll(specs: list[str], *, config: ScanConfig, state: AlertState, sinks: list[Sink], dashboard_url: str | None,
          every: float, once: bool, verbose: bool) -> int:
    """Pass after pass, ``every`` seconds apart start to start; with ``once``, one pass and its exit code."""
    cache = LocalReadCache(limits=config.limits)  # a poll is bounded as a scan is
    shown_errors: set[str] = set()
    shown_undecided: set[str] = set()
    while True:
        started = time.monotonic()
        report = watch_pass(specs, config=config, cache=cache, state=state, sinks=sinks,
                            dashboard_url=dashboard_url, out=sys.stdout, respect_backoff=not once)
        _show_errors(report.result, shown_errors)
        _show_undecided(report.result, shown_undecided)
        if verbose:
            _show_pass(report, state)
        if once:
            return _once_exit_code(report, state)
        time.sleep(max(0.0, every - (time.monotonic() - started)))


def _once_exit_code(report: PassReport, state: AlertState) -> int:
    """2 when nothing was readable; 3 when something was not, or an alert is still undelivered (or was
    given up in this pass)."""
    if report.result.nothing_read:
        return EXIT_USAGE
    if report.result.any_error or report.failed or state.pending():
        return EXIT_UNREADABLE
    return EXIT_OK


def _warn(message: str) -> None:
    """How ``deliver`` tells the person at the console that an alert is still pending."""
    say("warning", message)


def _show_errors(result: ScanResult, shown: set[str]) -> None:
    """Each unreadable source or run once (not at every poll), without a secret or a control character."""
    clean = secret_free(result)
    for m in result.unreadable:
        if m not in shown:
            shown.add(m)
            say("error", m, clean=clean)


def _show_undecided(result: ScanResult, shown: set[str]) -> None:
    """Each resume left undecided in a run with no reset (``report.undecided``) once, as a warning: nothing
    says all is well there, though no alert is sent (alerts are for resets)."""
    for line in undecided(result):
        if line not in shown:
            shown.add(line)
            say("warning", line)


def _show_pass(report: PassReport, state: AlertState) -> None:
    """The --verbose line: what one poll read, judged and alerted, and what is still pending."""
    read = sum(s.read for s in report.read_stats.values())
    reused = sum(s.reused for s in report.read_stats.values())
    judged = sum(len(r.verdicts) for r in report.result.results)
    err.print(f"poll: {len(report.result.results)} run(s), {judged} boundary(ies) judged; files read {read}, "
              f"reused {reused}; {len(report.new_alerts)} new alert(s); {len(state.pending())} delivery(ies) pending",
              highlight=False)
