"""What a replica knows of each capsule: `ServedCapsule` (what to load, from a registry source or a caller),
`ServedRecords` (what the engine keeps while serving them, read back one `ServedRecord` at a time) and `Answer`
(what one request gets back)."""

from __future__ import annotations

import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capt.names import NameTable
from capt.tasks import Collator


@dataclass(frozen=True, slots=True)
class ServedCapsule:
    """A capsule to serve: where its files are and which registry version they are. The engine reads it while the
    capsule loads and keeps its record (`ServedRecords`) instead; a caller may still hold many (a list given to a
    replica), so it is kept small: slots, and the folder as a string."""

    name: str
    """Its name in the bank and in requests (the task name; the benchmark serves copies under other names)."""
    task: str
    """The task whose rows it reads."""
    model_name: str
    """Registered model it came from (``capt-<model-slug>-<task>``), or a label for local capsules."""
    version: int
    """Registry version."""
    capsule_dir: str
    """Capsule artifact folder (safetensors + JSON). A `Path` given is kept as its string: a Path holds each of its
    parts as a string of its own, about 500 bytes more per capsule of a 1,000-capsule bank."""
    result: Mapping[str, Any] = field(repr=False)
    """The job's result.json (base model, method options, evaluation mode)."""
    digest: str | None = None
    """SHA-256 of the artifact's digest manifest once the source verified it (GET /tasks shows it); None until the
    registry source records one."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "capsule_dir", os.fspath(self.capsule_dir))


@dataclass
class Answer:
    """What one request gets back."""

    labels: list[str]
    scores: list[list[float]] | None
    """Per row, the log-likelihood of each label (rank mode; encoder classifiers: the head's log-softmax); None
    when generated."""
    label_names: list[str]
    model_name: str
    version: int


@dataclass(frozen=True, slots=True)
class ServedRecord:
    """What the engine knows of a capsule it serves: its registry identity and how its rows are read. Not the
    `ServedCapsule`'s job result, which is read only while the capsule loads: parsed, a result.json is about 16 KB,
    more than a MiniLM capsule's values. Built on demand from `ServedRecords`."""

    task: str
    """The task whose rows it reads."""
    model_name: str
    """Registered model it came from."""
    version: int
    """Registry version."""
    digest: str | None
    """SHA-256 of the artifact's digest manifest (None: not verified by a registry source)."""
    collator: Collator
    """Tokenizes its rows (shared by the capsules of one max_length, slot count and input format)."""
    mode: str
    """How it answers: "rank" or "generate" (the job's eval_mode)."""
    max_new_tokens: int
    """Most tokens it generates."""


_NO_DIGEST = bytes(32)


class ServedRecords:
    """The `ServedRecord` of every capsule a bank holds, in columns by the capsule's index in the bank.

    Why columns rather than a record and a dict entry per capsule: in a 1,000-capsule replica those came to about
    130 bytes of Python objects each, left among the pages that reading each capsule touched, where a MiniLM capsule
    is 12 KB of values and the serving target allows 10 % beyond them. Here a capsule costs its registered model's
    name in a `capt.names.NameTable` and 47 bytes of arrays; what capsules share (task, collator, mode, generation
    length) is kept once.
    """

    def __init__(self) -> None:
        self._model_names = NameTable()
        """Each distinct registered-model name once (a replaced version may come from another)."""
        self._model_of = array("I")
        """Per capsule, its registered model's index in `_model_names`."""
        self._versions = array("q")
        self._digests = bytearray()
        """32 bytes per capsule: the SHA-256 its registry source verified, zeros when none did (see `_verified`)."""
        self._verified = bytearray()
        self._kinds = array("H")
        """Per capsule, its index in `_shared`."""
        self._shared: list[tuple[str, Collator, str, int]] = []
        """Each distinct (task, collator, mode, max_new_tokens) of the capsules held."""

    def __len__(self) -> int:
        return len(self._versions)

    def append(self, record: ServedRecord) -> None:
        """The record of the capsule at the next bank index."""
        digest, kind = _digest_bytes(record.digest), self._kind(record)  # checked before any column grows
        self._model_of.append(self._model_index(record.model_name))
        self._versions.append(record.version)
        self._digests += digest
        self._verified.append(record.digest is not None)
        self._kinds.append(kind)

    def set(self, index: int, record: ServedRecord) -> None:
        """The record of the capsule now at bank index `index` (a new version of the same name)."""
        if not 0 <= index < len(self):
            raise IndexError(f"no capsule record at index {index} of {len(self)}")
        digest, kind = _digest_bytes(record.digest), self._kind(record)
        self._model_of[index] = self._model_index(record.model_name)
        self._versions[index] = record.version
        self._digests[32 * index:32 * index + 32] = digest
        self._verified[index] = record.digest is not None
        self._kinds[index] = kind

    def get(self, index: int) -> ServedRecord:
        """The record of the capsule at bank index `index`."""
        task, collator, mode, max_new_tokens = self._shared[self._kinds[index]]
        digest = self._digests[32 * index:32 * index + 32].hex() if self._verified[index] else None
        model_name = self._model_names[self._model_of[index]]
        return ServedRecord(task, model_name, self._versions[index], digest, collator, mode, max_new_tokens)

    def _model_index(self, model_name: str) -> int:
        found = self._model_names.position(model_name)
        return self._model_names.append(model_name) if found is None else found

    def _kind(self, record: ServedRecord) -> int:
        shared = (record.task, record.collator, record.mode, record.max_new_tokens)
        for index, known in enumerate(self._shared):  # a handful: one per task and serving shape
            if known[0] == shared[0] and known[1] is shared[1] and known[2:] == shared[2:]:
                return index
        self._shared.append(shared)
        return len(self._shared) - 1


def _digest_bytes(digest: str | None) -> bytes:
    """A SHA-256 hex digest as its 32 bytes (zeros for None)."""
    if digest is None:
        return _NO_DIGEST
    value = bytes.fromhex(digest)
    if len(value) != 32:
        raise ValueError(f"not a SHA-256 hex digest: {digest!r}")
    return value
