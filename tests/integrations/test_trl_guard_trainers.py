"""The resume guard inside the other TRL trainers with a frozen reference, trained for real on the CPU:
``DPOTrainer`` (no KL logged: judged from its implicit rewards; LoRA and precomputed reference log-probs),
``KTOTrainer`` and ``RLOOTrainer`` (both log ``kl``).

Each test trains a first launch to a checkpoint, then resumes it right (the base model and
``resume_from_checkpoint``) or wrong (the checkpoint passed as the model: TRL builds the reference from it,
trl #3179). A wrong resume must be caught before or at the first logged points after it; a right one must
stay silent (``on_reset="raise"`` under warnings-as-errors). Needs the ``trl`` extra; ``.ci/run`` runs these
with ``-m trl``.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.trl
if importlib.util.find_spec("trl") is None or importlib.util.find_spec("peft") is None:
    pytest.skip("needs the trl extra (scripts/setup.sh --test --trl)", allow_module_level=True)
for _key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_key, "1")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from klwatch.integrations import ReferenceResetError, ReferenceResetWarning  # noqa: E402
from klwatch.integrations.trl import guard_resumes  # noqa: E402
from trl_training import LORA_TARGETS, SAVE, WINDOW, StepCounter, base  # noqa: E402,F401
from sample_runs.trl_corpus.tiny_model import (build_dataset, build_preference_dataset,  # noqa: E402
                                               build_unpaired_dataset, reward_good)

COMMON = dict(report_to="none", save_steps=SAVE, logging_steps=1, lr_scheduler_type="constant", seed=42, use_cpu=True,
              disable_tqdm=True, dataloader_num_workers=0)




def _model(base: Path, out: Path, model_from: str, resume: int | None):
    """What a user's script passes as the model: the base, the checkpoint (the bug), or for LoRA the base with a
    new adapter config, or the saved adapter continued (TRL copies it into a frozen 'ref' adapter: the bug)."""
    checkpoint = str(out / f"checkpoint-{resume}") if resume else None
    if model_from == "checkpoint":
        return checkpoint, None
    if model_from == "peft-checkpoint":
        from peft import PeftModel

        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), checkpoint, is_trainable=True), None
    if model_from == "peft-base":
        from peft import LoraConfig

        return str(base), LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                     target_modules=LORA_TARGETS)
    return str(base), None


def build(trainer: str, out: Path, base: Path, *, model_from: str = "base", resume: int | None = None,
          max_steps: int = SAVE, **extra):
    """One launch's trainer of kind ``trainer`` (dpo, kto, rloo), built as a user's script builds it."""
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer, RLOOConfig, RLOOTrainer

    model, peft_config = _model(base, out, model_from, resume)
    tokenizer = AutoTokenizer.from_pretrained(base, padding_side="left", truncation_side="left")
    common = {**COMMON, "output_dir": str(out), "max_steps": max_steps, "beta": 0.1}
    if trainer == "dpo":
        args = DPOConfig(**common, learning_rate=extra.pop("lr", 0.005), per_device_train_batch_size=8, max_length=32,
                         **extra)
        return DPOTrainer(model=model, args=args, train_dataset=build_preference_dataset(), processing_class=tokenizer,
                          peft_config=peft_config)
    if trainer == "kto":
        args = KTOConfig(**common, learning_rate=0.005, per_device_train_batch_size=8, max_length=32, **extra)
        return KTOTrainer(model=model, args=args, train_dataset=build_unpaired_dataset(), processing_class=tokenizer,
                          peft_config=peft_config)
    args = RLOOConfig(**common, learning_rate=0.005, per_device_train_batch_size=16, num_generations=8,
                      max_completion_length=6, temperature=1.0, log_completions=False, **extra)
    return RLOOTrainer(model=model, reward_funcs=reward_good, args=args, train_dataset=build_dataset(),
                       processing_class=tokenizer, peft_config=peft_config)


def launch(trainer: str, out: Path, base: Path, *, model_from: str = "base", resume: int | None = None,
           max_steps: int = SAVE, counter: StepCounter | None = None, extra: dict | None = None, **guard):
    t = build(trainer, out, base, model_from=model_from, resume=resume, max_steps=max_steps, **(extra or {}))
    callback = guard_resumes(t, **guard)
    counter = counter or StepCounter()
    t.add_callback(counter)
    t.train(resume_from_checkpoint=str(out / f"checkpoint-{resume}") if resume else None)
    return t, callback, counter


def _silently(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceResetWarning)
        return fn()


@pytest.mark.parametrize("trainer", ["dpo", "kto", "rloo"])
def test_a_checkpoint_passed_as_the_model_is_caught_before_its_first_optimizer_step(tmp_path, base, trainer):
    out = tmp_path / "run"
    launch(trainer, out, base)
    counter = StepCounter()
    with pytest.raises(ReferenceResetError) as caught:
        launch(trainer, out, base, model_from="checkpoint", resume=SAVE, max_steps=2 * SAVE, on_reset="raise",
               counter=counter)
    assert counter.steps == 0 and caught.value.event.check is not None and not caught.value.event.check.matches


@pytest.mark.parametrize("trainer", ["dpo", "kto", "rloo"])
def test_the_judge_alone_catches_the_reset_at_the_third_logged_point_after_the_resume(tmp_path, base, trainer):
    out = tmp_path / "run"
    launch(trainer, out, base)
    with pytest.warns(ReferenceResetWarning, match="reference_reset"):
        t, callback, _ = launch(trainer, out, base, model_from="checkpoint", resume=SAVE, max_steps=4 * SAVE,
                                on_reset="stop", check_reference=False)
    [event] = callback.events
    assert event.verdict is not None and event.verdict.verdict == "reference_reset", event.message
    assert event.step == SAVE + WINDOW and t.state.global_step == SAVE + WINDOW
    if trainer == "dpo":
        assert "implicit rewards" in event.message and "ln 2" in event.message


@pytest.mark.parametrize("trainer", ["dpo", "kto", "rloo"])
def test_a_correct_resume_passes_silently(tmp_path, base, trainer):
    out = tmp_path / "run"
    launch(trainer, out, base)
    t, callback, counter = _silently(lambda: launch(trainer, out, base, resume=SAVE, max_steps=2 * SAVE,
                                                    on_reset="raise"))
    assert t.state.global_step == 2 * SAVE and counter.steps == SAVE
    assert [e.reset for e in callback.events] == [False, False]
    assert callback.events[1].verdict is not None and callback.events[1].verdict.verdict == "ok"


def test_dpo_with_precomputed_reference_log_probs_is_guarded_by_its_judge(tmp_path, base):
    # no reference model to hash: TRL computes the reference log-probs once, from the model it was given
    out = tmp_path / "run"
    extra = {"precompute_ref_log_probs": True}
    launch("dpo", out, base, extra=extra)
    with pytest.warns(ReferenceResetWarning, match="reference_reset"):
        _, callback, _ = launch("dpo", out, base, model_from="checkpoint", resume=SAVE, max_steps=4 * SAVE,
                                on_reset="stop", extra=extra)
    assert [e.verdict.verdict for e in callback.events if e.verdict is not None] == ["reference_reset"]
    out2 = tmp_path / "run2"
    launch("dpo", out2, base, extra=extra)
    _, callback, _ = _silently(lambda: launch("dpo", out2, base, resume=SAVE, max_steps=2 * SAVE, on_reset="raise",
                                              extra=extra))
    assert not any(e.reset for e in callback.events)


def test_dpo_lora_resumed_right_passes_and_a_continued_adapter_is_caught(tmp_path, base):
    out = tmp_path / "run"
    launch("dpo", out, base, model_from="peft-base", extra={"lr": 0.05})
    _, callback, _ = _silently(lambda: launch("dpo", out, base, model_from="peft-base", resume=SAVE, max_steps=2 * SAVE,
                                              on_reset="raise", extra={"lr": 0.05}))
    assert callback.events[0].check is not None and callback.events[0].check.matches
    assert not any(e.reset for e in callback.events)
    with pytest.raises(ReferenceResetError):
        launch("dpo", out, base, model_from="peft-checkpoint", resume=SAVE, max_steps=2 * SAVE, on_reset="raise",
               extra={"lr": 0.05})
