"""`TaskHeads`: the linear classifier heads of many encoder-only capsules, applied row by row in one batch.

An encoder-only (BERT-family) capsule comes with its own task's linear head and the readout that head was
trained to read (`capt.arch.readout`). In a batch that mixes tasks the encoder runs once; each row's readout
vector then goes through its own task's head: the heads are stacked, padded to the largest label count,
gathered per row and applied with one batched matmul. A task's padded classes get -inf logits, so a softmax
over a row gives exactly that task's distribution.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from capt.arch import head_parameters
from capt.arch.readout import READOUTS, ReadoutError, bare_encoder, row_readout_vectors
from capt.errors import CapsuleArtifactError


@dataclass(frozen=True)
class TaskHead:
    """One task's trained linear head and the readout it reads."""

    weight: torch.Tensor
    """(C, D): C labels of the task, D the encoder's hidden size."""
    bias: torch.Tensor | None
    """(C,), or None for a head without bias."""
    readout: str
    """What the head reads (`capt.arch.readout.READOUTS`)."""

    @property
    def num_labels(self) -> int:
        """C, the task's label count."""
        return int(self.weight.shape[0])


def linear_head_problem(model: nn.Module) -> str | None:
    """Why `model`'s task heads cannot share one batch (None when they can): the head must be one `nn.Linear`
    over the bare encoder's pooled vector, the vector a readout replaces."""
    name = _linear_head_name(model)
    if name is None:
        return (f"{type(model).__name__} (model_type={getattr(model.config, 'model_type', None)!r}) classifies "
                "with a head that is not one linear layer over the pooled vector; a batch mixing tasks gathers "
                "each row's linear head, so its capsules can only be served one task per model")
    try:
        bare_encoder(model)
    except ReadoutError as err:
        return str(err)
    return None


_HEAD_NAMES: weakref.WeakKeyDictionary[nn.Module, tuple[str, tuple[tuple[str, nn.Module], ...]]] = \
    weakref.WeakKeyDictionary()
"""model -> (its head's module path, its direct children when it was found). The search walks every module's
parameters (~2.6 ms on MiniLM) and loading one capsule asked for it three times: 1,000 capsules on one base model
now search once. Weak keys: a model's entry goes with it (its children hold no reference to it)."""


def _linear_head_name(model: nn.Module) -> str | None:
    """The module path of the `nn.Linear` that holds every head parameter, or None; searched once per model while
    its direct children stay the same modules (a head swapped for another is searched again) and the path still
    leads to an `nn.Linear`."""
    found, children = _HEAD_NAMES.get(model), tuple(model.named_children())
    if found is not None and found[1] == children and isinstance(_submodule(model, found[0]), nn.Linear):
        return found[0]  # == on modules is identity: the same objects
    name = _search_linear_head(model)
    if name is not None:
        _HEAD_NAMES[model] = name, children
    return name


def _submodule(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _search_linear_head(model: nn.Module) -> str | None:
    """`_linear_head_name` without the cache: every module's parameters against the head's."""
    head = {id(p) for p in head_parameters(model)}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and head and {id(p) for p in module.parameters()} == head:
            return name
    return None


def linear_head(model: nn.Module) -> nn.Linear:
    """The `nn.Linear` classifier head of the encoder classifier `model` (an error when its head is not one)."""
    problem = linear_head_problem(model)
    if problem is not None:
        raise CapsuleArtifactError(problem + ".")
    return model.get_submodule(_linear_head_name(model))


def head_from_weights(model: nn.Module, weights: Mapping[str, torch.Tensor], readout: str) -> TaskHead:
    """The `TaskHead` in `weights` (the head's parameters by their names in `model`, as a trained job saves them)."""
    problem = linear_head_problem(model)
    if problem is not None:
        raise CapsuleArtifactError(problem + ".")
    name = _linear_head_name(model)
    weight, bias = weights.get(f"{name}.weight"), weights.get(f"{name}.bias")
    expected = {f"{name}.weight"} | ({f"{name}.bias"} if bias is not None else set())
    if weight is None or set(weights) != expected:
        raise CapsuleArtifactError(f"The head weights hold {sorted(weights)}; this model's head is "
                                   f"{name}.weight and {name}.bias.")
    return TaskHead(weight, bias, readout)


@contextmanager
def head_installed(model: nn.Module, head: TaskHead | None) -> Iterator[None]:
    """`model` with `head` as its classifier head meanwhile (nothing when None), then its own head again.

    A capsule artifact's fingerprint covers the whole model it was trained in, its trained head included: it is
    checked against the base model with that capsule's head in place.
    """
    if head is None:
        yield
        return
    linear = model.get_submodule(_linear_head_name(model) or "")
    if not isinstance(linear, nn.Linear):
        raise CapsuleArtifactError(linear_head_problem(model) + ".")
    own = linear.weight, linear.bias
    linear.weight = nn.Parameter(head.weight.to(own[0].device, own[0].dtype), requires_grad=False)
    linear.bias = None if head.bias is None else nn.Parameter(head.bias.to(own[0].device, own[0].dtype),
                                                              requires_grad=False)
    try:
        yield
    finally:
        linear.weight, linear.bias = own


class TaskHeads(nn.Module):
    """The heads of a bank's capsules, by capsule index, held once: stacked as (N, C_max, D) for a per-row gather
    (the `TaskHead`s given are not kept; each index keeps only its label count and readout name)."""

    def __init__(self, heads: Sequence[TaskHead], hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        checked = [self._checked(head) for head in heads]
        self.label_counts: list[int] = [head.num_labels for head in checked]
        """C per capsule index."""
        self.readouts: list[str] = [sys.intern(head.readout) for head in checked]
        """What each capsule index's head reads (`capt.arch.readout.READOUTS`)."""
        width = max(self.label_counts)
        rows = [self._padded(head, width) for head in checked]
        self.register_buffer("weight", torch.stack([w for w, _ in rows]), persistent=False)  # (N, C_max, D)
        self.register_buffer("bias", torch.stack([b for _, b in rows]), persistent=False)  # (N, C_max)

    def _checked(self, head: TaskHead) -> TaskHead:
        if head.readout not in READOUTS:
            raise CapsuleArtifactError(f"readout={head.readout!r} is not a readout (allowed: {', '.join(READOUTS)}).")
        width = head.weight.shape[-1] if head.weight.dim() == 2 else None
        if width != self.hidden_size or (head.bias is not None and head.bias.shape != (head.weight.shape[0],)):
            raise CapsuleArtifactError(
                f"A task head of shape {tuple(head.weight.shape)} (bias "
                f"{None if head.bias is None else tuple(head.bias.shape)}) does not fit this encoder: it needs "
                f"(labels, {self.hidden_size}) and (labels,).")
        return head

    def _padded(self, head: TaskHead, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`head` as (width, D) weights and (width,) bias: padded classes have zero weights and a -inf bias."""
        like = getattr(self, "weight", head.weight)
        weight = torch.zeros(width, self.hidden_size, dtype=like.dtype, device=like.device)
        bias = torch.full((width,), float("-inf"), dtype=like.dtype, device=like.device)
        weight[:head.num_labels] = head.weight.detach()
        bias[:head.num_labels] = 0.0 if head.bias is None else head.bias.detach()
        return weight, bias

    def _widen(self, width: int) -> None:
        """Pad every head to `width` classes (a head with more labels than any before joins)."""
        extra = width - self.weight.shape[1]
        if extra > 0:
            self.weight = nn.functional.pad(self.weight, (0, 0, 0, extra))  # (N, width, D), zero weights
            self.bias = nn.functional.pad(self.bias, (0, extra), value=float("-inf"))  # (N, width)

    def replace(self, index: int, head: TaskHead) -> None:
        """Put `head` at capsule index `index` (a hot-reloaded capsule brings its own head)."""
        self._widen(self._checked(head).num_labels)
        self.weight[index], self.bias[index] = self._padded(head, self.weight.shape[1])
        self.label_counts[index], self.readouts[index] = head.num_labels, sys.intern(head.readout)

    def append(self, head: TaskHead) -> None:
        """The head of one more capsule, at the next index (one `cat`; the heads held are not read again)."""
        self._widen(self._checked(head).num_labels)
        weight, bias = self._padded(head, self.weight.shape[1])
        self.weight, self.bias = torch.cat([self.weight, weight[None]]), torch.cat([self.bias, bias[None]])
        self.label_counts.append(head.num_labels)
        self.readouts.append(sys.intern(head.readout))

    def forward(self, states: torch.Tensor, pooled: torch.Tensor | None, attention_mask: torch.Tensor,
                rows: torch.Tensor, inserted: tuple[int, int]) -> torch.Tensor:
        """(B, C_max) logits: each row's readout of the final `states` (B, S, D), through its own task's head.

        `rows` (B,) is each row's capsule index; `inserted` the [start, stop) positions of the slots.
        """
        features = row_readout_vectors(self.readouts, rows, states, pooled, attention_mask, *inserted)  # (B, D)
        weight = self.weight.index_select(0, rows).to(features.dtype)  # (B, C_max, D)
        logits = torch.bmm(weight, features.unsqueeze(2)).squeeze(2)  # (B, C_max)
        return logits + self.bias.index_select(0, rows).to(logits.dtype)
