"""How a SOURCE and its files are named: the one home of these rules, in the standard library only, so
a warm ``klwatch scan`` (the scan cache's memo) can apply them before anything that reads is loaded."""

from __future__ import annotations

import os

REMOTE_PREFIXES = ("wandb://", "mlflow://", "mlflow+http://", "mlflow+https://")
"""SOURCEs read from a server, not from this machine's files."""
TABLE_SUFFIXES = frozenset({".csv", ".jsonl", ".parquet"})
INPUT_SUFFIXES = TABLE_SUFFIXES | {".db", ".wandb"}
"""Files a reader would open (besides event files): one that is not a regular file is skipped aloud."""
SKIP_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules", ".ipynb_checkpoints"})
"""Folders discovery never walks into, at any depth: nothing in them is a run."""


def split_pattern(spec: str) -> tuple[str, str | None]:
    """``mlflow.db#grpo-*`` -> (``mlflow.db``, ``grpo-*``): the run-name glob is applied by the pipeline."""
    if "#" in spec:
        base, pattern = spec.rsplit("#", 1)
        return base, (pattern or None)
    return spec, None


def is_input_name(name: str) -> bool:
    """Named like something a reader opens (an event file, a table, a store, a W&B log)."""
    if name.startswith("events.out.tfevents"):
        return not name.endswith(".profile-empty")
    return os.path.splitext(name)[1] in INPUT_SUFFIXES
