"""``klwatch compare CONTROL RESUMED``: the face of the reproduction test (``klwatch.comparison``).

It resolves each SOURCE to one training run through the pipeline, compares their KL from the resume
on, and prints the verdict as a table or JSON with SPEC-style exit codes. The statistic itself, and
why it is built the way it is, lives in ``klwatch.comparison``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any, Optional

import typer

from .cli_common import MetricOpt, error_exit, say
from .comparison import CompareConfig, Comparison, compare_runs, first_resume, fmt_ratio, log_ratio
from .model import LineageResult, ScanResult
from .pipeline import ScanConfig, matches_pattern, scan
from .redact import redact_spec, redactor
from .report import EXIT_UNREADABLE, clean_strings, json_safe, json_text, printable, round_sig, secret_free
from .sources import split_pattern

EXIT_AGREE, EXIT_PARTED = 0, 1
"""The curves agree; they part after the resume (bad usage and unreadable exit as ``scan`` does)."""
SCHEMA = "klwatch.compare/1"


class CompareUsageError(Exception):
    """Exit 2: the SOURCE does not resolve to one training run, or there is nothing to compare."""


class CompareReadError(Exception):
    """Exit 3: a SOURCE could not be read."""


def resolve_run(spec: str, *, role: str, config: ScanConfig) -> LineageResult:
    """The single training run a SOURCE (possibly with ``#PATTERN``) names, read through the pipeline;
    the messages of its exceptions name the SOURCE without credentials."""
    base, pattern = split_pattern(spec)
    result = scan([base], config=config)
    try:
        return _one_run(result, role=role, spec=spec, pattern=pattern)
    except (CompareUsageError, CompareReadError) as exc:
        raise type(exc)(secret_free(result)(str(exc))) from None


def _one_run(result: ScanResult, *, role: str, spec: str, pattern: str | None) -> LineageResult:
    """The one training run of ``result`` that ``#PATTERN`` keeps, or the exception saying why not."""
    base = split_pattern(spec)[0]
    spec, base = redact_spec(spec), redact_spec(base)
    errors = [e.message for s in result.sources for e in s.errors]
    if result.nothing_read:
        raise CompareReadError(f"{role} {spec}: nothing could be read" + (f" ({'; '.join(errors)})" if errors else ""))
    matched = [r for r in result.results if matches_pattern(pattern, r.lineage)]
    names = ", ".join(sorted(r.lineage.name for r in result.results if r.status != "error")) or "none"
    unreadable = errors + [f"{r.lineage.name}: {r.error}" for r in result.results if r.status == "error"]
    if not matched and unreadable:
        raise CompareReadError(f"{role} {spec}: no readable training run matches"
                               + (f" #{pattern}" if pattern else "") + f" ({'; '.join(unreadable)})")
    if not matched:
        raise CompareUsageError(f"{role} {spec}: no training run matches #{pattern} (runs there: {names})")
    if len(matched) > 1:
        shown = ", ".join(sorted(r.lineage.name for r in matched))
        raise CompareUsageError(f"{role} {spec} holds {len(matched)} training runs ({shown}); name one with "
                                f"{base}#PATTERN (a glob on the run's name or id)")
    r = matched[0]
    if r.status == "error":
        raise CompareReadError(f"{role} {spec}: run {r.lineage.name} could not be read: {r.error}")
    if r.metric is None:
        raise CompareUsageError(f"{role} {spec}: run {r.lineage.name} logs no reference-KL metric; name it with --metric")
    return r


def _trackers(r: LineageResult) -> list[str]:
    """The kinds of tracker a training run was read from, in the order its pieces came."""
    return list(dict.fromkeys(s.kind for s in r.lineage.segments))


def _side(spec: str, r: LineageResult) -> dict[str, Any]:
    """One run's part of the JSON report: what the SOURCE named (without credentials), and what was
    compared of it."""
    return {"spec": redact_spec(spec), "id": r.lineage.id, "name": r.lineage.name,
            "trackers": _trackers(r), "metric": r.metric,
            "boundaries": [int(b.step) for b in r.lineage.boundaries]}


def comparison_dict(cmp: Comparison, *, control: dict[str, Any], resumed: dict[str, Any], resume_from: str) -> dict[str, Any]:
    """The JSON report (``klwatch.compare/1``): every field of the Comparison, numbers rounded as the scan
    report's, finite or None, strings valid Unicode."""
    d = asdict(cmp)
    for k, v in list(d.items()):
        if isinstance(v, float):
            d[k] = round_sig(v)
    d["tolerance_ratio"] = round_sig(log_ratio(cmp.tolerance))
    return json_safe({"schema": SCHEMA, "control": control, "resumed": resumed, "resume_step_from": resume_from,
                      "test": "mann-whitney-u", **d})


def compare_command(
    control: Annotated[str, typer.Argument(help="The continuous run: a SOURCE, with #PATTERN when it holds several runs.", show_default=False)],
    resumed: Annotated[str, typer.Argument(help="The checkpoint→resume run of the same config: a SOURCE[#PATTERN].", show_default=False)],
    metric: MetricOpt = None,
    from_step: Annotated[Optional[int], typer.Option("--from-step", help="Compare from this step (default: RESUMED's first resume).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table or json.")] = "table",
    sigmas: Annotated[float, typer.Option("--sigmas", min=0.5, help="Tolerance, in units of the noise learned from the control.")] = CompareConfig.sigmas,
    window: Annotated[int, typer.Option("--window", min=3, help="Points each side of the resume for the two-sample test.")] = CompareConfig.window,
) -> None:
    """Fail when a resumed run's KL parts from a continuous run's after the resume (the seed's reproduction test).

    Exit codes: 0 the curves agree; 1 they part; 2 bad usage (a SOURCE is not exactly one training
    run, no resume step, nothing in common); 3 a SOURCE could not be read.
    """
    if fmt not in ("table", "json"):
        error_exit(f"--format must be table or json, not {fmt!r}")
    clean = redactor([control, resumed])
    c_run, r_run = _resolve_both(control, resumed, ScanConfig(metrics=tuple(metric or ()), findings=False))
    resume_step, resume_from = _resume_step(r_run, spec=resumed, from_step=from_step)
    cmp = compare_runs(c_run, r_run, resume_step=resume_step, config=CompareConfig(sigmas=sigmas, window=window))
    if cmp.verdict == "insufficient":
        error_exit(cmp.explanation, clean=clean)
    if fmt == "json":
        print(json_text(clean_strings(comparison_dict(cmp, control=_side(control, c_run), resumed=_side(resumed, r_run),
                                                      resume_from=resume_from), clean)))
    else:
        _render_table(cmp, c_run, r_run, resume_from, clean)
    raise typer.Exit(EXIT_PARTED if cmp.verdict == "parted" else EXIT_AGREE)


def _resolve_both(control: str, resumed: str, config: ScanConfig) -> tuple[LineageResult, LineageResult]:
    """CONTROL's and RESUMED's training runs, or the exit a SOURCE that names none calls for."""
    try:
        return (resolve_run(control, role="CONTROL", config=config),
                resolve_run(resumed, role="RESUMED", config=config))
    except CompareUsageError as exc:
        error_exit(f"{exc}")
    except CompareReadError as exc:
        error_exit(f"{exc}", EXIT_UNREADABLE)


def _resume_step(r_run: LineageResult, *, spec: str, from_step: int | None) -> tuple[int, str]:
    """The step compared from and where it came from; exit 2 when RESUMED shows no resume and none is given."""
    if from_step is not None:
        return from_step, "--from-step"
    step = first_resume(r_run)
    if step is None:
        error_exit(f"RESUMED {redact_spec(spec)}: no resume found in run {r_run.lineage.name}; give --from-step STEP",
                   clean=redactor([spec]))
    return step, "first boundary of RESUMED"


def _g(x: float | None) -> str:
    """A KL value in the table: 4 significant digits, ``-`` when missing."""
    return "-" if x is None else f"{x:.4g}"


def _render_table(cmp: Comparison, c_run: LineageResult, r_run: LineageResult, resume_from: str,
                  clean: Callable[[str], str]) -> None:
    """The verdict as a two-column table on stdout, the explanation under it, warnings on stderr; every
    name shown through ``clean`` (no secret) and ``printable`` (no control character)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def shown(text: str) -> Text:
        return Text(printable(clean(text)))

    t = Table(title="klwatch compare", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("control", shown(f"{c_run.lineage.name} ({','.join(_trackers(c_run))}, {c_run.metric})"))
    t.add_row("resumed", shown(f"{r_run.lineage.name} ({','.join(_trackers(r_run))}, {r_run.metric})"))
    t.add_row("from step", f"{cmp.resume_step} ({resume_from})")
    t.add_row("steps compared", f"{cmp.n_pre} before, {cmp.n_post} from the resume on")
    t.add_row("tolerance", f"x{log_ratio(cmp.tolerance):.3g} (control noise {cmp.noise:.3g} in log)")
    t.add_row("two-sample test", "-" if cmp.p_value is None else f"Mann-Whitney p={cmp.p_value:.3g}")
    style = "bold red" if cmp.verdict == "parted" else "green"
    t.add_row("verdict", f"[{style}]{cmp.verdict}[/]")
    if cmp.part_step is not None:
        t.add_row("parts at step", f"{cmp.part_step}: resumed {_g(cmp.resumed_at)} vs control {_g(cmp.control_at)} "
                                   f"(x{fmt_ratio(cmp.ratio)}, gap {cmp.gap:+.3g})")
    t.add_row("largest gap", f"x{fmt_ratio(cmp.max_ratio)} at step {cmp.max_gap_step}")
    console = Console()
    console.print(t)
    console.print(shown(cmp.explanation), highlight=False)
    for w in cmp.warnings:
        say("warning", w, clean=clean)
