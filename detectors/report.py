"""Render a scan: the JSON report of SPEC.md, a terminal table, markdown, JUnit XML, the exit code.

Every face (CLI, CI hook, dashboard export, watcher) renders through here, so a field means the same
thing wherever a user reads it.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import __version__
from .redact import env_secrets_digest, redact_spec, redactor

if TYPE_CHECKING:
    from xml.etree.ElementTree import Element

    from .model import BoundaryVerdict, LineageResult, ScanResult

SCHEMA = "klwatch.report/1"

EXIT_OK, EXIT_RESET, EXIT_USAGE, EXIT_UNREADABLE = 0, 1, 2, 3
EXIT_NOTHING_JUDGED = 4
"""``check`` only (an addition to SPEC.md): everything was read, no reset, but not one training run could be judged
against its reference (``nothing_judged``): a gate must not pass on nothing."""
JUDGED_STATUSES = frozenset({"reference_reset", "ok", "intentional", "inconclusive", "kl_disabled"})
"""A training run's statuses that say it was looked at against its reference (``kl_disabled``: it has none)."""


def exit_code(result: ScanResult) -> int:
    """SPEC.md: 1 on any reset; 2 when nothing could be read (or a ``#PATTERN`` named no run); 3 when some of it
    could not; else 0."""
    if result.any_reset:
        return EXIT_RESET
    if result.nothing_read or result.unmatched:  # a #PATTERN naming no run is bad usage, not a read failure
        return EXIT_USAGE
    if result.any_error:
        return EXIT_UNREADABLE
    return EXIT_OK


REPORT_DIGITS = 6
"""Significant digits of every number a report prints: enough to check, few enough to compare byte for byte."""


def round_sig(x: float | None, digits: int = REPORT_DIGITS) -> float | None:
    """``x`` to ``digits`` significant digits; None for a missing or non-finite value (JSON has no NaN)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def finite(x: float | None) -> float | None:
    """``x`` as a float when finite, else None: JSON has no NaN or Infinity (a tracker may hold them)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# ------------------------------------------------------------------------------ text made valid

_SURROGATES = re.compile(r"[\ud800-\udfff]")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff"
                          r"\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
"""Control characters (C0, DEL, C1), the Unicode line and paragraph separators, lone surrogates, the
two non-characters XML refuses, and the invisible format characters: bidirectional controls (U+202E turns
what follows around on screen: a name can read as another) and zero-width ones (two names that look alike)."""


def _escaped(m: re.Match[str]) -> str:
    """One character as text: a byte a file name could not decode (surrogateescape) as ``\\xNN``, a
    control character as ``\\xNN``, anything else as ``\\uNNNN``."""
    o = ord(m.group())
    if 0xDC80 <= o <= 0xDCFF:
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o <= 0xFF else f"\\u{o:04x}"


def valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (undecodable bytes of a non-UTF-8 name) shown as ``\\xNN``: a
    string every UTF-8 writer and every strict JSON parser accepts."""
    return text if text.isascii() else _SURROGATES.sub(_escaped, text)


_CI_COMMAND = re.compile(r"^(\s*):(?=:)")
"""A leading ``::`` (after any spaces): what starts a GitHub workflow command on a log line."""


MESSAGE_LIMIT = 4096
"""The most any one message, name or field may take in any output, counted as shown: a character a face
shows as an escape counts as its longest escape (``\\uNNNN``: 6, ``&amp;``: 5, a backslash before
punctuation: 2)."""


def _shown_cost(c: str) -> int:
    if _UNPRINTABLE.match(c):
        return 6
    return 5 if c in "&<>" else 2 if c in _ESCAPED_PUNCTUATION else 1


_ESCAPED_PUNCTUATION = set("\\\"'|[]*_`#!%:,")
_ELIDED = " ... [{n:,} characters elided] ... "


def bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` whole when it fits ``limit`` (``MESSAGE_LIMIT``), else its start (where a message names its
    file) and its end with the middle elided, saying how much: a 100 MB column name or a 10,000-level path
    costs a few KB in every output, never its size."""
    if len(text) * 6 <= limit:
        return text
    costs = [_shown_cost(c) for c in text] if len(text) <= 16 * limit else None
    total = sum(costs) if costs is not None else len(text) * 6
    if costs is not None and total <= limit:
        return text
    room = limit - len(_ELIDED.format(n=len(text))) - 6
    head, tail, used = 0, 0, 0
    cost = (lambda i: costs[i]) if costs is not None else (lambda i: _shown_cost(text[i]))
    while head < len(text) and used + cost(head) <= room * 3 // 4:
        used += cost(head)
        head += 1
    while tail < len(text) - head and used + cost(len(text) - 1 - tail) <= room:
        used += cost(len(text) - 1 - tail)
        tail += 1
    return text[:head] + _ELIDED.format(n=len(text) - head - tail) + (text[len(text) - tail:] if tail else "")


def printable(text: str, *, keep: str = "") -> str:
    """``text`` with control characters and lone surrogates shown as escapes (``keep`` lists control
    characters to leave, e.g. newlines in a message body), so one name cannot break a table, an XML
    file or a terminal line, nor become a CI command: GitHub's runner takes a legacy ``##[command]``
    anywhere in a line (shown ``##\\[``) and ``::command::`` at its start (its first ``:`` shown
    ``\\x3a``). Already printable text comes back unchanged."""
    text = bounded(text)
    if keep:
        text = _UNPRINTABLE.sub(lambda m: m.group() if m.group() in keep else _escaped(m), text)
    else:
        text = _UNPRINTABLE.sub(_escaped, text)
    return _CI_COMMAND.sub(r"\1\\x3a", text.replace("##[", "##\\["))


def secret_free(result: ScanResult) -> Callable[[str], str]:
    """What every face passes a scan's text through before showing it: the credentials of its
    SOURCEs (userinfo, query values) and of the environment masked, any URL's userinfo removed
    (``klwatch.redact``), then ``bounded``. A local path is shown as given."""
    clean = redactor([s.spec for s in result.sources])
    return lambda text: bounded(clean(text))


def clean_strings(obj: Any, clean: Callable[[str], str]) -> Any:
    """``obj`` (JSON-like data) with ``clean`` applied to every string in it, keys included."""
    if isinstance(obj, str):
        return clean(obj)
    if isinstance(obj, dict):
        return {clean_strings(k, clean): clean_strings(v, clean) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_strings(v, clean) for v in obj]
    return obj


def json_safe(obj: Any) -> Any:
    """``obj`` as plain JSON data (``model.plain_data``) with every string valid Unicode. What every
    JSON face passes its data through before ``json_text``."""
    if "numpy" not in sys.modules:  # then nothing in obj is a numpy value: a report from the scan memo
        return _plain_builtins(obj, valid_unicode)
    from .model import plain_data

    return plain_data(obj, text=valid_unicode)


def _plain_builtins(obj: Any, text: Callable[[str], str]) -> Any:
    """``model.plain_data`` of data made of Python's own types only (what a process that never loaded
    numpy holds), without importing numpy for it: the same result (tests/test_scan_memo.py checks)."""
    if isinstance(obj, str):
        return text(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {text(str(k)): _plain_builtins(v, text) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain_builtins(v, text) for v in obj]
    return obj


def json_text(data: Any) -> str:
    """Indented JSON of data made safe by ``json_safe``. ``allow_nan=False``: a non-finite float that
    slips past it is an error in the tests, never an invalid report (``"score": NaN``). Control
    characters come out as ``\\u`` escapes, and so does the ``[`` of a ``##[`` (the same string to a
    parser, but no legacy GitHub workflow command when the report is printed in a CI log)."""
    return json.dumps(data, indent=2, allow_nan=False).replace("##[", "##\\u005b")


def boundary_dict(v: BoundaryVerdict) -> dict[str, Any]:
    """One boundary of the JSON report (SPEC ``boundaries``): numbers rounded so reports compare byte for byte."""
    b = v.boundary
    return {
        "step": int(b.step),
        "resumed_from_step": None if b.resumed_from_step is None else int(b.resumed_from_step),
        "evidence": list(b.evidence),
        "verdict": v.verdict,
        "score": None if finite(v.score) is None else round(float(v.score), 4),
        "kl_before": round_sig(v.kl_before),
        "kl_after": round_sig(v.kl_after),
        "explanation": v.explanation,
        "window_before": [int(s) for s in v.window_before] if v.window_before else None,
        "window_after": [int(s) for s in v.window_after] if v.window_after else None,
    }


def lineage_dict(r: LineageResult) -> dict[str, Any]:
    """One training run of the JSON report (SPEC ``lineages``), its boundaries in step order."""
    lin = r.lineage
    members = []
    prefer = (lin.kl_metric,) if lin.kl_metric else ()
    for seg in lin.segments:
        first, last = seg.extent(prefer)  # where its training starts and ends, not a setup key's step 0
        members.append({"kind": seg.kind, "ref": seg.ref, "first_step": first, "last_step": last})
    boundaries = [boundary_dict(v) for v in r.verdicts]  # the pipeline gives every boundary a verdict
    boundaries.sort(key=lambda d: d["step"])
    warnings = [w for seg in lin.segments for w in seg.warnings]
    return {
        "id": lin.id,
        "name": lin.name,
        "members": members,
        "metric": r.metric,
        "status": r.status,
        "boundaries": boundaries,
        "findings": [{"detector": f.detector, "step": None if f.step is None else int(f.step), "severity": f.severity,
                      "message": f.message, "metrics": list(f.metrics)}
                     for f in r.findings],
        "error": r.error,
        "incomplete": list(r.incomplete),
        "step_axis": lin.step_axis,
        "warnings": warnings,
        "stitching": list(lin.notes),
    }


def to_dict(result: ScanResult) -> dict[str, Any]:
    """The JSON report (SPEC.md ``--format json``), every float finite or None, every string valid
    Unicode and free of secrets (a SOURCE's spec without its userinfo or query values)."""
    report = _report_head(result)
    report["lineages"] = [lineage_dict(r) for r in result.results]
    return json_safe(clean_strings(report, secret_free(result)))


def _report_head(result: ScanResult) -> dict[str, Any]:
    """The JSON report without its training runs (``"lineages": []``, its last key), as raw data."""
    return {
        "schema": SCHEMA,
        "tool_version": __version__,
        "generated_at": result.generated_at,
        "sources": [{"spec": redact_spec(s.spec), "kinds": list(s.kinds),
                     "error": "; ".join(e.message for e in s.errors) or None,
                     "warnings": list(s.warnings), "unmatched": s.unmatched} for s in result.sources],
        "lineages": [],
    }


def to_json(result: ScanResult) -> str:
    """The JSON report as text, indented for people and diffs; valid JSON whatever the runs hold."""
    return "".join(json_chunks(result))


def json_chunks(result: ScanResult) -> Iterator[str]:
    """``to_json``'s text in pieces, one training run at a time: the same text as
    ``json_text(to_dict(result))``, but the report is never held as data (three times over: built,
    cleaned, made JSON-safe) nor as one text; a file written from the pieces costs a run at a time."""
    clean = secret_free(result)
    head = json_text(json_safe(clean_strings(_report_head(result), clean)))
    if not result.results:
        yield head
        return
    assert head.endswith(_NO_LINEAGES)  # "lineages" is the report's last key
    yield head[:-len(_NO_LINEAGES)] + "[\n    "
    shown = result.lineage_texts() if isinstance(result, ScanView) else None  # as the memo's scan rendered them
    texts = shown if shown is not None else (lineage_json(r, clean) for r in result.results)
    for k, text in enumerate(texts):
        yield f",\n    {text}" if k else text
    yield "\n  ]\n}"


def lineage_json(r: LineageResult, clean: Callable[[str], str]) -> str:
    """One training run's text in the JSON report (indented to sit in its ``lineages`` list), its
    strings made safe by ``clean``."""
    return json_text(json_safe(clean_strings(lineage_dict(r), clean))).replace("\n", "\n    ")


_NO_LINEAGES = "[]\n}"
"""How an indented report ends with no training run: where ``to_json`` puts them, one by one."""


def _fmt(x: float | None) -> str:
    """A KL in a table cell: 3 significant digits."""
    return "-" if x is None else f"{x:.3g}"


def rows(result: ScanResult) -> list[dict[str, str]]:
    """One row per boundary (or per run without one): what the table and markdown show, each cell one
    printable line without a secret whatever the run's name holds."""
    out = []
    clean = secret_free(result)

    def shown(text: str) -> str:
        return printable(clean(text))

    for r in result.results:
        kinds = ",".join(dict.fromkeys(s.kind for s in r.lineage.segments))
        base = {"run": shown(r.lineage.name), "tracker": kinds, "status": r.status, "metric": shown(r.metric or "-")}
        if not r.verdicts:
            note = r.error or (r.findings[0].message if r.findings and r.status == "no_kl_metric" else "")
            out.append({**base, "step": "-", "evidence": "-", "verdict": "-", "score": "-", "kl": "-",
                        "note": shown(note)})
        for v in r.verdicts:
            out.append({**base, "step": str(v.boundary.step), "evidence": ",".join(v.boundary.evidence),
                        "verdict": v.verdict, "score": f"{v.score:.2f}",
                        "kl": f"{_fmt(v.kl_before)} -> {_fmt(v.kl_after)}", "note": shown(v.explanation)})
    return out


def nothing_judged(result: ScanResult) -> str | None:
    """Why not one training run of the scan was judged against its reference (every one without a KL or
    implicit rewards, a ``--metric`` naming nothing, too few points, unreadable), free of secrets; None when one
    was, or when nothing could be read (exit 2 says that)."""
    if result.nothing_read or result.unmatched or any(r.status in JUDGED_STATUSES for r in result.results):
        return None
    if not result.results:
        return secret_free(result)("no training run was found in what was read")
    counts: dict[str, int] = {}
    for r in result.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    why = next((f"{r.lineage.name}: {f.message}" for r in result.results for f in r.findings
                if f.detector == "kl_metric" and f.severity == "warning"), None)
    said = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return secret_free(result)(f"no training run could be judged against its reference ({said or 'no training run'})"
                               + (f"; {why}" if why else ""))


def undecided(result: ScanResult) -> list[str]:
    """One line per resume left ``inconclusive`` in a run that rolled up ``inconclusive`` (no reset found, but
    not all is known to be well): what ``check`` and the markdown say under their verdicts, free of secrets
    (still to be escaped per medium). The exit code stays the verdict's."""
    clean = secret_free(result)
    return [clean(f"{r.lineage.name}: resume at step {v.boundary.step} undecided: {v.explanation}")
            for r in result.results if r.status == "inconclusive" for v in r.verdicts if v.verdict == "inconclusive"]


def incomplete(result: ScanResult) -> list[str]:
    """One line per reason a training run is incomplete (``LineageResult.incomplete``), naming the run:
    what the table, markdown and ``check`` say under their verdicts, free of secrets (still to be
    escaped per medium)."""
    clean = secret_free(result)
    return [clean(f"{r.lineage.name}: incomplete, {why}") for r in result.results if r.status != "error"
            for why in r.incomplete]  # a run with nothing read is listed among the errors already


def unreadable(result: ScanResult) -> list[str]:
    """``result.unreadable`` as shown: every message free of secrets (still to be escaped per medium)."""
    clean = secret_free(result)
    return [clean(m) for m in result.unreadable]


STATUS_STYLE = {"reference_reset": "bold red", "error": "red", "ok": "green", "intentional": "cyan",
                "kl_disabled": "dim", "no_kl_metric": "yellow", "insufficient_data": "yellow",
                "inconclusive": "yellow"}
VERDICT_STYLE = {"reference_reset": "bold red", "ok": "green", "intentional": "cyan", "inconclusive": "yellow"}


def render_table(result: ScanResult, console: Any) -> None:
    """A rich table on ``console``: every training run, every boundary, its verdict."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="klwatch: resume boundaries", show_lines=False)
    for col in ("run", "tracker", "status", "metric", "step", "evidence", "verdict", "score", "KL before -> after"):
        table.add_column(col, overflow="fold")
    for row in rows(result):
        table.add_row(Text(row["run"]), row["tracker"], Text(row["status"], style=STATUS_STYLE.get(row["status"], "")),
                      Text(row["metric"]), row["step"], row["evidence"],
                      Text(row["verdict"], style=VERDICT_STYLE.get(row["verdict"], "")), row["score"], row["kl"])
    console.print(table)
    for line in incomplete(result):  # each line whole (soft wrap): a log keeps it on one line
        console.print(Text(f"warning: {printable(line)}", style="yellow"), soft_wrap=True)
    if why := nothing_judged(result):
        console.print(Text(f"warning: {printable(why)}", style="yellow"), soft_wrap=True)
    console.print(summary_line(result), soft_wrap=True)


def summary_line(result: ScanResult) -> str:
    """One line under the table: runs by status and how many boundaries were a reference reset."""
    counts: dict[str, int] = {}
    for r in result.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    resets = sum(1 for r in result.results for v in r.verdicts if v.verdict == "reference_reset")
    parts = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    line = f"{len(result.results)} training run(s): {parts or 'none'}; {resets} boundary(ies) judged reference_reset."
    from .metrics import NO_MATCH

    unmatched = sum(any(f.detector == "kl_metric" and f.message.startswith(NO_MATCH) for f in r.findings)
                    for r in result.results)
    if unmatched:
        line += f" --metric matched nothing in {unmatched} of {len(result.results)} training run(s)."
    return line


_MARKDOWN_CELL = str.maketrans({"\\": "\\\\", "|": "\\|", "<": "&lt;", "[": "\\[", "]": "\\]"})
_ENTITY_START = re.compile(r"&(?=#?[A-Za-z0-9]+;)")
"""An ``&`` that would begin a character reference (``&lt;``, ``&#60;``): escaped; any other stays as written
(``W&B``, not ``W&amp;B``)."""


def escape_cell(text: str) -> str:
    """Text for a markdown table cell or list item, one line: a ``|`` would end the cell, a newline the
    row, a ``<`` open HTML (``<!--`` hides the rest of the table), a ``[`` a link or an image a viewer's
    browser fetches (``![x](https://...)``), a backslash escape the next ``|``, an ``&`` a character reference."""
    return _ENTITY_START.sub("&amp;", printable(text)).translate(_MARKDOWN_CELL)


def render_markdown(result: ScanResult) -> str:
    """The markdown report (``--format markdown``): the table, what could not be read, the summary line."""
    lines = ["| run | tracker | status | metric | step | evidence | verdict | score | KL before → after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows(result):
        cells = [escape_cell(row[k]) for k in ("run", "tracker", "status", "metric", "step", "evidence", "verdict", "score", "kl")]
        cells[2] = f"**{cells[2]}**" if row["status"] == "reference_reset" else cells[2]
        lines.append("| " + " | ".join(cells).replace("->", "→") + " |")
    if result.unreadable:
        lines += ["", "Errors:", *[f"- {escape_cell(e)}" for e in unreadable(result)]]
    if incomplete(result):
        lines += ["", "Incomplete (judged on what could be read):", *[f"- {escape_cell(e)}" for e in incomplete(result)]]
    lines += ["", summary_line(result)]
    return "\n".join(lines) + "\n"


JUNIT_SKIPPED_STATUSES = ("no_kl_metric", "kl_disabled", "insufficient_data", "inconclusive")
"""Statuses whose test case is skipped: there was nothing to judge, or a resume could not be decided, which
is neither a pass nor a failure."""


def junit_xml(result: ScanResult, *, finding_failures: Sequence[tuple[LineageResult, str]] = ()) -> str:
    """JUnit XML: one test case per training run, failing on a reference reset, erroring when unreadable.

    ``finding_failures`` are (run, line) pairs for error findings a check gates on (``check
    --fail-on``): they fail that run's case too, built in the same pass as the rest of the suite."""
    from xml.etree import ElementTree as ET

    lines_of: dict[int, list[str]] = {}
    for r, line in finding_failures:
        lines_of.setdefault(id(r), []).append(line)
    suite = ET.Element("testsuite", name="klwatch", tests=str(len(result.results)))
    counts = {"failure": 0, "error": 0, "skipped": 0}
    for r in result.results:
        for outcome in _junit_case(suite, r, lines_of.get(id(r), [])):
            counts[outcome] += 1
    for s in result.sources:
        for e in s.errors:
            counts["error"] += 1
            case = ET.SubElement(suite, "testcase", classname="klwatch.source", name=redact_spec(s.spec))
            ET.SubElement(case, "error", message=e.message, type="source_error")
    suite.set("failures", str(counts["failure"]))
    suite.set("errors", str(counts["error"]))
    suite.set("skipped", str(counts["skipped"]))
    suite.set("tests", str(len(suite.findall("testcase"))))
    _xml_valid(suite, secret_free(result))
    return JUNIT_DECLARATION + ET.tostring(suite, encoding="unicode")


JUNIT_DECLARATION = "<?xml version='1.0' encoding='utf-8'?>\n"
"""The file is always written as UTF-8, so it says so (not the locale's encoding)."""

_XML_KEEP = "\t\n\r"
"""The only control characters XML 1.0 allows."""


def _xml_valid(root: Element, clean: Callable[[str], str]) -> None:
    """Every attribute and text under ``root`` made valid XML 1.0 and free of secrets (``clean``): a
    run's name or message may hold control characters or undecodable bytes, which ElementTree writes as
    they are (then nothing parses the file); they are shown as escapes instead."""
    for el in root.iter():
        for k, v in el.attrib.items():
            el.set(k, printable(clean(v), keep=_XML_KEEP))
        if el.text:
            el.text = printable(clean(el.text), keep=_XML_KEEP)


def _junit_case(suite: Element, r: LineageResult, finding_lines: list[str]) -> list[str]:
    """Add one run's test case to ``suite``; return its outcomes ("failure", "error", "skipped").

    A failing finding fails a run that has no reset (and is then not skipped); on a run that has one,
    its lines are added under the reset's explanations."""
    from xml.etree import ElementTree as ET

    kind = r.lineage.segments[0].kind if r.lineage.segments else "run"
    case = ET.SubElement(suite, "testcase", classname=f"klwatch.{kind}", name=r.lineage.name)
    outcomes: list[str] = []
    if r.status == "reference_reset":
        bad = [v for v in r.verdicts if v.verdict == "reference_reset"]
        msg = "; ".join(f"step {v.boundary.step}: KL {_fmt(v.kl_before)} -> {_fmt(v.kl_after)}, score {v.score:.2f}" for v in bad)
        f = ET.SubElement(case, "failure", message=f"reference reset at {len(bad)} resume(s): {msg}", type="reference_reset")
        f.text = "\n".join([v.explanation for v in bad] + finding_lines)
        outcomes.append("failure")
    elif finding_lines:
        ET.SubElement(case, "failure", type="finding", message="; ".join(finding_lines))
        outcomes.append("failure")
    if r.status == "error":
        ET.SubElement(case, "error", message=r.error or "unreadable", type="error")
        outcomes.append("error")
    elif r.status in JUNIT_SKIPPED_STATUSES and not finding_lines:
        ET.SubElement(case, "skipped", message=r.status)
        outcomes.append("skipped")
    out = ET.SubElement(case, "system-out")
    out.text = "\n".join(f"step {v.boundary.step} [{','.join(v.boundary.evidence)}]: {v.verdict} ({v.score:.2f}) {v.explanation}"
                         for v in r.verdicts)
    return outcomes


# ------------------------------------------------------------------ a scan as its reports need it


VIEW_FORMAT = 3
"""Bumped when what ``scan_view`` keeps changes (klwatch's code version keys the memo as well)."""


def scan_view(result: ScanResult) -> dict[str, Any]:
    """What every report of ``klwatch scan`` reads from a scan, as plain data (JSON): its sources,
    every training run's verdicts, findings, members and their extents, what could not be read, and
    the result's derived facts (a reset, an error, nothing read), as computed by the model. Nothing is
    redacted, escaped or dated here: that is done when it is shown, as for a fresh result; but for the
    JSON report's runs, also kept as rendered, for as long as the environment's secrets stay the same.
    ``ScanView.from_data`` gives it back as an object every renderer here takes like a ScanResult,
    with no numpy or model class to load: the scan cache's memo of a whole scan (``klwatch.scan_cache``)."""

    def segment(seg: Any, prefer: tuple[str, ...]) -> dict[str, Any]:
        first, last = seg.extent(prefer)
        return {"kind": seg.kind, "ref": seg.ref, "warnings": list(seg.warnings), "error": seg.error,
                "extent": [list(prefer), first, last]}

    def verdict(v: Any) -> dict[str, Any]:
        b = v.boundary
        return {"boundary": {"step": b.step, "resumed_from_step": b.resumed_from_step, "evidence": list(b.evidence)},
                "verdict": v.verdict, "score": v.score, "kl_before": v.kl_before, "kl_after": v.kl_after,
                "explanation": v.explanation, "window_before": v.window_before, "window_after": v.window_after}

    def run(r: Any) -> dict[str, Any]:
        lin = r.lineage
        prefer = (lin.kl_metric,) if lin.kl_metric else ()
        return {"lineage": {"id": lin.id, "name": lin.name, "kl_metric": lin.kl_metric, "step_axis": lin.step_axis,
                            "notes": list(lin.notes), "segments": [segment(s, prefer) for s in lin.segments]},
                "metric": r.metric, "status": r.status, "verdicts": [verdict(v) for v in r.verdicts],
                "findings": [{"detector": f.detector, "step": f.step, "severity": f.severity, "message": f.message,
                              "metrics": list(f.metrics)} for f in r.findings],
                "error": r.error, "incomplete": list(r.incomplete)}

    clean = secret_free(result)
    return {"format": VIEW_FORMAT,
            "sources": [{"spec": s.spec, "kinds": list(s.kinds), "errors": [e.message for e in s.errors],
                         "warnings": list(s.warnings), "unmatched": s.unmatched} for s in result.sources],
            "results": [run(r) for r in result.results],
            "any_reset": result.any_reset, "any_error": result.any_error, "nothing_read": result.nothing_read,
            "unreadable": list(result.unreadable), "unmatched": list(result.unmatched),
            # the JSON report's runs as rendered now: a re-scan prints them as they are (rendering 1,000
            # runs' JSON costs more than the rest of a memo's re-scan) while the environment's secrets,
            # which they are masked against, stay the same (their digest; a spec's are in the memo's key)
            "lineages_json": {"env": env_secrets_digest(), "texts": [lineage_json(r, clean) for r in result.results]}}


def view_json(view: dict[str, Any]) -> str | None:
    """``scan_view`` data as JSON text that loads back the same (numpy numbers as Python's, tuples as
    lists, which is all the renderers see of them); None when something in it would not."""
    def plain(o: Any) -> Any:
        if hasattr(o, "item") and type(o).__module__ == "numpy":
            return o.item()
        raise TypeError(type(o).__name__)

    try:
        return json.dumps(view, default=plain)
    except (TypeError, ValueError):
        return None


class _Record:
    """Attributes given by keyword: one object of the view (a source, a run, a boundary...)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class _ViewSegment(_Record):
    def extent(self, prefer: tuple[str, ...] = ()) -> tuple[Any, Any]:
        """The extent ``Segment.extent`` gave for the run's KL metric, the one a report asks for."""
        kept, first, last = self.__dict__["_extent"]
        if list(prefer) != kept:
            raise ValueError(f"the scan view holds the extent for {kept}, not {list(prefer)}")
        return first, last


class ScanView(_Record):
    """A scan as ``scan_view`` kept it, read like a ScanResult by ``exit_code``, ``to_json``,
    ``render_table``, ``render_markdown``, ``junit_xml`` and the CLI's warnings; dated when loaded."""

    @classmethod
    def from_data(cls, data: dict[str, Any], *, generated_at: str) -> ScanView:
        def run(d: dict[str, Any]) -> _Record:
            lin = d["lineage"]
            segments = [_ViewSegment(kind=s["kind"], ref=s["ref"], warnings=s["warnings"], error=s["error"],
                                     _extent=s["extent"]) for s in lin["segments"]]
            verdicts = [_Record(**{**v, "boundary": _Record(**v["boundary"])}) for v in d["verdicts"]]
            return _Record(**{**d, "lineage": _Record(**{**lin, "segments": segments}), "verdicts": verdicts,
                              "findings": [_Record(**f) for f in d["findings"]]})

        sources = [_Record(spec=s["spec"], kinds=s["kinds"], warnings=s["warnings"], unmatched=s["unmatched"],
                           errors=[_Record(message=m) for m in s["errors"]]) for s in data["sources"]]
        return cls(sources=sources, results=[run(r) for r in data["results"]], any_reset=data["any_reset"],
                   any_error=data["any_error"], nothing_read=data["nothing_read"], unreadable=data["unreadable"],
                   unmatched=data["unmatched"], generated_at=generated_at, _rendered=data["lineages_json"])

    def lineage_texts(self) -> list[str] | None:
        """The JSON report's runs as the kept scan rendered them, while the environment's secrets are
        still those they were masked against (else None: rendered anew from the view)."""
        rendered = self.__dict__["_rendered"]
        return rendered["texts"] if rendered["env"] == env_secrets_digest() else None
