"""``klwatch check`` and ``assert_no_reference_reset`` as CI runs them: quiet when all is well, one
line (or GitHub annotation) per reset, a step summary with a sparkline, JUnit XML, SPEC.md's exit
codes, ``--fail-on`` for the other detectors; and the examples/ that show them work as written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from typer.testing import CliRunner

from klwatch.ci import assert_no_reference_reset, sparkline
from klwatch.cli import app
from klwatch.pipeline import ScanConfig, scan
from tb_runs import write_run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    write_run(root / "good" / "grpo-fixed", resumes=[40], buggy=False)
    write_run(root / "good" / "grpo-continuous", resumes=[], buggy=False, seed=1)
    write_run(root / "bad" / "grpo-buggy", resumes=[40], buggy=True)
    write_run(root / "bad" / "grpo-ratchet", resumes=[30, 55, 80], buggy=True, last=110, seed=2)
    return root


def check(*args: object, env: dict[str, str] | None = None):
    """The real command in this process, with the environment CI gives it."""
    base = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None}
    return CliRunner().invoke(app, ["check", *map(str, args)], env={**base, **(env or {})}, catch_exceptions=False)


def test_all_well_is_silent_and_exits_0(runs):
    res = check(runs / "good")
    assert res.exit_code == 0
    assert res.stdout == "" and res.stderr == ""


def test_one_line_per_reset_boundary_and_exit_1(runs):
    res = check(runs)
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    heads = sorted(ln.split(" (resumed")[0] for ln in lines)
    assert heads == ["bad/grpo-buggy: reference reset at step 41", "bad/grpo-ratchet: reference reset at step 31",
                     "bad/grpo-ratchet: reference reset at step 56", "bad/grpo-ratchet: reference reset at step 81"]
    assert all("KL " in ln and " -> " in ln and "score" in ln for ln in lines)


def test_github_actions_gets_annotations_and_an_appended_step_summary(runs, tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    res = check(runs, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert len(lines) == 4 and all(ln.startswith("::error title=klwatch%3A KL reference reset in ") for ln in lines)
    assert any("bad/grpo-buggy at step 41::bad/grpo-buggy: reference reset at step 41" in ln for ln in lines)
    assert all("\n" not in ln and "%0A" not in ln.split("::", 2)[1] for ln in lines)

    text = summary.read_text()
    assert text.startswith("# earlier step\n")  # appended, never overwritten
    assert "❌ klwatch check: 4 problem(s) in 2 of 4 training run(s)" in text
    assert "| bad/grpo-buggy | 41 | 40 | **reference reset** |" in text
    blocks = text.split("```text\n")[1:]
    assert len(blocks) == 2  # one sparkline per flagged run
    for block in blocks:
        spark, marks = block.split("\n")[:2]
        assert spark.startswith("KL ") and set(spark[3:]) <= set("▁▂▃▄▅▆▇█│")
        carets = [i for i, ch in enumerate(marks) if ch == "^"]
        assert carets and all(spark[i] == "│" for i in carets)


def test_all_well_summary_is_one_reassuring_line(runs, tmp_path):
    summary = tmp_path / "summary.md"
    res = check(runs / "good", env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert res.exit_code == 0 and res.stdout == ""
    assert summary.read_text().startswith("### ✅ klwatch check: no reference reset (2 training run(s), 1 resume(s) judged)")


def test_junit_has_a_failing_case_per_reset_run(runs, tmp_path):
    junit = tmp_path / "klwatch.xml"
    res = check(runs, "--junit", junit)
    assert res.exit_code == 1
    suite = ET.parse(junit).getroot()
    failing = sorted(c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None)
    assert failing == ["bad/grpo-buggy", "bad/grpo-ratchet"] and suite.get("failures") == "2" and suite.get("tests") == "4"


def test_exit_codes_for_unreadable_sources(runs, tmp_path):
    partly = check(runs / "good", tmp_path / "missing")
    assert partly.exit_code == 3 and partly.stdout == "" and "missing" in partly.stderr
    reset_wins = check(runs / "bad", tmp_path / "missing")
    assert reset_wins.exit_code == 1
    nothing = check(tmp_path / "missing")
    assert nothing.exit_code == 2
    gh = check(runs / "good", tmp_path / "missing", env={"GITHUB_ACTIONS": "true"})
    assert gh.exit_code == 3 and gh.stdout.startswith("::error title=klwatch%3A unreadable source::")


@pytest.mark.parametrize("where", ["under a file", "a folder"])
def test_an_unwritable_junit_path_exits_2_before_the_scan_even_with_a_reset_to_report(runs, tmp_path, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    junit, why = {"under a file": (blocker / "klwatch.xml", f"{blocker} is a file, not a folder"),
                  "a folder": (tmp_path, "it is a folder, not a file")}[where]
    res = check(runs / "bad", "--junit", junit)  # the reset would exit 1: CI must not read this as one
    assert res.exit_code == 2 and res.stdout == ""  # stopped before the scan: no reset lines either
    assert res.stderr == f"error cannot write --junit {junit}: {why}\n"


def test_a_step_summary_that_cannot_be_written_only_warns(runs, tmp_path):
    res = check(runs / "good", env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path)})
    assert res.exit_code == 0 and "warning cannot append to GITHUB_STEP_SUMMARY" in res.stderr


def test_an_unreadable_run_is_its_own_annotation_after_the_unreadable_sources(runs, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    good = sorted((runs / "good" / "grpo-fixed").iterdir())[0]
    corrupt = bytearray(good.read_bytes())
    corrupt[9] ^= 0xFF  # the first record's length header: nothing of the file is read
    (bad / "events.out.tfevents.456.host").write_bytes(bytes(corrupt))
    gh = check(runs / "good", tmp_path / "missing", bad, env={"GITHUB_ACTIONS": "true"})
    assert gh.exit_code == 3
    lines = gh.stdout.splitlines()
    assert [ln.split("::")[1] for ln in lines] == ["error title=klwatch%3A unreadable source",
                                                   "error title=klwatch%3A unreadable run"]
    assert "missing" in lines[0] and "corrupt event file" in lines[1]
    plain = check(runs / "good", bad)
    assert plain.exit_code == 3 and plain.stdout == ""
    # the two SOURCEs read as one fleet: the file named from their common parent, once
    err = " ".join(plain.stderr.split())
    assert err.startswith("error: ") and "bad/events.out.tfevents.456.host: corrupt event file" in err
    assert err.count("events.out.tfevents.456.host") == 1


HOSTILE_NAME = "::warning::pwned\x1b[31m\x1b]8;;http:evil\x07%0A\n::error::injected\r##[stop-commands]tok\b ![i](javascript:x) <img src=x>"
"""A run folder's name (so the run's name) a user cannot see the harm in: workflow commands, a URL-encoded
and a real newline, terminal escapes (colour, OSC 8 link, backspace), markdown and HTML."""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    write_run(root / HOSTILE_NAME, resumes=[40], buggy=True)
    return root


def _inert(text: str, *, ours: str = "::error title=klwatch") -> None:
    """No control character, no legacy ``##[`` command anywhere, no line starting a workflow command
    but klwatch's own annotations."""
    assert not any(c in text for c in "\x1b\x07\x08\r"), text
    assert "##[" not in text
    assert all(not ln.lstrip().startswith("::") or ln.startswith(ours) for ln in text.split("\n")), text


def test_a_hostile_run_name_is_inert_in_every_output_of_check(hostile, tmp_path):
    summary, junit = tmp_path / "summary.md", tmp_path / "klwatch.xml"
    gh = check(hostile, "--junit", junit, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert gh.exit_code == 1 and len(gh.stdout.splitlines()) == 1
    _inert(gh.stdout + gh.stderr)
    command, _, data = gh.stdout.partition("::error title=")[2].partition("::")
    assert "::" not in command and "," not in command.split("klwatch%3A", 1)[1]  # the title cannot end early
    assert "%250A%0A::error::injected%0D##\\[" in data  # its "%0A" stays text, its newline one of the message
    text = summary.read_text()
    _inert(text)
    assert "![i]" not in text and "<img" not in text and "&lt;img" in text
    ET.parse(junit)  # valid XML, whatever the name holds
    _inert(junit.read_text())
    plain = check(hostile)
    assert plain.exit_code == 1 and plain.stdout.startswith("\\x3a:warning::pwned\\x1b[31m")
    _inert(plain.stdout + plain.stderr, ours="never")


def test_sparkline_marks_each_reset_under_its_resume(runs):
    result = scan([str(runs / "bad" / "grpo-ratchet")], config=ScanConfig(findings=False))
    spark, marks = sparkline(result.results[0], width=40)
    assert spark.count("│") == 3 and marks.count("^") == 3
    for before, after in zip(spark.split("│"), spark.split("│")[1:]):
        # the collapse right after the resume is never averaged with the level before it
        assert "▁▂▃▄▅▆▇█".index(after[0]) < "▁▂▃▄▅▆▇█".index(before[-1]) - 2


# ------------------------------------------------------------------------- --fail-on with findings


@pytest.fixture(scope="module")
def lr_restart(tmp_path_factory) -> Path:
    """The generator's run whose LR scheduler is re-created at the resume (reference correct)."""
    out = tmp_path_factory.mktemp("lr")
    subprocess.run([sys.executable, str(REPO / "sample_runs" / "generate.py"), "--out", str(out), "--scenarios",
                    "lr-restart", "--trackers", "tensorboard", "--step-delay", "0", "--restart-gap", "0.2", "--quiet"],
                   check=True, cwd=REPO, capture_output=True)
    fault = json.loads((out / "manifest.json").read_text())["runs"][0]["faults"][0]
    assert fault["fault"] == "lr_schedule_restart"
    return out / "tensorboard" / "lr-restart", fault["step"]


def test_fail_on_gates_on_error_findings_of_the_named_detectors(lr_restart, tmp_path):
    lr_restart, step = lr_restart
    assert check(lr_restart).exit_code == 0  # by default only the reference reset fails the check
    named = check(lr_restart, "--fail-on", "lr_schedule_restart")
    assert named.exit_code == 1
    lines = named.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lr-restart: lr_schedule_restart at step {step}: ")
    assert check(lr_restart, "--fail-on", "optimizer_state_lost,kl_coef_reset").exit_code == 0
    assert check(lr_restart, "--fail-on", "reference_reset", "--fail-on", "all").exit_code == 1
    junit = tmp_path / "j.xml"
    check(lr_restart, "--fail-on", "lr_schedule_restart", "--junit", junit)
    failure = ET.parse(junit).getroot().find("testcase/failure")
    assert failure is not None and failure.get("type") == "finding" and "lr_schedule_restart" in failure.get("message")
    typo = check(lr_restart, "--fail-on", "lr_schedule_rstart")
    assert typo.exit_code == 2 and "unknown detector" in typo.stderr


# --------------------------------------------------------------------------------------- Python API


def test_assert_no_reference_reset_message_names_run_step_kl_and_score(runs):
    with pytest.raises(AssertionError) as caught:
        assert_no_reference_reset(runs / "bad" / "grpo-buggy")
    msg = str(caught.value)
    assert "run 'grpo-buggy'" in msg and "boundary step 41" in msg and "resumed from step 40" in msg
    assert "KL before 0.0" in msg and "KL after " in msg and "score 1.00" in msg


def test_assert_no_reference_reset_passes_a_good_resume_and_returns_the_scan(runs):
    result = assert_no_reference_reset(runs / "good" / "grpo-fixed", min_boundaries=1)
    assert [v.verdict for r in result.results for v in r.verdicts] == ["ok"]


def test_assert_no_reference_reset_fails_when_the_resume_is_not_in_the_logs(runs, tmp_path):
    with pytest.raises(AssertionError, match="expected at least 1 resume boundary"):
        assert_no_reference_reset(runs / "good" / "grpo-continuous", min_boundaries=1)
    with pytest.raises(AssertionError, match="could not read any run"):
        assert_no_reference_reset(tmp_path / "nothing-here")
    with pytest.raises(AssertionError, match="could not read"):
        assert_no_reference_reset(runs / "good", tmp_path / "nothing-here")
    assert_no_reference_reset(runs / "good", tmp_path / "nothing-here", allow_unreadable=True)


def test_assert_no_reference_reset_honours_declared_intentional_resets(runs):
    assert_no_reference_reset(runs / "bad" / "grpo-buggy", intentional_reset=[41])


# ------------------------------------------------------------------------------------------ examples


# The GitHub Actions example now gates through the action (a uses: step): tests/test_action.py runs it with the
# runner emulation that step needs.


def test_pytest_example_passes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path),
                           str(REPO / "examples" / "pytest_resume_test.py")], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


# --------------------------------------------------------------- a gate that cannot pass on nothing (issue 25, 1)


def test_a_misspelled_metric_fails_check_with_exit_4_and_names_the_closest_logged_name(runs):
    res = check(runs / "bad", "--metric", "train/kl_penalti")
    assert res.exit_code == 4, res.output
    assert res.stdout == ""
    err = " ".join(res.stderr.split())
    assert "no training run could be judged against its reference (2 no_kl_metric)" in err
    assert "No logged metric matches --metric train/kl_penalti: did you mean train/kl_penalty?" in err


def test_a_run_with_no_kl_at_all_fails_check_under_github_with_an_error_annotation_and_summary(tmp_path):
    write_run(tmp_path / "sft", resumes=[40], buggy=False, metric="train/grad_norm")  # logs no KL
    summary = tmp_path / "summary.md"
    res = check(tmp_path / "sft", env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert res.exit_code == 4
    assert res.stdout.startswith("::error title=klwatch%3A nothing judged::no training run could be judged")
    assert summary.read_text().startswith("### ❌ klwatch check: no training run could be judged")


def test_a_glob_prefers_the_reference_kl_over_a_look_alike_and_catches_the_reset(tmp_path):
    write_run(tmp_path / "buggy", resumes=[40], buggy=True, extra={"train/approxkl": 0.001})
    res = check(tmp_path / "buggy", "--metric", "*kl*")
    assert res.exit_code == 1, res.output
    (only,) = scan([str(tmp_path / "buggy")], config=ScanConfig(metrics=("*kl*",))).results
    assert only.metric == "train/kl_penalty" and only.status == "reference_reset"
    said = [f.message for f in only.findings if f.detector == "kl_metric"]
    assert said and "train/approxkl is a KL look-alike" in said[0] and "judged train/kl_penalty" in said[0]


def test_the_assert_api_fails_when_nothing_was_judged_or_too_few_resumes_were(runs):
    with pytest.raises(AssertionError, match="klwatch judged nothing: no training run could be judged"):
        assert_no_reference_reset(runs / "good" / "grpo-fixed", metric="train/kl_penalti", min_boundaries=1)
    assert_no_reference_reset(runs / "good" / "grpo-fixed", min_boundaries=1)


def test_a_pattern_naming_no_run_is_bad_usage_exit_2_and_lists_the_runs_there(runs):
    res = check(f"{runs}#no-such-run-*")
    assert res.exit_code == 2, res.output
    err = " ".join(res.stderr.split())
    assert "no training run matches #no-such-run-*" in err
    assert "runs there: bad/grpo-buggy, bad/grpo-ratchet, good/grpo-continuous, good/grpo-fixed" in err
    assert "could not be read" not in err and "judged against" not in err


def test_an_unreadable_table_is_named_once_in_checks_error_line(tmp_path):
    """Issue 25, 7: ``error: people.csv: people.csv: no step column``."""
    (tmp_path / "people.csv").write_text("a,b\n1,2\n")
    res = check(tmp_path / "people.csv")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: people.csv: no step column") and res.stderr.count("people.csv") == 1
