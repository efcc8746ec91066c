"""Alerts for a judged reference reset: what one says, how it travels, and how its secrets stay hidden.

A webhook URL is a credential (Slack's ``hooks.slack.com/services/T../B../XXXX`` path *is* the
token), so nothing here ever prints one: every URL shown to a person goes through ``klwatch.redact.redact_url``,
and every error message is scrubbed of the raw URL before it leaves this module.

Delivery is at-least-once with backoff; the watcher's state (``klwatch.alert_store``) keeps what
is still pending in its file, so a failed delivery is retried across restarts. Each POST carries an
``X-Klwatch-Alert-Key`` header that stays the same for every retry of one alert, so a receiver can
drop the duplicate that a crash between "receiver said 200" and "state recorded it" would cause.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit, urlunsplit

from .model import BoundaryVerdict, LineageResult
from .preference_reset import judged_quantity
from .redact import redact_spec, scrub, without_userinfo
from .report import printable

ALERT_KEY_HEADER = "X-Klwatch-Alert-Key"
_KEY_SAFE = "/:@#!$&'()*+,;=-._~"
"""Printable ASCII kept as is in an alert key (besides letters and digits): every id klwatch makes."""


def webhook_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be POSTed to (None when it can): checked at start-up, so a malformed
    ``--webhook`` is a usage error then, not a crash at the first alert. The message holds no secret."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "it holds a space or a control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a port that is not a number in range)
    except ValueError as exc:
        return f"it cannot be parsed ({scrub(str(exc), [url])})"
    if parts.scheme not in ("http", "https"):
        return "it is not an http(s) URL"
    if not parts.hostname:
        return "it has no host"
    return None


@dataclass(frozen=True)
class Alert:
    """One reference reset, as every sink reports it. ``key`` identifies it across restarts."""

    lineage_id: str
    run: str
    step: int
    resumed_from_step: int | None
    metric: str | None
    kl_before: float | None
    kl_after: float | None
    score: float
    explanation: str
    evidence: list[str] = field(default_factory=list)
    source: str = ""
    verdict: str = "reference_reset"

    @property
    def key(self) -> str:
        """The receiver's de-duplication key (``X-Klwatch-Alert-Key``): one per (lineage, boundary,
        verdict), so the same for every retry, every restart and every sink. ASCII whatever the run's
        names (an HTTP header cannot carry more): other characters are percent-encoded."""
        raw = f"{self.lineage_id}@{self.step}:{self.verdict}"
        return quote(raw.encode("utf-8", "surrogateescape"), safe=_KEY_SAFE)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Alert":
        return Alert(**json.loads(text))


def alert_from_verdict(result: LineageResult, verdict: BoundaryVerdict, *, source: str) -> Alert:
    """The alert for one judged boundary: plain values only, so it round-trips through the state file;
    its SOURCE without credentials, since the alert travels to webhooks and is kept in the state file."""
    b = verdict.boundary
    return Alert(lineage_id=result.lineage.id, run=result.lineage.name, step=int(b.step),
                 resumed_from_step=None if b.resumed_from_step is None else int(b.resumed_from_step),
                 metric=result.metric, kl_before=verdict.kl_before, kl_after=verdict.kl_after,
                 score=float(verdict.score), explanation=verdict.explanation, evidence=list(b.evidence),
                 source=redact_spec(source), verdict=verdict.verdict)


def dashboard_link(base: str | None, lineage_id: str) -> str | None:
    """The dashboard view of one training run: ``BASE?run=<lineage id>``, without any userinfo of
    BASE (the link goes to a chat and a console; a viewer signs in for themselves)."""
    if not base:
        return None
    base = without_userinfo(base)
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}{urlencode({'run': lineage_id})}"


def _g(x: float | None) -> str:
    """A KL value as people read it in a one-line alert (3 significant digits, ``-`` when unknown)."""
    return "-" if x is None else f"{x:.3g}"


def alert_line(alert: Alert, *, dashboard_url: str | None) -> str:
    """The stdout sink's one line: a run's name cannot break it, colour a terminal or start a CI command."""
    since = f" (resumed from step {alert.resumed_from_step})" if alert.resumed_from_step is not None else ""
    link = dashboard_link(dashboard_url, alert.lineage_id)
    return printable(scrub(f"klwatch ALERT reference reset: run {alert.run} [{alert.lineage_id}] at step {alert.step}"
                           f"{since}: {judged_quantity(alert.metric)} {_g(alert.kl_before)} -> {_g(alert.kl_after)}, score {alert.score:.2f}"
                           + (f" {link}" if link else "")))


_SLACK_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def _mrkdwn(text: str) -> str:
    """Untrusted text (a run's name, a metric) inside Slack mrkdwn: no ``<url|link>`` or mention of its own."""
    return scrub(text).translate(_SLACK_ESCAPES)


def slack_payload(alert: Alert, *, dashboard_url: str | None) -> dict[str, Any]:
    """A Slack-compatible body: ``text`` (notifications, plain receivers) and ``blocks`` (rich view)."""
    link = dashboard_link(dashboard_url, alert.lineage_id)
    since = str(alert.resumed_from_step) if alert.resumed_from_step is not None else "unknown"
    text = (f":rotating_light: {judged_quantity(alert.metric)} reference reset in run *{_mrkdwn(alert.run)}* at step {alert.step}: "
            f"{judged_quantity(alert.metric)} {_g(alert.kl_before)} -> {_g(alert.kl_after)} (score {alert.score:.2f})")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "KL reference reset after a resume"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_mrkdwn(alert.run)}*\n{_mrkdwn(alert.explanation)}"},
         "fields": [
             {"type": "mrkdwn", "text": f"*Run*\n`{_mrkdwn(alert.lineage_id)}`"},
             {"type": "mrkdwn", "text": f"*Step*\n{alert.step} (resumed from {since})"},
             {"type": "mrkdwn", "text": f"*KL before -> after*\n{_g(alert.kl_before)} -> {_g(alert.kl_after)}"},
             {"type": "mrkdwn", "text": f"*Score*\n{alert.score:.2f}"},
         ]},
        {"type": "context", "elements": [
            {"type": "mrkdwn", "text": f"metric `{_mrkdwn(alert.metric or '-')}` · evidence {', '.join(alert.evidence) or '-'}"
                                       f" · source `{_mrkdwn(redact_spec(alert.source))}`"}]},
    ]
    if link:
        blocks.append({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Open in klwatch dashboard"}, "url": link}]})
        text += f" <{link}|dashboard>"
    return {"text": text, "blocks": blocks,
            "klwatch": {"key": alert.key, "lineage_id": alert.lineage_id, "run": alert.run, "step": alert.step,
                        "resumed_from_step": alert.resumed_from_step, "kl_before": alert.kl_before,
                        "kl_after": alert.kl_after, "score": alert.score, "metric": alert.metric,
                        "dashboard": link}}


@dataclass
class Delivery:
    """How one delivery went; ``error`` is already scrubbed of the URL's secrets."""

    ok: bool
    attempts: int
    status: int | None = None
    error: str | None = None
    permanent: bool = False
    """No retry can succeed (the URL itself is unusable): the delivery is dropped, not retried."""


def backoff_delay(failures: int, *, base: float, cap: float) -> float:
    """Exponential backoff: base, 2*base, 4*base, ... never above ``cap``."""
    return min(cap, base * (2.0 ** max(0, failures - 1)))


def _split_userinfo(url: str) -> tuple[str, dict[str, str]]:
    """``https://user:pw@host/x`` -> (``https://host/x``, Basic auth header): urllib cannot send userinfo."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    host = parts.netloc.rsplit("@", 1)[1]
    cred = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
    return urlunsplit(parts._replace(netloc=host)), {"Authorization": "Basic " + base64.b64encode(cred).decode()}


def post_webhook(url: str, payload: dict[str, Any], *, key: str, attempts: int = 3, backoff: float = 0.5,
                 timeout: float = 10.0) -> Delivery:
    """POST ``payload`` as JSON with ``key`` in ``X-Klwatch-Alert-Key``; retry transport errors, 429
    and 5xx with exponential backoff.

    Any 2xx is delivered. Other 4xx answers are not retried here (the watcher retries them later,
    with its longer backoff, in case the receiver is being fixed). Never raises: a URL that cannot be
    used is a failed delivery (``permanent``), not a crash.
    """
    import urllib.error  # with http.client and email, only when an alert is sent, not at every CLI start
    import urllib.request

    problem = webhook_url_problem(url)
    if problem:
        return Delivery(ok=False, attempts=0, error=f"webhook URL unusable: {problem}", permanent=True)
    body = json.dumps(payload).encode()
    target, headers = _split_userinfo(url)
    headers.update({"Content-Type": "application/json", ALERT_KEY_HEADER: key, "User-Agent": "klwatch"})
    last = Delivery(ok=False, attempts=0)
    for n in range(1, attempts + 1):
        retry = True
        try:
            req = urllib.request.Request(target, data=body, method="POST", headers=headers)
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
                return Delivery(ok=True, attempts=n, status=resp.status)
        except urllib.error.HTTPError as exc:
            retry = exc.code == 429 or exc.code >= 500
            last = Delivery(ok=False, attempts=n, status=exc.code, error=scrub(f"HTTP {exc.code} {exc.reason}", [url]))
        except Exception as exc:  # transport errors, and whatever else a broken server provokes in urllib
            reason = getattr(exc, "reason", exc)
            last = Delivery(ok=False, attempts=n, error=scrub(f"{type(exc).__name__}: {reason}", [url]))
        if not retry or n == attempts:
            break
        time.sleep(backoff_delay(n, base=backoff, cap=30.0))
    return last
