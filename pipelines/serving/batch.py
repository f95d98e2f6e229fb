"""One mixed batch from many requests: each request's rows tokenised by its own capsule's collator, then
padded to one width and run through the bank in one call, each row with its own capsule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from capt.arch import ArchSpec
from capt.tasks import IGNORE_INDEX, Example
from capt.tasks.collate import pad

_PAD_VALUES = {"attention_mask": 0, "prompt_mask": 0, "token_type_ids": 0, "labels": IGNORE_INDEX}
_MODEL_KEYS = ("input_ids", "attention_mask", "token_type_ids", "prompt_mask", "labels")


@dataclass
class Part:
    """One request's share of a mixed batch."""

    capsule: str
    """The bank's name of the capsule that answers it."""
    examples: list[Example]
    """Its validated examples."""
    collator: object
    """The collator of that capsule (its max_length and slot count)."""


def _padded(parts: Sequence[dict[str, torch.Tensor]], key: str, value: int, side: str) -> torch.Tensor:
    rows = [row.tolist() for part in parts for row in part[key]]
    return pad(rows, value, side)


def concatenate(batches: Sequence[dict[str, torch.Tensor]], pad_id: int,
                side: str = "right") -> dict[str, torch.Tensor]:
    """Collated batches stacked along rows, every model input padded to the widest on `side`."""
    keys = [k for k in _MODEL_KEYS if all(k in b for b in batches)]
    return {k: _padded(batches, k, _PAD_VALUES.get(k, pad_id), side) for k in keys}


def candidate_batch(parts: Sequence[Part], pad_id: int) -> tuple[dict[str, torch.Tensor], list[str], list[int]]:
    """(model inputs, capsule per row, candidates per part) for rank classification of every part at once."""
    batches = [part.collator.candidate_batch(part.examples) for part in parts]
    capsules = [part.capsule for part, b in zip(parts, batches, strict=True) for _ in range(len(b["input_ids"]))]
    counts = [len(b["input_ids"]) // max(1, len(part.examples)) for part, b in zip(parts, batches, strict=True)]
    return concatenate(batches, pad_id), capsules, counts


def generation_batch(parts: Sequence[Part], pad_id: int, spec: ArchSpec) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(model inputs, capsule per row) for generation over every part at once; prompts that generation continues
    in place (decoder-only models) are left-padded."""
    side = "left" if spec.generation_echoes_prompt else "right"
    batches = [part.collator.generation_batch(part.examples, padding_side=side) for part in parts]
    capsules = [part.capsule for part in parts for _ in part.examples]
    return concatenate(batches, pad_id, side), capsules


def head_batch(parts: Sequence[Part], pad_id: int) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(model inputs, capsule per row) for encoder classifiers, whose task heads answer every part at once."""
    batches = [part.collator(part.examples) for part in parts]
    inputs = [{k: v for k, v in b.items() if k != "labels"} for b in batches]  # (B,) placeholder labels: unused
    capsules = [part.capsule for part in parts for _ in part.examples]
    return concatenate(inputs, pad_id), capsules
