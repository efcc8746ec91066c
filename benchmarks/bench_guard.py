"""Benchmark: what the resume guard's reference fingerprint costs, measured against the obvious alternatives.

    python benchmarks/bench_guard.py [--mb 512] [--repeat 3] [--no-trl]

Printed, each as a ratio measured in the same run:
- throughput: ``klwatch.integrations.fingerprint`` over a synthetic reference of --mb MB in tensors of a
  7B model's shapes (bf16 when torch is here, else float16 arrays), against one SHA-256 pass over the
  same bytes in one buffer on one thread (what hashing costs at all) and against copying them once
  (memory bandwidth);
- the 7B estimate: a 7B model's 14 GB of bf16 weights at the measured throughput (plus, on a GPU, one
  copy to the host, which this machine cannot measure);
- on the tiny local model of the real-framework corpus (needs the trl extra): the fingerprint against
  loading the model with ``from_pretrained`` and against one GRPO training step, both of which the
  guard's launch already pays.
Not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klwatch.integrations import fingerprint  # noqa: E402

SEVEN_B_BYTES = 7.0e9 * 2  # bf16


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def synthetic_reference(mb: int):
    """Tensors shaped like a 7B Llama's (4096 hidden, 11008 MLP), as many as fit in MB megabytes."""
    shapes = [(4096, 4096)] * 4 + [(11008, 4096)] * 3 + [(4096,)] * 2
    rng = np.random.default_rng(0)
    try:
        import torch

        make = lambda shape: torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(torch.bfloat16)  # noqa: E731
    except ImportError:
        make = lambda shape: rng.standard_normal(shape, dtype=np.float32).astype(np.float16)  # noqa: E731
    tensors, total, layer = {}, 0, 0
    while total < mb * 2**20:
        for i, shape in enumerate(shapes):
            t = make(shape)
            tensors[f"model.layers.{layer}.w{i}"] = t
            total += int(np.prod(shape)) * 2
        layer += 1
    return tensors, total


def _raw(t) -> memoryview:
    if hasattr(t, "view") and hasattr(t, "detach"):
        import torch

        return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())
    return memoryview(np.ascontiguousarray(t).reshape(-1).view(np.uint8))


def bench_throughput(mb: int, repeat: int) -> float:
    tensors, total = synthetic_reference(mb)
    flat = np.concatenate([np.frombuffer(_raw(t), dtype=np.uint8) for t in tensors.values()])
    ours = best(lambda: fingerprint(tensors), repeat)
    one_pass = best(lambda: hashlib.sha256(memoryview(flat)).digest(), repeat)
    copy = best(lambda: flat.copy(), repeat)
    rate = total / ours
    print(f"reference of {total / 2**20:.0f} MB in {len(tensors)} tensors ({os.cpu_count()} cores):")
    print(f"  klwatch fingerprint (per tensor, threads)  {ours:7.3f} s   {rate / 1e9:5.2f} GB/s")
    print(f"  one SHA-256 pass, one buffer, one thread   {one_pass:7.3f} s   fingerprint / that: {ours / one_pass:.2f}x")
    print(f"  one copy of the bytes (memory bandwidth)   {copy:7.3f} s   fingerprint / that: {ours / copy:.1f}x")
    print(f"  a 7B model in bf16 (14 GB) at this rate: about {SEVEN_B_BYTES / rate:.0f} s per launch on this "
          f"machine's {os.cpu_count()} cores (threads scale it down on a training node's many cores), plus one "
          "device-to-host copy when the reference lives on a GPU")
    return rate


def bench_tiny_model(repeat: int) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401
    except ImportError:
        print("tiny model: skipped (needs the trl extra: scripts/setup.sh --trl)")
        return
    from sample_runs.trl_corpus.tiny_model import build_base_model

    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(key, "1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        base = build_base_model(Path(tmp) / "base")
        model = AutoModelForCausalLM.from_pretrained(base)
        state = model.state_dict()
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        ours = best(lambda: fingerprint(state), repeat * 3)
        load = best(lambda: AutoModelForCausalLM.from_pretrained(base), repeat)
        step = _one_grpo_step(base, Path(tmp) / "out")
    print(f"tiny local model ({nbytes / 1e3:.0f} kB in {len(state)} tensors):")
    print(f"  fingerprint                     {ours * 1e3:8.2f} ms")
    print(f"  from_pretrained of the model    {load * 1e3:8.2f} ms   fingerprint / that: {ours / load:.3f}x")
    print(f"  one GRPO training step          {step * 1e3:8.2f} ms   fingerprint / that: {ours / step:.3f}x")


def _one_grpo_step(base: Path, out: Path) -> float:
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sample_runs.trl_corpus.tiny_model import build_dataset, reward_good

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t)

    args = GRPOConfig(output_dir=str(out), report_to="none", max_steps=4, save_strategy="no", logging_steps=1,
                      per_device_train_batch_size=16, num_generations=8, max_completion_length=6, use_cpu=True,
                      disable_tqdm=True, dataloader_num_workers=0, log_completions=False)
    tokenizer = AutoTokenizer.from_pretrained(base, padding_side="left", truncation_side="left")
    trainer = GRPOTrainer(model=str(base), reward_funcs=reward_good, args=args, train_dataset=build_dataset(),
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="size of the synthetic reference (default 512 MB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-trl", action="store_true", help="skip the tiny model (and its GRPO step)")
    args = parser.parse_args()
    bench_throughput(args.mb, args.repeat)
    if not args.no_trl:
        bench_tiny_model(args.repeat)


if __name__ == "__main__":
    main()
