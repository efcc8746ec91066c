"""A fingerprint of the frozen reference policy, recorded at the first launch and checked at every resume.

The reference reset (NeMo-RL #2955, TRL with a checkpoint passed as the model) rebuilds the reference
from the resumed weights. Its KL collapse shows in the logs a few points later; the weights show it
at once: hash each tensor of the reference at the first launch, hash them again when a resumed launch
has built its reference, and any tensor that differs means the anchor moved.

Framework-neutral: it takes a ``state_dict()`` (name -> tensor), ``named_parameters()`` pairs, or
name -> numpy array, and never imports torch itself. A sharded model (FSDP, DTensor) is hashed as each
rank's own shards, with no collective: give each rank a record of its own (``...rank{N}.json``). Hashes are of the tensor's bytes on the CPU with
its dtype and shape, so they are stable across runs, machines and devices; tensors are hashed on
threads (hashlib releases the GIL), so a large model hashes at about the machine's memory bandwidth
divided by what one core's SHA-256 takes (``benchmarks/bench_guard.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..scan_cache import atomic_write

RECORD_FORMAT = 1
ALGORITHM = "sha256"
MAX_RECORD_BYTES = 64 * 2**20
"""A record is a few hundred bytes per tensor; anything far larger is not ours and is not loaded."""

# Wrappers that rename a model's tensors without changing them: DDP / accelerate (``module.``),
# torch.compile (``_orig_mod.``), PEFT (``base_model.model.`` and the ``base_layer`` a LoRA layer wraps).
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "base_model.model.")
_BASE_LAYER = re.compile(r"\.base_layer(?=\.)")

TensorLike = Any
Weights = Mapping[str, TensorLike] | Iterable[tuple[str, TensorLike]]


@dataclass(frozen=True)
class TensorPrint:
    """One tensor's identity: what it holds (``digest``), as which dtype and shape."""

    dtype: str
    shape: tuple[int, ...]
    digest: str

    def as_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "digest": self.digest}


@dataclass(frozen=True)
class ReferencePrint:
    """The fingerprint of a reference policy and where it was loaded from."""

    tensors: dict[str, TensorPrint]
    source: str | None = None
    """What the reference was loaded from: a path or a hub id."""
    revision: str | None = None
    bytes_hashed: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"klwatch_reference": RECORD_FORMAT, "algorithm": ALGORITHM, "source": self.source,
                "revision": self.revision, "recorded_at": time.time(), "bytes_hashed": self.bytes_hashed,
                "extra": self.extra, "tensors": {k: v.as_json() for k, v in sorted(self.tensors.items())}}


@dataclass(frozen=True)
class ReferenceCheck:
    """A resumed launch's reference compared with the one recorded at the first launch."""

    matches: bool
    changed: tuple[str, ...] = ()
    """Tensors whose bytes, dtype or shape differ."""
    missing: tuple[str, ...] = ()
    """Tensors the recorded reference had and this one lacks."""
    added: tuple[str, ...] = ()
    """Tensors this reference has and the recorded one did not (an adapter copied into it, ...)."""
    recorded_source: str | None = None
    source: str | None = None
    record: Path | None = None

    @property
    def differing(self) -> tuple[str, ...]:
        return self.changed + self.missing + self.added

    def describe(self, *, limit: int = 5) -> str:
        """One paragraph a user can act on: which tensors differ and what each reference came from."""
        if self.matches:
            return f"the reference matches the one recorded at the first launch ({self.record})"
        parts = []
        for label, names in (("changed", self.changed), ("missing", self.missing), ("added", self.added)):
            if names:
                shown = ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
                parts.append(f"{len(names)} {label} ({shown})")
        loaded = f"; this launch's reference was loaded from {self.source}" if self.source else ""
        recorded = f" (recorded from {self.recorded_source})" if self.recorded_source else ""
        return (f"the reference policy differs from the one recorded at the first launch{recorded}: "
                f"{'; '.join(parts)} tensors{loaded}. It was rebuilt from other weights, so the KL penalty "
                f"now anchors to them (the reference reset); see the record {self.record}")


class ReferenceRecordError(ValueError):
    """A record file that cannot be read as one klwatch wrote (named in the message)."""


def canonical_name(name: str) -> str:
    """A tensor's name without the wrappers that rename it (DDP, torch.compile, PEFT's base layer)."""
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return _BASE_LAYER.sub("", name)


def _as_bytes(tensor: TensorLike) -> tuple[str, tuple[int, ...], memoryview]:
    """A tensor's dtype, shape and bytes on the CPU: torch tensors (any dtype, DTensor gathered) or numpy."""
    if hasattr(tensor, "to_local"):  # a torch DTensor: this rank's shard (gathering it would be a collective)
        tensor = tensor.to_local()
    if hasattr(tensor, "detach"):  # torch
        t = tensor.detach()
        dtype = str(t.dtype).removeprefix("torch.")
        shape = tuple(int(d) for d in t.shape)
        t = t.cpu().contiguous().reshape(-1)
        import torch

        raw = t.view(torch.uint8).numpy() if t.numel() else t.numpy()
        return dtype, shape, memoryview(raw).cast("B")
    import numpy as np

    arr = np.ascontiguousarray(tensor)
    return str(arr.dtype), tuple(int(d) for d in arr.shape), memoryview(arr.reshape(-1).view(np.uint8))


def _digest(data: memoryview) -> str:
    h = hashlib.new(ALGORITHM)
    step = 64 * 2**20  # big slices: hashlib drops the GIL for each
    for i in range(0, len(data), step):
        h.update(data[i:i + step])
    return h.hexdigest()


def _items(weights: Weights) -> list[tuple[str, TensorLike]]:
    items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
    out: dict[str, TensorLike] = {}
    for name, tensor in items:
        key = canonical_name(str(name))
        if key in out:
            raise ValueError(f"two tensors are both named {key!r} once wrappers are stripped ({name!r})")
        out[key] = tensor
    return list(out.items())


def fingerprint(weights: Weights, *, source: str | None = None, revision: str | None = None,
                threads: int | None = None, extra: Mapping[str, Any] | None = None) -> ReferencePrint:
    """Hash every tensor of a reference policy (``state_dict()``, ``named_parameters()`` or name -> array).

    Tensors sharing one storage (tied embeddings) are hashed once."""
    started = time.perf_counter()
    items = _items(weights)

    def one(tensor: TensorLike) -> tuple[TensorPrint, int]:
        dtype, shape, data = _as_bytes(tensor)
        return TensorPrint(dtype=dtype, shape=shape, digest=_digest(data)), len(data)

    unique: dict[Any, TensorLike] = {}
    keys: list[Any] = []
    for i, (_, tensor) in enumerate(items):
        k = _storage_key(tensor) or ("item", i)
        keys.append(k)
        unique.setdefault(k, tensor)
    with ThreadPoolExecutor(max_workers=threads or min(8, os.cpu_count() or 1)) as pool:
        hashed = dict(zip(unique, pool.map(one, unique.values())))
    return ReferencePrint(tensors={name: hashed[k][0] for (name, _), k in zip(items, keys)}, source=source,
                          revision=revision, bytes_hashed=sum(n for _, n in hashed.values()),
                          seconds=time.perf_counter() - started, extra=dict(extra or {}))


def _storage_key(tensor: TensorLike) -> tuple[int, int, str, tuple[int, ...]] | None:
    """Where a torch tensor's bytes live: two names with the same key hold the same tensor (tied weights)."""
    ptr = getattr(tensor, "data_ptr", None)
    if ptr is None or getattr(tensor, "is_meta", False) or hasattr(tensor, "to_local"):
        return None
    return (int(ptr()), int(tensor.numel()), str(tensor.dtype), tuple(tensor.shape))


def record_reference(weights: Weights, path: str | Path, *, source: str | None = None,
                     revision: str | None = None, extra: Mapping[str, Any] | None = None) -> ReferencePrint:
    """Fingerprint the reference policy and write the record to PATH (JSON, written atomically).

    Call it once, at the first launch, after the framework has built its reference."""
    ref = fingerprint(weights, source=source, revision=revision, extra=extra)
    write_record(ref, path)
    return ref


def write_record(ref: ReferencePrint, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(ref.as_json(), indent=1).encode("utf-8"))


def load_record(path: str | Path) -> ReferencePrint:
    """The reference recorded at PATH; ``ReferenceRecordError`` naming the file if it is not one."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_RECORD_BYTES:
            raise ReferenceRecordError(f"{path}: {size} bytes, larger than any klwatch reference record")
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("klwatch_reference") != RECORD_FORMAT:
            raise ReferenceRecordError(f"{path}: not a klwatch reference record (format {RECORD_FORMAT})")
        if data.get("algorithm") != ALGORITHM:
            raise ReferenceRecordError(f"{path}: hashed with {data.get('algorithm')!r}, this klwatch uses {ALGORITHM}")
        tensors = {str(k): TensorPrint(dtype=str(v["dtype"]), shape=tuple(int(d) for d in v["shape"]),
                                       digest=str(v["digest"]))
                   for k, v in data["tensors"].items()}
    except (ReferenceRecordError, FileNotFoundError):
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReferenceRecordError(f"{path}: cannot read the klwatch reference record: {exc}") from exc
    return ReferencePrint(tensors=tensors, source=data.get("source"), revision=data.get("revision"),
                          bytes_hashed=int(data.get("bytes_hashed") or 0), extra=dict(data.get("extra") or {}))


def compare(recorded: ReferencePrint, current: ReferencePrint, *, record: Path | None = None) -> ReferenceCheck:
    """Which tensors differ between the recorded reference and this one."""
    changed = tuple(k for k in recorded.tensors if k in current.tensors and recorded.tensors[k] != current.tensors[k])
    missing = tuple(k for k in recorded.tensors if k not in current.tensors)
    added = tuple(k for k in current.tensors if k not in recorded.tensors)
    return ReferenceCheck(matches=not (changed or missing or added), changed=changed, missing=missing, added=added,
                          recorded_source=recorded.source, source=current.source, record=record)


def verify_reference(weights: Weights, path: str | Path, *, source: str | None = None,
                     revision: str | None = None) -> ReferenceCheck:
    """Compare the reference a resumed launch built with the one recorded at PATH.

    Call it after the framework has built its reference and before the first training step. Raises
    ``FileNotFoundError`` when nothing was recorded there, ``ReferenceRecordError`` for a damaged record."""
    path = Path(path)
    recorded = load_record(path)
    return compare(recorded, fingerprint(weights, source=source, revision=revision), record=path)
