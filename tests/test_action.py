"""The GitHub Action (``action.yml``) as a runner runs it: its steps, the README's ``uses:`` block and the example
workflow through ``tests/action_runner.py``, on copies of the sample runs with and without a reset.

No GitHub runner is available here, so the runner is emulated for what the action uses (see action_runner.py);
everything the action's scripts do runs for real, the install step included. That step needs the package index,
which the suite must not use: the action reuses a klwatch venv that a first use in the job would have left in
``$RUNNER_TEMP`` (here made by the test, borrowing the test venv's installed packages through a path entry, as
tests/test_wheel.py does), and pip is told there is no index (``PIP_NO_INDEX``, no config file, a dead proxy).
So the step's pip really builds klwatch from the action's folder with the locked setuptools and installs it into
that venv; it fails, and the test with it, if it would need to download anything. The action's folder is a copy
of this checkout's files with the version marked (``+from.action.path``), so the klwatch that runs is shown to be
the one installed from there and not the test venv's own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml

import klwatch
from action_runner import Runner, Scope

REPO = Path(__file__).resolve().parents[1]
MARK = "from.action.path"
"""The local version label the action's copy carries: ``klwatch --version`` says which klwatch ran."""
ACTION_FILES = ("action.yml", "pyproject.toml", "README.md", "requirements/lock.txt")
PACKAGE_FOLDERS = ("detectors", "dashboard")
PINNED = f"owner/klwatch@v{klwatch.__version__}"
"""How a workflow names this release of the action (the tests map it to the copy, as the runner downloads it)."""


def copy_action(dest: Path) -> Path:
    """What the action needs from a checkout at its ref, with the version marked."""
    for name in ACTION_FILES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name)
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    init = dest / "detectors" / "__init__.py"
    text = init.read_text(encoding="utf-8")
    marked = text.replace(f'__version__ = "{klwatch.__version__}"', f'__version__ = "{klwatch.__version__}+{MARK}"')
    assert marked != text, "the version line of detectors/__init__.py"
    init.write_text(marked, encoding="utf-8")
    return dest


@pytest.fixture(scope="module")
def action_ref(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The action's folder at the pinned ref."""
    return copy_action(tmp_path_factory.mktemp("action") / "klwatch")


def stand_in_python(folder: Path) -> Path:
    """What actions/setup-python gives: a ``python`` (and ``python3``) on its own, here the test's interpreter."""
    folder.mkdir(parents=True)
    for name in ("python", "python3"):
        (folder / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (folder / name).chmod(0o755)
    return folder / "python"


def earlier_klwatch_venv(temp: Path) -> Path:
    """The venv a first use of the action in the job leaves in $RUNNER_TEMP, with the test venv's packages on its
    path (a .pth path entry: that venv's own .pth files, its editable klwatch among them, stay out)."""
    folder = temp / "klwatch-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    site = subprocess.run([str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "test-venv-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder


def runner_env(workspace: Path, temp: Path) -> dict[str, str]:
    """A runner's environment: the machine's PATH without the test venv (no klwatch on it), the GITHUB_* variables,
    and no way for pip to reach an index."""
    keep = ("HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYENV_ROOT", "KLWATCH_CACHE_DIR")
    path = [p for p in os.environ["PATH"].split(os.pathsep) if p and Path(p) != Path(sys.executable).parent]
    dead_proxy = "http://127.0.0.1:9"
    return {**{k: os.environ[k] for k in keep if k in os.environ}, "PATH": os.pathsep.join(path),
            "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(temp),
            "RUNNER_OS": "Linux", "GITHUB_REPOSITORY": "owner/project", "GITHUB_ACTION": "__owner_klwatch",
            "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "HTTP_PROXY": dead_proxy, "HTTPS_PROXY": dead_proxy, "http_proxy": dead_proxy, "https_proxy": dead_proxy}


def make_runner(root: Path, action: Path) -> Runner:
    """A fresh job: an empty workspace and temp folder, the earlier klwatch venv, the stand-in setup-python."""
    workspace, temp = root / "workspace", root / "runner-temp"
    workspace.mkdir(parents=True)
    temp.mkdir()
    earlier_klwatch_venv(temp)
    runner = Runner(workspace=workspace, temp=temp, env=runner_env(workspace, temp), python=stand_in_python(root / "toolcache"),
                    actions={PINNED: action})
    assert shutil.which("klwatch", path=runner.env["PATH"]) is None, "klwatch must come from the action"
    return runner


def sample_runs(workspace: Path, *names: str) -> None:
    """Copies of sample_runs/tensorboard/NAME as runs/NAME in the workspace."""
    for name in names:
        shutil.copytree(REPO / "sample_runs" / "tensorboard" / name, workspace / "runs" / name)


def planted(*names: str) -> Counter:
    """The verdict of every resume of those sample runs, as the generator's manifest records what it did."""
    manifest = json.loads((REPO / "sample_runs" / "manifest.json").read_text())
    runs = {r["path"]: r for r in manifest["runs"]}
    return Counter(b["expected_verdict"] for n in names for b in runs[f"tensorboard/{n}"]["boundaries"])


def counts(expected: Counter, runs: int) -> dict[str, str]:
    """The outputs the action should set for those verdicts."""
    out = {v.replace("_", "-"): str(expected[v]) for v in ("reference_reset", "ok", "intentional", "inconclusive")}
    return {**out, "boundaries": str(sum(expected.values())), "runs": str(runs)}


def step_output(runner: Runner, name: str) -> str:
    """What the step of that name printed."""
    [log] = [s for s in runner.log if s.name == name]
    return log.output


def without_clock(report: str) -> str:
    """A JSON report without its ``generated_at``: two scans of the same runs then read the same."""
    return re.sub(r'"generated_at": "[^"]*"', "", report)


def readme_action_block() -> list[dict]:
    """The README's ``uses:`` block (the CI section's first), as the steps it is."""
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    [block] = [b for b in blocks if "/klwatch@v" in b]
    return yaml.safe_load(block)


# ------------------------------------------------------------------------------------------------ the action


def test_check_json_is_the_report_scan_gives_and_is_written_on_a_reset(tmp_path):
    """What the action counts verdicts from: ``check --json FILE``, written whatever check exits."""
    from typer.testing import CliRunner

    from klwatch.cli import app

    runs = REPO / "sample_runs" / "tensorboard" / "resume-buggy"
    checked = CliRunner().invoke(app, ["check", str(runs), "--json", str(tmp_path / "r.json")],
                                 env={"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None})
    scanned = CliRunner().invoke(app, ["scan", str(runs), "--format", "json"])
    assert checked.exit_code == scanned.exit_code == 1
    assert without_clock((tmp_path / "r.json").read_text()) == without_clock(scanned.stdout)


def test_no_input_is_pasted_into_a_script_only_passed_through_env():
    """Script injection: the runner pastes ``${{ ... }}`` into a script's text before bash reads it, so a SOURCE
    named ``$(curl ...)`` would run. Every run step takes its values from ``env:`` instead, and runs in bash."""
    spec = yaml.safe_load((REPO / "action.yml").read_text(encoding="utf-8"))
    steps = spec["runs"]["steps"]
    scripts = [s for s in steps if "run" in s]
    assert scripts and all("${{" not in s["run"] and s.get("shell") == "bash" for s in scripts)
    passed = {m for s in steps for v in (s.get("env") or {}).values() for m in re.findall(r"inputs\.([\w-]+)", str(v))}
    passed |= {m for s in steps for v in (s.get("with") or {}).values() for m in re.findall(r"inputs\.([\w-]+)", str(v))}
    assert passed == set(spec["inputs"]), "every input is used, through env: or with:"
    assert set(spec["outputs"]) >= {"exit-code", "reference-reset", "ok", "intentional", "inconclusive"}


def test_the_readme_block_fails_the_job_on_a_reset_with_outputs_summary_and_junit(action_ref, tmp_path):
    steps = readme_action_block()
    [uses] = [s["uses"] for s in steps if "klwatch@" in s.get("uses", "")]
    assert uses.endswith(f"/klwatch@v{klwatch.__version__}"), "the README pins this release"
    runner = make_runner(tmp_path, action_ref)
    runner.actions[uses] = action_ref
    sample_runs(runner.workspace, "resume-buggy", "resume-fixed", "continuous")
    job = runner.run_job(steps)
    why = runner.transcript()
    assert job.failed and job.steps["klwatch"]["outcome"] == "failure", why
    outputs = job.steps["klwatch"]["outputs"]
    expected = planted("resume-buggy", "resume-fixed", "continuous")
    assert expected["reference_reset"] == 1
    assert {k: outputs[k] for k in counts(expected, 3)} == counts(expected, 3), why
    assert outputs["exit-code"] == "1", why
    assert f"klwatch {klwatch.__version__}+{MARK}" in step_output(runner, "Install klwatch from this action's ref"), why
    report = json.loads(Path(outputs["report"]).read_text())
    assert report["tool_version"] == f"{klwatch.__version__}+{MARK}"  # check ran the klwatch installed from the ref
    assert "::error title=klwatch" in step_output(runner, "klwatch check")
    assert runner.path_prepend == [str(runner.temp / "klwatch-path")]  # klwatch alone; the job's python untouched
    assert "### ❌ klwatch check: 1 problem(s)" in runner.summary and "resume-buggy" in runner.summary
    assert ET.parse(runner.workspace / "klwatch.xml").getroot().get("failures") == "1"
    [after] = [s for s in runner.log[-1:] if s.outcome == "success"]  # the README's next step ran: if: always()
    assert f"exit 1: {expected['reference_reset']} reset(s) in {sum(expected.values())} resume(s)" in after.output


def test_a_clean_folder_passes_on_the_python_already_on_path(action_ref, tmp_path):
    runner = make_runner(tmp_path, action_ref)
    sample_runs(runner.workspace, "resume-fixed", "continuous")
    job = runner.run_job([{"uses": PINNED, "id": "klwatch",
                           "with": {"sources": "runs/resume-fixed\n  runs/continuous  \n\n", "python-version": ""}}])
    why = runner.transcript()
    assert not job.failed, why
    assert [s.outcome for s in runner.log if s.name == "Set up Python for klwatch"] == ["skipped"]
    outputs = job.steps["klwatch"]["outputs"]
    expected = planted("resume-fixed", "continuous")
    assert expected["ok"] == 1 and expected["reference_reset"] == 0
    assert {**counts(expected, 2), "exit-code": "0"}.items() <= outputs.items(), why
    assert runner.summary.startswith("### ✅ klwatch check: no reference reset"), runner.summary


def test_inputs_reach_klwatch_as_arguments_never_as_shell_or_options(action_ref, tmp_path):
    runner = make_runner(tmp_path, action_ref)
    sample_runs(runner.workspace, "resume-fixed")
    hostile = ["$(touch pwned-1)", '"; touch pwned-2; echo "', "`touch pwned-3`", "--junit=pwned-4.xml", "runs/resume-fixed"]
    job = runner.run_job([{"uses": PINNED, "id": "klwatch",
                           "with": {"sources": "\n".join(hostile), "metric": "$(touch pwned-5)\n--help"}}])
    why = runner.transcript()
    assert job.failed and job.steps["klwatch"]["outputs"]["exit-code"] not in ("", "0"), why
    assert not [p for p in tmp_path.rglob("pwned-*")], why
    said = step_output(runner, "klwatch check")
    assert "$(touch pwned-1)" in said and "--junit=pwned-4.xml" in said, why


# ---------------------------------------------------------------------------------------- the example workflow


def workspace_checkout(workspace: Path) -> None:
    """What actions/checkout gives the example: this repository (the action and the sample generator's code)."""
    copy_action(workspace)
    (workspace / "sample_runs").mkdir()
    for module in (REPO / "sample_runs").glob("*.py"):
        shutil.copy2(module, workspace / "sample_runs" / module.name)


def test_the_example_workflow_runs_as_written(tmp_path):
    """Every step of examples/github-actions/klwatch-resume-test.yml in order, the action (``uses: ./``) included:
    the gate passes on the correct resume and says so in its outputs, compare agrees, the self-test holds."""
    workflow = yaml.safe_load((REPO / "examples" / "github-actions" / "klwatch-resume-test.yml").read_text())
    steps = workflow["jobs"]["resume-test"]["steps"]
    runner = make_runner(tmp_path, tmp_path / "unused")
    workspace_checkout(runner.workspace)
    job: Scope = runner.run_job(steps)
    why = runner.transcript()
    assert not job.failed, why
    gate = job.steps["gate"]["outputs"]
    manifest = json.loads((runner.temp / "runs" / "manifest.json").read_text())
    expected = Counter(b["expected_verdict"] for r in manifest["runs"] for b in r["boundaries"])
    assert expected == Counter(ok=1)
    assert {**counts(expected, len(manifest["runs"])), "exit-code": "0"}.items() <= gate.items(), why
    assert runner.summary.startswith("### ✅ klwatch check: no reference reset"), runner.summary
    assert ET.parse(runner.temp / "klwatch-junit.xml").getroot().get("failures") == "0"
    assert runner.artifacts == [str(runner.temp / "klwatch-junit.xml")]
    buggy = json.loads((runner.temp / "buggy" / "manifest.json").read_text())["runs"][0]["boundaries"][0]["step"]
    assert f"reference reset at step {buggy} " in (runner.temp / "buggy.txt").read_text()
