"""What the commands share: option types, the options of every judging command (``ScanOptions``,
``with_scan_options``) and their ScanConfig, running a scan with a progress bar, printing what
could not be read, one-line errors, and writing output files (atomically, or exit 2). Faces in their
own modules (``check``, ``watch``, ``compare``, ``dashboard``) import from here, never from
``klwatch.cli``."""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional, get_type_hints

import typer
from typer.core import TyperCommand

from .read_budget import DEFAULT_MAX_READ_BYTES
from .redact import redact_spec, scrub
from .report import EXIT_USAGE, printable, secret_free

if TYPE_CHECKING:  # the rest loads when used: a re-scan the scan cache answers needs none of it
    from rich.console import Console

    from .model import ScanResult
    from .pipeline import ScanConfig


@functools.cache
def _err() -> Console:
    """The console every face writes its stderr lines through (made on first use: rich loads then)."""
    from rich.console import Console

    # a log file (cron, CI) gets each line whole: no hard wrap at 80 columns when stderr is not a terminal
    return Console(stderr=True, soft_wrap=not sys.stderr.isatty())


def __getattr__(name: str) -> Any:
    if name == "err":  # ``from .cli_common import err``: the one stderr console
        return _err()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


SourcesArg = Annotated[list[str], typer.Argument(help="Local paths, wandb://ENTITY/PROJECT or .../RUN_ID, mlflow://HOST:PORT or .../EXPERIMENT; "
                                                       "append #PATTERN to keep matching runs.", show_default=False)]
MetricOpt = Annotated[Optional[list[str]], typer.Option("--metric", "-m", help="KL metric name or glob (repeatable).")]
IntentOpt = Annotated[Optional[list[int]], typer.Option("--intentional-reset", help="A step where the reference is reset on purpose (repeatable).")]
RestartOpt = Annotated[Optional[list[int]], typer.Option("--restart", help="A step where the run was restarted though the logs do not show it (repeatable).")]
GroupOpt = Annotated[Optional[str], typer.Option("--group-by", help="Stitch tracker runs into training runs by this config/tag key.")]
LineageOpt = Annotated[Optional[Path], typer.Option("--lineage", help='JSON file {"run name": ["ref or run-id glob", ...]} overriding stitching.')]
ResetScoreOpt = Annotated[float, typer.Option("--reset-score", min=0.0, max=1.0, help="Score at or above which a boundary is a reference reset.")]
MaxBytesOpt = Annotated[int, typer.Option("--max-read-bytes", min=1, show_default=False, help="Most bytes reading one SOURCE may take (files and server responses together); default: half the machine's memory, at most 16 GiB.")]
MaxSecondsOpt = Annotated[float, typer.Option("--max-read-seconds", min=0.001, help="Most wall time reading one SOURCE may take, however its server answers.")]
JobsOpt = Annotated[Optional[int], typer.Option(
    "--jobs", "-j", min=1, show_default=False,
    help="Worker processes reading local files and judging runs (default: the machine's core count; "
         "1: all in this process). Small scans stay in this process whatever it is.")]
DaskOpt = Annotated[Optional[str], typer.Option(
    "--dask", metavar="ADDRESS", show_default=False,
    help="Read and judge on the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://127.0.0.1:8786); "
         "its workers must see local SOURCEs at the same paths. Needs klwatch[dask].")]
NoCacheOpt = Annotated[bool, typer.Option(
    "--no-cache", help="Read every file afresh, and keep nothing in the scan cache.")]
CacheDirOpt = Annotated[Optional[Path], typer.Option(
    "--cache-dir", metavar="DIR", show_default=False,
    help="Where the scan cache lives (default: KLWATCH_CACHE_DIR, else the user's cache folder); "
         "never inside a SOURCE.")]
CacheSizeOpt = Annotated[str, typer.Option(
    "--cache-size", metavar="SIZE", help="Most the scan cache may hold (e.g. 500MB, 2GB); the least recently "
                                         "used entries go first.")]
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
    reset_score: ResetScoreOpt = 0.95
    """``ReferenceResetConfig.reset_score`` (tests/test_scan_memo.py keeps these three the library's defaults:
    written here so that parsing a command line loads no judging or reading code)."""
    max_read_bytes: MaxBytesOpt = DEFAULT_MAX_READ_BYTES
    """``ReadLimits.max_bytes``."""
    max_read_seconds: MaxSecondsOpt = 3600.0
    """``ReadLimits.max_seconds``."""
    jobs: JobsOpt = None
    dask: DaskOpt = None

    WHERE = ("jobs", "dask")
    """The options that say where the work runs, never what a scan finds."""

    def settings_text(self, *, findings: bool = True) -> str | None:
        """The options a scan's result depends on, as text for the scan cache's memo of its reports
        (every field but where the work runs, so a new option counts without a word here); None with
        --lineage (a file that may change) or --dask (a cluster to check first): those scans are not
        memoised this way."""
        if self.lineage is not None or self.dask:
            return None
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.WHERE}
        return repr(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in values.items())) + f" findings={findings}"

    def config(self, *, findings: bool = True) -> ScanConfig:
        """The one configuration object the pipeline takes (exits 2 naming the file when --lineage
        cannot be read, or the --dask scheduler when it cannot be reached: before any reading)."""
        from .boundaries import BoundaryConfig
        from .fleet_memory import CHART_POINTS
        from .parallel import ClusterUnreachable, Execution, check_cluster, default_jobs
        from .pipeline import ScanConfig
        from .reference_reset import ReferenceResetConfig
        from .sources.limits import ReadLimits
        from .stitching import StitchConfig, load_lineage_file

        lineage_map = None
        if self.lineage is not None:
            try:
                lineage_map = load_lineage_file(str(self.lineage))
            except (OSError, ValueError) as exc:
                error_exit(f"--lineage {self.lineage}: {exc}")
        execution = Execution(jobs=self.jobs or default_jobs(), dask=self.dask or None)
        if execution.dask:
            _say_klwatch_warnings()
            try:
                check_cluster(execution.dask)
            except ClusterUnreachable as exc:
                error_exit(str(exc), clean=lambda m: scrub(m, [execution.dask or ""]))
        return ScanConfig(metrics=tuple(self.metric or ()), intentional_resets=tuple(self.intentional_reset or ()),
                          declared_restarts=tuple(self.restart or ()),
                          stitch=StitchConfig(group_by=self.group_by, lineage_map=lineage_map), boundaries=BoundaryConfig(),
                          reference_reset=ReferenceResetConfig(reset_score=self.reset_score), findings=findings,
                          limits=ReadLimits(max_bytes=self.max_read_bytes, max_seconds=self.max_read_seconds),
                          execution=execution, chart_points=CHART_POINTS)


def _say_klwatch_warnings() -> None:
    """Show the pipeline's log warnings (a Dask cluster lost mid-scan) as every other warning line."""
    import logging

    handler = _say_handler()
    logger = logging.getLogger("klwatch")
    if not any(isinstance(h, handler) for h in logger.handlers):
        logger.addHandler(handler(logging.WARNING))


@functools.cache
def _say_handler() -> type:
    """A ``logging`` handler printing through ``say`` (logging loads with --dask only)."""
    import logging

    class SayHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say("error" if record.levelno >= logging.ERROR else "warning", record.getMessage())

    return SayHandler


class _Slow(Exception):
    """A value ``_quick_value`` leaves to typer's own coercion."""


_DIGITS = re.compile(r"(0|[1-9][0-9]{0,17})")
_DECIMAL = re.compile(r"[0-9]{1,15}(\.[0-9]{1,15})?")
_QUICK_TYPES = (str, bool, int, float, Path, list[str], list[int])


def _quick_value(annotation: Any, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    """``value`` as typer's own coercion gives it, for the values that leave no doubt: a string for a
    ``str``, a bool for a ``bool``; plain digits (or the default, already a number) within the option's bounds for an ``int``
    or a ``float``; a non-empty path for a ``Path`` that passes typer's own checks; lists of those.
    Anything else raises ``_Slow`` (a sign, an exponent, spaces, a bound crossed: typer says it)."""
    if annotation is str or annotation is bool:
        if type(value) is annotation:
            return value
    elif annotation is int or annotation is float:
        if type(value) is annotation:
            number = value
        elif type(value) is str and (_DIGITS if annotation is int else _DECIMAL).fullmatch(value):
            number = annotation(value)
        else:
            raise _Slow
        if (info.min is None or number >= info.min) and (info.max is None or number <= info.max):
            return number
    elif annotation is Path:
        if isinstance(value, Path) or (type(value) is str and value):
            from typer._param_types import coerce_cli_path

            try:
                return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
            except Exception:  # noqa: BLE001 - typer's own coercion says what is wrong, in its words
                raise _Slow from None
    elif annotation in (list[str], list[int]) and isinstance(value, (list, tuple)):
        item = annotation.__args__[0]
        return [_quick_value(item, info, v, param, ctx) for v in value]
    raise _Slow


def quick_coercion(params: list[Any]) -> None:
    """Give typer's parameters of the plain types klwatch's options have a coercion that settles the
    values that leave no doubt in Python (``_quick_value``) and hands every other to typer's own
    (Pydantic), which then loads: a command line of plain values costs no Pydantic import or schema
    (tens of milliseconds of every command's start). The same values come out either way
    (tests/test_scan_memo.py compares them). Nothing is changed if typer's internals are not as expected."""
    quick = _quick_runtime_param()
    if quick is None:
        return
    for p in params:
        desc = getattr(p, "type_descriptor", None)
        if getattr(p, "_runtime_param", "") is not None or desc is None:
            continue
        info = desc.parameter_info
        if desc.file_annotation is None and desc.annotation in _QUICK_TYPES and info.parser is None and not info.clamp:
            p._runtime_param = quick(parameter_info=info, annotation=desc.annotation, descriptor=desc)


@functools.cache
def _quick_runtime_param() -> type | None:
    """typer's runtime coercion of a parameter, trying ``_quick_value`` first (None with a typer
    whose internals differ: its own coercion is then left alone)."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
    except ImportError:
        return None

    @dataclass(frozen=True)
    class QuickRuntimeParam(RuntimeParam):  # type: ignore[misc, valid-type]
        descriptor: Any = None

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                return _quick_value(self.annotation, self.parameter_info, value, param, ctx)
            except _Slow:
                return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)

    return QuickRuntimeParam


class QuickCoercion:
    """A typer command or group whose parameters, ``--help`` included, are coerced by ``quick_coercion``."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        quick_coercion(params)
        readable_metavars(params)
        return params


METAVARS = {"sources": "SOURCE", "control": "CONTROL", "resumed": "RESUMED", "metric": "NAME",
            "intentional_reset": "STEP", "restart": "STEP", "from_step": "STEP", "group_by": "KEY", "lineage": "FILE",
            "reset_score": "SCORE", "max_read_bytes": "BYTES", "max_read_seconds": "SECONDS", "jobs": "N",
            "fmt": "FORMAT", "output": "FILE", "junit": "FILE", "fail_on": "DETECTOR", "every": "SECONDS",
            "state_path": "FILE", "webhook": "URL", "dashboard_url": "URL", "port": "PORT", "address": "ADDRESS",
            "allow_add": "ROOT_OR_HOST", "sigmas": "SIGMAS", "window": "N"}
"""What ``--help`` shows a value as (a word, as Unix usage has it; typer would show its Python type: ``<list[str]>``)."""


def readable_metavars(params: list[Any]) -> None:
    """Give each parameter without a metavar of its own the word ``METAVARS`` has for it (its name, in capitals,
    for one not listed); flags take no value and get none."""
    for p in params:
        if getattr(p, "metavar", None) is None and not getattr(p, "is_flag", False) and p.name:
            p.metavar = METAVARS.get(p.name, p.name.upper())
        if getattr(p, "param_type_name", "") == "argument" and hasattr(p, "_usage_display_name"):
            word = p.metavar + ("..." if p.nargs != 1 else "")
            shown = word if p.required else f"[{word}]"
            p._usage_display_name = lambda shown=shown: shown  # SOURCE..., not typer's {SOURCE}...
            p.display_type_rich = lambda ctx: None  # nor its Python type after the name


class KlwatchCommand(QuickCoercion, TyperCommand):
    """Every klwatch command: typer's, its options coerced by ``quick_coercion``."""


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


def open_cache(sources: list[str], *, no_cache: bool, cache_dir: Path | None, cache_size: str) -> Any:
    """The scan cache the options ask for (a ``klwatch.scan_cache.ScanCache``), or None: with
    ``--no-cache``, or (with a warning saying why) when its folder cannot be used or lies inside a
    SOURCE, where it would be written into the user's run folders. A bad ``--cache-size`` exits 2."""
    from .scan_cache import CacheUnusable, ScanCache, default_cache_dir, parse_size
    from .source_names import REMOTE_PREFIXES, split_pattern

    try:
        max_bytes = parse_size(cache_size)
    except ValueError as exc:
        error_exit(f"--cache-size: {exc}")
    if no_cache:
        return None
    folder = (cache_dir.expanduser() if cache_dir is not None else default_cache_dir()).absolute()
    for spec in sources:
        base, _ = split_pattern(spec)
        if base.startswith(REMOTE_PREFIXES):
            continue
        root = Path(base).expanduser().absolute()
        if root.is_dir() and (folder == root or root in folder.parents):
            say("warning", f"the scan cache folder {folder} lies inside the SOURCE {spec}: not used (it would be "
                           "written into your run folders; give --cache-dir elsewhere)")
            return None
    try:
        return ScanCache.open(folder, max_bytes=max_bytes)
    except CacheUnusable as exc:
        say("warning", f"scan cache not used: {exc}")
        return None


def run_scan(sources: list[str], config: ScanConfig, *, show_progress: bool = True, cache: Any = None,
             memo: Any = None) -> ScanResult:
    """Scan with a progress bar on stderr when it takes more than a moment; the bar names each SOURCE
    as it may be shown (no credentials, no control characters, no markup). Through ``cache`` (a
    ``ScanCache``) when given: an unchanged scan is reused whole, unchanged files are not read again.
    The result is kept in ``memo`` too when given (a ``klwatch.scan_cache.ReportMemo`` taken before
    the scan, which ``scan_reports`` serves)."""
    if not sources:
        error_exit("give at least one SOURCE")
    key = cache.scan_key(sources, config) if cache is not None else None
    reused = cache.load_scan(key) if key is not None else None
    if reused is not None:
        if memo is not None:
            memo.store(reused)
        return reused
    from .pipeline import scan

    # on a Dask cluster the files are read on its machines: the cache folder is this machine's
    read_unit = cache.read_unit if cache is not None and not config.execution.dask else None
    err = _err()
    if not show_progress or not err.is_terminal:
        result = scan(sources, config=config, read_unit=read_unit, judge_cache=cache)
    else:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        def shown(spec: str) -> str:
            return _escape(printable(scrub(redact_spec(spec))))

        with Progress(SpinnerColumn(), TextColumn("reading {task.description}"), TimeElapsedColumn(),
                      console=err, transient=True) as progress:
            task = progress.add_task("", total=None)
            result = scan(sources, config=config, read_unit=read_unit, judge_cache=cache,
                          progress=lambda spec: progress.update(task, description=shown(spec)))
    if cache is not None:
        if key is not None and not result.any_error:  # a read bound passed (time) need not pass again
            cache.store_scan(key, result)
        if memo is not None:
            memo.store(result)
        cache.prune()
    return result


def scan_reports(sources: list[str], options: ScanOptions, *, cache: Any, config: ScanConfig | None = None) -> Any:
    """What ``klwatch scan`` reports on: a scan (``run_scan``), or, when the scan cache holds the memo
    of one made with the same options, klwatch code and fleet, unchanged down to every file's size,
    times and ends (``ScanCache.report_memo``), that scan's view as its reports read it
    (``klwatch.report.ScanView``): the same output, without loading what reads or judges runs.
    ``config``: ``options.config()`` when the caller made it already."""
    settings = options.settings_text() if cache is not None and sources else None
    memo = cache.report_memo(sources, settings, max_seconds=options.max_read_seconds) if settings else None
    view = memo.load() if memo is not None else None
    if view is not None:
        return view
    return run_scan(sources, config or options.config(), cache=cache, memo=memo)


def say(level: str, message: str, *, clean: Callable[[str], str] = scrub) -> None:
    """One ``error`` or ``warning`` line on stderr, as every face prints one: secrets masked by
    ``clean`` (the environment's and any URL's userinfo by default), control characters and CI
    commands shown inert (``printable``), never taken as markup, never wrapped (a wrapped line could
    start with a name's ``::``)."""
    style = "red" if level == "error" else "yellow"
    _err().print(f"[{style}]{level}[/] " + _escape(printable(clean(message))), highlight=False, soft_wrap=True)


def report_errors(result: ScanResult | Any) -> None:
    """Every unreadable source or run on stderr, naming it and why (a name's control characters shown
    as escapes, so each message stays its own line; no SOURCE's credentials)."""
    clean = secret_free(result)
    for s in result.sources:
        for w in s.warnings:
            say("warning", w, clean=clean)
        for e in s.errors:
            say("error", e.message, clean=clean)
        if s.unmatched:
            say("error", s.unmatched, clean=clean)
    for r in result.results:
        if r.error:
            msg = r.error if r.error.startswith(r.lineage.name) else f"{r.lineage.name}: {r.error}"
            say("error", msg, clean=clean)
        for seg in r.lineage.segments:
            for w in seg.warnings:
                say("warning", w, clean=clean)




# ------------------------------------------------------------------------- errors and output files


def error_exit(message: str, code: int = EXIT_USAGE, *, clean: Callable[[str], str] = scrub) -> NoReturn:
    """``error MESSAGE`` as one line on stderr (``say``) and exit ``code`` (2 by default)."""
    say("error", message, clean=clean)
    raise typer.Exit(code)


def tolerant_std_streams() -> None:
    """Let stdout and stderr show what they cannot encode (a non-UTF-8 folder name, held as lone
    surrogates) as backslash escapes instead of raising mid-report. Streams already tolerant (the
    C locale's surrogateescape writes the original bytes back) are left as they are."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _write_target(path: Path) -> tuple[Path, bool]:
    """Where writing ``path`` lands, and whether in place: a symlink's target (the link is kept); a
    device or pipe (``/dev/stdout``) is written directly, since a rename would replace it."""
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "it is a folder, not a file", str(path))
    if st is not None and not stat.S_ISREG(st.st_mode):
        return path, True
    return Path(os.path.realpath(path)), False


def _temp_beside(target: Path) -> tuple[int, Path]:
    """A new file in ``target``'s folder (same file system, so the rename is atomic), created with
    the umask's mode; a short name, since ``target``'s may already be at the length limit."""
    tmp = target.parent / f".klwatch-{os.urandom(6).hex()}.tmp"  # secrets.token_hex(6), without its imports
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp


def probe_writable(path: Path) -> None:
    """Raise the OSError writing ``path`` would raise, by creating and removing a file beside it (making the
    folders it is to go in, as ``--state`` does): cheap, so a bad output path fails before a long scan rather
    than after it."""
    target, in_place = _write_target(path)
    if in_place or target.exists():
        if not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))
        if in_place:
            return
    target.parent.mkdir(parents=True, exist_ok=True)  # as --state: a folder that does not exist yet is made
    fd, tmp = _temp_beside(target)
    os.close(fd)
    os.unlink(tmp)


def write_atomically(path: Path, text: str | Iterable[str]) -> None:
    """Write ``text`` (or its pieces, in order: a fleet's report one run at a time) as UTF-8 to ``path``
    all at once: into a temporary file beside it, then renamed over it, so a failed write leaves the old
    file (or none), never half a file. Characters UTF-8 cannot hold (lone surrogates) are written as
    backslash escapes."""
    pieces = [text] if isinstance(text, str) else text
    target, in_place = _write_target(path)
    if in_place:
        with open(target, "wb") as fh:
            for piece in pieces:
                fh.write(piece.encode("utf-8", "backslashreplace"))
        return
    mode = stat.S_IMODE(os.stat(target).st_mode) if target.exists() else None
    fd, tmp = _temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            for piece in pieces:
                fh.write(piece.encode("utf-8", "backslashreplace"))
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def why_unwritable(path: Path, exc: OSError) -> str:
    """What to tell a user about ``exc``: the folder that is missing or is a file, else the system's
    own reason (permission denied, read-only file system, no space left)."""
    if exc.errno == errno.EISDIR:
        return "it is a folder, not a file"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):  # EEXIST: making the folders met a file of that name
        blocker = next((p for p in Path(path).absolute().parents if p.exists() and not p.is_dir()), None)
        return f"{blocker} is a file, not a folder" if blocker else "a part of the path is not a folder"
    folder = Path(path).absolute().parent
    if exc.errno == errno.ENOENT:
        return f"the folder {folder} does not exist" if not folder.exists() else f"no file can be created in {folder}"
    return exc.strerror or str(exc)


def check_outputs(outputs: dict[str, Path | None]) -> None:
    """Exit 2 naming the first output (``{flag: path}``) that cannot be written, before any scan."""
    for flag, path in outputs.items():
        if path is None:
            continue
        try:
            probe_writable(path)
        except OSError as exc:
            error_exit(f"cannot write {flag} {path}: {why_unwritable(path, exc)}")


def write_output(path: Path, text: str | Iterable[str], *, flag: str) -> None:
    """Write an output file (``--junit``, ``-o``) atomically, or exit 2 naming it and why: never a
    traceback, never half a file, never exit 1 (which CI reads as "a reset was found")."""
    try:
        write_atomically(path, text)
    except OSError as exc:
        error_exit(f"cannot write {flag} {path}: {why_unwritable(path, exc)}")
