"""Tensor helpers for the capsule slots: insertion, label alignment, batch expansion, row routing."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from capt.errors import CaptError


def insert_slots(tensor: torch.Tensor, start: int, stop: int, fill: float | int) -> torch.Tensor:
    """Insert `stop - start` positions filled with `fill` at position `start` of dim 1.

    (B, T) -> (B, T+k) and (B, T, D) -> (B, T+k, D).
    """
    shape = list(tensor.shape)
    shape[1] = stop - start
    filler = torch.full(shape, fill, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor[:, :start], filler, tensor[:, start:]], dim=1)


def shift_causal_labels(labels: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """(B, T) -> (B, T+k) labels for a causal LM with slots at [start, stop).

    The slots are never targets, and neither is the first token after them: the base model never predicts
    its own first token either, so the loss covers exactly the same targets with and without the capsule.
    """
    full = insert_slots(labels, start, stop, -100)
    if stop < full.shape[1]:
        full[:, stop] = -100
    return full


def match_batch(tensor: torch.Tensor, batch: int) -> torch.Tensor:
    """Repeat rows when `generate` expanded the batch (beams, num_return_sequences): (B, ...) -> (batch, ...)."""
    if tensor.shape[0] == batch:
        return tensor
    if batch % tensor.shape[0]:
        raise CaptError(f"Cannot match a batch of {tensor.shape[0]} rows to {batch} rows.")
    return tensor.repeat_interleave(batch // tensor.shape[0], dim=0)


class CapsuleSelector:
    """Turns a per-row capsule choice (names, indices or a tensor) into a (B,) index tensor."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names: list[str] = []
        """Capsule names by index (repeats allowed: capsules attached without names are all "default")."""
        self._first: dict[str, int] = {}
        """The index of each name's first capsule: a bank of 1,000 capsules routes a row without a scan."""
        for name in names:
            self.append(name)

    def append(self, name: str) -> None:
        """One more capsule, at the next index."""
        self._first.setdefault(name, len(self.names))
        self.names.append(name)

    def position(self, name: str) -> int | None:
        """The index of capsule `name` (the first of equal names), or None when no capsule has that name."""
        return self._first.get(name)

    def rows(self, capsule, batch: int, count: int) -> torch.Tensor | None:
        """(B,) capsule index per row on the host (CPU), or None when every row uses the only capsule. A tensor on an
        accelerator is read back here, once per call, so that no capsule layer waits for the device."""
        if capsule is None:
            if count > 1:
                raise CaptError(f"This model holds {count} capsules {self.names}: pass capsule=[...] per row.")
            return None
        if isinstance(capsule, str | int):
            capsule = [capsule] * batch
        if isinstance(capsule, torch.Tensor):
            index = capsule.detach().to(device="cpu", dtype=torch.long)
        else:
            index = torch.tensor([self._index(c, count) for c in capsule], dtype=torch.long)
        if index.shape != (batch,):
            raise CaptError(f"capsule= must give one capsule per row: got {tuple(index.shape)} for {batch} rows.")
        if index.numel() and (index.min() < 0 or index.max() >= count):
            raise CaptError(f"capsule indices must be in 0..{count - 1}; got {index.tolist()}.")
        return index

    def _index(self, choice: str | int, count: int) -> int:
        if isinstance(choice, int) and not isinstance(choice, bool):
            return choice
        index = self.position(choice) if isinstance(choice, str) else None
        if index is not None:
            return index
        raise CaptError(f"Unknown capsule {choice!r}; this model holds {self.names} (or indices 0..{count - 1}).")

    def __repr__(self) -> str:
        return f"CapsuleSelector({self.names})"

