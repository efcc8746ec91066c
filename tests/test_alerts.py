"""Alert sinks against a real HTTP receiver on 127.0.0.1: the body a Slack webhook accepts, retries
with backoff, and no secret of a webhook URL in anything printed (how URLs are redacted:
tests/test_redact.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from urllib.parse import parse_qs, urlsplit

import pytest

from klwatch.alerts import (ALERT_KEY_HEADER, Alert, alert_line, dashboard_link, post_webhook,
                              slack_payload, webhook_url_problem)


ALERT = Alert(lineage_id="tensorboard:runs:grpo/7b", run="grpo-7b", step=41, resumed_from_step=40,
              metric="train/kl_penalty", kl_before=0.118, kl_after=5.7e-06, score=0.998,
              explanation="KL fell from 0.118 to 5.7e-06 at the resume.", evidence=["new_event_file", "time_gap"],
              source="runs/")


def test_slack_body_names_run_step_kl_score_and_links_the_dashboard_view():
    body = slack_payload(ALERT, dashboard_url="https://klwatch.example.com/")
    json.dumps(body)  # serialisable as sent
    assert "grpo-7b" in body["text"] and "41" in body["text"] and "0.118" in body["text"]
    assert [b["type"] for b in body["blocks"]][:2] == ["header", "section"]
    fields = " ".join(f["text"] for f in body["blocks"][1]["fields"])
    for needle in ("tensorboard:runs:grpo/7b", "41", "resumed from 40", "0.118 -> 5.7e-06", "1.00"):
        assert needle in fields
    button = body["blocks"][-1]["elements"][0]
    assert button["type"] == "button"
    q = parse_qs(urlsplit(button["url"]).query)
    assert q == {"run": ["tensorboard:runs:grpo/7b"]}
    assert body["klwatch"]["key"] == "tensorboard:runs:grpo/7b@41:reference_reset"


def test_without_dashboard_url_there_is_no_link():
    body = slack_payload(ALERT, dashboard_url=None)
    assert all(b["type"] != "actions" for b in body["blocks"])
    assert "http" not in alert_line(ALERT, dashboard_url=None)


def test_dashboard_link_keeps_an_existing_query():
    assert dashboard_link("http://h:8501/?page=runs", "a b") == "http://h:8501/?page=runs&run=a+b"


def test_webhook_retries_with_backoff_until_the_receiver_accepts(receiver):
    receiver.fail_first = 2
    res = post_webhook(receiver.url + "/hook", slack_payload(ALERT, dashboard_url=None), key=ALERT.key,
                       attempts=3, backoff=0.2)
    assert res.ok and res.attempts == 3 and res.status == 200
    assert [r.status for r in receiver.requests] == [500, 500, 200]
    assert {r.headers[ALERT_KEY_HEADER] for r in receiver.requests} == {ALERT.key}
    gaps = [b.at - a.at for a, b in zip(receiver.requests, receiver.requests[1:])]
    assert gaps[0] >= 0.18 and gaps[1] >= 0.38  # 0.2 s, then doubled
    assert receiver.requests[-1].body["text"].startswith(":rotating_light:")


def test_userinfo_is_sent_as_basic_auth_not_in_the_url(receiver):
    url = receiver.url.replace("http://", "http://bot:pa55word@") + "/hook"
    res = post_webhook(url, {"text": "x"}, key="k", attempts=1)
    assert res.ok
    assert receiver.requests[0].headers["Authorization"] == "Basic Ym90OnBhNTV3b3Jk"


def test_a_client_error_is_not_retried_inline(receiver):
    receiver.fail_first, receiver.fail_status = 5, 404
    res = post_webhook(receiver.url + "/hook", {"text": "x"}, key="k", attempts=3, backoff=0.05)
    assert not res.ok and res.attempts == 1 and res.status == 404
    assert len(receiver.requests) == 1


def test_failed_delivery_error_never_holds_the_secret():
    # A closed port: the transport error must not echo the token in the path or query.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/services/T0AAA1111/B0BBB2222/abcdefghijklmnop1234?token=qwerty987"
    res = post_webhook(url, {"text": "x"}, key="k", attempts=2, backoff=0.01, timeout=2)
    assert not res.ok and res.attempts == 2
    assert res.error and "abcdefghijklmnop1234" not in res.error and "qwerty987" not in res.error


@pytest.mark.parametrize("url, why", [
    ("http://[x/y", "cannot be parsed"),
    ("http://host:99999/hook", "cannot be parsed"),
    ("ftp://host/hook", "not an http(s) URL"),
    ("https:///hook", "no host"),
    ("https://hooks.example.com/a b", "space"),
])
def test_a_webhook_url_that_cannot_be_posted_to_is_named_before_any_alert(url, why):
    problem = webhook_url_problem(url)
    assert problem and why in problem
    assert webhook_url_problem("https://bot:pw@hooks.slack.com/services/T0/B0/xyz?x=1") is None


def test_posting_to_an_unusable_url_is_a_failed_delivery_never_a_crash():
    res = post_webhook("http://[x/y", {"text": "x"}, key="k", attempts=3, backoff=0.01)
    assert not res.ok and res.permanent and res.attempts == 0 and "cannot be parsed" in (res.error or "")


def test_the_alert_key_is_ascii_whatever_the_run_is_called():
    """An HTTP header carries ASCII only: a run in a non-UTF-8 or non-Latin folder still gets a key."""
    odd = replace(ALERT, lineage_id="tensorboard:runs:r\udcff/\u8bad\u7ec3 1")
    assert odd.key.isascii() and " " not in odd.key and odd.key == replace(odd, run="other").key
    assert ALERT.key == "tensorboard:runs:grpo/7b@41:reference_reset"  # the ids klwatch makes are kept as they are


def test_the_key_header_reaches_the_receiver_for_an_odd_name(receiver):
    odd = replace(ALERT, lineage_id="tensorboard:runs:\u8bad\u7ec3")
    assert post_webhook(receiver.url + "/hook", {"text": "x"}, key=odd.key, attempts=1).ok
    assert receiver.requests[0].headers[ALERT_KEY_HEADER] == odd.key


HOSTILE = "evil\x1b[31m\x1b]8;;http://attacker.example/\x07link\x1b]8;;\x07 <http://attacker.example|click> @here &"


def test_a_hostile_run_name_is_inert_on_the_console_and_in_slack():
    alert = replace(ALERT, run=HOSTILE, metric="kl`<!channel>`", source="mlflow://bob:pw-123456@h:5000#x")
    line = alert_line(alert, dashboard_url="https://viewer:dash-pw-1@klwatch.example.com/")
    assert "\x1b" not in line and "\x07" not in line and "\\x1b]8;;" in line
    assert "dash-pw-1" not in line and "https://klwatch.example.com/?run=" in line
    body = slack_payload(alert, dashboard_url="https://viewer:dash-pw-1@klwatch.example.com/")
    shown = json.dumps([body["text"], body["blocks"]])  # what Slack renders (``klwatch`` is data for programs)
    assert "<http://attacker" not in shown and "<!channel>" not in shown
    assert "&lt;http://attacker.example|click&gt;" in shown
    assert "dash-pw-1" not in json.dumps(body) and "pw-123456" not in json.dumps(body)
    assert "mlflow://***@h:5000#x" in shown


def test_an_alert_names_its_source_without_credentials():
    from klwatch.alerts import alert_from_verdict
    from klwatch.model import Boundary, BoundaryVerdict, Lineage, LineageResult

    b = Boundary(step=21, resumed_from_step=20, evidence=["new_tracker_run"], piece_index=1)
    v = BoundaryVerdict(boundary=b, verdict="reference_reset", score=0.99, kl_before=0.1, kl_after=0.0,
                        explanation="x")
    r = LineageResult(lineage=Lineage(id="mlflow:x", name="x", segments=[]), metric="kl", status="reference_reset",
                      verdicts=[v])
    alert = alert_from_verdict(r, v, source="mlflow://bob:pw-123456@127.0.0.1:5000/exp")
    assert alert.source == "mlflow://***@127.0.0.1:5000/exp" and "pw-123456" not in alert.to_json()
