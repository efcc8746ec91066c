"""One home for keeping secrets out of everything klwatch shows.

What a person or a log may see of a SOURCE or a URL: no ``user:password@``, no query values, no
token-like path parts (a Slack webhook's path *is* its token), and never the value of a credential
from the environment. Every face (report, JUnit, stderr, the progress line, GitHub annotations and
step summary, the dashboard, alert payloads) shows specs through ``redact_spec``/``redact_url`` and
free text (an exception's message may quote a URL) through ``scrub``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

SECRET_ENV = ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME",
              "DATABRICKS_TOKEN", "HF_TOKEN", "GITHUB_TOKEN")
"""Environment variables whose values are credentials: never shown, whatever message quotes them."""
MIN_SECRET_LENGTH = 4
"""Shorter values are not scrubbed from text (a two-letter password would blank half of every message)."""
MASK = "***"

# Hosts whose whole path after its first segment is the secret (Slack, Discord, Teams, Google Chat).
_HOOK_HOSTS = re.compile(r"(^|\.)(hooks\.slack(-gov)?\.com|discord(app)?\.com|webhook\.office\.com|"
                         r"outlook\.office(365)?\.com|chat\.googleapis\.com)$", re.I)
# On any host, what follows a segment with one of these names is a hook's id or token (Slack-style
# ``/services/T../B../XXX``, Mattermost ``/hooks/ID``, ``/api/webhooks/ID/TOKEN``).
_HOOK_SEGMENTS = {"services", "hooks", "hook", "webhooks", "webhook", "triggers", "workflows"}
_TOKENISH = re.compile(r"^(?=.*\d)[A-Za-z0-9_\-]{12,}$|^[A-Za-z0-9_\-]{24,}$")
"""A path segment that looks like a token: long and mixed with digits, or very long."""
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/@'\"<>]+@")
"""``scheme://anything@`` inside free text: the userinfo of a URL, whatever the scheme."""


def _redact_path(host: str, path: str) -> str:
    segs = path.split("/")
    named = [i for i, seg in enumerate(segs) if seg.lower() in _HOOK_SEGMENTS]
    keep = named[0] + 1 if named else (2 if _HOOK_HOSTS.search(host) else None)
    if keep is not None and len(segs) > keep and any(segs[keep:]):
        return "/".join(segs[:keep] + [MASK])
    return "/".join(MASK if _TOKENISH.match(seg) else seg for seg in segs)


def redact_url(url: str) -> str:
    """A URL safe to print: no userinfo, no query or fragment values, no token-like path parts.

    ``https://hooks.slack.com/services/T0/B0/XYZ`` -> ``https://hooks.slack.com/services/***``;
    ``https://user:pw@example.com/hook/abc123def456ghi?token=s`` -> ``https://***@example.com/hook/***?***``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    if not parts.scheme or not parts.netloc:
        return MASK
    host = parts.hostname or ""
    netloc = host if ":" not in host else f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        netloc += f":{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"{MASK}@" + netloc
    path = _redact_path(host, parts.path)
    return urlunsplit((parts.scheme, netloc, path, MASK if parts.query else "", MASK if parts.fragment else ""))


def redact_spec(spec: str) -> str:
    """A SOURCE as it may be shown: a URL-like spec (``mlflow://``, ``wandb://``, ``http(s)://``)
    without its userinfo and query values; a local path as given. The ``#PATTERN`` is kept (the whole
    spec is searched for userinfo, so a ``#`` inside a password cannot hide it)."""
    if "://" not in spec:
        return spec
    shown = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", spec)
    return re.sub(r"\?[^#]*", "?" + MASK, shown, count=1)


def env_secrets() -> list[str]:
    """The credential values set in this process's environment (long enough to scrub)."""
    return [v for k in SECRET_ENV if len(v := os.environ.get(k, "")) >= MIN_SECRET_LENGTH]


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` safe to show: every given secret URL (and any secret part of it that shows up alone,
    e.g. in an exception message) replaced by its redacted form, every credential from the environment
    masked, and the userinfo of any URL in it removed."""
    for s in sorted(secrets, key=len, reverse=True):
        if not s:
            continue
        shown = redact_url(s)
        text = text.replace(s, shown)
        try:
            parts, red = urlsplit(s), urlsplit(shown)
        except ValueError:
            continue
        for piece, safe in ((parts.password, MASK), (parts.username, MASK), (parts.query, MASK), (parts.path, red.path)):
            if piece and len(piece) > 3 and piece != safe:
                text = text.replace(piece, safe)
    for value in sorted(env_secrets(), key=len, reverse=True):
        text = text.replace(value, MASK)
    return _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
