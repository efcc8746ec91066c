"""The resume guard inside real TRL GRPO training on the CPU (the tiny local model of the real-framework corpus).

Each test trains a first launch to a checkpoint, then resumes it the way users do, right or wrong: the
checkpoint passed as the model (trl #3179, the reference reset), the base model with
``resume_from_checkpoint`` (correct), LoRA both ways, an intentional reference sync, ``beta=0``.
Needs the ``trl`` extra (``scripts/setup.sh --test --trl``); ``.ci/run`` runs these with ``-m trl``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.trl
if importlib.util.find_spec("trl") is None or importlib.util.find_spec("peft") is None:
    pytest.skip("needs the trl extra (scripts/setup.sh --test --trl)", allow_module_level=True)
# Nothing reaches a network: set before transformers is imported, which reads them once. Only these: the
# rest of the session (the corpus generator's launches inherit the environment) must see what it set.
for _key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_key, "1")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from klwatch.integrations import ReferenceResetError, ReferenceResetWarning  # noqa: E402
from klwatch.integrations.trl import RECORD_NAME, guard_resumes  # noqa: E402
from trl_training import LORA_TARGETS, SAVE, WINDOW, StepCounter, base  # noqa: E402,F401
from sample_runs.trl_corpus.tiny_model import build_dataset, reward_good  # noqa: E402

REPO = Path(__file__).resolve().parents[2]




def build(out: Path, base: Path, *, model_from: str = "base", resume: int | None = None, max_steps: int = SAVE,
          beta: float = 0.1, sync: bool = False, report_to: str | list[str] = "none") -> GRPOTrainer:
    """The trainer of one launch of a GRPO run into OUT, built as a user's script builds it."""
    checkpoint = str(out / f"checkpoint-{resume}") if resume else None
    args = GRPOConfig(output_dir=str(out), report_to=report_to, max_steps=max_steps, save_steps=SAVE, logging_steps=1,
                      learning_rate=0.005, lr_scheduler_type="constant", beta=beta, per_device_train_batch_size=16,
                      num_generations=8, max_completion_length=6, temperature=1.0, seed=42, use_cpu=True,
                      disable_tqdm=True, dataloader_num_workers=0, log_completions=False, sync_ref_model=sync,
                      ref_model_sync_steps=3, ref_model_mixup_alpha=1.0)
    peft_config = None
    if model_from == "base":
        model = str(base)
    elif model_from == "checkpoint":  # trl #3179: the reference is built from the resumed weights
        model = checkpoint
    elif model_from == "peft-base":
        from peft import LoraConfig

        model = str(base)
        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                 target_modules=LORA_TARGETS)
    elif model_from == "peft-checkpoint":  # the saved adapter continued: TRL copies it into a frozen 'ref'
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), checkpoint, is_trainable=True)
    else:
        raise ValueError(model_from)
    tokenizer = AutoTokenizer.from_pretrained(base, padding_side="left", truncation_side="left")
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(out / "tb")  # read by transformers' TensorBoard callback
    try:
        trainer = GRPOTrainer(model=model, reward_funcs=reward_good, args=args, train_dataset=build_dataset(),
                              processing_class=tokenizer, peft_config=peft_config)
    finally:
        os.environ.pop("TENSORBOARD_LOGGING_DIR", None)
    return trainer


def launch(out: Path, base: Path, *, model_from: str = "base", resume: int | None = None, max_steps: int = SAVE,
           beta: float = 0.1, sync: bool = False, report_to: str | list[str] = "none",
           counter: StepCounter | None = None, **guard):
    """One launch with the guard on; (trainer, guard callback, step counter)."""
    trainer = build(out, base, model_from=model_from, resume=resume, max_steps=max_steps, beta=beta, sync=sync,
                    report_to=report_to)
    callback = guard_resumes(trainer, **guard)
    counter = counter or StepCounter()
    trainer.add_callback(counter)
    trainer.train(resume_from_checkpoint=str(out / f"checkpoint-{resume}") if resume else None)
    return trainer, callback, counter


def _silently(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceResetWarning)
        return fn()


def test_a_checkpoint_passed_as_the_model_is_caught_by_the_fingerprint_before_its_first_optimizer_step(tmp_path,
                                                                                                      base):
    out = tmp_path / "run"
    launch(out, base)
    record = json.loads((out / RECORD_NAME).read_text())
    assert record["source"] == str(base) and record["tensors"]
    counter = StepCounter()
    with pytest.raises(ReferenceResetError) as caught:
        launch(out, base, model_from="checkpoint", resume=SAVE, max_steps=2 * SAVE, on_reset="raise", counter=counter)
    assert counter.steps == 0  # not one optimizer step against the moved anchor
    event = caught.value.event
    assert event.step == SAVE and event.check is not None and not event.check.matches
    assert "model.embed_tokens.weight" in event.check.changed
    assert f"checkpoint-{SAVE}" in str(caught.value)  # says what the reference was loaded from
    assert not (out / f"checkpoint-{2 * SAVE}").exists()


def test_stop_ends_training_cleanly_after_the_step_in_progress(tmp_path, base):
    out = tmp_path / "run"
    launch(out, base)
    counter = StepCounter()
    with pytest.warns(ReferenceResetWarning, match="differs from the one recorded"):
        trainer, callback, _ = launch(out, base, model_from="checkpoint", resume=SAVE, max_steps=2 * SAVE,
                                      on_reset="stop", counter=counter)
    # the Trainer honours should_training_stop at the end of the step in progress
    assert counter.steps == 1 and trainer.state.global_step == SAVE + 1 and callback.guard.should_stop


def test_the_kl_judge_catches_the_reset_at_its_first_logged_points_when_the_reference_is_not_checked(tmp_path, base):
    out = tmp_path / "run"
    launch(out, base)
    with pytest.warns(ReferenceResetWarning, match="reference_reset"):
        trainer, callback, _ = launch(out, base, model_from="checkpoint", resume=SAVE, max_steps=4 * SAVE,
                                      on_reset="stop", check_reference=False)
    [event] = callback.events
    assert event.verdict is not None and event.verdict.verdict == "reference_reset"
    assert event.step == SAVE + WINDOW  # the third logged point after the resume decides
    assert trainer.state.global_step == SAVE + WINDOW  # and training stopped there, not at step 24


def test_a_correct_resume_passes_silently(tmp_path, base):
    out = tmp_path / "run"
    launch(out, base)
    trainer, callback, counter = _silently(lambda: launch(out, base, resume=SAVE, max_steps=2 * SAVE, on_reset="raise"))
    assert trainer.state.global_step == 2 * SAVE and counter.steps == SAVE
    assert [e.reset for e in callback.events] == [False, False]
    assert callback.events[0].check.matches and callback.events[1].verdict.verdict == "ok"


def test_a_lora_resume_passes_silently(tmp_path, base):
    out = tmp_path / "run"
    launch(out, base, model_from="peft-base")
    record = json.loads((out / RECORD_NAME).read_text())
    assert not any("lora_" in name for name in record["tensors"])  # the base with the adapter off
    trainer, callback, _ = _silently(lambda: launch(out, base, model_from="peft-base", resume=SAVE,
                                                    max_steps=2 * SAVE, on_reset="raise"))
    assert trainer.state.global_step == 2 * SAVE
    assert callback.events[0].check.matches and not any(e.reset for e in callback.events)


def test_a_continued_adapter_copied_into_the_reference_is_caught(tmp_path, base):
    out = tmp_path / "run"
    launch(out, base, model_from="peft-base")
    with pytest.raises(ReferenceResetError) as caught:
        launch(out, base, model_from="peft-checkpoint", resume=SAVE, max_steps=2 * SAVE, on_reset="raise")
    check = caught.value.event.check
    assert check.added and all(".ref." in name for name in check.added) and not check.changed
    assert "'ref' adapter" in str(caught.value)


def test_an_intentional_reference_sync_never_trips_it(tmp_path, base):
    out = tmp_path / "run"
    launch(out, base, sync=True)
    trainer, callback, _ = _silently(lambda: launch(out, base, resume=SAVE, max_steps=3 * SAVE, sync=True,
                                                    on_reset="raise"))
    assert trainer.state.global_step == 3 * SAVE
    assert not any(e.reset for e in callback.events)


def test_a_run_without_a_reference_is_not_guarded(tmp_path, base):
    out = tmp_path / "run"
    launch(out, base, beta=0.0)
    trainer, callback, _ = _silently(lambda: launch(out, base, model_from="checkpoint", resume=SAVE,
                                                    max_steps=2 * SAVE, beta=0.0, on_reset="raise"))
    assert not callback.enabled and not callback.events
    assert not (out / RECORD_NAME).exists() and trainer.state.global_step == 2 * SAVE


def _scan(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", str(path), "--format", "json", "--no-cache"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 1, done.stderr
    [result] = json.loads(done.stdout)["lineages"]
    return result


def test_the_verdict_reaches_the_trackers_and_klwatch_scan(tmp_path, base, monkeypatch):
    import wandb

    from wandb_offline import offline_env

    for key, value in offline_env(tmp_path / "wandb").items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "run"
    trackers = ["tensorboard", "wandb"]
    try:
        launch(out, base, report_to=trackers)
        wandb.finish()  # each launch is its own process, so its own W&B run
        with pytest.warns(ReferenceResetWarning):
            launch(out, base, model_from="checkpoint", resume=SAVE, max_steps=2 * SAVE, report_to=trackers)
        wandb.finish()
    finally:
        wandb.teardown()  # no wandb state left in this process for later tests
    from tbparse import SummaryReader

    scalars = SummaryReader(str(out / "tb")).scalars
    match = scalars[scalars.tag.str.endswith("klwatch/reference_match")]
    assert list(match.step) == [SAVE + 1] and match.value.iloc[0] == pytest.approx(0.0)
    reset = scalars[scalars.tag.str.endswith("klwatch/resume_reset")]
    assert list(reset.step) == [SAVE + WINDOW] and reset.value.iloc[0] == pytest.approx(1.0)
    for logs in (out / "tb", tmp_path / "wandb" / "wandb"):
        result = _scan(logs)
        assert result["status"] == "reference_reset", logs
        guard_findings = [f for f in result["findings"] if f["detector"] == "training_guard"]
        assert {f["step"] for f in guard_findings} == {SAVE + 1, SAVE + WINDOW}, logs
        assert all(f["severity"] == "error" for f in guard_findings)


def test_the_readme_example_runs_as_written(tmp_path, base):
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    [code] = [b for b in blocks if "guard_resumes(trainer" in b]
    out = tmp_path / "run"
    first = {"trainer": build(out, base), "last_checkpoint": None}
    exec(compile(code, "README.md", "exec"), first)  # the first launch: records
    assert (out / RECORD_NAME).exists() and (out / f"checkpoint-{SAVE}").exists()
    resumed = build(out, base, model_from="checkpoint", resume=SAVE, max_steps=2 * SAVE)
    with pytest.warns(ReferenceResetWarning, match="differs from the one recorded"):
        exec(compile(code, "README.md", "exec"), {"trainer": resumed, "last_checkpoint": get_last_checkpoint(out)})
    assert resumed.state.global_step == SAVE + 1  # stopped after the step in progress


def test_each_process_keeps_its_own_record_when_several_train():
    from types import SimpleNamespace

    from klwatch.integrations.trl import default_record

    assert default_record(SimpleNamespace(output_dir="/o", world_size=1, process_index=0)) == \
        Path("/o/klwatch_reference.json")
    assert default_record(SimpleNamespace(output_dir="/o", world_size=4, process_index=2)) == \
        Path("/o/klwatch_reference.rank2.json")
