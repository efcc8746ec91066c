"""The scan cache's memo of a whole scan as its reports read it (``ScanCache.report_memo``,
``klwatch.report.ScanView``) and the quick start of the command line (faces loaded when used, plain
option values coerced without Pydantic): a re-scan of an unchanged fleet gives the very output a fresh
scan gives, and loads nothing that reads or judges runs. No timings here: what is loaded, and what
comes out, is what is checked."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tb_runs import write_run

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"
CLI = "import sys; from klwatch.cli import main; sys.argv[0] = 'klwatch'; main()"


def klwatch(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "GITHUB_ACTIONS": "", **(env or {})})


def undated(text: str) -> str:
    import re

    return re.sub(r'"generated_at": "[^"]*"', '"generated_at": "-"', text)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> Path:
    """Runs that read with warnings (a truncated event file, a W&B run folder without its log, a FIFO
    named like an event file, a name with a control character): what a memo must say again."""
    root = tmp_path_factory.mktemp("damaged")
    write_run(root / "grpo-buggy", resumes=[40], buggy=True)
    write_run(root / "grpo-ok", resumes=[40], buggy=False)
    write_run(root / "odd\x1b[31mname", resumes=[30], buggy=False)
    event = sorted((root / "grpo-ok").rglob("events.out.tfevents*"))[-1]
    with open(event, "r+b") as f:
        f.truncate(event.stat().st_size - 7)
    (root / "run-20240101_120000-abc123").mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "grpo-ok" / "events.out.tfevents.99.host.fifo.0")
    return root


# ----------------------------------------------------------------------------- the same output


def _outputs(result) -> dict[str, object]:
    """Every output ``klwatch scan`` makes of a result: the reports, JUnit, exit code, stderr lines."""
    from rich.console import Console

    from klwatch.cli_common import report_errors
    from klwatch.report import exit_code, junit_xml, render_markdown, render_table, to_json

    table = io.StringIO()
    render_table(result, Console(file=table, width=160, force_terminal=False))
    return {"json": to_json(result), "markdown": render_markdown(result), "table": table.getvalue(),
            "junit": junit_xml(result), "exit": exit_code(result), "stderr": _stderr_of(report_errors, result)}


def _stderr_of(fn, *args) -> str:
    import klwatch.cli_common as cc

    console = cc._err()
    console.begin_capture()
    try:
        fn(*args)
    finally:
        text = console.end_capture()
    return text


@pytest.mark.parametrize("sub", ["tensorboard", "wandb", "mlflow", "trl", "negatives", "damaged"])
def test_a_scan_view_renders_every_output_as_the_scan_does(sub: str, damaged: Path, monkeypatch) -> None:
    """The memo keeps ``scan_view`` as JSON; what it loads back renders byte for byte what the result
    does, warnings and exit code included, with secrets masked as the environment says when shown."""
    from klwatch.pipeline import ScanConfig, scan
    from klwatch.report import ScanView, scan_view, view_json

    spec = str(damaged if sub == "damaged" else SAMPLES / sub)
    result = scan([spec], config=ScanConfig())
    view = ScanView.from_data(json.loads(view_json(scan_view(result))), generated_at=result.generated_at)
    assert _outputs(view) == _outputs(result)
    name = result.results[0].lineage.name
    monkeypatch.setenv("HF_TOKEN", name)  # a secret that shows up in a name: masked in both alike
    assert _outputs(view) == _outputs(result)
    assert name not in _outputs(view)["json"]


def test_a_scan_view_prints_the_json_runs_it_kept_until_the_environments_secrets_change(monkeypatch) -> None:
    """A memo's re-scan prints each run's JSON as the scan rendered it (no run is rendered again), but
    only under the secrets it was masked against: a new credential in the environment renders anew."""
    import klwatch.report as report
    from klwatch.pipeline import ScanConfig, scan

    result = scan([str(SAMPLES / "tensorboard")], config=ScanConfig())
    fresh = report.to_json(result)
    view = report.ScanView.from_data(json.loads(report.view_json(report.scan_view(result))),
                                     generated_at=result.generated_at)

    def rendered_again(r):
        raise AssertionError("a kept run was rendered again")

    monkeypatch.setattr(report, "lineage_dict", rendered_again)
    assert report.to_json(view) == fresh
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    with pytest.raises(AssertionError, match="rendered again"):
        report.to_json(view)


def test_a_rescan_from_the_memo_gives_what_a_fresh_scan_gives(tmp_path: Path, damaged: Path) -> None:
    """As a user runs it: ``--no-cache``, a first scan (fills the memo) and a second (served by it) give
    the same report in every format, the same JUnit file, warnings and exit code."""
    runs = tmp_path / "runs"
    shutil.copytree(damaged, runs, symlinks=True, ignore=lambda d, names: [n for n in names if ".fifo." in n])
    for fmt in ("table", "json", "markdown"):
        got = []
        for extra in (["--no-cache"], [], []):
            junit = tmp_path / f"junit-{fmt}-{len(got)}.xml"
            out = klwatch("scan", runs, "--format", fmt, "--junit", junit, *extra)
            got.append((out.returncode, undated(out.stdout), out.stderr, junit.read_text(encoding="utf-8")))
        assert got[0] == got[1] == got[2], fmt
        assert "warning" in got[0][2] and got[0][0] == 1
    reports = list((Path(os.environ["KLWATCH_CACHE_DIR"]) / "reports").rglob("*.json"))
    assert reports  # (one, unless klwatch's code changed meanwhile: each code version its own memo)


HEAVY = ["numpy", "scipy", "pandas", "pyarrow", "pydantic", "google.protobuf", "klwatch.model", "klwatch.sources",
         "klwatch.pipeline", "klwatch.boundaries", "klwatch.reference_reset", "klwatch.stitching",
         "klwatch.findings", "klwatch.parallel", "klwatch.ci", "klwatch.watch", "klwatch.compare",
         "klwatch.dashboard_cli", "rich"]


def _loaded_after(args: list[str]) -> tuple[int, list[str]]:
    code = (f"import sys; from klwatch.cli import main; sys.argv = ['klwatch', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code)\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    *_, rc, loaded = out.stdout.splitlines()
    return int(rc), json.loads(loaded.replace("'", '"'))


def test_a_rescan_from_the_memo_loads_nothing_that_reads_or_judges(tmp_path: Path) -> None:
    """The warm path of ``klwatch scan``: no numpy, no reader, no judge, no other face, no Pydantic
    (typer's coercion of plain values) and, for a JSON report, no rich; a miss loads them all."""
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard", runs)
    args = ["scan", str(runs), "--format", "json", "-o", str(tmp_path / "r.json"), "--reset-score", "0.9"]
    rc, cold = _loaded_after(args)
    assert "klwatch.pipeline" in cold and "numpy" in cold
    first = undated((tmp_path / "r.json").read_text(encoding="utf-8"))
    rc2, warm = _loaded_after(args)
    assert (rc2, warm) == (rc, [])
    assert undated((tmp_path / "r.json").read_text(encoding="utf-8")) == first


def test_a_changed_option_or_source_is_another_memo(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard", runs)
    base = ["scan", str(runs), "--format", "json"]
    assert _loaded_after(base)[1] and _loaded_after(base)[1] == []
    assert "klwatch.pipeline" in _loaded_after([*base, "--reset-score", "0.5"])[1]
    assert "klwatch.pipeline" in _loaded_after([*base, f"{runs}#grpo*"])[1]
    assert _loaded_after([*base, "--jobs", "1"])[1] == []  # where the work runs changes nothing found


# ------------------------------------------------------------------------ what keys and checks it


def _tree(root: Path) -> Path:
    write_run(root / "a", resumes=[30], buggy=False)
    (root / "a" / "notes.txt").write_text("hello", encoding="utf-8")
    (root / "b").mkdir()
    (root / "b" / "train.csv").write_text("step,kl\n1,0.1\n", encoding="utf-8")
    return root


def _mutations(root: Path):
    csv = root / "b" / "train.csv"

    def event() -> Path:
        return sorted((root / "a").rglob("events.out.tfevents*"))[0]

    def rewrite_keeping_size_and_mtime(p: Path) -> None:
        st = p.stat()
        data = bytearray(p.read_bytes())
        data[-1] ^= 1
        p.write_bytes(bytes(data))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))

    return {
        "an event file grew": lambda: event().open("ab").write(b"\0"),
        "a file rewritten, size and mtime kept": lambda: rewrite_keeping_size_and_mtime(csv),
        "a file no reader opens changed": lambda: (root / "a" / "notes.txt").write_text("hellO", encoding="utf-8"),
        "a new empty folder": lambda: (root / "b" / "new").mkdir(),
        "a new file deep down": lambda: (root / "a" / "x.jsonl").write_text("", encoding="utf-8"),
        "a file renamed": lambda: csv.rename(root / "b" / "eval.csv"),
        "a file removed": lambda: (root / "a" / "notes.txt").unlink(),
        "permissions": lambda: os.chmod(csv, 0o600),
        "a symlink": lambda: (root / "b" / "link.csv").symlink_to(csv),
        "mtime only": lambda: os.utime(csv, ns=(1, 1)),
    }


@pytest.mark.parametrize("change", list(_mutations(Path("/nonexistent"))))
def test_any_change_under_a_source_changes_the_fleet_state(tmp_path: Path, change: str) -> None:
    from klwatch.scan_cache import fleet_state

    root = _tree(tmp_path / "fleet")
    specs, far = [str(root)], 1e18
    before = fleet_state(specs, deadline=far)
    assert before is not None and fleet_state(specs, deadline=far) == before
    _mutations(root)[change]()
    assert fleet_state(specs, deadline=far) != before


def test_what_discovery_never_walks_into_does_not_change_the_fleet_state(tmp_path: Path) -> None:
    """A virtualenv or a git folder inside a SOURCE holds no run (discovery skips them at any depth): work
    there does not cost the memo, nor a walk of its thousands of files."""
    from klwatch.scan_cache import fleet_state

    root = _tree(tmp_path / "fleet")
    for skipped in (root / ".venv" / "lib", root / "a" / ".git" / "objects"):
        skipped.mkdir(parents=True)
    specs, far = [str(root)], 1e18
    before = fleet_state(specs, deadline=far)
    (root / ".venv" / "lib" / "site.py").write_text("x = 1\n", encoding="utf-8")
    (root / "a" / ".git" / "objects" / "ab.csv").write_text("step,kl\n", encoding="utf-8")
    assert fleet_state(specs, deadline=far) == before


def test_a_symlink_retargeted_changes_the_fleet_state(tmp_path: Path) -> None:
    from klwatch.scan_cache import fleet_state

    root = _tree(tmp_path / "fleet")
    (tmp_path / "one.csv").write_text("step,kl\n1,0.1\n", encoding="utf-8")
    (tmp_path / "two.csv").write_text("step,kl\n1,0.2\n", encoding="utf-8")
    link = root / "b" / "link.csv"
    link.symlink_to(tmp_path / "one.csv")
    before = fleet_state([str(root)], deadline=1e18)
    (tmp_path / "one.csv").write_text("step,kl\n1,0.3\n", encoding="utf-8")  # what it points to changed
    after_content = fleet_state([str(root)], deadline=1e18)
    link.unlink()
    link.symlink_to(tmp_path / "two.csv")
    assert len({before, after_content, fleet_state([str(root)], deadline=1e18)}) == 3


def test_no_fleet_state_for_remote_or_missing_sources_or_past_its_time(tmp_path: Path) -> None:
    from klwatch.scan_cache import fleet_state

    root = _tree(tmp_path / "fleet")
    assert fleet_state(["wandb://me/proj"], deadline=1e18) is None
    assert fleet_state([str(root), "mlflow://host:5000"], deadline=1e18) is None
    assert fleet_state([str(tmp_path / "missing")], deadline=1e18) is None
    assert fleet_state([str(root)], deadline=0) is None
    assert fleet_state([f"{root}#a*"], deadline=1e18) != fleet_state([str(root)], deadline=1e18)


def test_a_memo_is_served_only_for_the_state_taken_before_its_scan(tmp_path: Path, monkeypatch) -> None:
    """A fleet that changes while it is scanned: the memo keeps the state taken before, so the next
    scan (which sees the change) is not served the result of the one that may have missed it."""
    import klwatch.scan_cache as scan_cache
    from klwatch.pipeline import ScanConfig, scan
    from klwatch.scan_cache import ScanCache

    root = _tree(tmp_path / "fleet")
    cache = ScanCache.open(tmp_path / "cache")
    settings = "s"
    memo = cache.report_memo([str(root)], settings, max_seconds=60)
    assert memo is not None and memo.load() is None
    result = scan([str(root)], config=ScanConfig())
    (root / "a" / "late.txt").write_text("written during the scan", encoding="utf-8")
    memo.store(result)
    assert cache.report_memo([str(root)], settings, max_seconds=60).load() is None
    memo = cache.report_memo([str(root)], settings, max_seconds=60)
    memo.store(result)
    assert cache.report_memo([str(root)], settings, max_seconds=60).load() is not None
    assert cache.report_memo([str(root)], "other settings", max_seconds=60).load() is None
    monkeypatch.setattr(scan_cache, "_CODE", ["another klwatch"])
    assert cache.report_memo([str(root)], settings, max_seconds=60).load() is None


def test_a_scan_with_an_unreadable_part_is_not_memoised(tmp_path: Path) -> None:
    from klwatch.pipeline import ScanConfig, scan
    from klwatch.scan_cache import ScanCache

    root = tmp_path / "fleet"
    write_run(root / "a", resumes=[30], buggy=False)
    (root / "bad.csv").write_text("not,a\ntable", encoding="utf-8")
    result = scan([str(root)], config=ScanConfig())
    cache = ScanCache.open(tmp_path / "cache")
    memo = cache.report_memo([str(root)], "s", max_seconds=60)
    if result.any_error:
        memo.store(result)
        assert memo.load() is None


def test_a_damaged_memo_entry_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    from klwatch.scan_cache import ScanCache

    root = _tree(tmp_path / "fleet")
    memo = ScanCache.open(tmp_path / "cache").report_memo([str(root)], "s", max_seconds=60)
    memo.path.parent.mkdir(parents=True)
    from klwatch.report import VIEW_FORMAT

    memo.path.write_text('{"format": 1, "state": "%s", "view": {"format": %d}}' % (memo.state, VIEW_FORMAT),
                         encoding="utf-8")  # the current view format, its fields missing: damaged
    assert memo.load() is None and not memo.path.exists()


def test_settings_text_counts_every_option_but_where_the_work_runs() -> None:
    import dataclasses

    from klwatch.cli_common import ScanOptions

    base = ScanOptions()
    assert ScanOptions(jobs=3).settings_text() == base.settings_text()
    assert ScanOptions(lineage=Path("x.json")).settings_text() is None
    assert ScanOptions(dask="tcp://h:1").settings_text() is None
    assert base.settings_text(findings=False) != base.settings_text()
    changed = {"metric": ["kl"], "intentional_reset": [5], "restart": [7], "group_by": "g", "reset_score": 0.5,
               "max_read_bytes": 10, "max_read_seconds": 2.0}
    assert set(changed) | set(ScanOptions.WHERE) | {"lineage"} == {f.name for f in dataclasses.fields(ScanOptions)}
    texts = {dataclasses.replace(base, **{k: v}).settings_text() for k, v in changed.items()}
    assert len(texts) == len(changed) and base.settings_text() not in texts


def test_what_the_light_path_writes_down_is_what_the_library_says() -> None:
    """The command line's option defaults are written where parsing needs them without loading the judges:
    the same as the library's."""
    from klwatch.cli_common import ScanOptions
    from klwatch.reference_reset import ReferenceResetConfig
    from klwatch.sources.limits import ReadLimits

    assert ScanOptions.reset_score == ReferenceResetConfig.reset_score
    assert (ScanOptions.max_read_bytes, ScanOptions.max_read_seconds) == (ReadLimits.max_bytes, ReadLimits.max_seconds)


def test_json_safe_without_numpy_is_plain_data() -> None:
    from klwatch.model import plain_data
    from klwatch.report import _plain_builtins, valid_unicode

    data = {"a": [1, 2.5, float("nan"), float("inf"), -0.0, None, True, "x\udcff"], "b": ("t", {"c": {1: "one"}}),
            "\udc80k": [], 3: 4, "e": {}}
    assert _plain_builtins(data, valid_unicode) == plain_data(data, text=valid_unicode)


# ----------------------------------------------------------------------------- the quick start


def _commands():
    import typer

    from klwatch.cli import app

    group = typer.main.get_command(app)
    return group, [(name, group.commands[name]) for name in group.commands]


VALUES = {
    str: ["", "a", "table", "x y", "\udcff", "--x", "0", "é"],
    bool: [True, False],
    int: ["0", "1", "7", "007", "-1", "1_000", "+3", " 5", "5 ", "1e3", "3.0", "65535", "65536", "99999999999999999999",
          "17179869184", "x", "", 1, 0, 8501, 17179869184],
    float: ["0", "0.5", "1", "1.5", "0.001", "0.0005", "1e-3", "inf", "nan", "-0.5", ".5", "5.", "007.5", "3600",
            "0.95", "0.1", "0.30000000000000004", "2.675", "x", "", 0.95, 3600.0, 60.0, 4.0],
    Path: ["a", "", ".", "-", "/tmp", "/nonexistent/x", "~/x", "a b", Path("state.db")],
}


def test_quick_coercion_gives_what_typer_gives(tmp_path: Path) -> None:
    """Every parameter of every command (and ``--help``), every kind of value: the value (and its type)
    or the usage error typer's own (Pydantic) coercion gives."""
    from typer._click.core import Context
    from typer._click.exceptions import BadParameter
    from typer._coercion import build_runtime_param

    from klwatch.cli_common import _quick_runtime_param

    quick_type = _quick_runtime_param()
    assert quick_type is not None
    existing = tmp_path / "exists.txt"
    existing.write_text("x", encoding="utf-8")
    paths = [*VALUES[Path], str(existing), str(tmp_path)]
    group, commands = _commands()
    checked = 0
    for name, command in [("", group), *commands]:
        ctx = Context(command)
        for p in command.get_params(ctx):
            quick = getattr(p, "_runtime_param", None)
            if not isinstance(quick, quick_type):
                continue
            ann = quick.annotation
            item = getattr(ann, "__args__", (ann,))[0]
            values = paths if item is Path else VALUES[item]
            if item is not ann:
                values = [(), *[(v,) for v in values], tuple(v for v in values if isinstance(v, str))[:3]]
            slow = build_runtime_param(p.type_descriptor)
            for value in values:
                outcomes = []
                for runtime in (quick, slow):
                    try:
                        got = runtime._coerce_value(value, param=p, ctx=ctx)
                        outcomes.append(("ok", got, type(got), [type(x) for x in got] if isinstance(got, list) else None))
                    except BadParameter as exc:
                        outcomes.append(("usage error", exc.format_message()))
                assert outcomes[0] == outcomes[1], (name, p.name, value)
                checked += 1
    assert checked > 500


def test_the_faces_load_when_used_and_help_lists_them_in_order() -> None:
    code = ("import sys; from klwatch.cli import main; sys.argv = ['klwatch', 'scan', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ['klwatch.ci', 'klwatch.watch', 'klwatch.compare', 'klwatch.dashboard_cli', 'pydantic'] "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "[]", out.stderr
    top = klwatch("--help")
    listed = [line.split()[0] for line in top.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == ["scan", "check", "watch", "compare", "dashboard"]
    typo = klwatch("chek")
    assert typo.returncode == 2 and "Did you mean 'check'?" in typo.stderr
