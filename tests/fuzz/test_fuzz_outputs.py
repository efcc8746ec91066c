"""Every output stays valid whatever the runs are called (issue 12): real runs in folders named with
control characters, ANSI escapes, markdown and XML syntax, undecodable bytes and very long names, read
by the real CLI with a strict UTF-8 stdout. The JSON parses with NaN refused, the JUnit XML parses,
every markdown row keeps its nine cells, nothing raises. Then the escaping itself, fuzzed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from klwatch.report import escape_cell, json_safe, json_text, printable, valid_unicode
from tb_runs import write_run

HOSTILE_NAMES: dict[str, bytes] = {
    "control characters": b"ctl\x01\x07\x08\x7f",
    "ANSI escapes": b"ansi\x1b[31mred\x1b[0m\x1b]0;title\x07",
    "line breaks": b"multi\nline\ttab\rcr",
    "markdown and XML": b"a|b<c>&d`e`*f*",
    "an HTML comment": b"<!--hidden",
    "escaped pipe": b"back\\|slash\\",
    "undecodable bytes": b"latin1-\xe9\xff\xfe",
    "undecodable C1 bytes": b"\x80\x9f\xc3",
    "C1 characters": "c1-\u0085\u009b".encode(),
    "XML non-characters": "nonchar-\ufffe\uffff".encode(),
    "rich markup": b"[bold]markup[/bold]",
    "annotation syntax": b"50%:done,x::error",
    "quotes": b"quote'\"`tick",
    "bidi and emoji": "emoji-\U0001f600-\u202eRTL".encode(),
    "line separators": "sep-\u2028-\u2029".encode(),
    "a very long name": b"L" * 240,
}

CELLS = 9
"""Columns of the markdown table (run, tracker, status, metric, step, evidence, verdict, score, KL)."""


def fs_name(raw: bytes) -> str:
    """A file name as Python holds it: undecodable bytes as lone surrogates (surrogateescape)."""
    return os.fsdecode(raw)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small real run per hostile name, plus a corrupt event file in a hostile folder (an error
    message that quotes the name)."""
    root = tmp_path_factory.mktemp("hostile")
    for k, raw in enumerate(HOSTILE_NAMES.values()):
        write_run(root / fs_name(raw), resumes=[20], buggy=k % 2 == 0, last=40, seed=k)
    bad = root / fs_name(b"err\xff\x1b|<")
    bad.mkdir()
    good = sorted((root / fs_name(HOSTILE_NAMES["quotes"])).iterdir())[0]
    corrupt = bytearray(good.read_bytes())
    corrupt[9] ^= 0xFF  # the first record's length header: nothing of the file is read
    (bad / "events.out.tfevents.1.host").write_bytes(bytes(corrupt))
    return root


def klwatch(*args: str | Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    """The real CLI with a strict UTF-8 stdout, as a UTF-8 terminal or CI log gives it (not the C
    locale's tolerant one); output kept as bytes, so the test decodes it strictly."""
    strict = {"LC_ALL": "C.UTF-8", "PYTHONUTF8": "0", "PYTHONIOENCODING": "utf-8:strict", "COLUMNS": "200",
              "GITHUB_ACTIONS": "", "GITHUB_STEP_SUMMARY": ""}
    return subprocess.run([sys.executable, "-m", "klwatch.cli", *map(os.fsencode, args)], capture_output=True,
                          timeout=300, env={**os.environ, **strict, **env})


def no_traceback(out: subprocess.CompletedProcess[bytes], *codes: int) -> str:
    """The run's stdout as strict UTF-8, after checking it ended with a SPEC exit code and no traceback."""
    stderr = out.stderr.decode("utf-8")
    assert out.returncode in codes and "Traceback" not in stderr, (out.returncode, stderr[-3000:])
    return out.stdout.decode("utf-8")


def strict_json(text: str) -> dict:
    """Parse refusing NaN/Infinity, and check every string is valid Unicode (no lone surrogate)."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in the report")

    doc = json.loads(text, parse_constant=refuse)
    json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8")
    return doc


def markdown_rows(text: str) -> list[str]:
    """The table's body rows: every line after the header and separator up to the first blank one."""
    lines = text.splitlines()
    start = lines.index("|---|---|---|---|---|---|---|---|---|") + 1
    return lines[start:lines.index("", start)]


def cells(row: str) -> int:
    """Cells in a markdown table row: pipes not escaped by a backslash, less the outer one."""
    return re.sub(r"\\.", "", row).count("|") - 1


RUNS = len(HOSTILE_NAMES) + 1  # and the corrupt one


def test_the_json_report_is_valid_whatever_the_names(hostile):
    report = strict_json(no_traceback(klwatch("scan", hostile, "--format", "json"), 1))
    names = {lin["name"] for lin in report["lineages"]}
    assert len(report["lineages"]) == RUNS
    assert "latin1-\\xe9\\xff\\xfe" in names and "multi\nline\ttab\rcr" in names  # shown, not dropped
    assert any(lin["status"] == "error" and "err\\xff" in lin["error"] for lin in report["lineages"])


def test_markdown_keeps_one_row_of_nine_cells_per_run_whatever_the_names(hostile):
    text = no_traceback(klwatch("scan", hostile, "--format", "markdown"), 1)
    rows = markdown_rows(text)
    assert len(rows) == RUNS and all(cells(r) == CELLS for r in rows), rows
    assert "<" not in text.split("Errors:")[0].replace("| run |", "")  # no HTML opened by a name
    errors = text.split("Errors:\n")[1].split("\n\n")[0].splitlines()
    assert len(errors) == 1 and errors[0].startswith("- ")


def test_junit_parses_whatever_the_names_and_is_never_left_empty(hostile, tmp_path):
    junit = tmp_path / "klwatch.xml"
    no_traceback(klwatch("scan", hostile, "--junit", junit, "--format", "json"), 1)
    suite = ET.fromstring(junit.read_bytes())
    assert int(suite.get("tests")) == RUNS == len(suite.findall("testcase"))
    assert "latin1-\\xe9\\xff\\xfe" in {c.get("name") for c in suite.iter("testcase")}


def test_the_terminal_table_prints_every_run_on_a_strict_utf8_stdout(hostile):
    text = no_traceback(klwatch("scan", hostile), 1)
    assert f"{RUNS} training run(s)" in text and "\x1b" not in text and "latin1-\\xe9\\xff\\xfe" in text


def test_check_annotations_summary_and_junit_stay_valid_whatever_the_names(hostile, tmp_path):
    junit, summary = tmp_path / "klwatch.xml", tmp_path / "summary.md"
    out = no_traceback(klwatch("check", hostile, "--junit", junit, "--fail-on", "all", GITHUB_ACTIONS="true",
                               GITHUB_STEP_SUMMARY=str(summary)), 1)
    assert all(line.startswith("::error ") for line in out.splitlines())
    ET.fromstring(junit.read_bytes())
    table = [ln for ln in summary.read_text(encoding="utf-8").splitlines() if ln.startswith("| ")]
    assert table and all(cells(r) == 6 for r in table), table


def test_a_hostile_source_path_itself_is_reported_validly(hostile, tmp_path):
    source = hostile / fs_name(HOSTILE_NAMES["undecodable bytes"])
    report = strict_json(no_traceback(klwatch("scan", source, hostile / fs_name(b"gone\xff"), "--format", "json"), 1))
    assert [s["spec"].endswith("gone\\xff") for s in report["sources"]] == [False, True]
    out = tmp_path / fs_name(b"out-\xff.md")
    no_traceback(klwatch("scan", source, "-o", out, "--format", "markdown"), 1)
    assert all(cells(r) == CELLS for r in markdown_rows(out.read_text(encoding="utf-8")))


# ------------------------------------------------------------------------------ the escaping, fuzzed

ANY_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=60)
"""Any code points, lone surrogates and control characters included."""


@given(ANY_TEXT)
def test_a_markdown_cell_is_one_line_with_no_live_pipe_or_tag(text):
    cell = escape_cell(text)
    cell.encode("utf-8")
    assert "\n" not in cell and "\r" not in cell and "<" not in cell
    assert "|" not in re.sub(r"\\.", "", cell)


@given(ANY_TEXT, ANY_TEXT)
def test_any_text_makes_parseable_xml(attribute, body):
    el = ET.Element("testcase", name=printable(attribute, keep="\t\n\r"))
    el.text = printable(body, keep="\t\n\r")
    back = ET.fromstring(ET.tostring(el, encoding="unicode").encode("utf-8"))
    assert back.get("name") == el.get("name")  # attributes keep even their line breaks (as character references)


@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | ANY_TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
                    max_leaves=20))
def test_any_data_makes_json_a_strict_parser_accepts(data):
    text = json_text(json_safe(data))
    strict_json(text)
    assert valid_unicode(valid_unicode(str(data))) == valid_unicode(str(data))
