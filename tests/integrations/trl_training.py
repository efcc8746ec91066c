"""What the real-TRL guard tests share: the tiny local base model (built once per module, nothing downloaded),
the checkpoint interval and a callback counting the optimizer steps a launch takes. Imported only after a test
module has skipped itself where the ``trl`` extra is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from klwatch.reference_reset import ReferenceResetConfig
from sample_runs.trl_corpus.tiny_model import build_base_model

SAVE = 6
WINDOW = ReferenceResetConfig().window_after
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return build_base_model(tmp_path_factory.mktemp("tiny") / "base")


class StepCounter(TrainerCallback):
    """Counts the optimizer steps a launch takes."""

    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1
