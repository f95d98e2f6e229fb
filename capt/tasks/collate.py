"""`Collator`: lists of `Example` -> dicts of padded torch tensors for the three model families.

Training batches (``collator(examples)``), right padding:

- ``t5``: input_ids, attention_mask, labels (verbalizer ids + EOS, padding -100).
- ``decoder``: input_ids = prompt + answer + EOS, attention_mask, labels (-100 on the prompt and the
  padding), prompt_mask (1 on prompt tokens only: the capsule's instance mean must never see the answer).
- ``encoder``: input_ids, attention_mask, token_type_ids, labels (class ids).

`max_length` counts the capsule slots: every sequence gets at most ``max_length - capsule_slots`` tokens
(decoder: prompt + answer + EOS). Batches may mix tasks row by row (except candidate batches).

Evaluation helpers (text-to-text families only): `generation_batch` (model inputs without the answer,
left padding by default for decoder-only models) and `candidate_batch` (every example x every
verbalizer, for rank classification). Both add non-model keys ``class_labels`` (gold ids), and
candidate batches ``example_index`` / ``candidate_index`` (rows are example-major: row = i * C + c).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from capt.tasks.encode import ExampleEncoder
from capt.tasks.errors import TaskUsageError
from capt.tasks.input_formats import formatted_spec, input_format_problems
from capt.tasks.records import Example
from capt.tasks.registry import check_family

IGNORE_INDEX = -100
"""Label value ignored by the loss."""


def pad(rows: Sequence[Sequence[int]], value: int, side: str = "right", multiple: int | None = None) -> torch.Tensor:
    """Pad int lists to one length (the longest, rounded up to `multiple`) as a LongTensor."""
    if side not in ("left", "right"):
        raise TaskUsageError(f"Unknown padding side {side!r}; valid: left, right.")
    width = max((len(r) for r in rows), default=0)
    if multiple:
        width = -(-width // multiple) * multiple
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
            out[i, span] = torch.tensor(list(row), dtype=torch.long)
    return out


class Collator:
    """Tokenise and pad examples for `family` ("t5", "decoder" or "encoder")."""

    def __init__(self, tokenizer: Any, family: str, max_length: int = 512, capsule_slots: int = 1,
                 max_target_length: int = 16, pad_to_multiple_of: int | None = None,
                 input_format: str = "capt") -> None:
        check_family(family)
        problems = input_format_problems(input_format, family)
        if problems:
            raise TaskUsageError("; ".join(problems) + ".")
        self.input_format = input_format
        if capsule_slots < 0 or max_length - capsule_slots < 1:
            raise TaskUsageError(f"max_length={max_length} must exceed capsule_slots={capsule_slots} (>= 0).")
        self.tokenizer = tokenizer
        self.family = family
        self.max_length = max_length
        self.capsule_slots = capsule_slots
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise TaskUsageError("The tokenizer has neither a pad nor an EOS token.")
        self.encoder = ExampleEncoder(tokenizer, family, max_length - capsule_slots, max_target_length)

    def _spec(self, task: str):
        """The task's spec in this collator's input format (`capt.tasks.input_formats`)."""
        return formatted_spec(task, self.input_format)

    @property
    def budget(self) -> int:
        """Tokens per sequence: max_length - capsule_slots."""
        return self.max_length - self.capsule_slots

    def __call__(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        """A training batch (see the module docstring for the keys)."""
        if self.family == "t5":
            return self._t5(examples)
        if self.family == "decoder":
            return self._decoder(examples)
        return self._encoder(examples)

    def _pad(self, rows: Sequence[Sequence[int]], value: int, side: str = "right") -> torch.Tensor:
        return pad(rows, value, side, self.pad_to_multiple_of)

    def _ids_and_mask(self, rows: list[list[int]], side: str = "right") -> dict[str, torch.Tensor]:
        return {"input_ids": self._pad(rows, self.pad_id, side),
                "attention_mask": self._pad([[1] * len(r) for r in rows], 0, side)}

    def _t5(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        sources, targets = [], []
        for ex in examples:
            spec = self._spec(ex.task)
            sources.append(self.encoder.source_ids(spec, ex.fields))
            targets.append(self.encoder.answer_ids(spec)[ex.label])
        batch = self._ids_and_mask(sources)
        batch["labels"] = pad(targets, IGNORE_INDEX)
        return batch

    def _decoder_batch(self, prompts: Sequence[list[int]], answers: Sequence[list[int]]) -> dict[str, torch.Tensor]:
        ids = [p + a for p, a in zip(prompts, answers, strict=True)]
        labels = [[IGNORE_INDEX] * len(p) + a for p, a in zip(prompts, answers, strict=True)]
        prompt = [[1] * len(p) + [0] * len(a) for p, a in zip(prompts, answers, strict=True)]
        batch = self._ids_and_mask(ids)
        batch["labels"] = self._pad(labels, IGNORE_INDEX)
        batch["prompt_mask"] = self._pad(prompt, 0)
        return batch

    def _decoder(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        prompts = [self.encoder.prompt_ids(self._spec(ex.task), ex.fields) for ex in examples]
        answers = [self.encoder.answer_ids(self._spec(ex.task))[ex.label] for ex in examples]
        return self._decoder_batch(prompts, answers)

    def _encoder(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        ids, types = [], []
        for ex in examples:
            row_ids, row_types = self.encoder.pair_ids(self._spec(ex.task), ex.fields)
            ids.append(row_ids)
            types.append(row_types)
        batch = self._ids_and_mask(ids)
        batch["token_type_ids"] = self._pad(types, 0)
        batch["labels"] = torch.tensor([ex.label for ex in examples], dtype=torch.long)
        return batch

    def _require_text_to_text(self, what: str) -> None:
        if self.family == "encoder":
            raise TaskUsageError(f"{what} needs a text-to-text family (t5 or decoder); encoder models "
                             "classify with their head: use the training batch's labels.")

    def generation_batch(self, examples: Sequence[Example], padding_side: str | None = None) -> dict[str, torch.Tensor]:
        """Model inputs without the answer: t5 source, or decoder prompt (left-padded by default).

        Decoder keys: input_ids, attention_mask, prompt_mask (= attention_mask); t5: input_ids,
        attention_mask. Both add class_labels. Prompts are truncated exactly as in training.
        """
        self._require_text_to_text("generation_batch")
        side = padding_side or ("left" if self.family == "decoder" else "right")
        if self.family == "t5":
            rows = [self.encoder.source_ids(self._spec(ex.task), ex.fields) for ex in examples]
        else:
            rows = [self.encoder.prompt_ids(self._spec(ex.task), ex.fields) for ex in examples]
        batch = self._ids_and_mask(rows, side)
        if self.family == "decoder":
            batch["prompt_mask"] = batch["attention_mask"].clone()
        batch["class_labels"] = torch.tensor([ex.label for ex in examples], dtype=torch.long)
        return batch

    def candidate_batch(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        """Every example paired with every verbalizer (one task per batch), for rank classification.

        Same keys as a training batch, plus example_index, candidate_index and class_labels. Sum the
        per-token log-likelihoods of ``labels`` per row, reshape to (N, C), then `rank_classify`.
        """
        self._require_text_to_text("candidate_batch")
        tasks = {ex.task for ex in examples}
        if len(tasks) != 1:
            raise TaskUsageError(f"candidate_batch needs examples of exactly one task, got {sorted(tasks)}.")
        spec = self._spec(tasks.pop())
        count = spec.num_labels
        choices = [c for _ in examples for c in range(count)]
        answers = [self.encoder.answer_ids(spec)[c] for c in choices]
        if self.family == "t5":
            sources = [self.encoder.source_ids(spec, ex.fields) for ex in examples]
            batch = self._ids_and_mask([s for s in sources for _ in range(count)])
            batch["labels"] = pad(answers, IGNORE_INDEX)
        else:
            prompts = [self.encoder.prompt_ids(spec, ex.fields) for ex in examples]
            batch = self._decoder_batch([p for p in prompts for _ in range(count)], answers)
        batch["example_index"] = torch.arange(len(examples)).repeat_interleave(count)
        batch["candidate_index"] = torch.tensor(choices, dtype=torch.long)
        batch["class_labels"] = torch.tensor([ex.label for ex in examples], dtype=torch.long)
        return batch
