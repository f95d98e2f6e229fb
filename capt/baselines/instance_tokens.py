"""Training-free instance-aware tokens for a deep prompt-tuned model (the paper's "add a single instance-aware
token without fine-tuning" rows for P-Tuning v2).

The tokens are exactly CaPT's instance-only anchor (`CapsuleConfig(task_vector=False, length=k)`): k slots whose
state before every layer is the masked mean of the previous layer's states (the input embeddings before the first),
slot included, padding never, and in decoder-only models the prompt only. They hold no parameters. They are added
by attaching that capsule to the base model that already carries the P-Tuning v2 prefixes (the prefixes live in
the attention route, the slots in the sequence, so the two compose); its hooks act only inside calls made through it.
"""

from __future__ import annotations

from torch import nn

from capt.arch import spec_for
from capt.config import CapsuleConfig
from capt.inject import CapsuleModel, attach


def check_instance_tokens(base: nn.Module, count: int) -> None:
    """Refuse instance tokens on encoder-only models (before the caller changes anything)."""
    if count and spec_for(base).classifier_head:
        raise ValueError(f"instance_tokens={count} with an encoder-only ({type(base).__name__}) model: the "
                         "instance tokens are for text-to-text models (T5, decoder-only); allowed here: 0")


def attach_instance_tokens(base: nn.Module, count: int) -> CapsuleModel | None:
    """The instance-only capsule of `count` tokens on `base` (None for 0); T5 and decoder-only models only."""
    check_instance_tokens(base, count)
    return attach(base, CapsuleConfig(task_vector=False, length=count)) if count else None
