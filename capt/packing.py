"""`PackedCapsules`: K capsules trained together on one frozen base model, each batch row routed to its member.

A packed training step runs one batch that holds every member's rows; row r goes through capsule `rows[r]` (the
routing `capt.inject.CapsuleModel` already does for a bank), so a member's capsule receives gradient from its own
rows only. Encoder-only classifiers (BERT family) also train one linear head per member: the encoder runs once,
each row's readout vector (`capt.arch.readout`) goes through its own member's head. Members may classify different
tasks (different label counts): `member_logits` returns each member's logits over its own rows.

`merge_batches` pads the members' collated batches (right padding) into one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from capt.arch.readout import bare_encoder, row_readout_vectors
from capt.capsule import Capsule
from capt.errors import CaptError
from capt.heads import TaskHead
from capt.inject import CapsuleModel
from capt.io import describe, write_capsule

PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "prompt_mask": 0, "labels": -100}
"""Padding of each collated key when batches are merged; input_ids take the tokenizer's pad id."""


class PackedCapsules(CapsuleModel):
    """Trainable capsules (and, for encoder classifiers, trainable linear heads) of K members on one frozen base.

    `heads[m]` is member m's `nn.Linear` (C_m, D) and `readouts[m]` what it reads; both None for language models.
    """

    def __init__(self, base_model: nn.Module, capsules: Sequence[Capsule], heads: Sequence[nn.Linear] | None = None,
                 readouts: Sequence[str] | None = None) -> None:
        super().__init__(base_model, capsules, names=[f"member{i}" for i in range(len(capsules))])
        if (heads is None) != (readouts is None) or (heads is not None and len(heads) != len(capsules)):
            raise CaptError("PackedCapsules needs one head and one readout per capsule, or neither.")
        self.heads = None if heads is None else nn.ModuleList(heads)
        self.readouts = None if readouts is None else list(readouts)
        # BERT-family classifiers apply dropout to the pooled vector before their head; a member's head does too.
        dropout = getattr(base_model, "dropout", None)
        self.head_dropout = dropout if isinstance(dropout, nn.Dropout) else nn.Identity()

    def member_logits(self, batch: Mapping[str, torch.Tensor], rows: torch.Tensor,
                      picks: list[slice | torch.Tensor | None] | None = None) -> list[torch.Tensor | None]:
        """Per member m: the logits of its rows (where `rows` (B,) == m), or None when it has no row here.

        Language models: (B_m, T, V) token logits; encoder classifiers: (B_m, C_m) through member m's head. With
        `rows` on the host (CPU), nothing here waits for the device. `picks`: `member_rows` of `rows`, when the
        caller has them already.
        """
        if picks is None:
            picks = member_rows(rows, len(self.capsules), batch["input_ids"].device)
        if self.heads is not None:
            features = self._head_features(batch, rows)  # (B, D)
            return [None if pick is None else self.heads[m](features[pick]) for m, pick in enumerate(picks)]
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "prompt_mask", "labels") if k in batch}
        logits = self(**inputs, capsule=rows).logits  # (B, T, V)
        return [None if pick is None else logits[pick] for pick in picks]

    def _head_features(self, batch: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """(B, D) each row's readout vector of the final encoder states, after the classifier's dropout."""
        extra = {"token_type_ids": batch["token_type_ids"]} if batch.get("token_type_ids") is not None else {}
        model_kwargs, ctx = self._prepare(batch["input_ids"], batch.get("attention_mask"), None, None, None, rows,
                                          extra)
        with self._active(ctx):
            output = bare_encoder(self.base_model)(**model_kwargs)  # last_hidden_state (B, S, D)
        features = row_readout_vectors(self.readouts, rows, output.last_hidden_state, output.pooler_output,
                                       model_kwargs["attention_mask"], *self.slot_span)
        return self.head_dropout(features)

    def member_parameters(self, index: int) -> dict[str, nn.Parameter]:
        """Member `index`'s trainable parameters by name: ``capsule.<name>`` and ``head.<name>``."""
        params = {f"capsule.{n}": p for n, p in self.capsules[index].named_parameters() if p.requires_grad}
        if self.heads is not None:
            params.update({f"head.{n}": p for n, p in self.heads[index].named_parameters()})
        return params

    def member_head(self, index: int) -> TaskHead | None:
        """Member `index`'s head as a `TaskHead` (None for language models)."""
        if self.heads is None:
            return None
        head = self.heads[index]
        return TaskHead(head.weight.detach(), None if head.bias is None else head.bias.detach(), self.readouts[index])

    def save_member(self, index: int, directory: str | os.PathLike, task: str | None = None,
                    metrics: Mapping[str, float] | None = None, overwrite: bool = False) -> Path:
        """Write member `index`'s capsule as a single-capsule artifact (`capt.io`), as `CapsuleModel.save` does.

        An encoder classifier's artifact is checked against the base model with its own head in place: install
        `member_head(index)` meanwhile (`capt.heads.head_installed`), since the fingerprint covers the head.
        """
        capsule = self.capsules[index]
        metadata = describe(self.base_model, capsule.config, capsule.layers, task, metrics)
        return write_capsule(directory, capsule.state_dict(), metadata, overwrite)

    def member(self, index: int) -> MemberView:
        """Member `index` alone, as a model whose `forward` and `generate` mirror a single-capsule model's."""
        return MemberView(self, index)


class MemberView(nn.Module):
    """One member of a `PackedCapsules`: every row through its capsule (and head), for evaluation."""

    def __init__(self, packed: PackedCapsules, index: int) -> None:
        super().__init__()
        self.packed = packed
        self.index = index

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        """The member's outputs for every row: token logits, or its head's (B, C_m) logits for a classifier."""
        if self.packed.heads is None:
            return self.packed(input_ids=input_ids, attention_mask=attention_mask, capsule=self.index, **kwargs)
        rows = torch.full((input_ids.shape[0],), self.index, dtype=torch.long, device=input_ids.device)
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, **kwargs}
        return SequenceClassifierOutput(logits=self.packed.member_logits(batch, rows)[self.index])

    def generate(self, **kwargs):
        """`CapsuleModel.generate` with this member's capsule on every row."""
        return self.packed.generate(capsule=self.index, **kwargs)


def member_rows(rows: torch.Tensor, count: int, device: torch.device) -> list[slice | torch.Tensor | None]:
    """Per member m < `count`: what selects its rows of a batch whose rows belong to members `rows` (B,): a slice
    when they are contiguous (a merged batch's are: a view, no copy), else an index on `device`; None when it has
    none. Worked out on the host (a device tensor is read back once)."""
    host = rows.detach().cpu()
    picks: list[slice | torch.Tensor | None] = []
    for m in range(count):
        where = (host == m).nonzero().squeeze(1)
        if not len(where):
            picks.append(None)
        elif int(where[-1]) - int(where[0]) + 1 == len(where):
            picks.append(slice(int(where[0]), int(where[-1]) + 1))
        else:
            picks.append(where.to(device))
    return picks


def merge_batches(batches: Sequence[Mapping[str, Any]], pad_id: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One right-padded batch of the members' collated batches, and (B,) the member index of each row.

    Every batch must have the same keys; 2-D tensors are padded to the longest, 1-D (class labels) concatenated.
    """
    keys = [k for k in batches[0] if isinstance(batches[0][k], torch.Tensor)]
    if any(sorted(k for k in b if isinstance(b[k], torch.Tensor)) != sorted(keys) for b in batches):
        raise CaptError("Packed members' batches must have the same keys (the same model family).")
    merged = {key: _cat_padded([b[key] for b in batches], PAD_VALUES.get(key, pad_id)) for key in keys}
    rows = torch.cat([torch.full((len(b["input_ids"]),), m, dtype=torch.long) for m, b in enumerate(batches)])
    return merged, rows


def _cat_padded(tensors: Sequence[torch.Tensor], value: int) -> torch.Tensor:
    """(sum B_m, max T) from (B_m, T_m) tensors padded on the right with `value`; 1-D tensors are concatenated."""
    if tensors[0].dim() == 1:
        return torch.cat(list(tensors))
    width = max(t.shape[1] for t in tensors)
    return torch.cat([nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])
