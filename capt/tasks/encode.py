"""Token ids for one example, with truncation that shortens the long field first.

Truncation: when the rendered input does not fit the budget, the task's long field (passage, premise,
paragraph) is shortened from its end, word by word, and the input is re-rendered and re-tokenised, so
the question/hypothesis, the answer options and the template words always survive. Only if the input
still does not fit with the long field empty (or the task has none) are token ids cut directly (t5 and
encoder: from the right, keeping special tokens; decoder: prompt from the left, keeping BOS), with a
warning. Decoder prompts reserve room for the longest verbalizer, so truncation never depends on the
label.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from capt.tasks.errors import TaskUsageError
from capt.tasks.formats import answer_text, render_input
from capt.tasks.registry import TaskSpec

logger = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()
T = TypeVar("T")
_MAX_REMEMBERED = 200_000  # remembered cuts per encoder (a few MB); cleared when full


def _ids(tokenizer: Any, text: str, pair: str | None = None, special: bool = True) -> list[int]:
    return list(tokenizer(text, pair, add_special_tokens=special)["input_ids"])


def shorten_long_field(spec: TaskSpec, fields: Mapping[str, str], budget: int,
                       encode: Callable[[Mapping[str, str]], tuple[int, T]],
                       tokenizer: Any) -> tuple[int, T, int | None]:
    """Cut words from the end of `spec.long_field` until the encoded length fits `budget`.

    `encode(fields)` returns (length, payload). Returns the last (length, payload) and the number of
    long-field words kept (None: nothing was cut); the length may still exceed the budget when the long
    field is used up or the task has none.
    """
    fields = dict(fields)
    length, payload = encode(fields)
    if length <= budget or spec.long_field is None:
        return length, payload, None
    words = fields[spec.long_field].split()
    keep = len(words)
    while length > budget and keep > 0:
        field_tokens = max(1, len(_ids(tokenizer, " ".join(words[:keep]), special=False)))
        target = max(0, field_tokens - (length - budget))
        keep = min(keep - 1, keep * target // field_tokens)
        fields[spec.long_field] = " ".join(words[:keep])
        length, payload = encode(fields)
    return length, payload, keep


def _warn_hard_cut(spec: TaskSpec, family: str, length: int, budget: int) -> None:
    if (spec.name, family) not in _warned:
        _warned.add((spec.name, family))
        logger.warning("%s/%s: input of %d tokens exceeds the budget of %d even with the long field "
                       "removed; cutting token ids (warned once per task and family)",
                       spec.name, family, length, budget)


class ExampleEncoder:
    """Tokenises rendered examples of one family within a token budget (max_length - capsule slots)."""

    def __init__(self, tokenizer: Any, family: str, budget: int, max_target_length: int = 16) -> None:
        self.tokenizer = tokenizer
        self.family = family
        self.budget = budget
        self.max_target_length = max_target_length
        self._answers: dict[str, list[list[int]]] = {}
        self._kept: dict[tuple[str, ...], int] = {}

    def _fit(self, spec: TaskSpec, fields: Mapping[str, str], kind: str,
             encode: Callable[[Mapping[str, str]], tuple[int, T]]) -> tuple[int, T]:
        """`shorten_long_field`, remembering each cut so later epochs tokenise a long example once."""
        key = (kind, spec.name, *(value for _, value in sorted(fields.items())))
        keep = self._kept.get(key)
        if keep is not None and spec.long_field is not None:
            words = fields[spec.long_field].split()
            length, payload = encode({**fields, spec.long_field: " ".join(words[:keep])})
            if length <= self.budget:
                return length, payload
        length, payload, keep = shorten_long_field(spec, fields, self.budget, encode, self.tokenizer)
        if keep is not None:
            if len(self._kept) >= _MAX_REMEMBERED:
                self._kept.clear()
            self._kept[key] = keep
        return length, payload

    def answer_ids(self, spec: TaskSpec) -> list[list[int]]:
        """Token ids of each verbalizer as a target (t5/decoder), with EOS appended; cached per task."""
        if spec.name not in self._answers:
            eos = self.tokenizer.eos_token_id
            if eos is None:
                raise TaskUsageError(f"The {self.family!r} family needs a tokenizer with an EOS token.")
            limit = max(1, self.max_target_length - 1)
            self._answers[spec.name] = [
                _ids(self.tokenizer, answer_text(spec, label, self.family), special=False)[:limit] + [eos]
                for label in range(spec.num_labels)
            ]
        return self._answers[spec.name]

    def source_ids(self, spec: TaskSpec, fields: Mapping[str, str]) -> list[int]:
        """T5 source ids (with the tokenizer's special tokens) within the budget."""
        def encode(f: Mapping[str, str]) -> tuple[int, tuple[list[int], str]]:
            text = render_input(spec, f, "t5")
            ids = _ids(self.tokenizer, text)
            return len(ids), (ids, text)

        length, (ids, text) = self._fit(spec, fields, "source", encode)
        if length <= self.budget:
            return ids
        _warn_hard_cut(spec, self.family, length, self.budget)
        return list(self.tokenizer(text, truncation=True, max_length=self.budget)["input_ids"])

    def prompt_ids(self, spec: TaskSpec, fields: Mapping[str, str]) -> list[int]:
        """Decoder prompt ids, leaving room for the longest answer (+ EOS) within the budget."""
        reserve = max(len(ids) for ids in self.answer_ids(spec))
        if self.budget - reserve < 2:
            raise TaskUsageError(f"A budget of {self.budget} tokens leaves no room for a {spec.name} prompt "
                             f"next to its longest answer ({reserve} tokens with EOS): raise max_length.")

        def encode(f: Mapping[str, str]) -> tuple[int, list[int]]:
            ids = _ids(self.tokenizer, render_input(spec, f, "decoder"))
            return len(ids) + reserve, ids

        length, ids = self._fit(spec, fields, "prompt", encode)
        if length <= self.budget:
            return ids
        _warn_hard_cut(spec, self.family, length, self.budget)
        room = self.budget - reserve
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids and ids[0] == bos:
            return [bos] + ids[len(ids) - room + 1:]
        return ids[len(ids) - room:]

    def pair_ids(self, spec: TaskSpec, fields: Mapping[str, str]) -> tuple[list[int], list[int]]:
        """Encoder ids and token type ids of ``[CLS] text [SEP] pair [SEP]`` within the budget."""
        def encode(f: Mapping[str, str]) -> tuple[int, tuple[str, str | None, Any]]:
            text, pair = render_input(spec, f, "encoder")
            encoded = self.tokenizer(text, pair, return_token_type_ids=True)
            return len(encoded["input_ids"]), (text, pair, encoded)

        length, (text, pair, encoded) = self._fit(spec, fields, "pair", encode)
        if length > self.budget:
            _warn_hard_cut(spec, self.family, length, self.budget)
            encoded = self.tokenizer(text, pair, truncation=True, max_length=self.budget,
                                     return_token_type_ids=True)
        types = encoded.get("token_type_ids") or [0] * len(encoded["input_ids"])
        return list(encoded["input_ids"]), list(types)
