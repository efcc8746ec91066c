"""A planted secret never leaves klwatch (issue 13), whatever command, output or error path.

Secrets are planted everywhere a user puts them: a password in an ``mlflow://user:PASSWORD@`` SOURCE
(pointed at the session's real ``mlflow server``, at a server that echoes every header it is sent, at a
hanging one, at a closed port, with a bad port), ``MLFLOW_TRACKING_TOKEN``/``_USERNAME``/``_PASSWORD``,
a password in ``MLFLOW_TRACKING_URI``, ``WANDB_API_KEY`` and a password in ``WANDB_BASE_URL`` (the W&B
stub), a webhook URL whose path is its token and whose userinfo is a password, a password in
``--dashboard-url``. Then every command runs as a user runs it (a real process; the progress line
under a pseudo-terminal so rich draws it), and every stdout, stderr, written file, POSTed payload and
the watcher's state file is searched for every planted value (and the basic-auth header they make).
A run whose name holds terminal escapes and workflow commands rides along: nothing of it may be live.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import hostile_servers as hs
import numpy as np
import pytest
from mlflow_server import MlflowServer, free_port
from tb_runs import write_run
from wandb_stub import StubRun, WandbStub
from webhook_receiver import Receiver

pytestmark = pytest.mark.server

MARK = "PLANTED"
PW = "PLANTED-userinfo-pw"
TOKEN = "PLANTED-mlflow-token"
USER, MPW = "alice", "PLANTED-mlflow-pw"
URI_PW = "PLANTED-tracking-uri-pw"
WANDB_KEY = ("PLANTEDwandbKey" + "k" * 40)[:40]  # a dash would split it into a prefix and a key
WANDB_PW = "PLANTED-wandb-base-url-pw"
HOOK_TOKEN, HOOK_PW = "PLANTEDhookToken0123456789", "PLANTED-hook-pw"
DASH_PW = "PLANTED-dashboard-pw"
SECRETS = [PW, TOKEN, MPW, URI_PW, WANDB_KEY, WANDB_PW, HOOK_TOKEN, HOOK_PW, DASH_PW] + [
    base64.b64encode(pair.encode()).decode() for pair in (f"user:{PW}", f"echo:{PW}", f"{USER}:{MPW}", f"hook:{HOOK_PW}")]

HOSTILE = "grpo-evil\x1b[31m\x1b]8;;http://attacker.example/\x07link\x1b]8;;\x07\x1b]52;c;cHduZWQ=\x07\x08 ##[stop-commands]x"
KLWATCH = [sys.executable, "-m", "klwatch.cli"]
T0 = 1_760_000_000_000  # ms


@dataclass
class World:
    """Everything the commands read and write to, and the environment they run in."""

    tmp: Path
    env: dict[str, str]
    sources: list[str]
    specs: dict[str, str]
    hook: str
    receiver: Receiver
    echo: hs.HostileServer
    wandb: WandbStub
    outputs: dict[str, str] = field(default_factory=dict)


def _kl(steps: range, ref: int) -> list[float]:
    """The KL of a run whose reference was last taken at step ``ref``: it grows from there."""
    return [0.05 * (1 - float(np.exp(-(s - ref) / 8.0))) for s in steps]


def _log_runs(server: MlflowServer) -> tuple[str, str]:
    """A continuous run, a run whose reference was rebuilt at its resume, and the same with a hostile name,
    in an experiment of their own: (its name, its id)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=server.url)
    exp = f"secrets-{os.getpid()}"
    exp_id = client.create_experiment(exp)
    for k, (name, resumed) in enumerate([("ctl-continuous", False), ("grpo-buggy", True), (HOSTILE, True)]):
        run = client.create_run(exp_id, run_name=name, start_time=T0 + k)
        before = range(1, 31) if resumed else range(1, 61)
        points = [Metric("train/kl_penalty", v, T0 + 5000 * s, s) for s, v in zip(before, _kl(before, 0))]
        if resumed:
            after = range(21, 61)
            points += [Metric("train/kl_penalty", v, T0 + 900_000 + 5000 * s, s) for s, v in zip(after, _kl(after, 20))]
        client.log_batch(run.info.run_id, metrics=points)
        client.set_terminated(run.info.run_id)
    return exp, exp_id


def _environment(tmp: Path, server: MlflowServer, wandb: WandbStub) -> dict[str, str]:
    """Every credential planted; the tracking URI (with a password of its own) names the real server."""
    drop = {"GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "TTY_INTERACTIVE", "NO_COLOR"}
    return {**{k: v for k, v in os.environ.items() if k not in drop},
            "COLUMNS": "200", "PYTHONUNBUFFERED": "1",
            "MLFLOW_TRACKING_URI": f"http://uri:{URI_PW}@127.0.0.1:{server.port}",
            "MLFLOW_TRACKING_TOKEN": TOKEN, "MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": MPW,
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
            "WANDB_API_KEY": WANDB_KEY, "WANDB_BASE_URL": wandb.url.replace("http://", f"http://wb:{WANDB_PW}@"),
            "WANDB_SILENT": "true", "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
            "WANDB_CONFIG_DIR": str(tmp / "wandb-config"), "KLWATCH_WANDB_TIMEOUT": "10", "KLWATCH_WANDB_RETRIES": "0"}


@pytest.fixture(scope="module")
def world(mlflow_server: MlflowServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("secrets")
    write_run(tmp / "local" / "grpo-local-buggy", resumes=[40], buggy=True)
    exp, exp_id = _log_runs(mlflow_server)
    rows = [{"_step": s, "train/kl_penalty": v} for s, v in zip(range(1, 41), _kl(range(1, 41), 0))]
    with WandbStub(runs={("team", "rl"): [StubRun(id="w1", name="wandb-run", rows=rows)]}) as wandb, \
            hs.HostileServer(hs.echo_headers_answer(500)) as echo, \
            hs.HostileServer(hs.silent_answer()) as silent:
        receiver = Receiver().start()
        ml = f"mlflow://user:{PW}@127.0.0.1:{mlflow_server.port}/{exp}"
        specs = {"mlflow": ml, "nomatch": ml + "#nomatch-*", "unreachable": f"mlflow://user:{PW}@127.0.0.1:{free_port()}",
                 "badport": f"mlflow://user:{PW}@127.0.0.1:99999", "echo": f"mlflow://echo:{PW}@127.0.0.1:{echo.port}",
                 "wandb": "wandb://team/rl", "silent": f"mlflow://user:{PW}@127.0.0.1:{silent.port}"}
        sources = [str(tmp / "local"), *(specs[k] for k in ("mlflow", "nomatch", "unreachable", "badport", "echo", "wandb"))]
        hook = receiver.url.replace("http://", f"http://hook:{HOOK_PW}@") + f"/services/T0/B0/{HOOK_TOKEN}"
        yield World(tmp=tmp, env=_environment(tmp, mlflow_server, wandb), sources=sources, specs=specs, hook=hook,
                    receiver=receiver, echo=echo, wandb=wandb)
        receiver.stop()
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=mlflow_server.url).delete_experiment(exp_id)  # the session's server is shared


def _run(world: World, label: str, args: list[str], **env: str) -> str:
    """One command as a user runs it; its stdout and stderr, kept under ``label``."""
    full = {**world.env, "WANDB_CACHE_DIR": str(world.tmp / f"wandb-{label}"), **env}
    for k in [k for k, v in env.items() if v is None]:
        full.pop(k)
    out = subprocess.run([*KLWATCH, *args], capture_output=True, text=True, env=full, timeout=120)
    assert "Traceback" not in out.stderr, (label, out.stderr[-3000:])
    world.outputs[f"{label} stdout"], world.outputs[f"{label} stderr"] = out.stdout, out.stderr
    return out.stdout


def _run_in_pty(world: World, args: list[str]) -> str:
    """A command whose stderr is a pseudo-terminal, so rich draws its progress line there: all it drew."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*KLWATCH, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                            env={**world.env, "TERM": "xterm-256color"})
    os.close(slave)
    drawn: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            drawn.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    stdout, _ = proc.communicate(timeout=120)
    reader.join(timeout=30)
    os.close(master)
    text = b"".join(drawn).decode("utf-8", "replace")
    world.outputs["progress stdout"], world.outputs["progress terminal"] = stdout.decode("utf-8", "replace"), text
    return text


def _commands(world: World) -> list[tuple[str, list[str], dict[str, str | None]]]:
    """(label, arguments, environment) of every command and error path run against the planted secrets."""
    t, src, spec = world.tmp, world.sources, world.specs
    gh = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(t / "summary.md")}
    return [
        ("scan table", ["scan", *src], {}),
        ("scan json", ["scan", *src, "-f", "json"], {}),
        ("scan markdown", ["scan", *src, "-f", "markdown"], {}),
        ("scan files", ["scan", *src, "-f", "json", "-o", str(t / "report.json"), "--junit", str(t / "scan.xml")], {}),
        ("scan md file", ["scan", *src, "-f", "markdown", "-o", str(t / "report.md")], {}),
        ("scan nothing readable", ["scan", spec["unreachable"], spec["badport"]], {}),
        ("check", ["check", *src, "--junit", str(t / "check.xml")], {}),
        ("check github", ["check", *src, "--junit", str(t / "check-gh.xml")], gh),
        ("watch", ["watch", "--once", *src, "--webhook", world.hook, "--state", str(t / "state.db"),
                   "--dashboard-url", f"https://viewer:{DASH_PW}@dash.example.com/"], {}),
        ("compare json", ["compare", spec["mlflow"] + "#ctl-*", spec["mlflow"] + "#grpo-buggy", "-f", "json"], {}),
        ("compare table", ["compare", spec["mlflow"] + "#ctl-*", spec["mlflow"] + "#grpo-buggy"], {}),
        ("compare unreadable", ["compare", spec["unreachable"], spec["mlflow"] + "#grpo-buggy"], {}),
        ("compare bad port", ["compare", spec["mlflow"] + "#ctl-*", spec["badport"]], {}),
        ("usage error", ["compare", spec["mlflow"], spec["mlflow"], spec["unreachable"]], {}),
        # no tracking URI: the environment's credentials go to the server named, which echoes them back
        ("echo token", ["check", spec["echo"].replace(f"echo:{PW}@", "")], {
            **gh, "MLFLOW_TRACKING_URI": None, "MLFLOW_TRACKING_USERNAME": None, "GITHUB_STEP_SUMMARY": str(t / "s2.md")}),
        ("echo basic", ["scan", spec["echo"].replace(f"echo:{PW}@", ""), "-f", "json"], {"MLFLOW_TRACKING_URI": None}),
    ]


@pytest.fixture(scope="module")
def outputs(world: World) -> dict[str, str]:
    """Every command run (three at a time), and every file and payload they wrote, by name."""
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        progress = pool.submit(_run_in_pty, world, ["scan", world.specs["silent"], world.specs["mlflow"],
                                                    "--max-read-seconds", "2"])
        jobs = [pool.submit(_run, world, label, args, **env) for label, args, env in _commands(world)]
        for job in [progress, *jobs]:
            job.result()
    for name in ("report.json", "scan.xml", "report.md", "check.xml", "check-gh.xml", "summary.md", "s2.md"):
        world.outputs[name] = (world.tmp / name).read_text(encoding="utf-8")
    state = b"".join(p.read_bytes() for p in world.tmp.glob("state.db*"))
    world.outputs["state file"] = state.decode("latin-1")
    for i, req in enumerate(world.receiver.requests):
        world.outputs[f"payload {i}"] = json.dumps(req.body, ensure_ascii=False)
    assert time.monotonic() - started < 90
    return world.outputs


def test_no_planted_secret_in_any_output_file_or_payload(outputs: dict[str, str]) -> None:
    leaks = [(name, s) for name, text in outputs.items() for s in [MARK, *SECRETS] if s in text]
    assert not leaks, leaks


def test_the_secrets_were_in_play(world: World, outputs: dict[str, str]) -> None:
    """A scan that read nothing would leak nothing: the servers were reached, with the credentials."""
    report = json.loads(outputs["report.json"])
    specs = [s["spec"] for s in report["sources"]]
    assert f"mlflow://***@127.0.0.1:{world.specs['mlflow'].rsplit(':', 1)[1]}" in specs
    names = {r["name"] for r in report["lineages"]}
    assert {"grpo-local-buggy", "grpo-buggy", "ctl-continuous", "wandb-run"} <= names
    sent = [r.headers.get("authorization", "") for r in world.echo.requests]
    assert any(TOKEN in base64.b64decode(h.split()[-1] + "==").decode("latin-1", "replace") or TOKEN in h for h in sent)
    assert any(h.startswith("Basic ") for h in sent)
    assert any("Bearer ***" in outputs[k] for k in ("echo token stdout",))  # echoed back, and masked
    assert len(world.receiver.requests) >= 3 and all(HOOK_TOKEN in r.path for r in world.receiver.requests)
    sources = {r.body["blocks"][2]["elements"][0]["text"].rsplit("source ", 1)[1] for r in world.receiver.requests}
    assert any(s.startswith("`mlflow://***@127.0.0.1:") for s in sources)
    assert "https://dash.example.com/?run=" in outputs["watch stdout"]


def test_every_error_path_named_the_source_redacted(world: World, outputs: dict[str, str]) -> None:
    err = outputs["scan table stderr"]
    port = world.specs["unreachable"].rsplit(":", 1)[1]
    assert f"mlflow://***@127.0.0.1:{world.specs['mlflow'].rsplit(':', 1)[1]}#nomatch-*: no training run matches" in err
    assert f"127.0.0.1:{port}" in err and "mlflow://***@127.0.0.1:99999" in err and "HTTP 500" in err
    assert "error CONTROL mlflow://***@127.0.0.1:" in outputs["compare unreadable stderr"]
    assert "wandb-run" in outputs["scan table stdout"] and "Basic ***" in outputs["echo basic stdout"]
    assert "Got unexpected extra argument(s) (mlflow://***@127.0.0.1:" in outputs["usage error stderr"]


def test_the_progress_line_shows_the_source_redacted(world: World, outputs: dict[str, str]) -> None:
    drawn = outputs["progress terminal"]
    assert "reading" in drawn and f"mlflow://***@127.0.0.1:{world.specs['silent'].rsplit(':', 1)[1]}" in drawn


def test_a_hostile_run_name_is_inert_everywhere(outputs: dict[str, str]) -> None:
    shown = {k: v for k, v in outputs.items() if not k.startswith(("payload", "state", "progress terminal"))}
    assert any("grpo-evil" in v for v in shown.values())
    for name, text in shown.items():
        assert not any(c in text for c in "\x1b\x07\x08"), name
        assert "##[" not in text, name
        lines = [ln for ln in text.split("\n") if ln.lstrip().startswith("::")]
        assert all(ln.startswith("::error title=klwatch") for ln in lines), (name, lines)
    assert "\x1b]52" not in outputs["progress terminal"] and "\x1b]8;;http" not in outputs["progress terminal"]


# --- a secret echoed back in another form (issue 24, 4) ------------------------------------------------------

ECHO_TOKEN = "tok-9f8e7d6c5b4a3921-planted"


def _echo_forms_of_the_token() -> dict[str, str]:
    import urllib.parse

    return {"percent-encoded": urllib.parse.quote(ECHO_TOKEN, safe=""), "first 14": ECHO_TOKEN[:14],
            "base64": base64.b64encode(ECHO_TOKEN.encode()).decode(), "upper-cased": ECHO_TOKEN.upper(),
            "8 in the middle": ECHO_TOKEN[6:14]}


@pytest.mark.server
@pytest.mark.parametrize("form", list(_echo_forms_of_the_token()))
def test_a_token_echoed_back_in_another_form_is_masked_in_every_output(tmp_path, form: str) -> None:
    echoed = _echo_forms_of_the_token()[form]

    def answer(req, conn, stop) -> None:
        hs.send_json(conn, 400, {"error_code": "BAD_REQUEST", "message": f"token was <{echoed}>"})

    with hs.HostileServer(answer) as server:
        env = {**os.environ, "MLFLOW_TRACKING_TOKEN": ECHO_TOKEN}
        env.pop("MLFLOW_TRACKING_URI", None)
        out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", server.spec, "--format", "json",
                              "-o", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"), "--no-cache"],
                             capture_output=True, text=True, timeout=300, env=env)
    said = out.stdout + out.stderr + (tmp_path / "r.json").read_text() + (tmp_path / "j.xml").read_text()
    assert server.requests and "token was <***>" in said, said[-2000:]
    for shown in _echo_forms_of_the_token().values():
        assert shown.lower() not in said.lower(), (form, shown)
    windows = {ECHO_TOKEN[i:i + 8].lower() for i in range(len(ECHO_TOKEN) - 7)}
    assert not [w for w in windows if w in said.lower()], form
