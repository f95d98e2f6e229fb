"""A cheap, dtype-independent fingerprint of a model's weights, to refuse capsules meant for another model."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator

import torch
from torch import nn

SAMPLES_PER_TENSOR = 64

_SAMPLES: contextvars.ContextVar[dict[int, tuple[torch.Tensor, int, bytes]] | None] = contextvars.ContextVar(
    "fingerprint_samples", default=None)


@contextlib.contextmanager
def reused_samples() -> Iterator[None]:
    """Within this block, a tensor's sample is taken once and reused while the tensor is unchanged.

    A bank checks each of its capsules against the same base model; with an encoder's task head in place, only the
    head differs from one capsule to the next, so the base's hundreds of samples need not be taken (and allocated,
    and freed) again per capsule. A sample is reused only for the same tensor object at the same version counter
    (an in-place change moves it, a write through `.data` does not: nothing inside the block may change weights that
    way); the block holds a reference to each tensor, so no other takes its id meanwhile.
    """
    token = _SAMPLES.set({})
    try:
        yield
    finally:
        _SAMPLES.reset(token)


def fingerprint(model: nn.Module) -> str:
    """`"<structure hash>:<values hash>"`; the values part is "meta" for a model without weights.

    Hashing every weight of a 1B model takes seconds, so only a strided sample of each tensor is hashed.
    Samples are rounded to bfloat16 first, so the same checkpoint loaded in float32 or bfloat16 matches.
    """
    structure = hashlib.sha256()
    values = hashlib.sha256()
    on_meta = False
    for name, param in sorted(model.named_parameters(remove_duplicate=True)):
        structure.update(f"{name}:{tuple(param.shape)};".encode())
        if param.is_meta:
            on_meta = True
            continue
        values.update(_sample_bytes(param))
    return f"{structure.hexdigest()[:16]}:{'meta' if on_meta else values.hexdigest()[:16]}"


def _sample_bytes(param: torch.Tensor) -> bytes:
    """`_sample(param)`'s bytes, taken again only when `reused_samples` holds none for this tensor as it is now."""
    cache = _SAMPLES.get()
    if cache is None:
        return _sample(param).numpy().tobytes()
    held = cache.get(id(param))
    if held is not None and held[0] is param and held[1] == param._version:
        return held[2]
    sample = _sample(param).numpy().tobytes()
    cache[id(param)] = (param, param._version, sample)
    return sample


def _sample(param: torch.Tensor) -> torch.Tensor:
    flat = param.detach().reshape(-1)
    step = max(1, flat.numel() // SAMPLES_PER_TENSOR)
    return flat[::step][:SAMPLES_PER_TENSOR].to(torch.bfloat16).to("cpu", torch.float32)
