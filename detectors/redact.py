"""One home for keeping secrets out of everything klwatch shows.

What a person or a log may see of a SOURCE or a URL: no ``user:password@``, no query values, no
token-like path parts (a Slack webhook's path *is* its token), and never the value of a credential
from the environment. Every face (report, JUnit, stderr, the progress line, GitHub annotations and
step summary, the dashboard, alert payloads) shows specs through ``redact_spec``/``redact_url`` and
free text (an exception's message may quote a URL) through ``scrub``.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit, urlunsplit

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
_SPEC_USERINFO = re.compile(r"(?i)^[a-z][a-z0-9+.\-]*://([^/?\s]*)@")
"""A SOURCE's userinfo: up to its last ``@`` before the path (a password may hold ``@`` or ``#``)."""


def _redact_path(host: str, path: str) -> str:
    segs = path.split("/")
    named = [i for i, seg in enumerate(segs) if seg.lower() in _HOOK_SEGMENTS]
    keep = named[0] + 1 if named else (2 if _HOOK_HOSTS.search(host) else None)
    if keep is not None and len(segs) > keep and any(segs[keep:]):
        return "/".join(segs[:keep] + [MASK])
    return "/".join(MASK if _TOKENISH.match(seg) else seg for seg in segs)


_HOST = re.compile(r"^[A-Za-z0-9.-]{1,253}$")


def _redact_schemeless(url: str) -> str:
    """A value given as a URL without its scheme (``hooks.slack.com/services/T0/B0/XYZ``): its host when it has
    one, the rest masked, so a user can tell which value is meant; else only the mask."""
    host, sep, _ = url.partition("/")
    if "@" in host or ":" in host.split(".")[0] or not _HOST.match(host) or "." not in host:
        return MASK
    return host + (f"/{MASK}" if sep else "")


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
        return _redact_schemeless(url)
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
    m = _SPEC_USERINFO.match(spec)  # to its last "@": a password may hold one
    shown = spec[:m.start(1)] + MASK + spec[m.end(1):] if m else spec
    shown = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", shown)
    return re.sub(r"\?[^#]*", "?" + MASK, shown, count=1)


def basic_auth(user: str, password: str) -> str:
    """The ``Authorization: Basic`` value of ``user:password`` (as requests sends it): a server that
    echoes request headers in its error message quotes this, not the password."""
    return base64.b64encode(f"{user}:{password}".encode("latin-1", "replace")).decode()


def env_secrets() -> list[str]:
    """The credential values set in this process's environment (long enough to scrub), and the basic
    auth header that MLflow's user name and password make."""
    values = [v for k in SECRET_ENV if len(v := os.environ.get(k, "")) >= MIN_SECRET_LENGTH]
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    return values + ([basic_auth(user, password)] if user and password else [])


def env_secrets_digest() -> str:
    """A digest of ``env_secrets`` (never the values): text made safe under one environment is shown as
    it is only while this stays the same (the scan memo's pre-rendered report)."""
    import hashlib

    h = hashlib.blake2b(digest_size=16, person=b"klwatch-env")
    for v in sorted(env_secrets()):
        h.update(v.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def without_userinfo(url: str) -> str:
    """``url`` with the userinfo of every URL in it removed, the rest as given: for a link people must
    still be able to follow (a dashboard URL), where ``redact_url`` would mask its query too."""
    return _USERINFO.sub(lambda m: m.group(1), url)


def spec_secrets(spec: str) -> list[str]:
    """The credential parts of a SOURCE as a message may quote them: its userinfo and password, raw and
    percent-decoded, their basic auth header, and its query values; the longest first. A user name alone is not one (masking
    ``alice`` in every message would garble them); it is masked where it stands in a URL."""
    if "://" not in spec:
        return []
    pieces: list[str] = []
    m = _SPEC_USERINFO.match(spec)
    if m:
        user, _, password = m.group(1).partition(":")
        pieces += [m.group(1), password, basic_auth(unquote(user), unquote(password))]
    query = re.search(r"\?([^#]*)", spec[m.end() if m else 0:])
    if query:
        pieces += [v for part in query.group(1).split("&") for v in [part.partition("=")[2]]]
        pieces += [v for _, v in parse_qsl(query.group(1))]
    shown = {p for piece in pieces for p in (piece, unquote(piece)) if len(p) >= MIN_SECRET_LENGTH}
    return sorted(shown, key=len, reverse=True)


SECRET_WINDOW = 8
"""A secret at least this long is masked wherever any run of this many of its characters shows up (a server
that echoes the first 14 characters of a token has echoed a part of it that narrows the rest)."""


def echo_forms(value: str) -> set[str]:
    """The forms a server, a library or a header may echo a secret in: as is, percent-encoded (``quote`` and
    ``quote_plus``), base64 (standard, URL-safe, padded or not) and the base64 it makes inside a longer string
    (each of the three alignments, ends trimmed); case is ignored where they are matched."""
    raw = value.encode("utf-8", "surrogateescape")
    forms = {value, quote(value, safe=""), quote_plus(value, safe="")}
    for pad in (b"", b"\0", b"\0\0"):
        for enc in (base64.b64encode(pad + raw).decode(), base64.urlsafe_b64encode(pad + raw).decode()):
            forms.update((enc, enc.rstrip("=")) if not pad else (enc[4:-4],))
    return {f for f in forms if len(f) >= MIN_SECRET_LENGTH}


def _windows(values: Iterable[str]) -> set[str]:
    return {f[i:i + SECRET_WINDOW].lower() for v in values if len(v) >= SECRET_WINDOW
            for f in echo_forms(v) for i in range(len(f) - SECRET_WINDOW + 1)}


def masker(values: Iterable[str]) -> Callable[[str], str]:
    """What masks ``values`` in a text, built once for many texts: each in every form it may be echoed in
    (``echo_forms``, any case), longest first, and every stretch holding ``SECRET_WINDOW`` characters of a
    long one's forms masked whole."""
    values = list(values)
    forms = sorted({f for v in values for f in echo_forms(v)}, key=len, reverse=True)
    whole = re.compile("|".join(map(re.escape, forms)), re.I) if forms else None
    grams = _windows(values)

    def mask(text: str) -> str:
        if whole is None:
            return text
        text = whole.sub(MASK, text)
        if not grams or len(text) < SECRET_WINDOW:
            return text
        low, covered = text.lower(), []
        for i in range(len(text) - SECRET_WINDOW + 1):
            if low[i:i + SECRET_WINDOW] in grams:
                if covered and i <= covered[-1][1]:
                    covered[-1][1] = i + SECRET_WINDOW
                else:
                    covered.append([i, i + SECRET_WINDOW])
        for start, end in reversed(covered):
            text = text[:start] + MASK + text[end:]
        return text

    return mask


def _mask(text: str, values: Iterable[str]) -> str:
    """``text`` with ``values`` masked (``masker``)."""
    return masker(values)(text)


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
    text = _mask(text, sorted(env_secrets(), key=len, reverse=True))
    return _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)


def redactor(specs: Iterable[str]) -> Callable[[str], str]:
    """What makes any text of a scan of ``specs`` safe to show: each SOURCE's credentials
    (``spec_secrets``) and the environment's masked, and the userinfo of any URL removed. Built once
    per output (the environment is read then), applied to every string it shows."""
    mask = masker({v for s in specs for v in spec_secrets(s)} | set(env_secrets()))

    def clean(text: str) -> str:
        text = mask(text)
        return _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text) if "@" in text else text

    return clean
