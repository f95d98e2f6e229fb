"""`TaskHeads`: the linear classifier heads of many encoder-only capsules, applied row by row in one batch.

An encoder-only (BERT-family) capsule comes with its own task's linear head and the readout that head was
trained to read (`capt.arch.readout`). In a batch that mixes tasks the encoder runs once; each row's readout
vector then goes through its own task's head: the heads are stacked, padded to the largest label count,
gathered per row and applied with one batched matmul. A task's padded classes get -inf logits, so a softmax
over a row gives exactly that task's distribution.
"""

from __future__ import annotations

import functools
import math
import sys
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from capt.arch import head_parameters
from capt.arch.readout import READOUTS, ReadoutError, bare_encoder, row_readout_vectors
from capt.errors import CapsuleArtifactError
from capt.rows import RowStack


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


class HeadRows:
    """Task heads gathered one at a time into padded, stacked rows for `TaskHeads` (`add`; each head can be dropped
    once added): (n, C_max, D) weights and (n, C_max) biases, padded classes with zero weights and a -inf bias."""

    def __init__(self, hidden_size: int) -> None:
        self.hidden_size = hidden_size
        self.label_counts: list[int] = []
        self.readouts: list[str] = []
        self.weights, self.biases = RowStack(), RowStack()

    def add(self, head: TaskHead) -> None:
        """Check `head` against the encoder's width and copy it in (the rows so far widen to its label count)."""
        width = max(self.label_counts, default=0)
        if _checked(head, self.hidden_size).num_labels > width and self.label_counts:
            self.weights.reshape_rows(functools.partial(_pad_classes, width=head.num_labels, dim=1, value=0.0))
            self.biases.reshape_rows(functools.partial(_pad_classes, width=head.num_labels, dim=1, value=-math.inf))
        weight, bias = _padded(head, max(width, head.num_labels), self.hidden_size, head.weight)
        self.weights.append(weight)
        self.biases.append(bias)
        self.label_counts.append(head.num_labels)
        self.readouts.append(sys.intern(head.readout))


class TaskHeads(nn.Module):
    """The heads of a bank's capsules, by capsule index, held once: stacked as (N, C_max, D) for a per-row gather
    (the `TaskHead`s given are not kept; each index keeps only its label count and readout name)."""

    def __init__(self, heads: Iterable[TaskHead] | HeadRows, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        rows = heads if isinstance(heads, HeadRows) else _gathered(heads, hidden_size)
        if not rows.label_counts:
            raise CapsuleArtifactError("TaskHeads needs at least one task head.")
        self.label_counts: list[int] = rows.label_counts
        """C per capsule index."""
        self.readouts: list[str] = rows.readouts
        """What each capsule index's head reads (`capt.arch.readout.READOUTS`)."""
        self.register_buffer("weight", rows.weights.stacked(), persistent=False)  # (N, C_max, D)
        self.register_buffer("bias", rows.biases.stacked(), persistent=False)  # (N, C_max)

    def _widen(self, width: int) -> None:
        """Pad every head to `width` classes (a head with more labels than any before joins)."""
        self.weight = _pad_classes(self.weight, width, 1, 0.0)  # (N, width, D), zero weights
        self.bias = _pad_classes(self.bias, width, 1, -math.inf)  # (N, width)

    def replace(self, index: int, head: TaskHead) -> None:
        """Put `head` at capsule index `index` (a hot-reloaded capsule brings its own head)."""
        self._widen(_checked(head, self.hidden_size).num_labels)
        self.weight[index], self.bias[index] = _padded(head, self.weight.shape[1], self.hidden_size, self.weight)
        self.label_counts[index], self.readouts[index] = head.num_labels, sys.intern(head.readout)

    def append(self, head: TaskHead) -> None:
        """The head of one more capsule, at the next index (one `cat`; the heads held are not read again)."""
        self._widen(_checked(head, self.hidden_size).num_labels)
        weight, bias = _padded(head, self.weight.shape[1], self.hidden_size, self.weight)
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


def _pad_classes(stacked: torch.Tensor, width: int, dim: int, value: float) -> torch.Tensor:
    """`stacked` with its class dimension `dim` padded with `value` to `width` (as it is when already as wide): zero
    weights and -inf biases for the classes a task does not have."""
    extra = width - stacked.shape[dim]
    if extra <= 0:
        return stacked
    pad = [0, 0] * (stacked.dim() - 1 - dim) + [0, extra]  # F.pad lists the last dimension first
    return nn.functional.pad(stacked, pad, value=value)


def _gathered(heads: Iterable[TaskHead], hidden_size: int) -> HeadRows:
    rows = HeadRows(hidden_size)
    for head in heads:
        rows.add(head)
    return rows


def _checked(head: TaskHead, hidden_size: int) -> TaskHead:
    """`head`, once its readout is known and its shapes fit an encoder of width `hidden_size`."""
    if head.readout not in READOUTS:
        raise CapsuleArtifactError(f"readout={head.readout!r} is not a readout (allowed: {', '.join(READOUTS)}).")
    width = head.weight.shape[-1] if head.weight.dim() == 2 else None
    if width != hidden_size or (head.bias is not None and head.bias.shape != (head.weight.shape[0],)):
        raise CapsuleArtifactError(
            f"A task head of shape {tuple(head.weight.shape)} (bias "
            f"{None if head.bias is None else tuple(head.bias.shape)}) does not fit this encoder: it needs "
            f"(labels, {hidden_size}) and (labels,).")
    return head


def _padded(head: TaskHead, width: int, hidden_size: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`head` as (width, D) weights and (width,) bias in `like`'s dtype and device: padded classes have zero weights
    and a -inf bias."""
    weight = torch.zeros(width, hidden_size, dtype=like.dtype, device=like.device)
    bias = torch.full((width,), float("-inf"), dtype=like.dtype, device=like.device)
    weight[:head.num_labels] = head.weight.detach()
    bias[:head.num_labels] = 0.0 if head.bias is None else head.bias.detach()
    return weight, bias
