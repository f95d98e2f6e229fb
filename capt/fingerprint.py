"""A cheap, dtype-independent fingerprint of a model's weights, to refuse capsules meant for another model."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

SAMPLES_PER_TENSOR = 64


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
        values.update(_sample(param).numpy().tobytes())
    return f"{structure.hexdigest()[:16]}:{'meta' if on_meta else values.hexdigest()[:16]}"


def _sample(param: torch.Tensor) -> torch.Tensor:
    flat = param.detach().reshape(-1)
    step = max(1, flat.numel() // SAMPLES_PER_TENSOR)
    return flat[::step][:SAMPLES_PER_TENSOR].to(torch.bfloat16).to("cpu", torch.float32)
