"""The ``klwatch`` command line (SPEC.md "Faces"): a thin face over ``klwatch.pipeline``.

The exit code is the verdict (0 clean, 1 reset, 2 bad usage / nothing readable, 3 partly unreadable),
so CI can gate on it without parsing output.
"""

from __future__ import annotations

import os
import sys
from io import StringIO
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from . import __version__
from .cli_common import (CacheDirOpt, CacheSizeOpt, JunitOpt, NoCacheOpt, ScanOptions, SourcesArg, check_outputs,
                         error_exit, open_cache, report_errors, run_scan, tolerant_std_streams, with_scan_options,
                         write_output)
from .model import ScanResult
from .redact import scrub
from .report import exit_code, junit_xml, printable, render_markdown, render_table, to_json


UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
"""The usage error of the click typer runs on (its own copy in typer 0.29, click itself before)."""


class KlwatchGroup(TyperGroup):
    """The command group: a usage error that quotes an argument (``Got unexpected extra argument
    (mlflow://user:PASSWORD@...)``) shows it as every other error does, scrubbed and printable."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            exc.message = printable(scrub(exc.message))
            raise


app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, cls=KlwatchGroup,
                  help="Catch silent bugs at checkpoint/resume boundaries of RL post-training runs.")


@app.command("scan")
@with_scan_options
def scan_command(
    sources: SourcesArg,
    *,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, json or markdown.")] = "table",
    options: ScanOptions,
    junit: JunitOpt = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to FILE instead of stdout.")] = None,
    no_cache: NoCacheOpt = False,
    cache_dir: CacheDirOpt = None,
    cache_size: CacheSizeOpt = "2GB",
) -> None:
    """Read every run in the sources, rebuild each training run's resume history, judge every resume boundary."""
    if fmt not in ("table", "json", "markdown"):
        error_exit(f"--format must be table, json or markdown, not {fmt!r}")
    config = options.config()
    check_outputs({"--output": output, "--junit": junit})
    cache = open_cache(sources, no_cache=no_cache, cache_dir=cache_dir, cache_size=cache_size)
    result = run_scan(sources, config, cache=cache)
    report_errors(result)
    if output is not None:
        write_output(output, _report_text(result, fmt), flag="--output")
    elif fmt == "table":
        # piped into a file or a CI log: do not squeeze the table into 80 columns
        wide = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
        render_table(result, Console(width=wide))
    else:
        sys.stdout.write(_report_text(result, fmt))
    if junit is not None:
        write_output(junit, junit_xml(result), flag="--junit")
    raise typer.Exit(exit_code(result))


def _report_text(result: ScanResult, fmt: str) -> str:
    """The report in ``fmt`` as text (the table as 160 plain columns, for a file)."""
    if fmt == "json":
        return to_json(result) + "\n"
    if fmt == "markdown":
        return render_markdown(result)
    buf = StringIO()
    render_table(result, Console(file=buf, width=160, force_terminal=False))
    return buf.getvalue()


def _register_commands() -> None:
    """Faces that live in their own modules, registered in the order ``--help`` lists them. They always
    ship with klwatch: a failing import here is a bug to see, not a command to hide."""
    from .ci import check_command
    from .compare import compare_command
    from .dashboard_cli import dashboard_command
    from .watch import watch_command

    for name, command in (("check", check_command), ("watch", watch_command), ("compare", compare_command),
                          ("dashboard", dashboard_command)):
        app.command(name)(command)


def version_callback(value: bool) -> None:
    """``--version``: print it and stop before any command runs."""
    if value:
        print(f"klwatch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """klwatch: the KL reference reset and the other bugs that live at checkpoint/resume boundaries."""


_register_commands()


def main() -> None:
    """Console-script entry point; typer's usage errors exit 2 as SPEC.md says."""
    tolerant_std_streams()
    app()


if __name__ == "__main__":
    main()
