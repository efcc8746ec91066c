"""What the dashboard may read, where it may be served, and how untrusted text is shown on it.

A dashboard link is shared with a whole team, so nothing in a URL may widen what the server reads:
the SOURCEs come from whoever started the dashboard (its command line, ``KLWATCH_DASHBOARD_SOURCES``),
and a link's ``?src=`` only chooses among them. Adding a source from the page is off unless the
operator gave an allow-list of local roots and tracker hosts at launch (``--allow-add``,
``KLWATCH_DASHBOARD_ALLOW_ADD``); a path is checked after resolving symlinks and ``..``.

Streamlit listens on every interface unless told otherwise; the page serves data on such a server
only when the operator opted in (``klwatch dashboard --address 0.0.0.0`` or ``KLWATCH_DASHBOARD_PUBLIC=1``).

Run names, tags, metric names, specs and error messages come from files and servers anyone may have
written: ``md``/``code`` make them inert in Streamlit markdown (labels and help texts too),
``plot_text`` in Plotly's pseudo-HTML.

This module imports no Streamlit at load time: ``klwatch dashboard`` checks its flags with it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from klwatch.redact import redact_spec
from klwatch.report import bounded
from klwatch.sources import split_pattern

SOURCES_ENV = "KLWATCH_DASHBOARD_SOURCES"
"""Newline-separated SOURCEs, for running the app without command-line arguments (tests, containers)."""
ALLOW_ADD_ENV = "KLWATCH_DASHBOARD_ALLOW_ADD"
"""Newline-separated roots and hosts a person may add from the page (off when unset)."""
PUBLIC_ENV = "KLWATCH_DASHBOARD_PUBLIC"
"""``1``: the operator chose to serve the dashboard on every interface."""
ALLOW_ADD_FLAG = "--allow-add"
MAX_SPEC_CHARS = 2_000
"""A source typed or linked longer than this is not a source anyone meant."""
MAX_SHOWN_CHARS = 200
"""How much of a refused value a notice repeats."""
WILDCARD_ADDRESSES = {"", "0.0.0.0", "::", "[::]", "0"}

_WANDB = re.compile(r"^wandb://([^/#?@:\s]+)/([^/#?@:\s]+)(?:/([^/#?@:\s]+))?/?$")
_MLFLOW_SCHEMES = ("mlflow", "mlflow+http", "mlflow+https")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~:$#{}!])")
WORD_JOINER = "\u2060"
_LINKISH = re.compile(r"(?i)\b(?:https?|ftp|www)(?=\\?[:.])|@|:(?=[A-Za-z])")
_MD_LINE_START = re.compile(r"^(\s*)([+\-=]|\d+(?=[.)]))")


# ---------------------------------------------------------------- untrusted text


def plain(text: object) -> str:
    """One line of text: control characters (newlines, ANSI escapes' ESC, bidi overrides, invisible joiners) become spaces,
    so a value can neither start a new markdown block nor reorder what a reader sees; bounded as every face's
    messages are (``klwatch.report.bounded``: a 100 MB column name shows its start and end)."""
    return _CONTROL.sub(" ", bounded(str(text)))


def md(text: object) -> str:
    """``text`` as Streamlit markdown that renders exactly as the text: no image, link, HTML, colour
    directive, icon, math, list or heading can come out of it (every markdown-active character escaped)."""
    escaped = _unlink(_MD_SPECIAL.sub(r"\\\1", plain(text).strip()))  # 4 leading spaces would make a code block
    m = _MD_LINE_START.match(escaped)
    if m is None:
        return escaped
    cut = m.end() if m.group(2)[0].isdigit() else m.start(2)  # "1." -> "1\.", "- x" -> "\- x"
    return escaped[:cut] + "\\" + escaped[cut:]


def _unlink(text: str) -> str:
    """Break what Streamlit turns into a link or an icon after markdown escapes are undone (bare
    ``http://``, ``www.``, ``a@b.c``, ``:material/x:``, ``:emoji:``) with an invisible word joiner."""
    return _LINKISH.sub(lambda m: m.group(0) + WORD_JOINER, text)


def code(text: object) -> str:
    """``text`` as an inline code span (nothing inside one is interpreted): a fence longer than any
    run of backticks in it, padded so a leading or trailing backtick stays text. (Streamlit makes no
    link or icon inside one.)"""
    s = plain(text)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {s} {fence}" if longest or not s else f"{fence}{s}{fence}"


def plot_text(text: object) -> str:
    """``text`` for a Plotly title, legend, annotation or hover label: its tags (``<a>``, ``<img>``,
    ``<b>``) shown as text, and no ``%{...}`` that a hover template would fill in."""
    s = plain(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace("%{", "%&#123;")


def shorten(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """At most ``limit`` characters of ``text`` (a hostile link may be megabytes long)."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


# ---------------------------------------------------------------- where it listens


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: only this machine reaches it."""
    host = address.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(address: str | None) -> bool:
    """Streamlit listens on every interface for an unset address (its default) and for 0.0.0.0 / ::."""
    return address is None or address.strip() in WILDCARD_ADDRESSES


def served_address() -> str | None:
    """The address this Streamlit server listens on (``""`` for its default, every interface), or None
    when no server runs the page (AppTest and bare mode install no real runtime)."""
    from streamlit import config, runtime
    from streamlit.runtime import Runtime

    if not runtime.exists() or type(Runtime.instance()) is not Runtime:
        return None
    return config.get_option("server.address") or ""


def exposure_refusal(address: str | None, environ: Mapping[str, str]) -> str | None:
    """Why the page must not serve data at ``address``, or None: a server on every interface needs the
    operator's explicit opt-in, since anyone on the network could otherwise read every run."""
    if address is None or not is_wildcard(address) or environ.get(PUBLIC_ENV, "").strip() == "1":
        return None
    return (f"This dashboard listens on every network interface (server.address "
            f"{address or 'unset, Streamlit default'}), so anyone who can reach this machine could open it. "
            "It shows nothing until whoever starts it chooses that: bind to this machine only "
            "(`streamlit run dashboard/app.py --server.address 127.0.0.1`, or run it from the repository "
            "root, whose `.streamlit/config.toml` does), or opt in to sharing on the network with "
            f"`klwatch dashboard --address 0.0.0.0` or `{PUBLIC_ENV}=1`.")


# ---------------------------------------------------------------- what it may read


@dataclass(frozen=True)
class AllowList:
    """The roots and tracker hosts a person may add a source from on the page (none: adding is off)."""

    roots: tuple[Path, ...] = ()
    """Local folders, resolved (symlinks and ``..`` gone)."""
    mlflow: tuple[tuple[str, int | None], ...] = ()
    """MLflow servers as (host, port); a port of None allows any port of that host."""
    wandb: tuple[tuple[str, ...], ...] = ()
    """W&B ``(entity,)`` or ``(entity, project)`` prefixes."""

    @property
    def enabled(self) -> bool:
        return bool(self.roots or self.mlflow or self.wandb)

    @classmethod
    def parse(cls, entries: Sequence[str]) -> AllowList:
        """``--allow-add`` entries: a local folder, ``mlflow://HOST[:PORT]`` or ``wandb://ENTITY[/PROJECT]``.
        Raises ValueError naming an entry that is none of these."""
        roots: list[Path] = []
        mlflow: list[tuple[str, int | None]] = []
        wandb: list[tuple[str, ...]] = []
        for raw in (e.strip() for e in entries):
            if not raw:
                continue
            scheme = raw.partition("://")[0].lower() if "://" in raw else ""
            if scheme in _MLFLOW_SCHEMES:
                mlflow.append(_host_port(raw))
            elif scheme == "wandb":
                parts = tuple(p for p in raw[len("wandb://"):].split("/") if p)
                if not 1 <= len(parts) <= 2:
                    raise ValueError(f"{redact_spec(raw)}: expected wandb://ENTITY or wandb://ENTITY/PROJECT")
                wandb.append(parts)
            elif scheme:
                raise ValueError(f"{redact_spec(raw)}: expected a local folder, mlflow://HOST[:PORT] or "
                                 "wandb://ENTITY[/PROJECT]")
            else:
                root = Path(os.path.realpath(Path(raw).expanduser()))
                if not root.is_dir():
                    raise ValueError(f"{raw}: not a folder")
                roots.append(root)
        return cls(tuple(roots), tuple(mlflow), tuple(wandb))

    def describe(self) -> str:
        """The allow-list as a person reads it."""
        return ", ".join([str(r) for r in self.roots] + [f"mlflow://{h}" + (f":{p}" if p else "") for h, p in self.mlflow]
                         + ["wandb://" + "/".join(w) for w in self.wandb])

    def admit(self, spec: str) -> tuple[str | None, str]:
        """(the spec to read, "") when a person may add ``spec``, else (None, why not). A local path
        comes back resolved, so what was checked is what is read."""
        spec = spec.strip()
        if not self.enabled:
            return None, "adding sources from the page is off"
        if not spec or len(spec) > MAX_SPEC_CHARS or _CONTROL.search(spec):
            return None, "not a source"
        base, pattern = split_pattern(spec)
        if "://" in base:
            ok, why = self._admit_remote(base)
            return (spec if ok else None), why
        if not base.strip():
            return None, "not a source"
        real = Path(os.path.realpath(Path(base).expanduser()))
        if not any(real.is_relative_to(root) for root in self.roots):
            return None, "outside the folders this dashboard may read"
        return str(real) + (f"#{pattern}" if pattern else ""), ""

    def _admit_remote(self, base: str) -> tuple[bool, str]:
        scheme = base.partition("://")[0].lower()
        if scheme == "wandb":
            m = _WANDB.match(base)
            if not m:
                return False, "expected wandb://ENTITY/PROJECT[/RUN_ID]"
            ok = any(m.groups()[:len(w)] == w for w in self.wandb)
            return ok, "" if ok else "not a W&B project this dashboard may read"
        if scheme not in _MLFLOW_SCHEMES:
            return False, "not a kind of source this dashboard reads"
        try:
            host, port = _host_port(base)
        except ValueError as exc:
            return False, str(exc)
        ok = any(host == h and (p is None or port == p) for h, p in self.mlflow)
        return ok, "" if ok else "not an MLflow server this dashboard may read"


def _host_port(spec: str) -> tuple[str, int | None]:
    """(host, port) of ``mlflow://HOST[:PORT][/EXPERIMENT]``; credentials or a query are refused (the
    server's own credentials come from the operator's environment, never from a link)."""
    rest = spec.partition("://")[2]
    parts = urlsplit("http://" + rest)
    if "@" in parts.netloc or parts.query or parts.fragment:
        raise ValueError("credentials or a query in a server address are not accepted here")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError("bad port in the server address") from exc
    if not parts.hostname:
        raise ValueError("no host in the server address")
    return parts.hostname.lower(), port


@dataclass(frozen=True)
class Launch:
    """What the operator started the dashboard with: the SOURCEs it reads and what may be added."""

    sources: tuple[str, ...]
    allow: AllowList = AllowList()
    problems: tuple[str, ...] = ()
    """Allow-list entries that were refused (shown on the page; the rest still applies)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Each source as the page and the URL name it: redacted, unique."""

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for spec in self.sources:
            label, n = redact_spec(spec), 2
            while label in seen:
                label, n = f"{redact_spec(spec)} ({n})", n + 1
            seen.add(label)
            self.labels[spec] = label


def parse_app_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """The app's own arguments (after ``--``): ``--allow-add ROOT_OR_HOST`` (repeatable) and SOURCEs."""
    sources: list[str] = []
    allow: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == ALLOW_ADD_FLAG:
            allow.append(next(it, ""))
        elif arg.startswith(ALLOW_ADD_FLAG + "="):
            allow.append(arg.split("=", 1)[1])
        else:
            sources.append(arg)
    return sources, allow


def launch_settings(argv: Sequence[str], environ: Mapping[str, str], *, app_file: str,
                    default: Sequence[str]) -> Launch:
    """The operator's choices: the arguments after ``--`` of ``streamlit run app.py -- ...`` (when this
    process runs ``app_file``), else the environment; the repository's sample runs when neither names one."""
    args: list[str] = []
    if argv and argv[0] and Path(argv[0]).resolve() == Path(app_file).resolve():
        args = list(argv[1:])
    sources, allow_entries = parse_app_args(args)
    if not sources:
        sources = [s.strip() for s in environ.get(SOURCES_ENV, "").splitlines() if s.strip()]
    allow_entries += [s for s in environ.get(ALLOW_ADD_ENV, "").splitlines() if s.strip()]
    allow, problems = AllowList(), []
    for entry in allow_entries:
        try:
            one = AllowList.parse([entry])
        except ValueError as exc:
            problems.append(str(exc))
            continue
        allow = AllowList(allow.roots + one.roots, allow.mlflow + one.mlflow, allow.wandb + one.wandb)
    return Launch(tuple(dict.fromkeys(sources or default)), allow, tuple(problems))


@dataclass
class Selection:
    """What a link's ``?src=`` values chose: launch sources in view, added sources, and the rest ignored."""

    shown: list[str]
    """Launch sources in view (every one when the link names none)."""
    added: list[str]
    ignored: list[str]


def select_sources(values: Sequence[str], launch: Launch) -> Selection:
    """A link's ``?src=`` values, each a launch source (by its label or its spec), a source the
    allow-list admits, or ignored: a link can choose, never widen, what the dashboard reads."""
    by_name = {**{spec: spec for spec in launch.sources}, **{label: spec for spec, label in launch.labels.items()}}
    chosen: list[str] = []
    added: list[str] = []
    ignored: list[str] = []
    for value in (v.strip() for v in values):
        if not value:
            continue
        if value in by_name:
            chosen.append(by_name[value])
            continue
        spec, _ = launch.allow.admit(value) if launch.allow.enabled else (None, "")
        (added if spec else ignored).append(spec or value)
    shown = [s for s in launch.sources if s in chosen] or list(launch.sources)
    return Selection(shown=shown, added=list(dict.fromkeys(added)), ignored=ignored)


def link_sources(shown: Sequence[str], added: Sequence[str], launch: Launch) -> list[str]:
    """The ``?src=`` values of a view: the launch sources in it by label (none when all are), then the
    added ones; a credential in a launch source never reaches the URL."""
    picked = [] if set(shown) >= set(launch.sources) else [launch.labels[s] for s in launch.sources if s in shown]
    return [*picked, *added]
