"""NeMo-RL's own pieces, imported from a source tree at generation time (NeMo-RL is not on PyPI and is never copied
into klwatch): config loading and hydra overrides, the Logger, the CheckpointManager, get_next_experiment_dir.

Only ``nemo_rl.utils.{config,logger,checkpoint,timer}`` and ``nemo_rl.algorithms.metric_utils`` are imported.
``nemo_rl.algorithms.grpo`` / ``dpo`` (where ``MasterConfig`` lives) are not importable here: they pull in the
whole policy/generation stack (vLLM worker, zmq, Megatron, ...), and ``nemo_rl.models.policy`` asserts
``transformers < 5.12`` at import time while the TRL of klwatch's lock needs transformers 5.24.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

HERE = Path(__file__).resolve().parent
NEMO_RL_COMMIT = (HERE / "NEMO_RL_COMMIT").read_text().strip()
ENV_SRC = "KLWATCH_NEMO_RL_SRC"
EXAMPLE_CONFIG = {"grpo": "examples/configs/grpo_math_1B.yaml", "dpo": "examples/configs/dpo.yaml"}


class RunConfig(BaseModel, extra="allow"):
    """The resolved config, carried the way ``MasterConfig(**config)`` carries it in examples/run_grpo.py.

    Why not NeMo-RL's ``MasterConfig``: see the module docstring. The difference in what gets logged: pydantic
    defaults of ``GRPOConfig``/``DPOConfig`` fields that the shipped YAML does not set are absent here."""


def find_source(arg: str | None = None) -> Path | None:
    """The NeMo-RL source folder from ``--nemo-rl`` or ``$KLWATCH_NEMO_RL_SRC``; None when unset or not a tree."""
    raw = arg or os.environ.get(ENV_SRC)
    if not raw:
        return None
    src = Path(raw).expanduser().resolve()
    return src if (src / "nemo_rl" / "utils" / "logger.py").is_file() else None


def source_commit(src: Path) -> str | None:
    """The commit of a git checkout, or None for an exported tree (``git archive`` output has no .git)."""
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(src.parent)})
        return out.stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def load(src: Path) -> SimpleNamespace:
    """Import NeMo-RL's real modules from SRC (put on sys.path for this process only)."""
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    from nemo_rl.algorithms.metric_utils import SetupTimingMetrics
    from nemo_rl.utils.checkpoint import CheckpointManager
    from nemo_rl.utils.config import load_config, parse_hydra_overrides, register_omegaconf_resolvers
    from nemo_rl.utils.logger import Logger, get_next_experiment_dir
    from nemo_rl.utils.timer import Timer

    return SimpleNamespace(SetupTimingMetrics=SetupTimingMetrics, CheckpointManager=CheckpointManager,
                           load_config=load_config, parse_hydra_overrides=parse_hydra_overrides,
                           register_omegaconf_resolvers=register_omegaconf_resolvers, Logger=Logger,
                           get_next_experiment_dir=get_next_experiment_dir, Timer=Timer, src=src)


def build_config(nemo: SimpleNamespace, algorithm: str, overrides: list[str]) -> RunConfig:
    """examples/run_grpo.py and run_dpo.py, in their order: load the shipped example config, apply the overrides
    with NeMo-RL's hydra parser, resolve, wrap, and move ``logger.log_dir`` to the next ``exp_NNN``."""
    from omegaconf import OmegaConf

    if algorithm == "grpo":  # run_grpo.py registers NeMo-RL's resolvers; run_dpo.py does not
        nemo.register_omegaconf_resolvers()
    config = nemo.load_config(str(nemo.src / EXAMPLE_CONFIG[algorithm]))
    if overrides:
        config = nemo.parse_hydra_overrides(config, overrides)
    config = RunConfig(**OmegaConf.to_container(config, resolve=True))
    config.logger["log_dir"] = nemo.get_next_experiment_dir(config.logger["log_dir"])
    return config


def overrides_for(spec: dict[str, Any]) -> list[str]:
    """The hydra overrides a user of a tiny CPU run would pass on the command line (see README.md)."""
    algo, name, c = spec["algorithm"], spec["scenario"], spec["config"]
    section = "grpo" if algo == "grpo" else "dpo"
    out = [f"policy.model_name={spec['base_model']}", f"{section}.max_num_steps={c['max_steps']}",
           f"policy.train_global_batch_size={c['global_batch']}", f"policy.train_micro_batch_size={c['micro_batch']}",
           f"policy.max_total_sequence_length={c['max_seq_len']}", f"policy.optimizer.kwargs.lr={c['lr']}",
           f"checkpointing.save_period={c['save_period']}", f"checkpointing.checkpoint_dir=results/{name}",
           f"logger.log_dir=logs/{name}", "logger.wandb_enabled=true", "logger.tensorboard_enabled=true",
           "logger.mlflow_enabled=true", "logger.monitor_gpus=false", f"logger.wandb.project={spec['project']}",
           f"logger.wandb.name={name}", f"logger.mlflow.experiment_name={spec['project']}",
           f"logger.mlflow.run_name={name}", f"logger.mlflow.tracking_uri='{spec['tracking_uri']}'"]
    if algo == "grpo":
        out += [f"grpo.num_prompts_per_step={c['prompts_per_step']}",
                f"grpo.num_generations_per_prompt={c['generations_per_prompt']}",
                f"policy.generation.max_new_tokens={c['max_new_tokens']}",
                f"loss_fn.reference_policy_kl_penalty={c['kl_coef']}", "data.train.dataset_name=klwatch-tiny-words"]
    else:
        out += [f"policy.tokenizer.name={spec['base_model']}", f"dpo.reference_policy_kl_penalty={c['kl_coef']}",
                "data.train.dataset_name=klwatch-tiny-preferences",
                "data.validation.dataset_name=klwatch-tiny-preferences"]
    return out
