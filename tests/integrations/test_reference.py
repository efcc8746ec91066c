"""The reference fingerprint: stable for the same weights, exact about which tensors differ, safe on bad records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from klwatch.integrations import (ReferenceRecordError, canonical_name, fingerprint, load_record, record_reference,
                                  verify_reference)


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"model.embed_tokens.weight": rng.normal(size=(24, 8)).astype(np.float32),
            "model.layers.0.self_attn.q_proj.weight": rng.normal(size=(8, 8)).astype(np.float32),
            "model.norm.weight": np.ones(8, dtype=np.float32),
            "lm_head.weight": rng.normal(size=(24, 8)).astype(np.float16)}


def test_the_same_weights_give_the_same_fingerprint_whatever_their_order_or_copy(tmp_path):
    w = _weights()
    shuffled = [(k, w[k].copy()) for k in reversed(list(w))]
    assert fingerprint(w).tensors == fingerprint(shuffled).tensors


def test_a_resumed_reference_built_from_the_base_matches_the_record(tmp_path):
    path = tmp_path / "klwatch_reference.json"
    record_reference(_weights(), path, source="base/")
    check = verify_reference(_weights(), path, source="base/")
    assert check.matches and not check.differing
    assert "matches" in check.describe()


def test_a_reference_rebuilt_from_other_weights_names_the_tensors_and_where_it_came_from(tmp_path):
    path = tmp_path / "klwatch_reference.json"
    record_reference(_weights(), path, source="base/")
    resumed = _weights()
    resumed["model.layers.0.self_attn.q_proj.weight"] = resumed["model.layers.0.self_attn.q_proj.weight"] + 1e-3
    check = verify_reference(resumed, path, source="out/checkpoint-6")
    assert not check.matches
    assert check.changed == ("model.layers.0.self_attn.q_proj.weight",)
    text = check.describe()
    assert "q_proj" in text and "out/checkpoint-6" in text and "base/" in text and str(path) in text


def test_one_flipped_bit_is_a_different_reference(tmp_path):
    w = _weights()
    flipped = {k: v.copy() for k, v in w.items()}
    flipped["model.norm.weight"].view(np.uint32)[3] ^= 1
    assert fingerprint(w).tensors["model.norm.weight"] != fingerprint(flipped).tensors["model.norm.weight"]


def test_the_same_bytes_as_another_shape_or_dtype_differ():
    w = _weights()
    reshaped = dict(w, **{"model.embed_tokens.weight": w["model.embed_tokens.weight"].reshape(8, 24)})
    retyped = dict(w, **{"model.norm.weight": w["model.norm.weight"].view(np.int32)})
    base = fingerprint(w).tensors
    assert fingerprint(reshaped).tensors["model.embed_tokens.weight"] != base["model.embed_tokens.weight"]
    assert fingerprint(retyped).tensors["model.norm.weight"] != base["model.norm.weight"]


def test_an_adapter_copied_into_the_reference_shows_as_added_tensors(tmp_path):
    path = tmp_path / "r.json"
    record_reference(_weights(), path)
    with_adapter = dict(_weights(), **{"model.layers.0.self_attn.q_proj.lora_A.ref.weight": np.ones((4, 8))})
    check = verify_reference(with_adapter, path)
    assert check.added == ("model.layers.0.self_attn.q_proj.lora_A.ref.weight",) and not check.changed
    assert "1 added" in check.describe()


def test_wrappers_do_not_change_a_tensors_name():
    assert canonical_name("module._orig_mod.model.norm.weight") == "model.norm.weight"
    assert canonical_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    plain = fingerprint(_weights()).tensors
    wrapped = fingerprint({f"module.{k}": v for k, v in _weights().items()}).tensors
    assert plain == wrapped


def test_two_names_for_one_tensor_after_unwrapping_are_refused():
    w = _weights()
    with pytest.raises(ValueError, match="model.norm.weight"):
        fingerprint(dict(w, **{"module.model.norm.weight": w["model.norm.weight"]}))


def test_the_record_is_written_whole_and_nothing_else_is_left(tmp_path):
    path = tmp_path / "ckpt" / "klwatch_reference.json"
    ref = record_reference(_weights(), path, source="base/", revision="abc123")
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    loaded = load_record(path)
    assert loaded.tensors == ref.tensors and loaded.source == "base/" and loaded.revision == "abc123"
    assert ref.bytes_hashed == sum(v.nbytes for v in _weights().values())


@pytest.mark.parametrize("content", ["{not json", "[]", '{"klwatch_reference": 1, "algorithm": "sha256"}',
                                     '{"klwatch_reference": 99, "tensors": {}}',
                                     '{"klwatch_reference": 1, "algorithm": "md5", "tensors": {}}',
                                     '{"klwatch_reference": 1, "algorithm": "sha256", "tensors": {"a": {"dtype": 1}}}'])
def test_a_damaged_or_foreign_record_is_a_clear_error_naming_the_file(tmp_path, content):
    path = tmp_path / "klwatch_reference.json"
    path.write_text(content)
    with pytest.raises(ReferenceRecordError, match="klwatch_reference.json"):
        verify_reference(_weights(), path)


def test_a_huge_file_is_not_loaded(tmp_path, monkeypatch):
    import klwatch.integrations.reference as reference

    monkeypatch.setattr(reference, "MAX_RECORD_BYTES", 100)
    path = tmp_path / "r.json"
    record_reference(_weights(), path)
    with pytest.raises(ReferenceRecordError, match="larger than"):
        load_record(path)


def test_no_record_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        verify_reference(_weights(), tmp_path / "missing.json")


@pytest.mark.trl  # torch comes with the trl extra: .ci/run runs these where it is installed
def test_torch_tensors_of_any_dtype_hash_as_their_bytes():
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    as_numpy = fingerprint({"w": t.numpy()}).tensors["w"]
    as_torch = fingerprint({"w": t}).tensors["w"]
    assert as_torch.digest == as_numpy.digest and as_torch.shape == as_numpy.shape
    bf16 = fingerprint({"w": t.to(torch.bfloat16)}).tensors["w"]
    assert bf16.dtype == "bfloat16" and bf16.digest != as_torch.digest
    # a non-contiguous view hashes as its values, like a contiguous copy
    assert fingerprint({"w": t.t()}).tensors["w"] == fingerprint({"w": t.t().contiguous()}).tensors["w"]


@pytest.mark.trl
def test_tied_weights_are_hashed_once():
    torch = pytest.importorskip("torch")
    shared = torch.ones(64, 8)
    ref = fingerprint({"model.embed_tokens.weight": shared, "lm_head.weight": shared})
    assert ref.bytes_hashed == shared.numel() * 4
    assert ref.tensors["lm_head.weight"] == ref.tensors["model.embed_tokens.weight"]


def test_the_record_is_plain_json_a_user_can_read(tmp_path):
    path = tmp_path / "r.json"
    record_reference(_weights(), path, source="Qwen/Qwen2.5-0.5B", extra={"framework": "test"})
    data = json.loads(path.read_text())
    assert data["source"] == "Qwen/Qwen2.5-0.5B" and data["extra"] == {"framework": "test"}
    assert set(data["tensors"]["model.norm.weight"]) == {"dtype", "shape", "digest"}
