"""The environment a real ``wandb`` client writes an offline run in, all of it under one test folder."""

from __future__ import annotations

import os
from pathlib import Path


def offline_env(root: Path) -> dict[str, str]:
    """Offline, silent, no git probing; its files, cache and config under ``root``; no server to reach."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true",
           "WANDB_CONSOLE": "off", "WANDB_DISABLE_GIT": "true", "WANDB_CACHE_DIR": str(root / "cache"),
           "WANDB_CONFIG_DIR": str(root / "config")}
    env.pop("WANDB_BASE_URL", None)
    return env
