"""The watcher's memory (``klwatch.alert_store``): an alert is recorded once with a delivery per sink
before anything is sent, a delivery stays pending until its sink accepts it, a failed one waits out a
persisted backoff, and only one watcher uses a state file at a time."""

from __future__ import annotations

import io
import sqlite3
from dataclasses import replace

import pytest

from klwatch.alert_store import AlertState, DeliveryConfig, Sink, StateLocked, deliver
from test_alerts import ALERT

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
    state.record(ALERT, sinks, now=0.0)
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
