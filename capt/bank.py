"""`CapsuleBank`: many task capsules on one frozen base model, mixed row by row in one batch."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

from capt.arch import spec_for
from capt.arch.readout import bare_encoder
from capt.capsule import Capsule, read_capsule
from capt.errors import CapsuleArtifactError, CaptError
from capt.fingerprint import reused_samples
from capt.heads import HeadRows, TaskHead, TaskHeads, head_installed
from capt.inject import CapsuleModel
from capt.io import CapsuleMetadata
from capt.stack import CapsuleStack

Directory = str | os.PathLike
"""A capsule artifact's folder."""


class CapsuleBank(CapsuleModel):
    """Capsules loaded from artifact directories, selected per row with `capsule=[name or index, ...]`.

    `bank(input_ids, attention_mask, capsule=["rte", "cb", "rte"])` runs each row with its own capsule;
    every row's output equals what that row gets with its capsule alone.

    Encoder-only classifiers (BERT family) train a head per task: give `heads` (capsule name -> `TaskHead`) and
    `bank.classify(input_ids, attention_mask, capsule=[...])` gives each row its own task's logits.

    `capsules` is {name: artifact directory} or (name, directory) pairs, read one at a time as they come (a generator
    may describe each capsule only when it is read); `heads` may be a function that reads a capsule's head from its
    directory, called once per capsule as it is read, so that 1,000 capsules never hold 1,000 heads at once.
    """

    def __init__(self, base_model: nn.Module, capsules: Mapping[str, Directory] | Iterable[tuple[str, Directory]],
                 strict: bool = True, heads: Mapping[str, TaskHead] | Callable[[Directory], TaskHead] | None = None
                 ) -> None:
        if isinstance(capsules, Mapping) and isinstance(heads, Mapping):
            missing = [name for name in capsules if name not in heads]
            if missing:
                raise CapsuleArtifactError(f"No task head for capsule(s) {missing}: each capsule needs its head.")
        names: dict[str, None] = {}  # in reading order; a dict finds a repeated name without a scan
        head_rows = None if heads is None else HeadRows(spec_for(base_model).hidden_size(base_model))
        # read one at a time, each copied into the stacks at once: 1,000 capsules keep their values, never 1,000
        # modules, heads and metadata; each is checked against the same base, whose weights' samples are taken once
        with reused_samples():
            stack = CapsuleStack(_read_each(base_model, capsules, heads, strict, names, head_rows))
        if not names:
            raise CapsuleArtifactError("CapsuleBank needs at least one capsule directory.")
        super().__init__(base_model, stack, names=list(names))
        self.heads: TaskHeads | None = None
        if head_rows is not None:
            device = next(base_model.parameters()).device
            self.heads = TaskHeads(head_rows, self.spec.hidden_size(base_model)).to(device)

    @property
    def names(self) -> list[str]:
        """Capsule names, in index order."""
        return list(self.selector.names)

    def holds(self, name: str) -> bool:
        """Whether this bank holds a capsule named `name` (a lookup, not a scan of `names`)."""
        return self.selector.position(name) is not None

    def index_of(self, name: str) -> int:
        """The index of capsule `name` in this bank (where `add` put it; `replace` keeps it)."""
        index = self.selector.position(name)
        if index is None:
            raise CapsuleArtifactError(f"This bank holds no capsule {name!r}; it holds {self.names}.")
        return index

    def classify(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None, capsule=None) -> torch.Tensor:
        """(B, C_max) logits, each row through its own capsule and its own task's head and readout; C_max is the
        largest label count, and a task's classes beyond its own count are -inf.

        The encoder runs once for the whole batch; the heads are applied in one batched matmul (`TaskHeads`).
        """
        if self.heads is None:
            raise CaptError("This bank holds no task heads: build it with heads={name: TaskHead} to classify.")
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        model_kwargs, ctx = self._prepare(input_ids, attention_mask, None, None, None, capsule, extra)
        with self._active(ctx):
            # the bare encoder, not the model's own head; its states keep the slots, which "capsule" reads
            output = bare_encoder(self.base_model)(**model_kwargs)  # last_hidden_state (B, S, D)
        rows = ctx.row_capsule
        if rows is None:
            rows = torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
        return self.heads(output.last_hidden_state, output.pooler_output, model_kwargs["attention_mask"], rows,
                          self.slot_span)

    def replace(self, name: str, capsule: Capsule, head: TaskHead | None = None) -> None:
        """Swap capsule `name` for `capsule` (from `capt.capsule.read_capsule`, so already checked against the base).

        Hot reload without rebuilding the bank: the other capsules stay as they are. The caller must not
        run the bank meanwhile (a serving replica holds its lock around forwards and this call).
        """
        index = self.index_of(name)
        self._check_fits(name, capsule, head)
        if self.heads is not None and head is not None:
            self.heads.replace(index, head)  # checked before anything changes
        self.capsules.replace(index, capsule)
        self._rehook()

    def add(self, name: str, capsule: Capsule, head: TaskHead | None = None) -> None:
        """Hold one more capsule, `name`, at the next index (from `capt.capsule.read_capsule`, so already checked
        against the base). The capsules held stay as they are: nothing is read again. The caller must not run the
        bank meanwhile."""
        if self.holds(name):
            raise CapsuleArtifactError(f"This bank holds a capsule {name!r} already: replace it instead.")
        self._check_fits(name, capsule, head)
        if self.heads is not None and head is not None:
            self.heads.append(head)  # checked before anything changes
        self.capsules.append(capsule)
        self.selector.append(name)
        self._rehook()

    def _check_fits(self, name: str, capsule: Capsule, head: TaskHead | None) -> None:
        """A capsule joining this bank occupies its slot count and brings a head exactly when the others do."""
        if capsule.config.num_slots != self.num_slots:
            raise CapsuleArtifactError(
                f"The new capsule for {name!r} occupies {capsule.config.num_slots} slots; this bank's capsules occupy "
                f"{self.num_slots}. Capsules sharing one model must occupy the same number of slots.")
        if (head is None) != (self.heads is None):
            raise CapsuleArtifactError(f"The new capsule for {name!r} must come with its task head exactly when this "
                                       f"bank's capsules do ({'with' if self.heads else 'without'} heads).")

    def _rehook(self) -> None:
        for handle in self._handles:  # the set of capsule layers may have changed
            handle.remove()
        self._handles = self._register_hooks()


def read_with_head(base_model: nn.Module, directory: str | os.PathLike, head: TaskHead | None = None,
                   strict: bool = True) -> tuple[Capsule, CapsuleMetadata]:
    """`capt.capsule.read_capsule`, checked against `base_model` with the capsule's own task head in place (an
    encoder classifier's fingerprint covers the head it was trained with); `head=None` for models without one."""
    with head_installed(base_model, head):
        return read_capsule(base_model, directory, strict)


def _read_each(base_model: nn.Module, capsules: Mapping[str, Directory] | Iterable[tuple[str, Directory]],
               heads: Mapping[str, TaskHead] | Callable[[Directory], TaskHead] | None, strict: bool,
               names: dict[str, None], head_rows: HeadRows | None) -> Iterator[Capsule]:
    """Each capsule of `capsules` read and checked (its head in place), its name added to `names` and its head to
    `head_rows` as it is read."""
    for name, directory in capsules.items() if isinstance(capsules, Mapping) else capsules:
        if name in names:
            raise CapsuleArtifactError(f"Two capsules are named {name!r}: a bank's capsule names are unique.")
        if heads is None:
            head = None
        elif isinstance(heads, Mapping):
            if name not in heads:
                raise CapsuleArtifactError(f"No task head for capsule {name!r}: each capsule needs its head.")
            head = heads[name]
        else:
            head = heads(directory)
        capsule = read_with_head(base_model, directory, head, strict)[0]
        names[name] = None
        if head_rows is not None:
            head_rows.add(head)
        yield capsule
