"""Fuzzing the checkpoint-folder reader (issue 12) with the files trainers write beside their
weights, written here by ``json``/``yaml`` as the trainers do: a Hugging Face ``trainer_state.json``
with its ``log_history``, a NeMo-RL ``training_info.json`` and ``config.yaml``, verl's latest-step
file. One of them is damaged per example (truncations, bit flips, huge numbers, random bytes, JSON
nested deeply, a YAML alias bomb): every input must give a clear warning or error naming the file,
in bounded time and memory, without touching anything (``fuzz_helpers.check_read``), and the
checkpoint steps, which the folder names give, are always read.

The default number of examples keeps this module to a few seconds; ``KLWATCH_FUZZ_EXAMPLES=N`` (e.g.
5000) runs a long fuzz: ``KLWATCH_FUZZ_EXAMPLES=5000 pytest -p no:cacheprovider tests/fuzz``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzz_helpers import check_read, damage, fuzz_settings, tally  # noqa: F401  (tally: the module's totals)

ALIAS_BOMB = "\n".join(["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\n"


def files() -> dict[str, bytes]:
    """relative path -> bytes of every file the reader opens, as the trainers write them."""
    history = [{"step": s, "loss": 0.5 / s, "kl": 0.01 * s, "reward": 1.0 - 1.0 / s} for s in range(1, 21)]
    state = {"global_step": 20, "epoch": 1.0, "max_steps": 100, "log_history": history}
    return {
        "hf/checkpoint-20/trainer_state.json": json.dumps(state, indent=2).encode(),
        "nemo/step_10/training_info.json": json.dumps({"step": 10, "consumed_samples": 640}).encode(),
        "nemo/step_10/config.yaml": yaml.safe_dump({"logger": {"wandb": {"name": "grpo-7b"}},
                                                    "loss_fn": {"reference_policy_kl_penalty": 0.01}}).encode(),
        "nemo/latest_checkpoint_status.json": json.dumps({"last_checkpoint_step": 10}).encode(),
        "verl/global_step_7/.keep": b"",
        "verl/latest_checkpointed_iteration.txt": b"7\n",
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree of the three layouts, rewritten for each example."""
    return tmp_path_factory.mktemp("fuzz-ckpt")


def lay_out(root: Path, damaged: str, data: bytes) -> None:
    shutil.rmtree(root)
    for rel, content in files().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if rel == damaged else content)


DAMAGEABLE = [rel for rel in files() if not rel.endswith(".keep")]


@fuzz_settings(100)
@given(rel=st.sampled_from(DAMAGEABLE), data=st.data())
def test_a_damaged_checkpoint_file_gives_a_clear_warning_in_bounded_time_and_memory(
        folder: Path, rel: str, data: st.DataObject) -> None:
    original = files()[rel]
    hostile = [damage(original), st.tuples(st.just("alias bomb"), st.just(ALIAS_BOMB.encode()))]
    if rel.endswith(".json"):  # (deep YAML is refused at 100 levels: tests/sources/test_checkpoints.py)
        hostile.append(st.tuples(st.just("deep"), st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n)))
    kind, damaged = data.draw(st.one_of(*hostile))
    lay_out(folder, rel, damaged)
    read = check_read(folder, folder=folder, names=(Path(rel).name, Path(rel).parent.name), size=len(damaged))
    steps = {s.ref: s.checkpoint_steps for s in read.segments}
    assert steps == {"hf": [20], "nemo": [10], "verl": [7]}, (kind, steps)
