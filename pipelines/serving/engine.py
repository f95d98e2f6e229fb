"""`CapsuleEngine`: one frozen base model, one `capt.CapsuleBank`, many requests answered in one mixed batch: each
request's rows tokenised by its own capsule's collator, then padded to one width (`candidate_batch`,
`generation_batch`, `head_batch`) and run through the bank in one call, each row with its own capsule.

No Ray and no MLflow here: the Serve deployment (`pipelines.serving.app`) feeds it requests and new
registry versions; the benchmark and the tests can drive it directly.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from capt import CapsuleBank
from capt.arch import ArchSpec
from capt.bank import read_with_head
from capt.capsule import Capsule
from capt.errors import CapsuleArtifactError
from capt.heads import TaskHead
from capt.inject import CapsuleModel
from capt.methods import METHODS
from capt.tasks import IGNORE_INDEX, Collator, Example, rank_classify, texts_to_labels
from capt.tasks import get as task_spec
from capt.tasks.collate import pad
from pipelines.adapted import METHOD_FILE, load_task_head, sequence_log_likelihood, sequence_overhead
from pipelines.capsule_predictor import INVALID_LABEL, _quiet_when_head_follows, validated_examples
from pipelines.models.loading import load_model
from pipelines.models.shape import model_shape
from pipelines.serving.memory import release_freed_heap, resident_mb
from pipelines.serving.records import Answer, ServedCapsule, ServedRecord

logger = logging.getLogger(__name__)


class CapsuleEngine:
    """The base model of the capsules' results, loaded once, with every capsule in one bank."""

    def __init__(self, capsules: Iterable[ServedCapsule], device: str | None = None) -> None:
        """`capsules` are read one at a time, in order (a generator may fetch each only when it is read); of each,
        the engine keeps its values in the bank and its record in `records`, not the `ServedCapsule` or its job
        result."""
        each = iter(capsules)
        first = next(each, None)
        if first is None:
            raise CapsuleArtifactError("Nothing to serve: no capsule was given.")
        self.base_name, self.family = first.result["model"], first.result["family"]
        self.spec = model_shape(self.base_name).spec
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # encoder classifiers: transformers' "newly initialized head, consider training" report is wrong here, the
        # capsules' trained heads answer (the registry pyfunc silences it the same way)
        with _quiet_when_head_follows(Path(first.capsule_dir)):
            loaded = load_model(self.base_name, task_spec(first.task).num_labels,
                                first.result["config"]["model"]["dtype"])
        self.tokenizer = loaded.tokenizer
        self._collators: dict[tuple, Collator] = {}
        self.records: list[ServedRecord] = []
        """Each capsule's registry identity and serving settings, by its index in the bank."""
        unread = [first]
        del first  # the bank reads it from `unread`, and nothing here holds it (or its result) after that
        release_freed_heap()
        self.base_rss_mb = resident_mb()
        """Resident memory once the base model is loaded, before any capsule (what the capsules cost is the memory
        once loaded less this: GET /tasks shows both)."""
        self.bank = self._bank(loaded.model.to(self.device).eval(), _emptied_then(unread, each))
        release_freed_heap()  # what reading every capsule allocated and the stacked bank no longer holds
        self.retired: set[str] = set()
        """Names no longer served (registered model deleted, or alias gone): hidden from `names`, so new requests
        are refused, but kept in the bank, so a request accepted just before still gets its answer."""
        self.lock = threading.Lock()
        """Held around every batch and every capsule swap: a swap waits for the batch in flight."""
        self.revision = 0
        """Counts the changes of what is served (swap, add, retire): what is computed from the served names (the
        app's route checks: `app.CapsuleServer.catalog`) is computed again only when it moves."""

    def _bank(self, base: torch.nn.Module, capsules: Iterator[ServedCapsule]) -> CapsuleBank:
        """A bank of `capsules` on `base`; each capsule's fit to the base model's weights is checked as it loads."""
        # encoder classifiers (BERT family): each capsule's own task head, read from its folder, in the bank beside it
        heads = functools.partial(load_task_head, base) if self.spec.classifier_head else None
        return CapsuleBank(base, self._described(capsules), heads=heads).eval()

    def _described(self, capsules: Iterator[ServedCapsule]) -> Iterator[tuple[str, str]]:
        """(name, folder) of each capsule as the bank reads it, once its base model and method are checked and its
        record is kept (`records`: the bank reads them in this order, so a record's index is its capsule's)."""
        for served in capsules:
            self.records.append(self._record(served))
            yield served.name, served.capsule_dir

    def _record(self, served: ServedCapsule) -> ServedRecord:
        """`served`'s record, once its base model and method are checked."""
        _check_same_base(served, self.base_name)
        _check_method(served)
        config = served.result["config"]
        method = config["method"]
        shape = (config["model"]["max_length"], sequence_overhead(method["name"], method["options"]),
                 config["task"].get("input_format", "capt"))
        if shape not in self._collators:  # one collator per distinct shape, not per capsule
            self._collators[shape] = Collator(self.tokenizer, self.family, max_length=shape[0],
                                              capsule_slots=shape[1], input_format=shape[2])
        collator = self._collators[shape]
        return ServedRecord(sys.intern(served.task), served.model_name, served.version, served.digest, collator,
                            sys.intern(config["train"]["eval_mode"]), config["model"]["max_new_tokens"])

    @property
    def names(self) -> list[str]:
        """The capsules served, by name."""
        held = self.bank.names[:len(self.records)]  # a capsule being added has its record once it is served
        return [name for name in held if name not in self.retired]

    def served(self, name: str) -> ServedRecord:
        """The capsule answering under `name` now."""
        return self.records[self.bank.index_of(name)]

    def max_length(self, name: str) -> int:
        """Most tokens capsule `name` reads (its collator's max_length)."""
        return int(self.served(name).collator.max_length)

    def versions(self) -> dict[str, int]:
        """The registry version each capsule name serves now."""
        return {name: self.served(name).version for name in self.names}

    def examples(self, name: str, rows: Sequence[Mapping[str, Any]]) -> list[Example]:
        """Validated examples for capsule `name` (the registry pyfunc's checks and errors)."""
        return validated_examples(self.served(name).task, rows)

    def _loaded(self, served: ServedCapsule) -> tuple[Capsule, TaskHead | None, ServedRecord]:
        """`served`'s capsule (and head) read and checked against the base model, outside the lock: the bank's
        other capsules keep answering meanwhile."""
        record = self._record(served)
        head = load_task_head(self.bank.base_model, served.capsule_dir) if self.spec.classifier_head else None
        capsule, _ = read_with_head(self.bank.base_model, served.capsule_dir, head)
        return capsule.to(self.device).eval(), head, record

    def add(self, served: ServedCapsule) -> None:
        """Serve `served` from the next batch on: a new version of a name the bank holds, or a new name, added to the
        bank beside the capsules served (checked against the base model first; they are not read again)."""
        capsule, head, record = self._loaded(served)
        with self.lock:
            held = self.bank.holds(served.name)
            if held:
                self.bank.replace(served.name, capsule, head)
                self.records[self.bank.index_of(served.name)] = record
                self.retired.discard(served.name)
            else:
                self.bank.add(served.name, capsule, head)
                self.records.append(record)
            self.revision += 1
        logger.info("Now serving %s version %d as %r%s", served.model_name, served.version, served.name,
                    "" if held else " (new)")

    def retire(self, name: str) -> None:
        """Stop serving `name`: new requests for it are refused (its capsule stays in the bank, a few KB)."""
        with self.lock:
            self.retired.add(name)
            self.revision += 1
        logger.info("No longer serving %r", name)

    @torch.no_grad()
    def answer(self, requests: Sequence[tuple[str, list[Example]]]) -> list[Answer]:
        """Answers to (capsule name, examples) requests, all of them in one mixed batch per evaluation mode."""
        answers: list[Answer | None] = [None] * len(requests)
        with self.lock:
            if self.spec.classifier_head:  # a task head answers every row, whatever the eval mode says
                return self._classify([self._part(*request) for request in requests])
            for mode in ("rank", "generate"):
                chosen = [i for i, (name, _) in enumerate(requests) if self.served(name).mode == mode]
                if chosen:
                    parts = [self._part(*requests[i]) for i in chosen]
                    found = self._rank(parts) if mode == "rank" else self._generate(parts)
                    for i, ans in zip(chosen, found, strict=True):
                        answers[i] = ans
        return [a for a in answers if a is not None]

    def _part(self, name: str, examples: list[Example]) -> Part:
        return Part(name, examples, self.served(name).collator)

    def _answer(self, name: str, ids: list[int], scores: list[list[float]] | None) -> Answer:
        served = self.served(name)
        label_names = list(task_spec(served.task).label_names)
        labels = [label_names[i] if 0 <= i < len(label_names) else INVALID_LABEL for i in ids]
        return Answer(labels, scores, label_names, served.model_name, served.version)

    def _rank(self, parts: list[Part]) -> list[Answer]:
        inputs, capsules, counts = candidate_batch(parts, self.pad_id)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        labels = inputs.pop("labels")
        extra = {"labels": labels} if self.spec.encoder_decoder else {}  # labels build T5's decoder inputs
        logits = self.bank(**inputs, **extra, capsule=capsules).logits
        scores = sequence_log_likelihood(logits, labels, shift=self.spec.shifts_labels).cpu()
        answers, start = [], 0
        for part, count in zip(parts, counts, strict=True):
            block = scores[start:start + count * len(part.examples)].view(len(part.examples), count)
            start += count * len(part.examples)
            answers.append(self._answer(part.capsule, rank_classify(block), block.tolist()))
        return answers

    def _classify(self, parts: list[Part]) -> list[Answer]:
        """Encoder classifiers: one encoder pass, each row through its own task's head (`CapsuleBank.classify`)."""
        inputs, capsules = head_batch(parts, self.pad_id)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        logits = self.bank.classify(**inputs, capsule=capsules).float()  # (B, C_max); -inf past a task's labels
        scores = torch.log_softmax(logits, dim=-1).cpu()  # log-probability of each label, as the task's head gives
        answers, row = [], 0
        for part in parts:
            count = task_spec(self.served(part.capsule).task).num_labels
            block = scores[row:row + len(part.examples), :count]  # (n, C) this task's own labels
            row += len(part.examples)
            answers.append(self._answer(part.capsule, block.argmax(-1).tolist(), block.tolist()))
        return answers

    def _generate(self, parts: list[Part]) -> list[Answer]:
        inputs, capsules = generation_batch(parts, self.pad_id, self.spec)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        longest = max(self.served(p.capsule).max_new_tokens for p in parts)
        generated = self.bank.generate(**inputs, capsule=capsules, max_new_tokens=longest, do_sample=False,
                                       num_beams=1, pad_token_id=self.pad_id)
        if self.spec.generation_echoes_prompt:
            generated = generated[:, inputs["input_ids"].shape[1]:]  # keep the new tokens only
        answers, row = [], 0
        for part in parts:
            limit = self.served(part.capsule).max_new_tokens  # what this capsule's pyfunc would generate
            # T5's output starts with its decoder start token
            own = generated[row:row + len(part.examples), :limit + int(self.spec.encoder_decoder)]
            row += len(part.examples)
            texts = self.tokenizer.batch_decode(own, skip_special_tokens=True)
            task = self.served(part.capsule).task
            answers.append(self._answer(part.capsule, texts_to_labels(task, texts, part.examples), None))
        return answers

    @property
    def pad_id(self) -> int:
        """The padding token of the base model's tokenizer (EOS where it has none)."""
        pad_id = self.tokenizer.pad_token_id
        return pad_id if pad_id is not None else self.tokenizer.eos_token_id


def _emptied_then(unread: list[ServedCapsule], rest: Iterator[ServedCapsule]) -> Iterator[ServedCapsule]:
    """The capsules in `unread`, taken out as they are read, then `rest`'s."""
    while unread:
        yield unread.pop(0)
    yield from rest


def _check_same_base(served: ServedCapsule, base_name: str) -> None:
    """`served` was trained on `base_name` (the artifact's fingerprint is checked on load as well)."""
    if served.result["model"] != base_name:
        raise CapsuleArtifactError(
            f"{served.model_name} version {served.version} was trained on base model {served.result['model']!r}, "
            f"not on {base_name!r}, the base model this server holds: a capsule only fits its own base model.")


def _check_method(served: ServedCapsule) -> None:
    """Only CaPT capsules share a bank; other methods' adapters change the base model itself."""
    method = served.result["config"]["method"]["name"]
    entry = METHODS.get(method)
    shares_a_bank = entry is not None and issubclass(entry.model_class, CapsuleModel)
    if not shares_a_bank or not (Path(served.capsule_dir) / METHOD_FILE).is_file():
        raise CapsuleArtifactError(
            f"{served.model_name} version {served.version} holds a {method!r} artifact, not a CaPT capsule: "
            "only capsules can share one frozen base model.")


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
