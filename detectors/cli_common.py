"""What the commands share: option types, the options of every judging command (``ScanOptions``,
``with_scan_options``) and their ScanConfig, running a scan with a progress bar, and printing what
could not be read. Faces in their own modules (``check``, ``watch``, ``compare``, ``dashboard``)
import from here, never from ``klwatch.cli``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Optional, get_type_hints

import typer
from rich.console import Console
from rich.markup import escape

from .boundaries import BoundaryConfig
from .model import ScanResult
from .pipeline import ScanConfig, scan
from .reference_reset import ReferenceResetConfig
from .report import EXIT_USAGE
from .sources.limits import ReadLimits
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
MaxBytesOpt = Annotated[int, typer.Option("--max-read-bytes", min=1, help="Most bytes reading one SOURCE may take (files and server responses together).")]
MaxSecondsOpt = Annotated[float, typer.Option("--max-read-seconds", min=0.001, help="Most wall time reading one SOURCE may take, however its server answers.")]
JunitOpt = Annotated[Optional[Path], typer.Option("--junit", help="Also write JUnit XML (one test case per training run) to FILE.")]


@dataclass(frozen=True)
class ScanOptions:
    """The options every judging command (scan, check, watch) takes, as given on the command line.
    Each field is one typer option; ``with_scan_options`` puts them in a command's signature."""

    metric: MetricOpt = None
    intentional_reset: IntentOpt = None
    restart: RestartOpt = None
    group_by: GroupOpt = None
    lineage: LineageOpt = None
    reset_score: ResetScoreOpt = ReferenceResetConfig.reset_score
    max_read_bytes: MaxBytesOpt = ReadLimits.max_bytes
    max_read_seconds: MaxSecondsOpt = ReadLimits.max_seconds

    def config(self, *, findings: bool = True) -> ScanConfig:
        """The one configuration object the pipeline takes (exits 2 naming the file when --lineage
        cannot be read)."""
        lineage_map = None
        if self.lineage is not None:
            try:
                lineage_map = load_lineage_file(str(self.lineage))
            except (OSError, ValueError) as exc:
                err.print("[red]error[/] " + escape(f"--lineage {self.lineage}: {exc}"), highlight=False)
                raise typer.Exit(EXIT_USAGE)
        return ScanConfig(metrics=tuple(self.metric or ()), intentional_resets=tuple(self.intentional_reset or ()),
                          declared_restarts=tuple(self.restart or ()),
                          stitch=StitchConfig(group_by=self.group_by, lineage_map=lineage_map), boundaries=BoundaryConfig(),
                          reference_reset=ReferenceResetConfig(reset_score=self.reset_score), findings=findings,
                          limits=ReadLimits(max_bytes=self.max_read_bytes, max_seconds=self.max_read_seconds))


def with_scan_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give a typer command the ``ScanOptions`` options in place of its ``options: ScanOptions``
    parameter (so ``--help`` lists them there), and call it with them gathered in one ``ScanOptions``.

    Typer reads a command's options from its signature; this writes them there once instead of in
    every command that judges runs.
    """
    hints = get_type_hints(ScanOptions, include_extras=True)
    names = [f.name for f in fields(ScanOptions)]
    own = inspect.signature(command, eval_str=True)  # annotations as objects: typer takes this signature as is
    if "options" not in own.parameters:
        raise TypeError(f"{command.__name__} takes no 'options: ScanOptions' parameter")
    params: list[inspect.Parameter] = []
    for p in own.parameters.values():
        if p.name == "options":
            params += [inspect.Parameter(n, p.kind, annotation=hints[n], default=getattr(ScanOptions, n)) for n in names]
        else:
            params.append(p)

    @functools.wraps(command)
    def run(**kwargs: Any) -> None:
        """The command as typer calls it: the scan options gathered back into one ScanOptions."""
        options = ScanOptions(**{n: kwargs.pop(n) for n in names})
        command(**kwargs, options=options)

    run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params} | {"return": own.return_annotation}
    return run


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


