"""``klwatch scan`` as a user runs it: the real console script on real event files."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from spec_shape import check_report
from tb_runs import write_run

KLWATCH = [sys.executable, "-m", "klwatch.cli"]
REPO = Path(__file__).resolve().parents[1]


def klwatch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*KLWATCH, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    write_run(root / "grpo-buggy", resumes=[40], buggy=True)
    write_run(root / "grpo-ratchet", resumes=[30, 55, 80], buggy=True, last=110)
    write_run(root / "grpo-fixed", resumes=[40], buggy=False)
    write_run(root / "grpo-continuous", resumes=[], buggy=False)
    write_run(root / "kl-off", resumes=[40], buggy=True, kl_scale=0.0)
    return root


def test_scan_table_shows_every_run_and_exits_1_on_a_reset(runs):
    out = klwatch("scan", runs)
    assert out.returncode == 1, out.stderr
    for name in ("grpo-buggy", "grpo-ratchet", "grpo-fixed", "grpo-continuous", "kl-off"):
        assert name in out.stdout
    assert "reference_reset" in out.stdout and "kl_disabled" in out.stdout


def test_scan_json_follows_the_spec_and_flags_exactly_the_buggy_boundaries(runs):
    out = klwatch("scan", runs, "--format", "json")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    check_report(report)
    by_name = {lin["name"]: lin for lin in report["lineages"]}
    flagged = {(lin["name"], b["step"]) for lin in report["lineages"] for b in lin["boundaries"]
               if b["verdict"] == "reference_reset"}
    assert flagged == {("grpo-buggy", 41), ("grpo-ratchet", 31), ("grpo-ratchet", 56), ("grpo-ratchet", 81)}
    assert by_name["grpo-fixed"]["status"] == "ok"
    assert by_name["grpo-continuous"]["status"] == "ok" and by_name["grpo-continuous"]["boundaries"] == []
    assert by_name["kl-off"]["status"] == "kl_disabled"
    buggy = by_name["grpo-buggy"]
    assert len(buggy["members"]) == 2 and all(m["kind"] == "tensorboard" for m in buggy["members"])
    assert buggy["members"][0]["first_step"] == 1 and buggy["members"][1]["first_step"] == 41
    [b] = buggy["boundaries"]
    assert "new_event_file" in b["evidence"] and "time_gap" in b["evidence"]
    assert b["resumed_from_step"] == 40 and b["kl_after"] < 0.2 * b["kl_before"]


def test_markdown_and_junit_outputs(runs, tmp_path):
    junit = tmp_path / "klwatch.xml"
    out = klwatch("scan", runs, "--format", "markdown", "--junit", junit)
    assert out.returncode == 1
    assert out.stdout.startswith("| run |") and "**reference_reset**" in out.stdout
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "5" and suite.get("failures") == "2"
    failed = {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert failed == {"grpo-buggy", "grpo-ratchet"}


def test_pattern_keeps_only_matching_runs_and_exit_follows(runs):
    out = klwatch("scan", f"{runs}#grpo-fixed", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert [lin["name"] for lin in json.loads(out.stdout)["lineages"]] == ["grpo-fixed"]


def test_intentional_reset_flag_turns_the_reset_into_intentional(runs):
    out = klwatch("scan", f"{runs}#grpo-buggy", "--intentional-reset", "41", "--format", "json")
    assert out.returncode == 0
    [lin] = json.loads(out.stdout)["lineages"]
    assert lin["status"] == "intentional" and lin["boundaries"][0]["verdict"] == "intentional"


def test_metric_option_overrides_and_missing_metric_is_reported(runs):
    out = klwatch("scan", f"{runs}#grpo-buggy", "--metric", "nope/*", "--format", "json")
    assert out.returncode == 0, out.stderr  # the buggy run's reset is not judged: its KL was not chosen
    [lin] = json.loads(out.stdout)["lineages"]
    assert lin["status"] == "no_kl_metric" and lin["metric"] is None
    [finding] = lin["findings"]
    assert finding["detector"] == "kl_metric" and "No logged metric matches --metric nope/*" in finding["message"]
    assert "train/kl_penalty" in finding["message"]  # it names what was logged, so the user can fix the glob


def test_bad_input_is_named_and_the_rest_is_judged(runs, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "events.out.tfevents.123.host").write_bytes(b"")
    good = sorted((runs / "grpo-fixed").iterdir())[0]
    corrupt = bytearray(good.read_bytes())
    corrupt[9] ^= 0xFF  # the first record's length header: nothing of the file is read
    (bad / "events.out.tfevents.456.host").write_bytes(bytes(corrupt))
    out = klwatch("scan", runs, bad, "--format", "json")
    assert out.returncode == 1  # a reset elsewhere still wins
    report = json.loads(out.stdout)
    check_report(report)
    errors = [lin for lin in report["lineages"] if lin["status"] == "error"]
    assert len(errors) == 2 and all("events.out.tfevents" in lin["error"] for lin in errors)
    assert "events.out.tfevents.123.host" in out.stderr and "events.out.tfevents.456.host" in out.stderr
    out = klwatch("scan", runs / "grpo-fixed", bad, "--format", "json")
    assert out.returncode == 3


def test_nothing_readable_and_bad_usage_exit_2(runs, tmp_path):
    missing = klwatch("scan", tmp_path / "missing")
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr
    # on readable runs, so that only the bad option can make it exit 2
    bad_format = klwatch("scan", runs / "grpo-fixed", "--format", "yaml")
    assert bad_format.returncode == 2 and "--format must be table, json or markdown, not 'yaml'" in bad_format.stderr
    assert bad_format.stdout == ""
    no_source = klwatch("scan")
    assert no_source.returncode == 2 and "Missing argument" in no_source.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    out = klwatch("scan", empty)
    assert out.returncode == 2 and "no runs found" in out.stderr


def test_scan_never_modifies_what_it_reads(runs):
    def digest() -> dict[str, str]:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() + str(p.stat().st_mtime_ns)
                for p in sorted(runs.rglob("*")) if p.is_file()}

    before = digest()
    out = klwatch("scan", runs, "--format", "json")
    assert out.returncode == 1, out.stderr  # it ran to its verdict (a crash would touch nothing either)
    assert len(json.loads(out.stdout)["lineages"]) == 5
    assert digest() == before


@pytest.mark.parametrize("command", ["scan", "check", "watch", "compare", "dashboard"])
def test_every_command_has_working_help(command):
    out = klwatch(command, "--help")
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout


def test_help_does_not_import_the_heavy_libraries():
    """``klwatch --help`` (and so every start) loads no statistics, dataframe, dashboard or tracker library."""
    heavy = ["scipy.stats", "pandas", "streamlit", "plotly", "wandb", "mlflow", "requests"]
    code = ("import sys; from klwatch.cli import main; sys.argv = ['klwatch', '--help']\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout and out.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("args", [["--help"], ["scan", "--help"], ["check", "--help"]])
def test_help_does_not_import_the_process_pool_or_dask(args):
    """``--jobs`` and ``--dask`` cost nothing until a scan uses them: ``distributed`` loads only for
    ``--dask``, the process pool only when a scan starts one."""
    heavy = ["distributed", "dask", "concurrent.futures.process", "multiprocessing.pool"]
    code = (f"import sys; from klwatch.cli import main; sys.argv = ['klwatch', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("command", ["scan", "check"])
def test_scan_and_check_list_jobs_and_dask_in_their_help(command):
    out = klwatch(command, "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # help wraps its lines
    assert "--jobs" in text and "--dask ADDRESS" in text and "the machine's core count" in text


def test_jobs_below_one_is_a_usage_error():
    out = klwatch("scan", "sample_runs/tensorboard/", "--jobs", "0")
    assert out.returncode == 2
    assert "--jobs" in out.stderr


def test_error_messages_with_brackets_are_printed_verbatim(tmp_path):
    out = klwatch("scan", tmp_path / "[exp]" / "missing")
    assert out.returncode == 2
    assert "[exp]" in out.stderr


def test_a_dataset_file_in_a_run_tree_is_skipped_but_an_error_when_named(runs, tmp_path):
    tree = tmp_path / "tree"
    (tree / "data").mkdir(parents=True)
    (tree / "data" / "prompts.jsonl").write_text('{"prompt": "2+2?", "answer": "4"}\n')
    import shutil

    shutil.copytree(runs / "grpo-fixed", tree / "grpo-fixed")
    out = klwatch("scan", tree, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert "prompts.jsonl" in out.stderr and "skipped" in out.stderr
    named = klwatch("scan", tree / "data" / "prompts.jsonl", "--format", "json")
    assert named.returncode == 2
    assert "prompts.jsonl" in named.stderr and "no step column" in named.stderr


# ------------------------------------------------------------------------------------ output files


def one_line_error(out: subprocess.CompletedProcess, *parts: str) -> None:
    """Exit 2 with one ``error`` line naming what went wrong: no traceback, no report."""
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == ""
    [line] = [ln for ln in out.stderr.splitlines() if ln.startswith("error")]
    for part in parts:
        assert part in line, line


def unwritable_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Output paths that cannot be written even by root (chmod does not stop root): under a regular
    file, in /proc, a folder given as the file, in a folder that does not exist."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return {"under a file": (blocker / "out.xml", f"{blocker} is a file, not a folder"),
            "in /proc": (Path("/proc/klwatch-out.xml"), "no file can be created in /proc"),
            "a folder": (tmp_path, "it is a folder, not a file")}


@pytest.mark.parametrize("case", ["under a file", "in /proc", "a folder"])
@pytest.mark.parametrize("flag", ["--junit", "--output"])
def test_an_unwritable_output_path_exits_2_naming_it_and_why_even_when_a_reset_is_found(runs, tmp_path, flag, case):
    path, why = unwritable_paths(tmp_path)[case]
    out = klwatch("scan", runs / "grpo-buggy", flag, path, "--format", "json")  # a reset: would exit 1
    one_line_error(out, f"cannot write {flag} {path}", why)
    assert not any(p.name.startswith(".klwatch-") for p in tmp_path.iterdir())  # no temporary file left


@pytest.mark.parametrize("flag", ["--junit", "--output"])
def test_an_output_in_folders_that_do_not_exist_yet_is_written_there_as_the_watch_state_is(runs, tmp_path, flag):
    """Issue 25, 7: ``--junit``/``-o`` refused a missing folder while ``--state`` made it."""
    path = tmp_path / "reports" / "klwatch" / "out.xml"
    out = klwatch("scan", runs / "grpo-fixed", flag, path, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert path.is_file() and path.stat().st_size > 0


def test_output_files_are_written_whole_with_the_usual_permissions(runs, tmp_path):
    report, junit = tmp_path / "report.json", tmp_path / "klwatch.xml"
    report.write_text("stale, longer than nothing " * 1000)
    report.chmod(0o640)
    out = klwatch("scan", runs / "grpo-fixed", "-o", report, "--format", "json", "--junit", junit)
    assert out.returncode == 0, out.stderr
    assert json.loads(report.read_text(encoding="utf-8"))["lineages"][0]["name"] == "grpo-fixed"
    assert (report.stat().st_mode & 0o777) == 0o640  # an existing file keeps its mode
    assert (junit.stat().st_mode & 0o777) == 0o666 & ~current_umask()  # a new one is not the temp file's 0600
    assert ET.parse(junit).getroot().get("tests") == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["klwatch.xml", "report.json"]


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_output_through_a_symlink_replaces_the_target_and_keeps_the_link(runs, tmp_path):
    target = tmp_path / "real.md"
    target.write_text("old")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    out = klwatch("scan", runs / "grpo-fixed", "-o", link, "--format", "markdown")
    assert out.returncode == 0, out.stderr
    assert link.is_symlink() and target.read_text(encoding="utf-8").startswith("| run |")


def test_a_write_that_fails_after_the_scan_exits_2_and_leaves_the_old_file_whole(runs, tmp_path, monkeypatch):
    """The disk fills up between the check before the scan and the write after it."""
    from typer.testing import CliRunner

    from klwatch.cli import app

    junit = tmp_path / "klwatch.xml"
    junit.write_text("<old/>")

    def disk_full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", disk_full)
    res = CliRunner().invoke(app, ["scan", str(runs / "grpo-buggy"), "--format", "json", "--junit", str(junit)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert f"error cannot write --junit {junit}: No space left on device\n" in res.stderr
    assert junit.read_text() == "<old/>" and [p.name for p in tmp_path.iterdir()] == ["klwatch.xml"]


def test_a_device_is_written_in_place_never_renamed_over():
    from klwatch.cli_common import _write_target

    assert _write_target(Path("/dev/null")) == (Path("/dev/null"), True)


# ------------------------------------------------------------------ no secret, nothing live (issue 13)


def test_a_pattern_matching_nothing_names_the_source_without_its_password():
    import hostile_servers as hs

    with hs.HostileServer(hs.mlflow_routes()) as server:
        spec = f"mlflow://bob:hunter2-planted@127.0.0.1:{server.port}#nomatch-*"
        out = klwatch("scan", spec, "--format", "json")
    assert out.returncode == 2, out.stderr  # a pattern naming no run is bad usage, nothing failed to read
    assert "hunter2-planted" not in out.stdout + out.stderr
    assert out.stderr.startswith(f"error mlflow://***@127.0.0.1:{server.port}#nomatch-*: no training run matches "
                                 "#nomatch-* (a glob on the run's name or id; runs there: ")
    assert json.loads(out.stdout)["sources"][0]["spec"] == f"mlflow://***@127.0.0.1:{server.port}#nomatch-*"


def test_a_hostile_run_name_is_inert_in_the_table_and_on_stderr(tmp_path):
    name = "::error::x\x1b[2J\x1b]52;c;cHduZWQ=\x07 ##[add-mask]y [bold]z[/]"
    write_run(tmp_path / name, resumes=[40], buggy=True)
    (tmp_path / name / "events.out.tfevents.0.bad").write_bytes(b"\x00" * 40)  # a warning naming the run
    out = klwatch("scan", tmp_path)
    assert out.returncode in (1, 3), out.stderr
    both = out.stdout + out.stderr
    assert "\x1b" not in both and "\x07" not in both and "##[" not in both
    assert "\\x1b]52;c;cHduZWQ=\\x07" in out.stdout and "[bold]z[/]" in out.stdout  # shown, not obeyed
    assert all(not ln.lstrip().startswith("::") for ln in both.splitlines())


# ------------------------------------------------------------------ a new user's first hour (issue 25, 7)


def test_nothing_readable_prints_the_error_and_no_empty_table(tmp_path):
    (tmp_path / "people.csv").write_text("a,b\n1,2\n")
    out = klwatch("scan", tmp_path / "people.csv")
    assert out.returncode == 2 and out.stdout == ""  # no table, no "0 training run(s)" under a fatal error
    assert out.stderr.count("people.csv") == 1 and "no step column" in out.stderr


@pytest.mark.parametrize("given, said", [
    ("http://localhost:5000", "for an MLflow server give mlflow://HOST:PORT"),
    ("sqlite:///mlflow.db", "give the store's path itself: mlflow.db"),
    ("ftp://example.com/x", "a SOURCE is a local path, wandb://ENTITY/PROJECT[/RUN_ID] or mlflow://HOST:PORT"),
])
def test_a_url_klwatch_does_not_read_says_what_to_give_instead(given, said):
    one_line_error(klwatch("scan", given), f"no such file or folder: {given}", said)


def test_a_wandb_log_file_or_an_mlflow_experiment_folder_says_what_to_give_instead(tmp_path):
    import shutil

    run = next((REPO / "sample_runs" / "trl" / "wandb" / "resume" / "wandb").glob("offline-run-*"))
    log = next(run.glob("*.wandb"))
    one_line_error(klwatch("scan", log), f"{log.name} is a W&B run's log: give its run folder {run}")
    exp = tmp_path / "mlruns" / "123"
    exp.mkdir(parents=True)
    (exp / "meta.yaml").write_text("experiment_id: '123'\nname: grpo\n")
    shutil.copytree(run, exp / "not-a-run")  # something in it, so it is looked through
    out = klwatch("scan", exp)
    assert "is an MLflow experiment folder: give the store " in out.stderr and str(tmp_path / "mlruns") in out.stderr


def test_usage_shows_words_not_python_types():
    out = klwatch("scan", "--help")
    assert "list[" not in out.stdout and "<str>" not in out.stdout and "{SOURCE}" not in out.stdout
    assert "scan [OPTIONS] SOURCE...\n" in out.stdout
    assert "-m, --metric NAME" in out.stdout and "--intentional-reset STEP" in out.stdout


def test_long_lines_are_not_wrapped_when_the_output_is_a_file(tmp_path):
    long = tmp_path / ("a-run-folder-with-a-long-name-" * 5)
    write_run(long, resumes=[40], buggy=True)
    first = sorted(long.glob("events.out.tfevents.*"), key=lambda p: int(p.name.rsplit(".", 1)[-1]))[0]
    data = bytearray(first.read_bytes())
    data[9] ^= 0xFF  # unreadable: an error line and an "incomplete" warning, each longer than 200 columns
    first.write_bytes(bytes(data))
    out = klwatch("scan", tmp_path)
    err = [ln for ln in out.stderr.splitlines() if ln.startswith("error")]
    warn = [ln for ln in out.stdout.splitlines() if ln.startswith("warning")]
    assert err and warn and all(len(ln) > 200 and ln.rstrip().endswith("file?)") for ln in err + warn), (err, warn)
