"""Tiny models of every supported family for the tests, from the one factory `pipelines.models.tiny`."""

from __future__ import annotations

import functools

import torch

from pipelines.models import tiny as tiny_models

VOCAB = 64
PAD, EOS, BOS = 0, 1, 2
IDS = {"pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": BOS}
NAMES = {"t5": "tiny-t5", "llama": "tiny-llama", "qwen2": "tiny-qwen2", "bert": "tiny-bert"}
"""Test kind -> the tiny model of `pipelines.models.tiny` it is built from."""
_TEST_FIELDS = {"t5": {"num_decoder_layers": 2, "initializer_factor": 10.0},
                "llama": {"max_position_embeddings": 128}, "qwen2": {"max_position_embeddings": 128},
                "bert": {"max_position_embeddings": 128}}
"""What the test models change: a fixed two-layer T5 decoder, a larger T5 init, a shorter position limit."""


def tiny_model(kind: str, seed: int = 0, layers: int = 2, hidden: int = 32, **changes) -> torch.nn.Module:
    """A tiny model of `kind` (t5, llama, qwen2, bert; 3 labels for bert) in eval mode, seeded by `seed`."""
    torch.manual_seed(seed)
    name = NAMES[kind]
    config = tiny_models.config(name, VOCAB, IDS, num_labels=3, hidden=hidden, layers=layers,
                                **{**_TEST_FIELDS[kind], **changes})
    return tiny_models.instantiate(name, config).eval()


BUILDERS = {kind: functools.partial(tiny_model, kind) for kind in NAMES}


def random_batch(kind: str, batch: int = 3, length: int = 7, seed: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded inputs with labels suited to `kind` (row i has length - i real tokens)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        cut = length - row
        mask[row, cut:] = 0
        ids[row, cut:] = PAD
    inputs = {"input_ids": ids, "attention_mask": mask}
    if kind == "t5":
        inputs["labels"] = torch.randint(3, VOCAB, (batch, 3), generator=generator)
    elif kind == "bert":
        inputs["labels"] = torch.randint(0, 3, (batch,), generator=generator)
    else:
        labels = ids.clone()
        labels[:, : length // 2] = -100  # prompt
        labels[mask == 0] = -100
        inputs["labels"] = labels
    return inputs

