"""A GitHub Actions runner in miniature, for tests/test_action.py: it runs a job's steps, and a composite
action's steps (``action.yml``), as the runner does for the part of the workflow language klwatch's action and
its examples use, and refuses anything else (so the action cannot drift outside what is tested here).

What it does as the runner does (actions/runner, ``CompositeActionHandler``, ``ScriptHandler``):

- ``${{ ... }}``: ``inputs.X``, ``steps.ID.outputs.X``, ``github.action_path``/``workspace``, ``runner.temp``
  and ``env.X``, substituted as text wherever the runner evaluates them (``with:``, ``env:``, ``run:``, an
  action's ``outputs.*.value``); a missing value is ``''``. ``if:`` takes ``always()``, ``success()``,
  ``failure()`` and comparisons of one such value with a quoted string; a step without ``if`` runs on success.
- ``run:`` steps in a temporary script, ``shell: bash`` as ``bash --noprofile --norc -eo pipefail``, no shell
  (job steps only) as ``bash -e``, in ``$GITHUB_WORKSPACE``, with fresh ``GITHUB_OUTPUT``, ``GITHUB_ENV``,
  ``GITHUB_PATH`` and ``GITHUB_STEP_SUMMARY`` files read back after the step (``name=value`` and
  ``name<<DELIMITER`` forms); ``GITHUB_ACTION_PATH`` inside an action.
- A composite action's inputs from ``with:`` over its defaults (a required one missing or an unknown one given is
  an error), its steps in its own ``steps`` scope, its outputs evaluated after its steps even when one failed, and
  its failure the calling step's.
- ``uses:`` of ``./PATH`` (an action in the workspace) or of an ``owner/name@ref`` the test maps to a folder (what
  the runner would download for that ref). Three well-known actions stand in as themselves would here:
  ``actions/checkout`` (the test prepared the workspace), ``actions/setup-python`` (the interpreter the test names,
  on PATH unless ``update-environment: false``; outputs ``python-path``, ``python-version``) and
  ``actions/upload-artifact`` (the path is recorded).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}", re.S)
REFERENCE = re.compile(r"^(inputs|steps|github|runner|env)((?:\.[A-Za-z_][\w-]*)+)$")
COMPARISON = re.compile(r"^(\S+)\s*(==|!=)\s*'([^']*)'$")
STEP_TIMEOUT = 900
"""Seconds one step may take: far past what any step here needs, so only a hung step ends the test."""


class Unsupported(AssertionError):
    """The workflow uses something this runner does not emulate: the test fails rather than guess."""


@dataclass
class Scope:
    """What expressions see: a job's or an action's ``steps``, and an action's ``inputs`` and folder."""

    inputs: dict[str, str] = field(default_factory=dict)
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    action_path: Path | None = None
    failed: bool = False


@dataclass
class StepLog:
    """One step as it ran: its name, how it ended, what it printed."""

    name: str
    outcome: str
    output: str = ""


@dataclass
class Runner:
    """One job on one machine: its workspace, temp folder and environment, and what its steps left behind."""

    workspace: Path
    temp: Path
    env: dict[str, str]
    python: Path
    actions: dict[str, Path] = field(default_factory=dict)
    path_prepend: list[str] = field(default_factory=list)
    env_added: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    artifacts: list[str] = field(default_factory=list)
    log: list[StepLog] = field(default_factory=list)
    _files: int = 0

    def run_job(self, steps: list[dict[str, Any]]) -> Scope:
        """Run a job's steps in order; the returned scope says whether the job failed and holds each step's outputs."""
        job = Scope()
        for step in steps:
            self.run_step(step, job, in_action=False)
        return job

    def transcript(self) -> str:
        """Every step's name, outcome and output: the message a failing assertion shows."""
        return "\n".join(f"--- {s.name}: {s.outcome}\n{s.output}" for s in self.log)

    # ------------------------------------------------------------------------------------------ steps

    def run_step(self, step: dict[str, Any], scope: Scope, *, in_action: bool) -> None:
        """One step, if its condition holds; its outcome and outputs go into ``scope``."""
        known = {"name", "id", "if", "uses", "with", "run", "shell", "env", "working-directory"}
        if set(step) - known:
            raise Unsupported(f"step keys {sorted(set(step) - known)} in {step!r}")
        name = str(step.get("name") or step.get("uses") or step.get("run", "")[:40])
        if not self.condition(step.get("if"), scope):
            self.log.append(StepLog(name, "skipped"))
            return
        if "uses" in step:
            outputs, ok = self.run_uses(step, scope, name=name)
        else:
            outputs, ok = self.run_script(step, scope, name=name, in_action=in_action)
        if "id" in step:
            scope.steps[step["id"]] = {"outputs": outputs, "outcome": "success" if ok else "failure"}
        scope.failed = scope.failed or not ok

    def run_uses(self, step: dict[str, Any], scope: Scope, *, name: str) -> tuple[dict[str, str], bool]:
        """An action: one of the three stood in for, or a composite action's folder."""
        uses = str(step["uses"])
        given = {k: self.evaluate(as_text(v), scope) for k, v in (step.get("with") or {}).items()}
        if uses.startswith("actions/checkout@"):
            self.log.append(StepLog(name, "success", "the workspace is the checkout"))
            return {}, True
        if uses.startswith("actions/upload-artifact@"):
            self.artifacts.append(given.get("path", ""))
            self.log.append(StepLog(name, "success", f"artifact {given.get('path')}"))
            return {}, True
        if uses.startswith("actions/setup-python@"):
            return self.setup_python(given, name=name), True
        folder = self.workspace / uses if uses.startswith("./") else self.actions.get(uses)
        if folder is None:
            raise Unsupported(f"uses: {uses} (no folder given for it)")
        return self.run_composite(folder, given, name=name)

    def setup_python(self, given: dict[str, str], *, name: str) -> dict[str, str]:
        """``actions/setup-python``: the test's interpreter stands in for the version asked."""
        if given.get("update-environment", "true") != "false":
            self.path_prepend.insert(0, str(self.python.parent))
        self.log.append(StepLog(name, "success", f"python {given.get('python-version')} -> {self.python}"))
        return {"python-path": str(self.python), "python-version": given.get("python-version", "")}

    def run_composite(self, folder: Path, given: dict[str, str], *, name: str) -> tuple[dict[str, str], bool]:
        """A composite action: inputs over defaults, its steps in their own scope, then its outputs."""
        spec = yaml.safe_load((folder / "action.yml").read_text(encoding="utf-8"))
        if spec["runs"].get("using") != "composite":
            raise Unsupported(f"{folder}: runs.using {spec['runs'].get('using')!r}")
        declared = spec.get("inputs") or {}
        if set(given) - set(declared):
            raise Unsupported(f"{folder}: inputs {sorted(set(given) - set(declared))} are not the action's")
        inputs = {}
        for key, meta in declared.items():
            if key not in given and (meta or {}).get("required") and "default" not in (meta or {}):
                raise AssertionError(f"{folder}: required input {key!r} not given")
            inputs[key] = given.get(key, as_text((meta or {}).get("default", "")))
        inner = Scope(inputs=inputs, action_path=folder)
        self.log.append(StepLog(name, "started", f"action {folder}"))
        for step in spec["runs"]["steps"]:
            self.run_step(step, inner, in_action=True)
        outputs = {k: self.evaluate(str(v.get("value", "")), inner) for k, v in (spec.get("outputs") or {}).items()}
        return outputs, not inner.failed

    def run_script(self, step: dict[str, Any], scope: Scope, *, name: str, in_action: bool) -> tuple[dict[str, str], bool]:
        """A ``run:`` step through the shell the runner would use, with the file commands read back after it."""
        shell = step.get("shell")
        if in_action and shell is None:
            raise Unsupported(f"{name}: a composite action's run step must name its shell")
        if shell not in (None, "bash"):
            raise Unsupported(f"{name}: shell {shell!r}")
        self._files += 1
        files = {key: self.temp / "_runner_file_commands" / f"{key.lower()}_{self._files}"
                 for key in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}
        for path in files.values():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        script = self.temp / "_runner_scripts" / f"step_{self._files}.sh"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(self.evaluate(str(step["run"]), scope))
        argv = ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)] if shell else ["bash", "-e", str(script)]
        env = self.step_env(step, scope, files)
        cwd = self.workspace / self.evaluate(str(step.get("working-directory", ".")), scope)
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT)
        self.log.append(StepLog(name, "success" if proc.returncode == 0 else f"failure (exit {proc.returncode})",
                                proc.stdout + proc.stderr))
        return self.read_back(files), proc.returncode == 0

    def step_env(self, step: dict[str, Any], scope: Scope, files: dict[str, Path]) -> dict[str, str]:
        """The runner's environment, what earlier steps added (GITHUB_ENV, GITHUB_PATH), the step's own ``env:``."""
        env = {**self.env, **self.env_added, **{k: str(v) for k, v in files.items()}}
        env["PATH"] = os.pathsep.join([*self.path_prepend, self.env["PATH"]])
        if scope.action_path is not None:
            env["GITHUB_ACTION_PATH"] = str(scope.action_path)
        for key, value in (step.get("env") or {}).items():
            env[key] = self.evaluate(as_text(value), scope)
        return env

    def read_back(self, files: dict[str, Path]) -> dict[str, str]:
        """Apply a finished step's file commands; return its outputs."""
        self.env_added.update(parse_file_command(files["GITHUB_ENV"].read_text()))
        added = [line for line in files["GITHUB_PATH"].read_text().splitlines() if line.strip()]
        self.path_prepend[:0] = list(reversed(added))
        self.summary += files["GITHUB_STEP_SUMMARY"].read_text()
        return parse_file_command(files["GITHUB_OUTPUT"].read_text())

    # ------------------------------------------------------------------------------------ expressions

    def evaluate(self, text: str, scope: Scope) -> str:
        """``text`` with every ``${{ reference }}`` replaced by its value (``''`` when it has none)."""
        return EXPRESSION.sub(lambda m: self.value(m.group(1), scope), text)

    def value(self, expression: str, scope: Scope) -> str:
        """The value of one reference: ``inputs.x``, ``steps.id.outputs.x``, ``github.action_path``, ..."""
        match = REFERENCE.match(expression.strip())
        if not match:
            raise Unsupported(f"expression ${{{{ {expression} }}}}")
        root, path = match.group(1), match.group(2).split(".")[1:]
        contexts: dict[str, Any] = {
            "inputs": scope.inputs, "steps": scope.steps, "env": {**self.env, **self.env_added},
            "github": {"workspace": str(self.workspace), "action_path": str(scope.action_path or "")},
            "runner": {"temp": str(self.temp), "os": "Linux"},
        }
        node: Any = contexts[root]
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        return "" if node is None else str(node)

    def condition(self, expression: Any, scope: Scope) -> bool:
        """An ``if:``: ``always()``, ``success()``, ``failure()``, or ``reference ==|!= 'text'`` (on success)."""
        if expression is None:
            return not scope.failed
        text = str(expression).strip()
        text = EXPRESSION.fullmatch(text).group(1).strip() if EXPRESSION.fullmatch(text) else text
        functions = {"always()": True, "success()": not scope.failed, "failure()": scope.failed}
        if text in functions:
            return functions[text]
        match = COMPARISON.match(text)
        if not match:
            raise Unsupported(f"if: {expression}")
        equal = self.value(match.group(1), scope) == match.group(3)
        return not scope.failed and (equal if match.group(2) == "==" else not equal)


def as_text(value: Any) -> str:
    """A YAML value as the runner hands it to an action: ``false`` as ``"false"`` (not Python's ``"False"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def parse_file_command(text: str) -> dict[str, str]:
    """``name=value`` lines and ``name<<DELIMITER`` ... ``DELIMITER`` blocks, as the runner reads GITHUB_OUTPUT/ENV."""
    values: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if not line:
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            block = []
            for body in lines:
                if body == delimiter:
                    break
                block.append(body)
            else:
                raise AssertionError(f"{key}: no closing {delimiter!r} in a file command")
            values[key] = "\n".join(block)
        elif "=" in line:
            key, value = line.split("=", 1)
            values[key] = value
        else:
            raise AssertionError(f"a file command line the runner would refuse: {line!r}")
    return values
