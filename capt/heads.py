"""`TaskHeads`: the linear classifier heads of many encoder-only capsules, applied row by row in one batch.

An encoder-only (BERT-family) capsule comes with its own task's linear head and the readout that head was
trained to read (`capt.arch.readout`). In a batch that mixes tasks the encoder runs once; each row's readout
vector then goes through its own task's head: the heads are stacked, padded to the largest label count,
gathered per row and applied with one batched matmul. A task's padded classes get -inf logits, so a softmax
over a row gives exactly that task's distribution.
"""

from __future__ import annotations

import itertools
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
    """Task heads gathered one at a time for `TaskHeads` (`add`; each head can be dropped once added): every head's
    class rows one after another, (sum of C, D) weights and (sum of C,) biases, no padding."""

    def __init__(self, hidden_size: int) -> None:
        self.hidden_size = hidden_size
        self.label_counts: list[int] = []
        self.readouts: list[str] = []
        self.weights, self.biases = RowStack(), RowStack()

    def add(self, head: TaskHead) -> None:
        """Check `head` against the encoder's width and copy its class rows in."""
        weight, bias = _rows_of(_checked(head, self.hidden_size))
        self.weights.extend(weight)
        self.biases.extend(bias)
        self.label_counts.append(head.num_labels)
        self.readouts.append(sys.intern(head.readout))


class TaskHeads(nn.Module):
    """The heads of a bank's capsules, by capsule index, held once: every head's class rows one after another,
    (sum of C, D), without padding to the largest label count (a bank mixing 2- and 5-label tasks would otherwise
    hold 5 rows for each). A batch gathers each row's head as (B, C_max, D) and masks the classes its task does not
    have (the `TaskHead`s given are not kept; each index keeps its first row, label count and readout name)."""

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
        self.register_buffer("weight", rows.weights.stacked(), persistent=False)  # (sum of C, D)
        self.register_buffer("bias", rows.biases.stacked(), persistent=False)  # (sum of C,)
        firsts = [0, *itertools.accumulate(self.label_counts)][:-1]  # not torch.cumsum: its first call costs 0.35 MB
        device = self.weight.device
        self.register_buffer("count", torch.tensor(self.label_counts, dtype=torch.long, device=device),
                             persistent=False)  # (N,) C per capsule index
        self.register_buffer("first", torch.tensor(firsts, dtype=torch.long, device=device),
                             persistent=False)  # (N,) its first row

    def replace(self, index: int, head: TaskHead) -> None:
        """Put `head` at capsule index `index` (a hot-reloaded capsule brings its own head): over its rows when it has
        as many labels, else as new rows (the old ones stay unused)."""
        weight, bias = _rows_of(_checked(head, self.hidden_size), like=self.weight)
        if head.num_labels == self.label_counts[index]:
            start = int(self.first[index])
            self.weight[start:start + head.num_labels] = weight
            self.bias[start:start + head.num_labels] = bias
        else:
            self.first[index], self.count[index] = self.weight.shape[0], head.num_labels
            self.weight, self.bias = torch.cat([self.weight, weight]), torch.cat([self.bias, bias])
        self.label_counts[index], self.readouts[index] = head.num_labels, sys.intern(head.readout)

    def append(self, head: TaskHead) -> None:
        """The head of one more capsule, at the next index (one `cat`; the heads held are not read again)."""
        weight, bias = _rows_of(_checked(head, self.hidden_size), like=self.weight)
        place = torch.tensor([self.weight.shape[0], head.num_labels], dtype=torch.long, device=self.first.device)
        self.first, self.count = torch.cat([self.first, place[:1]]), torch.cat([self.count, place[1:]])
        self.weight, self.bias = torch.cat([self.weight, weight]), torch.cat([self.bias, bias])
        self.label_counts.append(head.num_labels)
        self.readouts.append(sys.intern(head.readout))

    def forward(self, states: torch.Tensor, pooled: torch.Tensor | None, attention_mask: torch.Tensor,
                rows: torch.Tensor, inserted: tuple[int, int]) -> torch.Tensor:
        """(B, C_max) logits: each row's readout of the final `states` (B, S, D), through its own task's head;
        C_max is the largest label count of the bank, and a row's classes beyond its task's are -inf.

        `rows` (B,) is each row's capsule index; `inserted` the [start, stop) positions of the slots.
        """
        features = row_readout_vectors(self.readouts, rows, states, pooled, attention_mask, *inserted)  # (B, D)
        classes = torch.arange(max(self.label_counts), device=rows.device)  # (C_max,)
        own = classes < self.count.index_select(0, rows).unsqueeze(1)  # (B, C_max): the row's task has the class
        at = torch.where(own, self.first.index_select(0, rows).unsqueeze(1) + classes, 0)  # (B, C_max) head rows
        weight = self.weight.index_select(0, at.flatten()).view(*at.shape, -1).to(features.dtype)  # (B, C_max, D)
        logits = torch.bmm(weight, features.unsqueeze(2)).squeeze(2)  # (B, C_max)
        logits = logits + self.bias.index_select(0, at.flatten()).view(at.shape).to(logits.dtype)
        return logits.masked_fill(~own, -math.inf)


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


def _rows_of(head: TaskHead, like: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`head`'s (C, D) weights and (C,) bias (zeros when it has none), in `like`'s dtype and device (else its own)."""
    like = head.weight if like is None else like
    weight = head.weight.detach().to(like.device, like.dtype)
    bias = torch.zeros(head.num_labels, dtype=like.dtype, device=like.device) if head.bias is None else \
        head.bias.detach().to(like.device, like.dtype)
    return weight, bias
