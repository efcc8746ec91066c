"""``klwatch check`` and ``assert_no_reference_reset``: the reset as a failing CI job or test.

Why a separate face from ``scan``: in CI the useful output is nothing when all is well and one line
per problem when not, in the places CI systems look (GitHub workflow annotations, the job's step
summary, JUnit XML), with the exit code as the gate. ``--fail-on`` lets the other resume-integrity
detectors (``Finding``s) gate the job too; a reference reset always does (SPEC.md exit code 1).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from .cli_common import (CacheDirOpt, CacheSizeOpt, JunitOpt, NoCacheOpt, ScanOptions, SourcesArg, check_outputs,
                         error_exit, open_cache, run_scan, say, with_scan_options, write_output)
from .model import BoundaryVerdict, Finding, LineageResult, ScanResult
from .pipeline import ScanConfig, scan
from .preference_reset import judged_quantity
from .redact import scrub
from .reference_reset import ReferenceResetConfig
from .report import (EXIT_NOTHING_JUDGED, EXIT_OK, EXIT_RESET, EXIT_UNREADABLE, escape_cell, exit_code, incomplete,
                     json_chunks, junit_xml, nothing_judged, printable, secret_free, undecided, unreadable)

RESET = "reference_reset"
DEFAULT_FAIL_ON: tuple[str, ...] = (RESET,)


@dataclass(frozen=True)
class Problem:
    """One thing that fails the check: a reset boundary, or an error finding of a --fail-on detector."""

    result: LineageResult
    verdict: BoundaryVerdict | None = None
    finding: Finding | None = None

    @property
    def step(self) -> int | None:
        """Where the problem is: the reset boundary's step, else the finding's (None when it has none)."""
        return self.verdict.boundary.step if self.verdict else (self.finding.step if self.finding else None)


def known_detectors() -> list[str]:
    """The names ``--fail-on`` accepts: the reference reset, every finding detector, and ``all``."""
    from .findings import DETECTORS  # here, not at the top: ``klwatch --help`` need not load every detector

    return [RESET, *DETECTORS, "all"]


def parse_fail_on(values: Sequence[str] | None) -> tuple[str, ...]:
    """``--fail-on a,b --fail-on c`` -> ('a', 'b', 'c'); ``all`` means every detector's errors.

    An unknown name is a ValueError: a typo must not turn a gate into one that never fails."""
    names: list[str] = []
    for v in values or DEFAULT_FAIL_ON:
        names.extend(x.strip() for x in v.split(",") if x.strip())
    known = known_detectors()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown detector(s) in --fail-on: {', '.join(unknown)} (known: {', '.join(known)})")
    return tuple(dict.fromkeys(names)) or DEFAULT_FAIL_ON


def problems(result: ScanResult, *, fail_on: Sequence[str]) -> list[Problem]:
    """Every reset boundary, then every error finding from a detector named in ``fail_on``."""
    out: list[Problem] = []
    for r in result.results:
        out.extend(Problem(r, verdict=v) for v in r.verdicts if v.verdict == RESET)
        for f in r.findings:
            if f.severity == "error" and f.detector != RESET and ("all" in fail_on or f.detector in fail_on):
                out.append(Problem(r, finding=f))
    return out


def check_exit_code(result: ScanResult, found: list[Problem]) -> int:
    """SPEC.md's codes; a failing finding counts as a problem like a reset does."""
    code = exit_code(result)
    if code in (EXIT_OK, EXIT_UNREADABLE) and found:
        return EXIT_RESET
    if code == EXIT_OK and nothing_judged(result):
        return EXIT_NOTHING_JUDGED  # a gate that judged nothing does not pass
    return code


def _g(x: float | None) -> str:
    """A KL as a line shows it: 3 significant digits, ``-`` when missing or not finite."""
    return "-" if x is None or not math.isfinite(x) else f"{x:.3g}"


def problem_line(p: Problem) -> str:
    """The one line ``check`` prints per problem."""
    run = p.result.lineage.name
    if p.verdict is not None:
        v, b = p.verdict, p.verdict.boundary
        since = f" (resumed from step {b.resumed_from_step})" if b.resumed_from_step is not None else ""
        what = judged_quantity(p.result.metric)
        return (f"{run}: reference reset at step {b.step}{since}: {what} {_g(v.kl_before)} -> {_g(v.kl_after)}, "
                f"score {v.score:.2f}")
    assert p.finding is not None
    at = f" at step {p.finding.step}" if p.finding.step is not None else ""
    return f"{run}: {p.finding.detector}{at}: {p.finding.message}"


# ------------------------------------------------------------------------------ GitHub Actions


def _escape_data(s: str) -> str:
    """A workflow command's message: ``%``, CR and LF encoded so a message stays one annotation, other
    control characters (an escape sequence, a NEL in a run's name) shown as escapes."""
    return printable(s, keep="\r\n").replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    """A workflow command's property (the title): ``:`` and ``,`` also end a property, so encode them."""
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def warning_command(title: str, message: str) -> str:
    """``::warning title=...::message``: a warning annotation, encoded as ``workflow_command``'s error."""
    return f"::warning title={_escape_property(title)}::{_escape_data(message)}"


def workflow_command(title: str, message: str) -> str:
    """``::error title=...::message``: an error annotation; the title and message encoded so that
    neither can end the command early or start another (``%0A``, ``::``, control characters)."""
    return f"::error title={_escape_property(title)}::{_escape_data(message)}"


def github_annotation(p: Problem, *, clean: Callable[[str], str] = scrub) -> str:
    """A workflow command GitHub turns into an error annotation on the run's summary page (its text
    passed through ``clean`` first: no secret)."""
    run = p.result.lineage.name
    if p.verdict is not None:
        title = f"klwatch: {judged_quantity(p.result.metric)} reference reset in {run} at step {p.verdict.boundary.step}"
        message = f"{problem_line(p)}. {p.verdict.explanation}"
    else:
        assert p.finding is not None
        title = f"klwatch: {p.finding.detector} in {run}"
        message = problem_line(p)
    return workflow_command(clean(title), clean(message))


SPARK = "▁▂▃▄▅▆▇█"
"""The sparkline's levels, lowest first."""

SPARK_WIDTH = 60
"""Characters a sparkline spreads a run's KL over (the resume markers come on top)."""


def _kl_pieces(r: LineageResult) -> list[np.ndarray]:
    """The finite KL values of every piece, signed as a distance (empty where a piece logs none)."""
    if r.metric is None:
        return []
    return [s.values[np.isfinite(s.values)] if s is not None else np.empty(0) for s in r.lineage.kl_pieces()]


def sparkline(r: LineageResult, *, width: int = SPARK_WIDTH) -> tuple[str, str] | None:
    """The run's KL as unicode blocks, a ``│`` at every resume, and a caret line under flagged resumes.

    Each piece (stretch between restarts) gets width in proportion to its points; points are averaged
    into characters within a piece only, so a drop right after a resume is never smoothed into the
    step before it. Returns (sparkline, marker line), or None without a KL.
    """
    pieces = _kl_pieces(r)
    n = sum(len(p) for p in pieces)
    if n == 0:
        return None
    top = max(float(np.max(p)) for p in pieces if len(p))
    flagged = {v.boundary.piece_index for v in r.verdicts if v.verdict == RESET}
    line, marks = [], []
    for k, p in enumerate(pieces):
        if k:
            line.append("│")
            marks.append("^" if k in flagged else " ")
        if not len(p):
            continue
        chars = max(1, round(width * len(p) / n))
        for chunk in np.array_split(p, min(chars, len(p))):
            level = 0 if top <= 0 else int(round(np.clip(float(np.mean(chunk)) / top, 0.0, 1.0) * (len(SPARK) - 1)))
            line.append(SPARK[level])
            marks.append(" ")
    return "".join(line), "".join(marks).rstrip()


SUMMARY_EXPLANATIONS = 3
"""Reset explanations quoted under a run's sparkline in the step summary; more would bury the table."""


def step_summary(result: ScanResult, found: list[Problem]) -> str:
    """The markdown appended to ``$GITHUB_STEP_SUMMARY``: verdict, a table, a sparkline per flagged run.
    Every name and message in it is escaped (no link, image, HTML or table break) and free of secrets."""
    clean = secret_free(result)
    lines = [_summary_head(result, found), ""]
    if found:
        lines += ["| run | step | resumed from | problem | KL before → after | score |", "|---|---|---|---|---|---|"]
        lines += [_summary_row(p, clean) for p in found]
        lines.append("")
        lines += _summary_sparklines(found, clean)
    if result.unreadable:
        lines += ["Could not read:", "", *[f"- {escape_cell(e)}" for e in unreadable(result)], ""]
    partial = incomplete(result)
    if partial:
        lines += ["Incomplete (judged on what could be read):", "", *[f"- {escape_cell(e)}" for e in partial], ""]
    open_ = undecided(result)
    if open_:
        lines += ["Undecided (no reset found, but these resumes could not be judged either way):", "",
                  *[f"- {escape_cell(e)}" for e in open_], ""]
    return "\n".join(lines) + "\n"


def _summary_head(result: ScanResult, found: list[Problem]) -> str:
    """The summary's one-line verdict: problems, else unreadable sources, else all clear."""
    runs = len(result.results)
    if found:
        return f"### ❌ klwatch check: {len(found)} problem(s) in {len({id(p.result) for p in found})} of {runs} training run(s)"
    if result.any_error or result.nothing_read:
        return f"### ⚠️ klwatch check: no reset found, but some sources could not be read ({runs} training run(s))"
    if why := nothing_judged(result):
        return f"### ❌ klwatch check: {escape_cell(why)}"
    boundaries = sum(len(r.verdicts) for r in result.results)
    open_ = len(undecided(result))
    if open_:
        return (f"### ⚠️ klwatch check: no reference reset found, {open_} resume(s) undecided "
                f"({runs} training run(s), {boundaries} resume(s) judged)")
    return f"### ✅ klwatch check: no reference reset ({runs} training run(s), {boundaries} resume(s) judged)"


def _summary_row(p: Problem, clean: Callable[[str], str]) -> str:
    """One problem as a row of the summary's markdown table."""
    run = escape_cell(clean(p.result.lineage.name))
    if p.verdict is not None:
        v, b = p.verdict, p.verdict.boundary
        return (f"| {run} | {b.step} | {'-' if b.resumed_from_step is None else b.resumed_from_step} | "
                f"**reference reset** | {_g(v.kl_before)} → {_g(v.kl_after)} | {v.score:.2f} |")
    assert p.finding is not None
    msg = escape_cell(clean(p.finding.message)).replace("\n", " ")
    return f"| {run} | {'-' if p.finding.step is None else p.finding.step} | - | **{p.finding.detector}**: {msg} | - | - |"


def _code_span(text: str) -> str:
    """``text`` as a markdown code span: one printable line with no backtick to end the span early
    (inside one, markdown and HTML are shown as they are)."""
    return "`" + printable(text).replace("`", "'") + "`"


def _summary_sparklines(found: list[Problem], clean: Callable[[str], str]) -> list[str]:
    """A sparkline block, with its first explanations quoted, for each run with a reset (once per run)."""
    lines: list[str] = []
    seen: set[int] = set()
    for p in found:
        r = p.result
        if id(r) in seen or p.verdict is None:
            continue
        seen.add(id(r))
        spark = sparkline(r)
        if spark is None:
            continue
        steps = [int(b.step) for b in r.lineage.boundaries]
        head = f"**{escape_cell(clean(r.lineage.name))}** — {_code_span(clean(r.metric or '-'))}"
        lines += [f"{head}, resumes at step(s) {', '.join(map(str, steps)) or '-'}; `^` marks a reference reset", "",
                  "```text", f"KL {spark[0]}", f"   {spark[1]}", "```", ""]
        lines += [f"> {escape_cell(clean(v.explanation))}" for v in r.verdicts if v.verdict == RESET][:SUMMARY_EXPLANATIONS]
        lines.append("")
    return lines


def junit_with_findings(result: ScanResult, found: list[Problem]) -> str:
    """``report.junit_xml`` with a failure on a run's test case for each of its failing findings."""
    return junit_xml(result, finding_failures=[(p.result, problem_line(p)) for p in found if p.finding is not None])


# ------------------------------------------------------------------------------------ command


JsonReportOpt = Annotated[Optional[Path], typer.Option(
    "--json", metavar="FILE", show_default=False,
    help="Also write the JSON report (what scan --format json gives) to FILE: for later CI steps to read.")]


FailOnOpt = Annotated[Optional[list[str]], typer.Option(
    "--fail-on", help="Detectors whose error findings fail the check too, comma-separated or repeated "
                      "(default reference_reset; 'all' for every detector). A reference reset always fails.")]


@with_scan_options
def check_command(
    sources: SourcesArg,
    *,
    options: ScanOptions,
    junit: JunitOpt = None,
    json_report: JsonReportOpt = None,
    fail_on: FailOnOpt = None,
    no_cache: NoCacheOpt = False,
    cache_dir: CacheDirOpt = None,
    cache_size: CacheSizeOpt = "2GB",
) -> None:
    """For CI: silent when all is well; one line per reset (GitHub annotations under Actions) and exit 1.

    Exit codes: 0 clean; 1 a reference reset (or an error finding of a --fail-on detector);
    2 bad usage or nothing readable; 3 no reset, but some sources or runs could not be read; 4 everything
    read, but not one training run could be judged against its reference (no KL, a --metric naming nothing).
    """
    try:
        names = parse_fail_on(fail_on)
    except ValueError as exc:
        error_exit(f"{exc}")
    config = options.config()
    check_outputs({"--junit": junit, "--json": json_report})
    cache = open_cache(sources, no_cache=no_cache, cache_dir=cache_dir, cache_size=cache_size)
    result = run_scan(sources, config, show_progress=False, cache=cache)
    found = problems(result, fail_on=names)
    _print_problems(result, found, github=os.environ.get("GITHUB_ACTIONS") == "true")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        _append_step_summary(summary, step_summary(result, found))
    if junit is not None:
        write_output(junit, junit_with_findings(result, found), flag="--junit")
    if json_report is not None:
        write_output(json_report, itertools.chain(json_chunks(result), ["\n"]), flag="--json")
    raise typer.Exit(check_exit_code(result, found))


def _print_problems(result: ScanResult, found: list[Problem], *, github: bool) -> None:
    """One line per problem on stdout, then one per unreadable source or run (stderr, or annotations
    on stdout under GitHub Actions); no secret, no control character, no workflow command of a name's."""
    clean = secret_free(result)
    for p in found:
        print(github_annotation(p, clean=clean) if github else printable(clean(problem_line(p))))
    n_sources = sum(len(s.errors) for s in result.sources)
    for i, msg in enumerate(unreadable(result)):  # the sources' errors come first, then the runs'
        title = "klwatch: unreadable source" if i < n_sources else "klwatch: unreadable run"
        print(workflow_command(title, msg) if github else f"error: {printable(msg)}",
              file=sys.stdout if github else sys.stderr)
    for msg in result.unmatched:  # bad usage: exit 2
        print(workflow_command("klwatch: no run matches", clean(msg)) if github else f"error: {printable(clean(msg))}",
              file=sys.stdout if github else sys.stderr)
    if (why := nothing_judged(result)) and not found:
        print(workflow_command("klwatch: nothing judged", why) if github else f"error: {printable(why)}",
              file=sys.stdout if github else sys.stderr)
    for msg in incomplete(result):  # judged on part of its logs: said, the exit code stays the verdict's
        print(warning_command("klwatch: incomplete run", msg) if github else f"warning: {printable(msg)}",
              file=sys.stdout if github else sys.stderr)
    for msg in undecided(result):  # no reset found, nor all well: said, the exit code stays the verdict's
        print(warning_command("klwatch: undecided resume", msg) if github else f"warning: {printable(msg)}",
              file=sys.stdout if github else sys.stderr)


def _append_step_summary(path: str, text: str) -> None:
    """Append (never overwrite: earlier steps wrote there too); a summary that cannot be written only warns."""
    try:
        with open(path, "a", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(text)
    except OSError as exc:
        say("warning", f"cannot append to GITHUB_STEP_SUMMARY {path}: {exc}")


# --------------------------------------------------------------------------------- Python API


def assert_no_reference_reset(
    *sources: str | os.PathLike[str],
    metric: str | Sequence[str] | None = None,
    intentional_reset: Sequence[int] = (),
    restart: Sequence[int] = (),
    fail_on: Sequence[str] = DEFAULT_FAIL_ON,
    reset_score: float = ReferenceResetConfig.reset_score,
    min_boundaries: int = 0,
    allow_unreadable: bool = False,
) -> ScanResult:
    """Fail a test (AssertionError) when the logs in ``sources`` show a KL reference reset.

    For a framework's own resume test: train a few steps, checkpoint, resume, then
    ``assert_no_reference_reset(logdir, min_boundaries=1)``. The message names each run, the boundary
    step, KL before/after and the score. ``min_boundaries`` guards against a vacuous pass (the resume
    was not seen at all); unreadable sources fail unless ``allow_unreadable``. Returns the scan.
    """
    if not sources:
        raise ValueError("assert_no_reference_reset needs at least one source (a log folder, store or URL)")
    metrics = (metric,) if isinstance(metric, str) else tuple(metric or ())
    config = ScanConfig(metrics=metrics, intentional_resets=tuple(intentional_reset), declared_restarts=tuple(restart),
                        reference_reset=ReferenceResetConfig(reset_score=reset_score))
    result = scan([os.fspath(s) for s in sources], config=config)
    found = problems(result, fail_on=parse_fail_on(list(fail_on)))
    msgs = [_assertion_line(p) for p in found]
    unreadable = result.unreadable
    if result.nothing_read:
        msgs.append("klwatch could not read any run from " + ", ".join(map(os.fspath, sources)) +
                    (": " + "; ".join(unreadable) if unreadable else ""))
    elif unreadable and not allow_unreadable:
        msgs.append("klwatch could not read: " + "; ".join(unreadable))
    if (why := nothing_judged(result)) and not found:
        msgs.append(f"klwatch judged nothing: {why}")
    seen = sum(len(r.lineage.boundaries) for r in result.results)
    judged = sum(v.verdict != "inconclusive" for r in result.results for v in r.verdicts)
    if not result.nothing_read and seen < min_boundaries:
        msgs.append(f"expected at least {min_boundaries} resume boundary(ies), found {seen}: the resume did not show in "
                    "the logs (is the resumed process logging to the same place?)")
    elif not result.nothing_read and judged < min_boundaries and not why:
        msgs.append(f"expected at least {min_boundaries} resume boundary(ies) judged, {judged} of {seen} were: "
                    + "; ".join(undecided(result) or ["the others were left undecided"]))
    if msgs:
        raise AssertionError(secret_free(result)("\n".join(msgs)))  # a test log is an output too
    return result


def _assertion_line(p: Problem) -> str:
    """One problem in the AssertionError: the run by name and id, so a test log points at it."""
    where = f"run {p.result.lineage.name!r} ({p.result.lineage.id})"
    if p.verdict is None:
        assert p.finding is not None
        return f"{p.finding.detector} in {where}: {problem_line(p)}"
    v, b = p.verdict, p.verdict.boundary
    since = f", resumed from step {b.resumed_from_step}" if b.resumed_from_step is not None else ""
    return (f"KL reference reset in {where} at boundary step {b.step}{since}: KL before {_g(v.kl_before)}, "
            f"KL after {_g(v.kl_after)}, score {v.score:.2f}. {v.explanation}")


__all__ = ["assert_no_reference_reset", "check_command", "problems", "step_summary", "sparkline", "Problem"]
