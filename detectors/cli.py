"""The ``klwatch`` command line (SPEC.md "Faces"): a thin face over ``klwatch.pipeline``.

The exit code is the verdict (0 clean, 1 reset, 2 bad usage / nothing readable, 3 partly unreadable),
so CI can gate on it without parsing output.
"""

from __future__ import annotations

import importlib
import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from . import __version__
from .cli_common import (CacheDirOpt, CacheSizeOpt, JunitOpt, KlwatchCommand, NoCacheOpt, ScanOptions, SourcesArg,
                         QuickCoercion, check_outputs, error_exit, open_cache, report_errors, scan_reports,
                         tolerant_std_streams, with_scan_options, write_output)
from .redact import scrub
from .report import exit_code, json_chunks, junit_xml, printable, render_markdown, render_table

if TYPE_CHECKING:
    from .model import ScanResult


UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
"""The usage error of the click typer runs on (its own copy in typer 0.29, click itself before)."""


FACES = {"check": ("ci", "check_command"), "watch": ("watch", "watch_command"),
         "compare": ("compare", "compare_command"), "dashboard": ("dashboard_cli", "dashboard_command")}
"""Faces that live in their own modules, in the order ``--help`` lists them (after ``scan``): each module
is imported when its command is run or listed, so ``klwatch scan`` loads none of them. They always ship
with klwatch: a failing import is a bug to see, not a command to hide."""


def _face_command(name: str) -> Any:
    """The click command of a face, built as ``app.command(name)`` would have built it with the others."""
    module, function = FACES[name]
    command = getattr(importlib.import_module(f".{module}", __package__), function)
    app.command(name, cls=KlwatchCommand)(command)
    info = app.registered_commands.pop()
    return typer.main.get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                            rich_markup_mode=app.rich_markup_mode)


class _Commands(MutableMapping):
    """The group's commands by name, in order: the faces' built on first use (``_face_command``)."""

    def __init__(self, built: MutableMapping[str, Any], later: dict[str, Any], build: Callable[[str], Any]) -> None:
        self._built = dict(built)
        self._order = [*self._built, *(n for n in later if n not in self._built)]
        self._build = build

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in self._order:
                raise KeyError(name)
            self._built[name] = self._build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command
        if name not in self._order:
            self._order.append(name)

    def __delitem__(self, name: str) -> None:
        self._order.remove(name)
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._order


class KlwatchGroup(QuickCoercion, TyperGroup):
    """The command group: a usage error that quotes an argument (``Got unexpected extra argument
    (mlflow://user:PASSWORD@...)``) shows it as every other error does, scrubbed and printable. The
    faces of ``FACES`` are its commands too, loaded when used."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self.commands, FACES, _face_command)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            exc.message = printable(scrub(exc.message))
            raise


app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, cls=KlwatchGroup,
                  help="Catch silent bugs at checkpoint/resume boundaries of RL post-training runs.")


@app.command("scan", cls=KlwatchCommand)
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
    # options the scan cache's memo cannot stand for (--lineage, --dask) are checked first, as ever
    config = options.config() if options.settings_text() is None else None
    check_outputs({"--output": output, "--junit": junit})
    cache = open_cache(sources, no_cache=no_cache, cache_dir=cache_dir, cache_size=cache_size)
    result = scan_reports(sources, options, cache=cache, config=config)
    report_errors(result)
    if output is not None:
        write_output(output, _report_text(result, fmt), flag="--output")
    elif fmt == "table" and result.nothing_read:
        pass  # nothing could be read: the errors above say why, no empty table under them
    elif fmt == "table":
        # piped into a file or a CI log: do not squeeze the table into 80 columns
        from rich.console import Console

        wide = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
        render_table(result, Console(width=wide))
    else:
        sys.stdout.writelines(_report_text(result, fmt))
    if junit is not None:
        write_output(junit, junit_xml(result), flag="--junit")
    raise typer.Exit(exit_code(result))


def _report_text(result: ScanResult, fmt: str) -> str | Iterable[str]:
    """The report in ``fmt`` as text (the table as 160 plain columns, for a file); JSON in pieces, one
    training run at a time (``report.json_chunks``: a fleet's report is never held whole)."""
    if fmt == "json":
        return itertools.chain(json_chunks(result), ["\n"])
    if fmt == "markdown":
        return render_markdown(result)
    from rich.console import Console

    buf = StringIO()
    render_table(result, Console(file=buf, width=160, force_terminal=False))
    return buf.getvalue()


def installed_version() -> str:
    """The version the installed distribution's metadata records: what pip, ``pip show`` and a pinned
    ``uses: ...@vX.Y.Z`` see. A source tree run without installing has no metadata: its ``__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("klwatch")
    except PackageNotFoundError:
        return __version__


def version_callback(value: bool) -> None:
    """``--version``: print it and stop before any command runs."""
    if value:
        print(f"klwatch {installed_version()}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """klwatch: the KL reference reset and the other bugs that live at checkpoint/resume boundaries."""


def main() -> None:
    """Console-script entry point; typer's usage errors exit 2 as SPEC.md says."""
    tolerant_std_streams()
    app()


if __name__ == "__main__":
    main()
