"""Read a folder of training checkpoints as resume evidence: which steps a run could resume from.

Layouts (the folder given holds the checkpoint folders):
- NeMo-RL: ``step_N/training_info.json`` (+ ``config.yaml``), and ``latest_checkpoint_status.json``
  beside them (``last_checkpoint_step``).
- Hugging Face Trainer / TRL: ``checkpoint-N/trainer_state.json``; its ``log_history`` is the
  run's logged metrics up to step N (TRL logs ``kl``, ``loss``, ``reward`` there), so the newest
  one also gives series.
- verl: ``global_step_N/`` with ``latest_checkpointed_iteration.txt`` beside them.

Only JSON, YAML and text files are read, and only the few named above: a checkpoint folder also
holds weights and pickles (``training_args.bin``, ``data.pt``, ``rng_state.pth``) that could run code
if loaded, so nothing else is ever opened. A file that cannot be parsed becomes a warning naming
it; the other checkpoints are still read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..model import Segment, Series
from .limits import BinaryText, NotRegularFile, YamlRefused, load_yaml, read_text_bytes
from .local import ReadError

LAYOUTS: list[tuple[str, re.Pattern[str]]] = [
    ("nemo-rl", re.compile(r"^step_(\d+)$")),
    ("huggingface", re.compile(r"^checkpoint-(\d+)$")),
    ("verl", re.compile(r"^global_step_(\d+)$")),
]
NAME_KEYS = ("run_name", "wandb_run_name", "experiment_name", "exp_name")
NEMO_STATUS = "latest_checkpoint_status.json"
VERL_LATEST = "latest_checkpointed_iteration.txt"
TRAINER_STATE_KEYS = ("global_step", "epoch", "max_steps", "num_train_epochs", "num_input_tokens_seen",
                      "train_batch_size", "save_steps", "logging_steps", "best_metric",
                      "best_model_checkpoint")


def _layout(name: str) -> tuple[str, int] | None:
    for layout, pattern in LAYOUTS:
        m = pattern.match(name)
        if m:
            return layout, int(m.group(1))
    return None


def _read_text(path: Path, rel: str, warnings: list[str]) -> str | None:
    """The file's text, or None: missing (no warning here), or not a regular file (a FIFO would
    block, a device never end: never opened, a warning naming it)."""
    try:
        return read_text_bytes(path).decode("utf-8")
    except FileNotFoundError:
        return None
    except BinaryText as exc:
        warnings.append(f"{rel}: {exc}; skipped")
        return None
    except NotRegularFile as exc:
        warnings.append(f"{rel}: not a regular file ({exc.kind}); skipped")
        return None


def _load_json(path: Path, rel: str, warnings: list[str]) -> Any:
    """The parsed file, or None with a warning naming it (missing files are not warned here)."""
    try:
        text = _read_text(path, rel, warnings)
        return None if text is None else json.loads(text)
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = "nested too deeply" if isinstance(exc, RecursionError) else exc
        warnings.append(f"{rel}: cannot read JSON ({why}); this checkpoint's details are skipped")
        return None


def _scalars(doc: dict[str, Any]) -> dict[str, Any]:
    """The top-level numbers and strings of a JSON object (not its nested lists or objects)."""
    return {k: v for k, v in doc.items() if isinstance(v, (int, float, str, bool)) or v is None}


def _name_in(doc: Any) -> str | None:
    if isinstance(doc, dict):
        for key in NAME_KEYS:
            if isinstance(doc.get(key), str) and doc[key]:
                return str(doc[key])
    return None


def _nemo_config_name(config: dict[str, Any]) -> str | None:
    """NeMo-RL's ``logger`` section names the run for the trackers it logs to."""
    logger = config.get("logger")
    if not isinstance(logger, dict):
        return None
    for tracker, key in (("wandb", "name"), ("mlflow", "run_name"), ("swanlab", "name")):
        section = logger.get(tracker)
        if isinstance(section, dict) and isinstance(section.get(key), str) and section[key]:
            return str(section[key])
    return None


def log_history_series(log_history: list[Any]) -> dict[str, Series]:
    """Hugging Face ``log_history`` (a list of flat dicts with ``step``) as one series per key, in
    logged order. Non-numbers (and booleans) are left out."""
    cols: dict[str, tuple[list[int], list[float]]] = {}
    for entry in log_history:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), (int, float)):
            continue
        step = int(entry["step"])
        for key, value in entry.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            steps, values = cols.setdefault(key, ([], []))
            steps.append(step)
            values.append(float(value))
    return {k: Series(np.array(s, dtype=np.int64), np.array(v, dtype=np.float64))
            for k, (s, v) in cols.items()}


@dataclass
class _Gathered:
    """What the checkpoints say about the run as a whole, gathered oldest to newest so that the
    newest checkpoint's name, config and log history win."""

    warnings: list[str] = field(default_factory=list)
    name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    newest_hf: tuple[int, list[Any]] | None = None
    """(step, ``log_history``) of the newest Hugging Face checkpoint that has one."""


def read_checkpoint_dir(path: Path, *, ref: str, source: str) -> list[Segment]:
    """One ``checkpoints`` Segment for a folder of checkpoint folders."""
    path = Path(path)
    prefix = "" if ref in ("", ".") else f"{ref}/"
    found = _checkpoint_folders(path)
    got = _Gathered()
    checkpoints = [_read_checkpoint(step, layout, folder, rel=f"{prefix}{folder.name}", got=got)
                   for step, layout, folder in found]
    meta: dict[str, Any] = {
        "checkpoints": checkpoints,
        "layouts": sorted({c["layout"] for c in checkpoints}),
    }
    _read_latest_markers(path, prefix=prefix, meta=meta, got=got)
    series: dict[str, Series] = {}
    if got.newest_hf is not None:
        meta["log_history_from"] = f"checkpoint-{got.newest_hf[0]}"
        series = log_history_series(got.newest_hf[1])

    return [Segment(
        kind="checkpoints",
        ref=ref,
        source=source,
        name=got.name or path.resolve().name,
        config=got.config,
        series=series,
        checkpoint_steps=sorted({c["step"] for c in checkpoints}),
        warnings=got.warnings,
        meta=meta,
    )]


def _checkpoint_folders(path: Path) -> list[tuple[int, str, Path]]:
    """(step, layout, folder) of every checkpoint folder in ``path``, oldest first."""
    found: list[tuple[int, str, Path]] = []
    for child in path.iterdir():
        hit = _layout(child.name)
        if hit and child.is_dir():
            found.append((hit[1], hit[0], child))
    if not found:
        raise ReadError("no checkpoint folders (step_N, checkpoint-N, global_step_N) in it")
    found.sort(key=lambda t: (t[0], t[1]))
    return found


def _read_checkpoint(step: int, layout: str, folder: Path, *, rel: str, got: _Gathered) -> dict[str, Any]:
    """One checkpoint's entry in ``meta["checkpoints"]``; what it says about the run goes to ``got``."""
    info: dict[str, Any] = {"step": step, "folder": folder.name, "layout": layout}
    if layout == "nemo-rl":
        f = _read_nemo_rl(folder, step=step, rel=rel, info=info, got=got)
    elif layout == "huggingface":
        f = _read_huggingface(folder, step=step, rel=rel, info=info, got=got)
    else:
        f = folder
    try:
        info["mtime"] = (f if f.exists() else folder).stat().st_mtime
    except OSError:
        info["mtime"] = None
    return info


def _read_nemo_rl(folder: Path, *, step: int, rel: str, info: dict[str, Any], got: _Gathered) -> Path:
    """``training_info.json`` and ``config.yaml`` of a NeMo-RL ``step_N``; the file whose time is
    the checkpoint's."""
    f = folder / "training_info.json"
    doc = _load_json(f, f"{rel}/training_info.json", got.warnings)
    if isinstance(doc, dict):
        info.update(_scalars(doc))
        info["step"] = step  # the folder name is what NeMo-RL resumes from
        got.name = _name_in(doc) or got.name
    elif doc is not None:
        got.warnings.append(f"{rel}/training_info.json: not a JSON object; skipped")
    try:
        text = _read_text(folder / "config.yaml", f"{rel}/config.yaml", got.warnings)
        cfg = None if text is None else load_yaml(text)
        if isinstance(cfg, dict):
            got.config = cfg  # the newest checkpoint's config wins (checkpoints are read by step)
            got.name = _nemo_config_name(cfg) or got.name
    except YamlRefused as exc:
        got.warnings.append(f"{rel}/config.yaml: {exc}; skipped")
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as exc:
        got.warnings.append(f"{rel}/config.yaml: cannot read YAML ({type(exc).__name__}); skipped")
    return f


def _read_huggingface(folder: Path, *, step: int, rel: str, info: dict[str, Any], got: _Gathered) -> Path:
    """``trainer_state.json`` of a Hugging Face ``checkpoint-N``; the file whose time is the
    checkpoint's."""
    f = folder / "trainer_state.json"
    doc = _load_json(f, f"{rel}/trainer_state.json", got.warnings)
    if isinstance(doc, dict):
        info.update({k: doc[k] for k in TRAINER_STATE_KEYS if k in doc})
        gs = doc.get("global_step")
        if isinstance(gs, int) and gs != step:
            got.warnings.append(f"{rel}/trainer_state.json: global_step {gs} differs from the "
                                f"folder's step {step}")
        got.name = _name_in(doc) or got.name
        hist = doc.get("log_history")
        if isinstance(hist, list) and (got.newest_hf is None or step >= got.newest_hf[0]):
            got.newest_hf = (step, hist)
    elif doc is None and not f.exists():
        got.warnings.append(f"{rel}: no trainer_state.json (an incomplete checkpoint?)")
    elif doc is not None:
        got.warnings.append(f"{rel}/trainer_state.json: not a JSON object; skipped")
    return f


def _read_latest_markers(path: Path, *, prefix: str, meta: dict[str, Any], got: _Gathered) -> None:
    """The files beside the checkpoints that say which one is the latest (NeMo-RL's status JSON,
    verl's iteration file)."""
    status = _load_json(path / NEMO_STATUS, f"{prefix}{NEMO_STATUS}", got.warnings)
    if isinstance(status, dict):
        meta["latest_status"] = _scalars(status)
        if isinstance(status.get("last_checkpoint_step"), int):
            meta["latest_checkpoint_step"] = status["last_checkpoint_step"]
        got.name = _name_in(status) or got.name
    try:
        text = _read_text(path / VERL_LATEST, f"{prefix}{VERL_LATEST}", got.warnings)
    except (OSError, ValueError) as exc:
        got.warnings.append(f"{prefix}{VERL_LATEST}: cannot read it ({exc}); skipped")
        text = None
    if text is not None:
        text = text.strip()
        if text.isdigit():
            meta["latest_checkpoint_step"] = int(text)
        else:
            got.warnings.append(f"{prefix}{VERL_LATEST}: expected a step number, got {text[:40]!r}")
