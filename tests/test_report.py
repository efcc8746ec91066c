"""``klwatch.report``: one scan rendered as the exit code, the JSON report of SPEC.md, the markdown and
terminal tables and JUnit XML, from real TensorBoard runs covering every status a training run can get."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import pytest
from rich.console import Console

from klwatch.model import Finding, ScanResult
from klwatch.pipeline import ScanConfig, scan
from klwatch.report import (EXIT_OK, EXIT_RESET, EXIT_UNREADABLE, EXIT_USAGE, boundary_dict, bounded, escape_cell, exit_code,
                            json_safe, json_text, junit_xml, printable, render_markdown, render_table, round_sig, rows,
                            to_dict, to_json, valid_unicode)
from spec_shape import check_report
from tb_runs import write_run


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder per status: a reset (its name holds a ``|``), an ok resume, KL off, no KL logged, too
    few points, and a folder whose only event file is corrupt."""
    root = tmp_path_factory.mktemp("report")
    runs = root / "runs"
    write_run(runs / "grpo|buggy", resumes=[40], buggy=True)
    write_run(runs / "grpo-fixed", resumes=[40], buggy=False)
    write_run(runs / "kl-off", resumes=[40], buggy=True, kl_scale=0.0)
    write_run(runs / "no-kl", resumes=[40], buggy=False, metric="train/reward")
    write_run(runs / "short", resumes=[], buggy=False, last=3)
    bad = root / "bad"
    bad.mkdir()
    good = sorted((runs / "grpo-fixed").iterdir())[0]
    corrupt = bytearray(good.read_bytes())
    corrupt[9] ^= 0xFF  # the first record's length header: a CRC mismatch, nothing of the file read
    (bad / "events.out.tfevents.456.host").write_bytes(bytes(corrupt))
    return root


def scan_of(*sources: Path | str, config: ScanConfig = ScanConfig()) -> ScanResult:
    return scan([str(s) for s in sources], config=config)


@pytest.fixture(scope="module")
def everything(logs: Path) -> ScanResult:
    """Every run, the corrupt folder and a source that does not exist. The corrupt folder carries a ``#PATTERN``
    that keeps all its runs: a SOURCE with a pattern keeps its runs to itself (local SOURCEs without one are read
    as one fleet, named from their common parent), so every run keeps the name its own folder gives it."""
    return scan_of(logs / "runs", f"{logs / 'bad'}#*", logs / "missing")


def by_name(result: ScanResult) -> dict[str, str]:
    return {r.lineage.name: r.status for r in result.results}


def test_the_fixture_covers_every_status_a_run_can_get(everything):
    assert sorted(by_name(everything).values()) == sorted(
        ["reference_reset", "ok", "kl_disabled", "no_kl_metric", "insufficient_data", "error"])


# -------------------------------------------------------------------------------------- exit code


def test_exit_code_is_0_when_every_run_reads_and_none_resets(logs):
    assert exit_code(scan_of(logs / "runs" / "grpo-fixed", logs / "runs" / "kl-off")) == EXIT_OK == 0


def test_exit_code_is_1_on_a_reset_even_when_other_sources_are_unreadable(logs, everything):
    assert exit_code(scan_of(logs / "runs" / "grpo|buggy")) == EXIT_RESET == 1
    assert everything.any_error and exit_code(everything) == EXIT_RESET


def test_exit_code_is_2_when_nothing_at_all_could_be_read(logs):
    assert exit_code(scan_of(logs / "missing")) == EXIT_USAGE == 2
    assert exit_code(scan_of(logs / "bad")) == EXIT_USAGE  # the corrupt file is the only one there


def test_exit_code_is_3_when_some_sources_are_unreadable_and_no_run_resets(logs):
    assert exit_code(scan_of(logs / "runs" / "grpo-fixed", logs / "missing")) == EXIT_UNREADABLE == 3
    assert exit_code(scan_of(logs / "runs" / "grpo-fixed", logs / "bad")) == EXIT_UNREADABLE


def test_a_declared_intentional_reset_exits_0(logs):
    result = scan_of(logs / "runs" / "grpo|buggy", config=ScanConfig(intentional_resets=(41,)))
    assert by_name(result) == {"grpo|buggy": "intentional"} and exit_code(result) == EXIT_OK


# ------------------------------------------------------------------------------------- JSON report


def test_the_json_report_has_the_shape_spec_md_fixes(everything):
    report = to_dict(everything)
    check_report(report)
    assert json.loads(to_json(everything)) == report
    assert [s["spec"] for s in report["sources"]] == [str(s.spec) for s in everything.sources]
    missing = next(s for s in report["sources"] if s["spec"].endswith("missing"))
    assert missing["error"] and missing["kinds"] == []


def test_the_json_report_names_the_reset_boundary_with_rounded_numbers(everything):
    lineages = {lin["name"]: lin for lin in to_dict(everything)["lineages"]}
    buggy = lineages["grpo|buggy"]
    [b] = buggy["boundaries"]
    assert buggy["status"] == "reference_reset" and buggy["metric"] == "train/kl_penalty"
    assert b["step"] == 41 and b["resumed_from_step"] == 40 and b["verdict"] == "reference_reset"
    [v] = next(r for r in everything.results if r.lineage.name == "grpo|buggy").verdicts
    assert b["kl_before"] == round_sig(v.kl_before) and b["score"] == round(v.score, 4)
    assert [m["first_step"] for m in buggy["members"]] == [1, 41]
    assert lineages["events.out.tfevents.456.host"]["error"].count("corrupt event file") >= 1
    assert lineages["no-kl"]["findings"][0]["detector"] == "kl_metric"


def test_round_sig_keeps_six_significant_digits_and_drops_what_json_cannot_hold():
    assert round_sig(0.123456789) == pytest.approx(0.123457, rel=1e-12)
    assert round_sig(123456789.0) == pytest.approx(123457000.0, rel=1e-12)
    assert round_sig(None) is None and round_sig(float("nan")) is None and round_sig(float("inf")) is None


# ----------------------------------------------------------------------------------- tables


def test_rows_give_one_row_per_boundary_and_one_per_run_without_any(everything):
    table = rows(everything)
    assert len(table) == sum(max(1, len(r.verdicts)) for r in everything.results)
    short = next(row for row in table if row["run"] == "short")
    assert short["step"] == "-" and short["verdict"] == "-"
    no_kl = next(row for row in table if row["run"] == "no-kl")
    assert no_kl["step"] == "41" and no_kl["verdict"] == "inconclusive"
    buggy = next(row for row in table if row["run"] == "grpo|buggy")
    assert buggy["verdict"] == "reference_reset" and buggy["kl"].count(" -> ") == 1


def test_markdown_escapes_a_pipe_in_a_cell_so_the_table_keeps_its_columns(everything):
    text = render_markdown(everything)
    line = next(ln for ln in text.splitlines() if "grpo" in ln and "buggy" in ln)
    assert "grpo\\|buggy" in line and "grpo|buggy" not in line.replace("\\|", "")
    header = text.splitlines()[0]
    assert line.replace("\\|", "").count("|") == header.count("|")
    assert "| **reference_reset** |" in line and "→" in line and "->" not in line


def test_markdown_lists_what_could_not_be_read_and_ends_with_the_summary(everything):
    lines = render_markdown(everything).splitlines()
    errors = lines[lines.index("Errors:") + 1:lines.index("Errors:") + 1 + len(everything.unreadable)]
    assert errors == [f"- {e}" for e in everything.unreadable] and len(errors) == 2
    assert lines[-1].startswith("6 training run(s): ") and "1 boundary(ies) judged reference_reset" in lines[-1]


def test_the_terminal_table_shows_every_run_with_its_status_and_the_summary(everything):
    buf = io.StringIO()
    render_table(everything, Console(file=buf, width=240, force_terminal=False))
    text = buf.getvalue()
    for name, status in by_name(everything).items():
        line = next(ln for ln in text.splitlines() if name in ln)
        assert status in line
    assert text.rstrip().splitlines()[-1].startswith("6 training run(s): 1 error, 1 insufficient_data")


# ------------------------------------------------------------------------------------------ JUnit


def junit(result: ScanResult, **kwargs) -> ET.Element:
    return ET.fromstring(junit_xml(result, **kwargs))


def case(suite: ET.Element, name: str) -> ET.Element:
    return next(c for c in suite.iter("testcase") if c.get("name") == name)


def test_junit_counts_a_failure_per_reset_an_error_per_unreadable_and_skips_what_is_not_judged(everything):
    suite = junit(everything)
    assert suite.get("tests") == "7"  # six runs and the missing source
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("1", "2", "3")
    failure = case(suite, "grpo|buggy").find("failure")
    assert failure.get("type") == "reference_reset" and failure.get("message").startswith("reference reset at 1 resume(s): step 41")
    assert failure.text == everything.results[[r.lineage.name for r in everything.results].index("grpo|buggy")].verdicts[0].explanation
    assert case(suite, "events.out.tfevents.456.host").find("error").get("type") == "error"
    assert [c.find("error").get("type") for c in suite.iter("testcase") if c.get("classname") == "klwatch.source"] == ["source_error"]
    assert {c.get("name") for c in suite.iter("testcase") if c.find("skipped") is not None} == {"kl-off", "no-kl", "short"}
    assert case(suite, "grpo-fixed").find("failure") is None and case(suite, "grpo-fixed").find("system-out").text.startswith("step 41 ")


def test_junit_finding_failures_fail_a_skipped_run_and_add_to_a_reset(everything):
    runs = {r.lineage.name: r for r in everything.results}
    failing = [(runs["kl-off"], "kl-off: lr_schedule_restart at step 41: restarted"),
               (runs["grpo|buggy"], "grpo|buggy: kl_coef_reset at step 41: reset"),
               (runs["grpo|buggy"], "grpo|buggy: data_order_restart at step 41: again")]
    suite = junit(everything, finding_failures=failing)
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("2", "2", "2")
    kl_off = case(suite, "kl-off")
    assert kl_off.find("skipped") is None and [e.tag for e in kl_off] == ["failure", "system-out"]
    assert kl_off.find("failure").get("type") == "finding" and kl_off.find("failure").get("message") == failing[0][1]
    text = case(suite, "grpo|buggy").find("failure").text.splitlines()
    assert text[-2:] == [failing[1][1], failing[2][1]]


def test_junit_without_finding_failures_is_what_the_scan_writes(everything):
    assert junit_xml(everything, finding_failures=()) == junit_xml(everything)
    assert junit_xml(everything).startswith("<?xml version='1.0' encoding=")



# ------------------------------------------------------------------------ valid whatever the runs hold


def _strict_json(text: str) -> dict:
    """Parse as a strict parser does: NaN and Infinity are not JSON."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in the report")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def non_finite(logs: Path) -> ScanResult:
    """The reset run as a tracker holding NaN and ±inf (MLflow keeps them) would leave its verdict, with a
    numpy step on a finding: a fresh scan, since the module's is shared."""
    result = scan_of(logs / "runs" / "grpo|buggy")
    v = result.results[0].verdicts[0]
    v.score, v.kl_before, v.kl_after = float("nan"), float("inf"), float("-inf")
    result.results[0].findings[:0] = [Finding("kl_ratchet", np.int64(41), "error", "ratchet")]
    return result


def test_non_finite_numbers_are_null_in_the_json_report_never_nan_or_infinity(non_finite):
    [b] = _strict_json(to_json(non_finite))["lineages"][0]["boundaries"]
    assert b["score"] is None and b["kl_before"] is None and b["kl_after"] is None
    assert b["step"] == 41 and isinstance(b["window_before"][0], int)
    assert json.dumps(to_dict(non_finite), allow_nan=False)  # the dict itself is safe, not only the text
    assert boundary_dict(non_finite.results[0].verdicts[0])["score"] is None  # what the dashboard shows


def test_json_safe_turns_numpy_and_non_finite_values_into_plain_json():
    data = {"a": np.float32(0.5), "b": [np.int64(3), float("nan")], "c": (np.array([1.0, np.inf]),), "d": "x\udcff"}
    assert json_safe(data) == {"a": 0.5, "b": [3, None], "c": [[1.0, None]], "d": "x\\xff"}
    assert json_text(json_safe(data))
    with pytest.raises(ValueError):
        json_text({"score": float("nan")})  # unsafe data is an error, never an invalid report


def test_printable_shows_control_characters_and_undecodable_bytes_as_escapes():
    assert printable("ok → name") == "ok → name"
    assert printable("a\x1b[31m\nb\udcff\ud800\ufffe") == "a\\x1b[31m\\x0ab\\xff\\ud800\\ufffe"
    assert printable("line\nbreak\tx\x00", keep="\n\t") == "line\nbreak\tx\\x00"
    assert valid_unicode("ctl\x01\udce9") == "ctl\x01\\xe9"  # JSON escapes control characters itself
    assert printable(printable("\x07\udcff")) == printable("\x07\udcff")


def test_a_markdown_cell_stays_one_cell_on_one_line_and_opens_no_html():
    cell = escape_cell("a|b\nc<!--d&e\\|")
    assert "\n" not in cell and "<" not in cell and cell.count("&") == 2
    assert re.sub(r"\\.", "", cell).count("|") == 0  # every pipe escaped, the backslash too


def test_junit_is_parseable_whatever_the_names_and_messages_hold(logs):
    result = scan_of(logs / "runs" / "grpo|buggy", logs / "bad")
    result.results[0].lineage.name = "ctl\x01\x1b[31m<&>\udcff\ufffe"
    result.results[0].verdicts[0].explanation = "why\x00 \udce9"
    suite = ET.fromstring(junit_xml(result).encode("utf-8"))
    assert [c.get("name") for c in suite.iter("testcase")][0] == "ctl\\x01\\x1b[31m<&>\\xff\\ufffe"
    assert suite.find("testcase/failure").text == "why\\x00 \\xe9"
    assert junit_xml(result).startswith("<?xml version='1.0' encoding='utf-8'?>\n")


# ------------------------------------------------------------------ no secret, nothing live (issue 13)

PASSWORD = "hunter2-planted"
SECRET_SPEC = f"mlflow://bob:{PASSWORD}@127.0.0.1:99999/exp#grpo-*"


@pytest.fixture
def with_secrets(logs: Path, monkeypatch: pytest.MonkeyPatch) -> ScanResult:
    """A scan whose SOURCE has a password, whose messages quote it (as a careless reader would), and
    whose run names and warnings quote a token from the environment and hold terminal escapes."""
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "env-token-planted")
    from klwatch.model import SourceError

    result = scan_of(logs / "runs", SECRET_SPEC)
    src = result.sources[1]
    src.errors.append(SourceError(src.spec, f"{src.spec}: said {PASSWORD} and Bearer env-token-planted"))
    src.warnings.append(f"retrying {SECRET_SPEC}")
    result.results[0].lineage.name = "run env-token-planted \x1b]52;c;cHduZWQ=\x07 ::error::x ##[add-mask]y ![i](http://e/i.png)"
    return result


def _no_secret(text: str) -> None:
    assert PASSWORD not in text and "env-token-planted" not in text
    assert "\x1b" not in text and "\x07" not in text and "##[" not in text


def test_no_output_of_a_scan_holds_a_secret_or_a_live_control_sequence(with_secrets):
    report = to_dict(with_secrets)
    assert [s["spec"] for s in report["sources"]][1] == "mlflow://***@127.0.0.1:99999/exp#grpo-*"
    buf = io.StringIO()
    render_table(with_secrets, Console(file=buf, width=300, force_terminal=False))
    for text in (to_json(with_secrets), render_markdown(with_secrets), buf.getvalue(), junit_xml(with_secrets)):
        _no_secret(text)
    suite = ET.fromstring(junit_xml(with_secrets).encode())
    assert "mlflow://***@127.0.0.1:99999/exp#grpo-*" in [c.get("name") for c in suite.iter("testcase")]
    assert "![i]" not in render_markdown(with_secrets) and "!\\[i\\]" in render_markdown(with_secrets)


def test_printable_leaves_no_github_workflow_command_in_a_line():
    assert printable("::error::x") == "\\x3a:error::x" and printable(" \u3000::set-output") == " \u3000\\x3a:set-output"
    assert printable("a ##[stop-commands]tok") == "a ##\\[stop-commands]tok" and printable("a::b") == "a::b"
    assert json.loads(json_text({"n": "##[error]x"})) == {"n": "##[error]x"} and "##[" not in json_text({"n": "##[x"})


def test_a_markdown_cell_has_no_link_or_image():
    assert escape_cell("![x](http://attacker/p.png) [y](javascript:z)") == "!\\[x\\](http://attacker/p.png) \\[y\\](javascript:z)"


BIDI_NAME = "grpo-\u202eevil\u202c-\u200bbuggy\u2066x\u2069\ufeff"


def test_printable_shows_bidi_and_zero_width_characters_as_escapes():
    """U+202E turns what follows around on screen and U+200B makes two names look alike: neither is shown raw."""
    assert printable(BIDI_NAME) == "grpo-\\u202eevil\\u202c-\\u200bbuggy\\u2066x\\u2069\\ufeff"
    assert printable("zwj \u200d and lrm \u200e, alm \u061c") == "zwj \\u200d and lrm \\u200e, alm \\u061c"


def test_no_face_shows_a_bidi_or_zero_width_character_of_a_run_name(logs):
    result = scan_of(logs / "runs" / "grpo|buggy")
    result.results[0].lineage.name = BIDI_NAME
    buf = io.StringIO()
    render_table(result, Console(file=buf, width=300, force_terminal=False))
    for text in (render_markdown(result), buf.getvalue(), junit_xml(result)):
        assert not re.search("[\u202a-\u202e\u2066-\u2069\u200b-\u200f\ufeff]", text), text[:500]
        assert "\\u202e" in text


def test_bounded_keeps_a_short_text_and_elides_the_middle_of_a_long_one_saying_how_much():
    assert bounded("people.csv: no step column") == "people.csv: no step column"
    long = "people.csv: columns " + "x" * 100_000 + " end"
    cut = bounded(long)
    assert cut.startswith("people.csv: columns xxx") and cut.endswith("x end") and len(cut) <= 4096
    assert "characters elided" in cut
    nul = "f.csv: " + "\x00" * 50_000
    assert len(printable(nul)) <= 4096 and len(json.dumps(bounded(nul))) <= 4096


def test_every_message_in_every_output_is_bounded_whatever_a_table_header_holds(tmp_path):
    """A 2 MB header of NUL bytes and a 30,000-column header: each output line and JSON string stays
    under 4 KB, the file named at its start."""
    import subprocess
    import sys

    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "people.csv").write_bytes(b"\x00" * 2_000_000 + b"\n")
    (runs / "wide.csv").write_text(",".join(f"col{i}" for i in range(30_000)) + "\n1\n")
    out = tmp_path / "out"
    out.mkdir()
    summary = out / "summary.md"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_ACTIONS": "true"}
    cli = [sys.executable, "-m", "klwatch.cli"]
    scan = subprocess.run([*cli, "scan", str(runs), "--no-cache", "-f", "json", "-o", str(out / "r.json"),
                           "--junit", str(out / "j.xml")], capture_output=True, text=True, timeout=300, env=env)
    md = subprocess.run([*cli, "scan", str(runs), "--no-cache", "-f", "markdown"], capture_output=True, text=True,
                        timeout=300, env=env)
    check = subprocess.run([*cli, "check", str(runs), "--no-cache"], capture_output=True, text=True, timeout=300,
                           env=env)
    assert scan.returncode == md.returncode == check.returncode == 2, (scan.returncode, check.returncode)

    def strings(o):
        if isinstance(o, str):
            yield o
        elif isinstance(o, dict):
            for k, v in o.items():
                yield k
                yield from strings(v)
        elif isinstance(o, list):
            for v in o:
                yield from strings(v)

    report = json.loads((out / "r.json").read_text())
    assert max(len(json.dumps(s)) for s in strings(report)) <= 4096
    texts = [scan.stderr, md.stdout, md.stderr, check.stdout, check.stderr, (out / "j.xml").read_text()]
    texts += [summary.read_text()] if summary.exists() else []
    for text in texts:
        assert max(map(len, text.splitlines()), default=0) <= 4096 + 64, max(map(len, text.splitlines()))
    said = scan.stderr + check.stdout + check.stderr
    assert "people.csv" in said and "wide.csv" in said


def test_markdown_keeps_an_ampersand_and_escapes_only_what_would_be_a_character_reference():
    """Issue 25, 7: ``W&amp;B`` in markdown; an ``&`` that would start ``&lt;`` still cannot turn into a ``<``."""
    from klwatch.report import escape_cell

    assert escape_cell("W&B run") == "W&B run"
    assert escape_cell("a &lt;img&gt; b") == "a &amp;lt;img&amp;gt; b"
    assert escape_cell("x &#60;!-- y") == "x &amp;#60;!-- y"
    assert escape_cell("<!--") == "&lt;!--"


def test_the_json_report_rendered_run_by_run_is_the_text_of_the_whole_report(everything, logs):
    nothing = scan_of(logs / "missing")
    for result in (everything, nothing, scan_of(f"{logs / 'runs'}#grpo*", "mlflow://user:secret@127.0.0.1:1/x")):
        assert to_json(result) == json_text(to_dict(result))
