"""A tiny causal LM and word-level tokenizer built locally (nothing is downloaded), plus the prompts and the reward.

The vocabulary is a handful of words; prompts are three words; the reward is the share of completion words that
are ``good``. A randomly initialised 2-layer Llama emits ``good`` about 1/len(vocab) of the time, so GRPO has
something to learn and the policy drifts visibly from the reference within a few dozen steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["good", "bad", "red", "blue", "cat", "dog", "sun", "moon", "tree", "rock", "fish", "bird",
         "one", "two", "three", "four", "up", "down", "left", "right"]
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
TARGET = "good"


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]",
                                   unk_token="[UNK]", padding_side="left", truncation_side="left")


def build_base_model(path: str | Path, seed: int = 7, initializer_range: float = 0.1) -> Path:
    """Write the base model and its tokenizer to PATH (a folder usable as ``model=`` by GRPOTrainer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
                         initializer_range=initializer_range)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "klwatch_base.json").write_text(json.dumps({"seed": seed, "vocab": SPECIAL + WORDS}))
    return path


def prompts(n: int = 64, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    others = [w for w in WORDS if w != TARGET]
    return [" ".join(rng.choice(others) for _ in range(3)) for _ in range(n)]


def build_dataset(n: int = 64, seed: int = 11):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": prompts(n, seed)})


def reward_good(completions, **kwargs) -> list[float]:
    """Share of the completion's words that are the target word."""
    out = []
    for c in completions:
        words = c.split()
        out.append(sum(w == TARGET for w in words) / max(len(words), 1) if words else 0.0)
    return out


# --- preference data (DPOTrainer, KTOTrainer) -------------------------------------------------------------------


def _completion(rng, words: list[str], n: int) -> str:
    # a leading space, so the tokenized prompt is a prefix of the tokenized prompt + completion
    return " " + " ".join(rng.choice(words) for _ in range(n))


def build_preference_dataset(n: int = 64, seed: int = 11):
    """Paired preferences for ``DPOTrainer``: ``{"prompt", "chosen", "rejected"}``.

    The chosen completion is 2-4 times the word ``good``, the rejected one 2-4 other words, so the implicit reward
    margin ``beta * (log-ratio(chosen) - log-ratio(rejected))`` grows steadily from 0 as the policy learns."""
    from datasets import Dataset

    rng = random.Random(seed + 1)
    others = [w for w in WORDS if w != TARGET]
    ps = prompts(n, seed)
    return Dataset.from_dict({"prompt": ps,
                              "chosen": [_completion(rng, [TARGET], rng.randint(2, 4)) for _ in ps],
                              "rejected": [_completion(rng, others, rng.randint(2, 4)) for _ in ps]})


def build_unpaired_dataset(n: int = 64, seed: int = 11, per_batch: int = 4):
    """Unpaired preferences for ``KTOTrainer``: ``{"prompt", "completion", "label"}``.

    Three rows in every four are desirable (the completion is 2-4 times ``good``), the fourth undesirable (2-4 other
    words), in a fixed pattern: KTOTrainer reads the data sequentially, so every batch holds the same mix and its KL
    estimate (the policy-vs-reference log-ratio of completions paired with another row's prompt) grows smoothly."""
    from datasets import Dataset

    rng = random.Random(seed + 2)
    others = [w for w in WORDS if w != TARGET]
    ps = prompts(n, seed)
    labels = [i % per_batch != per_batch - 1 for i in range(n)]
    return Dataset.from_dict({"prompt": ps,
                              "completion": [_completion(rng, [TARGET] if lab else others, rng.randint(2, 4))
                                             for lab in labels],
                              "label": labels})
