"""The watcher's memory (``klwatch.alert_store``): an alert is recorded once with a delivery per sink
before anything is sent, a delivery stays pending until its sink accepts it, a failed one waits out a
persisted backoff, and only one watcher uses a state file at a time."""

from __future__ import annotations

import io
import time
import sqlite3
from dataclasses import replace

import pytest

from klwatch.alert_store import AlertState, DeliveryConfig, Sink, StateLocked, deliver
from klwatch.alerts import ALERT_KEY_HEADER
from test_alerts import ALERT
from webhook_receiver import Receiver

SECRET_PATH = "/services/T0AAA1111/B0BBB2222/xoxTOKEN12345"


@pytest.fixture
def state(tmp_path):
    s = AlertState(tmp_path / "state.db")
    yield s
    s.close()


def test_an_alert_is_recorded_once_with_a_pending_delivery_per_sink(state):
    sinks = [Sink.stdout(), Sink.webhook("https://hooks.example.com" + SECRET_PATH)]
    assert state.record(ALERT, sinks, now=1.0)
    assert not state.record(ALERT, sinks, now=2.0)  # the same boundary again: already known
    assert not state.record(replace(ALERT, run="renamed"), sinks, now=3.0)  # known by lineage, step and verdict
    assert sorted(label for _, label, _, _ in state.pending()) == sorted(s.label for s in sinks)
    assert {key for key, *_ in state.pending()} == {ALERT.key}
    assert [(d.alert.to_json(), d.sink_id) for d in state.due(now=None)] == \
           [(ALERT.to_json(), s.id) for s in sorted(sinks, key=lambda s: s.id)]


def test_a_failed_delivery_is_due_again_only_once_its_backoff_has_run_out(state):
    state.record(ALERT, [Sink.stdout()], now=0.0)
    (d,) = state.due(now=0.0)
    state.mark_failed(d, attempts=3, error="HTTP 500", next_at=100.0)
    assert state.due(now=99.0) == []
    assert [x.attempts for x in state.due(now=100.0)] == [3]
    assert [x.attempts for x in state.due(now=None)] == [3]  # --once ignores the backoff
    assert state.pending() == [(ALERT.key, "stdout", 3, "HTTP 500")]
    state.mark_delivered(d, attempts=1, now=101.0)
    assert state.pending() == [] and state.due(now=None) == []


def test_what_was_recorded_survives_a_restart_and_a_second_opener_is_refused(tmp_path):
    path = tmp_path / "state.db"
    first = AlertState(path)
    try:
        first.record(ALERT, [Sink.stdout()], now=0.0)
        with pytest.raises(StateLocked, match="another klwatch watch"):
            AlertState(path)
    finally:
        first.close()
    again = AlertState(path)
    try:
        assert not again.record(ALERT, [Sink.stdout()], now=1.0)
        assert [key for key, *_ in again.pending()] == [ALERT.key]
    finally:
        again.close()
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("klwatch.watch-state/1",)
    finally:
        con.close()


def test_a_webhook_sink_is_known_across_restarts_by_an_id_that_holds_no_secret():
    url = "https://bot:pa55word@hooks.example.com" + SECRET_PATH + "?sig=zzz999"
    sink = Sink.webhook(url)
    assert sink == Sink.webhook(url) and sink.id != Sink.webhook(url + "x").id
    for secret in ("pa55word", "xoxTOKEN12345", "zzz999"):
        assert secret not in sink.id and secret not in sink.label


def test_deliver_prints_to_stdout_and_keeps_a_failed_webhook_pending_until_it_accepts(state, receiver):
    receiver.fail_first = 1
    url = receiver.url + SECRET_PATH
    sinks = [Sink.stdout(), Sink.webhook(url)]
    state.record(ALERT, sinks, now=time.time())
    out, warnings = io.StringIO(), []
    config = DeliveryConfig(attempts=1, retry_base=3600.0)  # a backoff no test run outlasts

    assert deliver(state, sinks, dashboard_url=None, out=out, config=config, respect_backoff=True,
                   warn=warnings.append) == (1, 1)
    assert out.getvalue().count("klwatch ALERT") == 1
    assert len(warnings) == 1 and "not delivered" in warnings[0] and "xoxTOKEN12345" not in warnings[0]
    assert [label for _, label, _, _ in state.pending()] == [sinks[1].label]

    assert deliver(state, sinks, dashboard_url=None, out=out, config=config, respect_backoff=True,
                   warn=warnings.append) == (0, 0)  # still backing off: not even tried
    assert len(receiver.requests) == 1

    assert deliver(state, sinks, dashboard_url=None, out=out, config=config, respect_backoff=False,
                   warn=warnings.append) == (1, 0)
    assert [r.status for r in receiver.requests] == [500, 200] and state.pending() == []
    assert out.getvalue().count("klwatch ALERT") == 1 and len(warnings) == 1


def test_a_delivery_for_a_webhook_not_given_this_time_is_kept_for_a_watcher_that_has_it(state):
    hook = Sink.webhook("https://hooks.example.com" + SECRET_PATH)
    state.record(ALERT, [Sink.stdout(), hook], now=0.0)
    assert state.pending_elsewhere({Sink.stdout().id}) == 1
    out = io.StringIO()
    assert deliver(state, [Sink.stdout()], dashboard_url=None, out=out, config=DeliveryConfig(),
                   respect_backoff=False, warn=pytest.fail) == (1, 0)
    assert [label for _, label, _, _ in state.pending()] == [hook.label]
    assert state.pending_elsewhere({Sink.stdout().id, hook.id}) == 0


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_second_watcher_reaching_the_state_through_a_link_is_refused(tmp_path, link):
    """The lock follows the file, not the name: through a symlink or a hard link, even from another
    folder, it is the same state file and a second watcher must not use it."""
    path = tmp_path / "state.db"
    first = AlertState(path)
    try:
        other = tmp_path / "elsewhere" / "alias.db"
        other.parent.mkdir()
        (other.symlink_to if link == "symlink" else other.hardlink_to)(path)
        with pytest.raises(StateLocked, match="another klwatch watch"):
            AlertState(other)
    finally:
        first.close()
    again = AlertState(other)  # released with the first watcher: the link works on its own
    again.close()


def test_sqlites_own_locking_is_untouched_by_the_watchers_lock(state, tmp_path):
    """The watcher's lock is on a byte SQLite never locks: readers (a person with ``sqlite3``, the
    tests) still read the file while the watcher writes it."""
    state.record(ALERT, [Sink.stdout()], now=0.0)
    con = sqlite3.connect(f"file:{state.path}?mode=ro", uri=True, timeout=1.0)
    try:
        assert con.execute("SELECT COUNT(*) FROM alerts").fetchone() == (1,)
    finally:
        con.close()
    state.mark_delivered(state.due(now=None)[0], attempts=1, now=1.0)  # a second connection's close dropped nothing
    with pytest.raises(StateLocked):
        AlertState(state.path)


def test_webhooks_are_delivered_in_parallel_so_a_slow_one_holds_up_no_other(state, receiver):
    """Two webhooks each taking ``delay`` to answer: a pass takes about one delay, not the sum."""
    delay = 1.5
    other = Receiver(delay=delay).start()
    receiver.delay = delay
    try:
        sinks = [Sink.stdout(), Sink.webhook(receiver.url + "/a"), Sink.webhook(other.url + "/b")]
        state.record(ALERT, sinks, now=time.time())
        started = time.monotonic()
        got = deliver(state, sinks, dashboard_url=None, out=io.StringIO(), config=DeliveryConfig(),
                      respect_backoff=True, warn=pytest.fail)
        took = time.monotonic() - started
    finally:
        other.stop()
    assert got == (3, 0) and state.pending() == []
    assert delay * 0.9 <= took < delay * 1.5, took  # serial delivery would take 2 x delay
    assert [r.headers[ALERT_KEY_HEADER] for r in receiver.requests + other.requests] == [ALERT.key, ALERT.key]


def test_retries_are_bounded_then_the_delivery_is_given_up_with_a_warning(state, receiver):
    receiver.fail_first = 100  # never accepts
    sinks = [Sink.webhook(receiver.url + "/hook")]
    state.record(ALERT, sinks, now=time.time())
    config, warnings = DeliveryConfig(attempts=2, backoff=0.01, max_attempts=4), []
    assert deliver(state, sinks, dashboard_url=None, out=io.StringIO(), config=config, respect_backoff=True,
                   warn=warnings.append) == (0, 1)
    assert state.due(now=time.time()) == []  # the backoff is in the file: the next pass waits it out
    assert deliver(state, sinks, dashboard_url=None, out=io.StringIO(), config=config, respect_backoff=False,
                   warn=warnings.append) == (0, 1)
    assert deliver(state, sinks, dashboard_url=None, out=io.StringIO(), config=config, respect_backoff=False,
                   warn=warnings.append) == (0, 0)  # given up: never tried again
    assert len(receiver.requests) == 4 and state.pending() == []
    assert "will retry" in warnings[0] and "4 attempt(s), given up" in warnings[1] and len(warnings) == 2
    assert {r.headers[ALERT_KEY_HEADER] for r in receiver.requests} == {ALERT.key}


def test_a_failing_delivery_is_given_up_once_it_is_older_than_the_bound(state, receiver):
    receiver.fail_first = 100
    sinks = [Sink.webhook(receiver.url + "/hook")]
    state.record(ALERT, sinks, now=time.time() - 3600)
    warnings = []
    config = DeliveryConfig(attempts=1, give_up_after=1800)
    assert deliver(state, sinks, dashboard_url=None, out=io.StringIO(), config=config, respect_backoff=False,
                   warn=warnings.append) == (0, 1)
    assert state.pending() == [] and "given up" in warnings[0] and len(receiver.requests) == 1


def test_a_pending_delivery_to_an_unparseable_url_is_dropped_never_a_crash(state):
    """An older watcher took ``--webhook 'http://[x/y'`` and crashed on its delivery at every restart."""
    bad = Sink.webhook("http://[x/y")
    assert bad.label == "***"
    state.record(ALERT, [Sink.stdout(), bad], now=time.time())
    warnings = []
    assert deliver(state, [Sink.stdout(), bad], dashboard_url=None, out=io.StringIO(), config=DeliveryConfig(),
                   respect_backoff=False, warn=warnings.append) == (1, 1)
    assert "cannot be parsed" in warnings[0] and "given up" in warnings[0] and state.pending() == []

    state.record(replace(ALERT, step=99), [Sink.stdout(), bad], now=time.time())
    assert state.abandon_unusable(now=time.time()) == 1  # at start-up, whatever --webhook is given now
    assert [label for _, label, _, _ in state.pending()] == ["stdout"]
