"""What the commands share: option types, turning options into a ScanConfig, running a scan with a
progress bar, and printing what could not be read. Faces in their own modules (``check``, ``watch``,
``compare``, ``dashboard``) import from here, never from ``detectors.cli``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from .boundaries import BoundaryConfig
from .pipeline import ScanConfig, ScanResult, scan
from .reference_reset import ReferenceResetConfig
from .report import EXIT_USAGE
from .stitching import StitchConfig, load_lineage_file

err = Console(stderr=True)

SourcesArg = Annotated[list[str], typer.Argument(help="Local paths, wandb://ENTITY/PROJECT or .../RUN_ID, mlflow://HOST:PORT or .../EXPERIMENT; "
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
            err.print("[red]error[/] " + escape(f"--lineage {lineage}: {exc}"), highlight=False)
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
        for w in s.warnings:
            err.print("[yellow]warning[/] " + escape(w), highlight=False)
        for e in s.errors:
            err.print("[red]error[/] " + escape(f"{e.message}"), highlight=False)
    for r in result.results:
        if r.error:
            msg = r.error if r.error.startswith(r.lineage.name) else f"{r.lineage.name}: {r.error}"
            err.print("[red]error[/] " + escape(msg), highlight=False)
        for seg in r.lineage.segments:
            for w in seg.warnings:
                err.print("[yellow]warning[/] " + escape(f"{w}"), highlight=False)


