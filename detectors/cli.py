"""The ``klwatch`` command line (SPEC.md "Faces"): a thin face over ``detectors.pipeline``.

The exit code is the verdict (0 clean, 1 reset, 2 bad usage / nothing readable, 3 partly unreadable),
so CI can gate on it without parsing output.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from . import __version__
from .boundaries import BoundaryConfig
from .pipeline import ScanConfig, ScanResult, scan
from .reference_reset import ReferenceResetConfig
from .report import EXIT_USAGE, exit_code, junit_xml, render_markdown, render_table, to_json
from .stitching import StitchConfig, load_lineage_file

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Catch silent bugs at checkpoint/resume boundaries of RL post-training runs.")
err = Console(stderr=True)

SourcesArg = Annotated[list[str], typer.Argument(help="Local paths, wandb://ENTITY/PROJECT[/RUN], mlflow://HOST:PORT[/EXPERIMENT]; "
                                                       "append #PATTERN to keep matching runs.", show_default=False)]
MetricOpt = Annotated[Optional[list[str]], typer.Option("--metric", "-m", help="KL metric name or glob (repeatable).")]
IntentOpt = Annotated[Optional[list[int]], typer.Option("--intentional-reset", help="A step where the reference is reset on purpose (repeatable).")]
RestartOpt = Annotated[Optional[list[int]], typer.Option("--restart", help="A step where the run was restarted though the logs do not show it (repeatable).")]
GroupOpt = Annotated[Optional[str], typer.Option("--group-by", help="Stitch tracker runs into training runs by this config/tag key.")]
LineageOpt = Annotated[Optional[Path], typer.Option("--lineage", help='JSON file {"run name": ["ref or run-id glob", ...]} overriding stitching.')]
ResetScoreOpt = Annotated[float, typer.Option("--reset-score", min=0.0, max=1.0, help="Score at or above which a boundary is a reference reset.")]
JunitOpt = Annotated[Optional[Path], typer.Option("--junit", help="Also write JUnit XML (one test case per training run) to FILE.")]


def build_config(metric: list[str] | None, intentional_reset: list[int] | None, restart: list[int] | None,
                 group_by: str | None, lineage: Path | None, reset_score: float, findings: bool = True) -> ScanConfig:
    """Turn command-line options into the one configuration object the pipeline takes."""
    lineage_map = None
    if lineage is not None:
        try:
            lineage_map = load_lineage_file(str(lineage))
        except (OSError, ValueError) as exc:
            err.print(f"[red]error[/] --lineage {lineage}: {exc}")
            raise typer.Exit(EXIT_USAGE)
    rr = ReferenceResetConfig(reset_score=reset_score)
    return ScanConfig(metrics=tuple(metric or ()), intentional_resets=tuple(intentional_reset or ()),
                      declared_restarts=tuple(restart or ()), stitch=StitchConfig(group_by=group_by, lineage_map=lineage_map),
                      boundaries=BoundaryConfig(), reference_reset=rr, findings=findings)


def run_scan(sources: list[str], config: ScanConfig, *, show_progress: bool = True) -> ScanResult:
    """Scan with a progress bar on stderr when it takes more than a moment."""
    if not sources:
        err.print("[red]error[/] give at least one SOURCE")
        raise typer.Exit(EXIT_USAGE)
    if not show_progress or not err.is_terminal:
        return scan(sources, config=config)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("reading {task.description}"), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("", total=None)
        return scan(sources, config=config, progress=lambda spec: progress.update(task, description=spec))


def report_errors(result: ScanResult) -> None:
    """Every unreadable source or run on stderr, naming it and why."""
    for s in result.sources:
        for e in s.errors:
            err.print(f"[red]error[/] {e.message}", highlight=False)
    for r in result.results:
        if r.error:
            err.print(f"[red]error[/] {r.lineage.name}: {r.error}", highlight=False)
        for seg in r.lineage.segments:
            for w in seg.warnings:
                err.print(f"[yellow]warning[/] {w}", highlight=False)


@app.command("scan")
def scan_command(
    sources: SourcesArg,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, json or markdown.")] = "table",
    metric: MetricOpt = None,
    intentional_reset: IntentOpt = None,
    restart: RestartOpt = None,
    group_by: GroupOpt = None,
    lineage: LineageOpt = None,
    junit: JunitOpt = None,
    reset_score: ResetScoreOpt = ReferenceResetConfig.reset_score,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to FILE instead of stdout.")] = None,
) -> None:
    """Read every run in the sources, rebuild each training run's resume history, judge every resume boundary."""
    if fmt not in ("table", "json", "markdown"):
        err.print(f"[red]error[/] --format must be table, json or markdown, not {fmt!r}")
        raise typer.Exit(EXIT_USAGE)
    config = build_config(metric, intentional_reset, restart, group_by, lineage, reset_score)
    result = run_scan(sources, config)
    report_errors(result)
    if fmt == "json":
        text = to_json(result) + "\n"
    elif fmt == "markdown":
        text = render_markdown(result)
    else:
        text = None
    if output is not None:
        if text is None:
            from io import StringIO

            buf = StringIO()
            render_table(result, Console(file=buf, width=160, force_terminal=False))
            text = buf.getvalue()
        output.write_text(text)
    elif text is not None:
        sys.stdout.write(text)
    else:
        render_table(result, Console())
    if junit is not None:
        junit.write_text(junit_xml(result))
    raise typer.Exit(exit_code(result))


def _register_optional_commands() -> None:
    """Faces that live in their own modules register themselves here (check, watch, compare, dashboard)."""
    import importlib

    for module, name in (("detectors.ci", "check"), ("detectors.watch", "watch"),
                         ("detectors.compare", "compare"), ("detectors.dashboard_cli", "dashboard")):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            raise
        app.command(name)(getattr(mod, f"{name}_command"))


def version_callback(value: bool) -> None:
    if value:
        print(f"klwatch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """klwatch: the KL reference reset and the other bugs that live at checkpoint/resume boundaries."""


_register_optional_commands()


def main() -> None:
    """Console-script entry point; typer's usage errors exit 2 as SPEC.md says."""
    app()


if __name__ == "__main__":
    main()
