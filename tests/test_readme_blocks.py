"""Issue 25, 8: every shell and Python block of the README runs as written, so it cannot drift from the program.

Each command runs in a workspace that holds what the README's placeholders stand for: ``runs/`` is a copy of
sample runs (one of them reset), ``sample_runs/`` and ``dashboard/`` are the repository's, ``127.0.0.1:5000``
is a real ``mlflow server`` on a free port serving a copy of the sample MLflow store, ``wandb://`` SOURCEs are
answered by the W&B stub the real ``wandb`` client talks to (the W&B cloud cannot run here), ``$SLACK_WEBHOOK``
is a webhook receiver on loopback, and ``/var/lib/klwatch`` a folder of the workspace. The only other changes:
a free port for each dashboard (``--port``/``--server.port``). A command that serves (the dashboard, ``watch``
without ``--once``) counts as run once it answers. What cannot run here is listed in ``NOT_HERE`` with why.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlflow_server import free_port, serving_a_copy
from wandb_stub import StubRun, WandbStub
from webhook_receiver import Receiver

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
pytestmark = pytest.mark.server

NOT_HERE = {
    "bash scripts/setup.sh && .venv/bin/klwatch dashboard":
        "makes a fresh venv from the package index; its dashboard half runs below as `klwatch dashboard`, "
        "the setup is what CI's .ci/run does",
    "bash scripts/test.sh": "the whole test suite, which this test is part of (CI runs it)",
    "bash scripts/lock.sh && bash scripts/test.sh": "re-resolves every dependency from the package index (the network)",
}
"""README commands that cannot run inside the suite, and why."""
PYTHON_ELSEWHERE = {
    "guard_resumes(trainer": "needs a TRL trainer (the trl extra): tests/integrations/test_trl_guard*.py makes the "
                             "same call on real TRL trainers",
    "detector.stream(": "run by tests/test_readme.py with its two KL lists bound to a resumed run",
}
"""README Python blocks run by other tests, and where."""


@dataclass(frozen=True)
class Command:
    line: int
    text: str
    comment: str


def readme_blocks() -> list[tuple[int, str, str]]:
    """(line, language, text) of every fenced block of the README."""
    text = README.read_text()
    return [(text[:m.start()].count("\n") + 2, m.group(1), m.group(2))
            for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]


def commands() -> list[Command]:
    """Every command of the README's bash blocks: continuation lines joined, its comment kept apart."""
    out = []
    for line, lang, text in readme_blocks():
        if lang != "bash":
            continue
        for i, raw in enumerate(re.sub(r"\\\n\s*", "", text).splitlines()):
            code, _, comment = raw.partition(" #")
            if code.strip() and not code.lstrip().startswith("#"):
                out.append(Command(line + i, code.strip(), comment.strip()))
    return out


def test_every_readme_block_is_run_here_or_listed_with_why() -> None:
    langs = {lang for _, lang, _ in readme_blocks()}
    # nginx: a server's configuration, not a command; yaml: the action's uses: block, run by tests/test_action.py
    assert langs <= {"bash", "python", "nginx", "yaml"}, langs
    listed = [c for c in commands() if c.text in NOT_HERE]
    assert len(listed) == len(NOT_HERE)  # nothing listed that is no longer in the README


def _rows(n: int) -> list[dict]:
    return [{"_step": s, "_timestamp": 1.76e9 + 2.0 * s, "train/kl_penalty": 0.01 + math.sin(s / 50) * 1e-3}
            for s in range(n)]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The folder the commands run in, the environment they get, and the servers behind their placeholders."""
    root = tmp_path_factory.mktemp("readme")
    for name in ("resume-buggy", "resume-fixed", "continuous"):
        shutil.copytree(REPO / "sample_runs" / "tensorboard" / name, root / "runs" / name)
    for name in ("sample_runs", "dashboard"):
        (root / name).symlink_to(REPO / name)
    (root / "var-lib-klwatch").mkdir()
    stub_runs = [StubRun(id="r1", name="grpo-7b", rows=_rows(60))]
    receiver = Receiver().start()
    with serving_a_copy(REPO / "sample_runs" / "mlflow" / "mlflow.db", workdir=root) as server, \
            WandbStub(runs={("my-team", "rl-project"): stub_runs, ("team", "rl"): stub_runs}) as stub:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               "WANDB_BASE_URL": stub.url, "WANDB_API_KEY": "k" * 40, "WANDB_SILENT": "true",
               "WANDB_CONFIG_DIR": str(root / "wandb-config"), "WANDB_CACHE_DIR": str(root / "wandb-cache"),
               "KLWATCH_WANDB_TIMEOUT": "20", "SLACK_WEBHOOK": receiver.url + "/hook", "COLUMNS": "200"}
        yield {"root": root, "env": env, "mlflow_port": server.port, "receiver": receiver}
    receiver.stop()


def bind(command: Command, ws: dict) -> tuple[str, int | None]:
    """The command as run here (placeholders bound), and the port it serves on (None: it runs and exits)."""
    text = command.text.replace("127.0.0.1:5000", f"127.0.0.1:{ws['mlflow_port']}")
    text = text.replace("/var/lib/klwatch/", f"{ws['root'] / 'var-lib-klwatch'}/")
    if text.startswith("klwatch dashboard") or " streamlit run " in f" {text}":
        port = free_port()
        if "streamlit run" in text:
            return text.replace("dashboard/app.py", f"dashboard/app.py --server.port={port}"), port
        if "--port " in text:
            return re.sub(r"--port \d+", f"--port {port}", text), port
        return text.replace("klwatch dashboard", f"klwatch dashboard --port {port}", 1), port
    if text.startswith("klwatch watch") and "--once" not in text:
        return text, 0
    return text, None


def serves(text: str, *, port: int, ws: dict, timeout: float = 120.0) -> str:
    """Start a serving command, wait until it answers (its health URL; for ``watch``, its first alert at the
    webhook), stop it; what it wrote."""
    before = len(ws["receiver"].requests)
    proc = subprocess.Popen(["bash", "-c", text], cwd=ws["root"], env=ws["env"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(port) if port else len(ws["receiver"].requests) > before:
                return "up"
            time.sleep(0.2)
        return f"did not answer (exit {proc.poll()}): " + (proc.stdout.read() if proc.poll() is not None else "")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_every_readme_command_runs_as_written(workspace: dict) -> None:
    """Each command exits 0 or 1 (1: the sample runs hold resets) with no traceback, or serves; an ``echo $?``
    line shows the exit code its comment says the command before it gives."""
    failures, last_rc = [], None
    for c in commands():
        if c.text in NOT_HERE:
            continue
        if c.text == "echo $?":
            said = re.match(r"(\d+)", c.comment)
            if said and last_rc != int(said.group(1)):
                failures.append(f"README line {c.line}: the exit code before it is {last_rc}, the README says {said[1]}")
            continue
        text, port = bind(c, workspace)
        if port is not None:
            got = serves(text, port=port, ws=workspace)
            if got != "up":
                failures.append(f"README line {c.line}: {c.text}: {got[-2000:]}")
            continue
        proc = subprocess.run(["bash", "-c", text], cwd=workspace["root"], env=workspace["env"], capture_output=True,
                              text=True, timeout=300)
        last_rc = proc.returncode
        if proc.returncode not in (0, 1) or "Traceback" in proc.stderr:
            failures.append(f"README line {c.line}: {c.text}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
        elif "exit 0" in c.comment and proc.returncode != 0:
            failures.append(f"README line {c.line}: {c.text}: exit {proc.returncode}, the README says 0")
    assert not failures, "\n\n".join(failures)


def test_every_readme_python_block_runs_or_is_run_elsewhere(workspace: dict, tmp_path: Path) -> None:
    """The assert API example with its ``train`` bound to the sample generator's resume (a correct one, then a
    buggy one that must fail it); the other blocks are run by the tests ``PYTHON_ELSEWHERE`` names."""
    blocks = [text for _, lang, text in readme_blocks() if lang == "python"]
    elsewhere = [b for b in blocks if any(marker in b for marker in PYTHON_ELSEWHERE)]
    [api] = [b for b in blocks if "assert_no_reference_reset(" in b]
    assert len(elsewhere) + 1 == len(blocks)
    for buggy in (False, True):
        logdir = tmp_path / ("buggy" if buggy else "fixed")
        scope = {"train": _trainer(buggy=buggy)}
        exec(compile(api, "README.md", "exec"), scope)
        if buggy:
            with pytest.raises(AssertionError, match="KL reference reset in run"):
                scope["test_resume_keeps_the_reference"](logdir)
        else:
            scope["test_resume_keeps_the_reference"](logdir)


def _trainer(*, buggy: bool):
    """``train(steps=, logdir=, resume=False)`` as the README calls it: the sample generator's job writes a
    checkpoint, crashes and resumes in one go (its second call, ``resume=True``, has nothing left to do)."""
    def train(*, steps: int, logdir: Path, resume: bool = False) -> None:
        if resume:
            return
        scenario = "resume-buggy" if buggy else "resume-fixed"
        subprocess.run([sys.executable, str(REPO / "sample_runs" / "generate.py"), "--out", str(logdir), "--scenarios",
                        scenario, "--trackers", "tensorboard", "--step-delay", "0", "--restart-gap", "0.2",
                        "--quiet"], check=True, cwd=REPO, timeout=300)
    return train


def _table_rows() -> list[tuple[list[str], list[str]]]:
    """The README's option table: (options, commands) per row, the commands of the row's parenthesis or else
    the header's."""
    text = README.read_text()
    header = re.search(r"^\| option \(([^)]*)\) \| what it does \|$", text, re.M)
    assert header, "the option table's header"
    every = re.findall(r"`(\w+)`", header.group(1))
    rows = []
    for line in text[header.end():].split("\n\n", 1)[0].splitlines()[2:]:
        cell = line.split(" | ")[0].lstrip("| ")
        own = re.search(r"\(((?:`\w+`(?:, )?)+)\)\s*$", cell)
        rows.append((re.findall(r"`(-[-\w]+)", cell), re.findall(r"`(\w+)`", own.group(1)) if own else every))
    return rows


def _options(command: str) -> set[str]:
    import typer

    from klwatch.cli import app

    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")} - {"--help"}


def test_the_option_table_lists_what_the_commands_take_and_nothing_they_do_not() -> None:
    """Issue 25, 8: it listed ``--junit`` for ``watch`` and left out ``--max-read-bytes``, ``--max-read-seconds``
    and ``-o``."""
    rows = _table_rows()
    wrong = [(opt, c) for opts, cmds in rows for opt in opts for c in cmds if opt not in _options(c)]
    assert not wrong, wrong
    listed = {opt for opts, _ in rows for opt in opts}
    assert _options("scan") <= listed, sorted(_options("scan") - listed)
