"""`CapsuleEngine`: one frozen base model, one `capt.CapsuleBank`, many requests answered in one mixed batch: each
request's rows tokenised by its own capsule's collator, then padded to one width (`CapsuleEngine._batch`) and run
through the bank in one call, each row with its own capsule.

No Ray and no MLflow here: the Serve deployment (`pipelines.serving.app`) feeds it requests and new
registry versions; the benchmark and the tests can drive it directly.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from capt import CapsuleBank
from capt.bank import read_with_head
from capt.errors import CapsuleArtifactError
from capt.inject import CapsuleModel
from capt.methods import METHODS
from capt.packing import PAD_VALUES
from capt.tasks import Collator, Example, rank_classify, texts_to_labels
from capt.tasks import get as task_spec
from capt.tasks.collate import pad
from pipelines.adapted import METHOD_FILE, load_task_head, sequence_log_likelihood, sequence_overhead
from pipelines.capsule_predictor import INVALID_LABEL, _quiet_when_head_follows, validated_examples
from pipelines.models.loading import load_model
from pipelines.models.shape import model_shape
from pipelines.serving.memory import release_freed_heap, resident_mb
from pipelines.serving.records import Answer, ServedCapsule, ServedRecord

logger = logging.getLogger(__name__)

_MODEL_KEYS = ("input_ids", "attention_mask", "token_type_ids", "prompt_mask", "labels")
Request = tuple[str, list[Example]]
"""One request's share of a mixed batch: the bank's name of the capsule that answers it, its validated examples."""


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
        pad_id = self.tokenizer.pad_token_id
        self.pad_id = pad_id if pad_id is not None else self.tokenizer.eos_token_id
        """The padding token of the base model's tokenizer (EOS where it has none)."""
        self._collators: dict[tuple, Collator] = {}
        self.records: list[ServedRecord] = []
        """Each capsule's registry identity and serving settings, by its index in the bank."""
        unread = [first]
        del first  # the bank reads it from `unread`, and nothing here holds it (or its result) after that
        release_freed_heap()
        self.base_rss_mb = resident_mb()
        """Resident memory once the base model is loaded, before any capsule (what the capsules cost is the memory
        once loaded less this: GET /tasks shows both)."""
        base = loaded.model.to(self.device).eval()
        # encoder classifiers (BERT family): each capsule's own task head, read from its folder, in the bank beside it
        heads = functools.partial(load_task_head, base) if self.spec.classifier_head else None
        self.bank = CapsuleBank(base, self._described(_emptied_then(unread, each)), heads=heads).eval()
        release_freed_heap()  # what reading every capsule allocated and the stacked bank no longer holds
        self.retired: set[str] = set()
        """Names no longer served (registered model deleted, or alias gone): hidden from `names`, so new requests
        are refused, but kept in the bank, so a request accepted just before still gets its answer."""
        self.lock = threading.Lock()
        """Held around every batch and every capsule swap: a swap waits for the batch in flight."""
        self.revision = 0
        """Counts the changes of what is served (swap, add, retire): what is computed from the served names (the
        app's route checks: `app.CapsuleServer.catalog`) is computed again only when it moves."""

    def _described(self, capsules: Iterator[ServedCapsule]) -> Iterator[tuple[str, str]]:
        """(name, folder) of each capsule as the bank reads it, once its base model and method are checked and its
        record is kept (`records`: the bank reads them in this order, so a record's index is its capsule's)."""
        for served in capsules:
            self.records.append(self._record(served))
            yield served.name, served.capsule_dir

    def _record(self, served: ServedCapsule) -> ServedRecord:
        """`served`'s record, once it is checked: trained on this base model (the artifact's fingerprint is checked on
        load as well), and a CaPT capsule (other methods' adapters change the base model itself: no bank shares
        them)."""
        if served.result["model"] != self.base_name:
            raise CapsuleArtifactError(
                f"{served.model_name} version {served.version} was trained on base model {served.result['model']!r}, "
                f"not on {self.base_name!r}, the base model this server holds: a capsule only fits its own base model.")
        config = served.result["config"]
        method = config["method"]["name"]
        entry = METHODS.get(method)
        if (entry is None or not issubclass(entry.model_class, CapsuleModel)
                or not (Path(served.capsule_dir) / METHOD_FILE).is_file()):
            raise CapsuleArtifactError(
                f"{served.model_name} version {served.version} holds a {method!r} artifact, not a CaPT capsule: "
                "only capsules can share one frozen base model.")
        shape = (config["model"]["max_length"], sequence_overhead(method, config["method"]["options"]),
                 config["task"].get("input_format", "capt"))
        if shape not in self._collators:  # one collator per distinct shape, not per capsule
            self._collators[shape] = Collator(self.tokenizer, self.family, max_length=shape[0],
                                              capsule_slots=shape[1], input_format=shape[2])
        return ServedRecord(sys.intern(served.task), served.model_name, served.version, served.digest,
                            self._collators[shape], sys.intern(config["train"]["eval_mode"]),
                            config["model"]["max_new_tokens"])

    @property
    def names(self) -> list[str]:
        """The capsules served, by name."""
        held = self.bank.names[:len(self.records)]  # a capsule being added has its record once it is served
        return [name for name in held if name not in self.retired]

    def served(self, name: str) -> ServedRecord:
        """The capsule answering under `name` now."""
        return self.records[self.bank.index_of(name)]

    def versions(self) -> dict[str, int]:
        """The registry version each capsule name serves now."""
        return {name: self.served(name).version for name in self.names}

    def examples(self, name: str, rows: Sequence[Mapping[str, Any]]) -> list[Example]:
        """Validated examples for capsule `name` (the registry pyfunc's checks and errors)."""
        return validated_examples(self.served(name).task, rows)

    def add(self, served: ServedCapsule) -> None:
        """Serve `served` from the next batch on: a new version of a name the bank holds, or a new name, added to the
        bank beside the capsules served (checked against the base model first; they are not read again). It is read
        outside the lock: the bank's other capsules keep answering meanwhile."""
        record = self._record(served)
        head = load_task_head(self.bank.base_model, served.capsule_dir) if self.spec.classifier_head else None
        capsule, _ = read_with_head(self.bank.base_model, served.capsule_dir, head)
        capsule = capsule.to(self.device).eval()
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
    def answer(self, requests: Sequence[Request]) -> list[Answer]:
        """Answers to (capsule name, examples) requests, all of them in one mixed batch per evaluation mode."""
        answers: list[Answer | None] = [None] * len(requests)
        with self.lock:
            if self.spec.classifier_head:  # a task head answers every row, whatever the eval mode says
                return self._classify(requests)
            for mode, run in (("rank", self._rank), ("generate", self._generate)):
                chosen = [i for i, (name, _) in enumerate(requests) if self.served(name).mode == mode]
                if chosen:
                    for i, ans in zip(chosen, run([requests[i] for i in chosen]), strict=True):
                        answers[i] = ans
        return [a for a in answers if a is not None]

    def _batch(self, requests: Sequence[Request], batches: Sequence[dict[str, torch.Tensor]],
               side: str = "right") -> tuple[dict[str, torch.Tensor], list[str]]:
        """(model inputs on the device, capsule per row): the requests' collated `batches` stacked along rows, every
        model input padded to the widest on `side`."""
        keys = [k for k in _MODEL_KEYS if all(k in b for b in batches)]
        inputs = {k: pad([row.tolist() for b in batches for row in b[k]], PAD_VALUES.get(k, self.pad_id), side)
                  for k in keys}
        capsules = [name for (name, _), b in zip(requests, batches, strict=True) for _ in range(len(b["input_ids"]))]
        return {k: v.to(self.device) for k, v in inputs.items()}, capsules

    def _answer(self, name: str, ids: list[int], scores: list[list[float]] | None) -> Answer:
        served = self.served(name)
        label_names = list(task_spec(served.task).label_names)
        labels = [label_names[i] if 0 <= i < len(label_names) else INVALID_LABEL for i in ids]
        return Answer(labels, scores, label_names, served.model_name, served.version)

    def _rank(self, requests: Sequence[Request]) -> list[Answer]:
        """Rank classification: every example x every candidate answer, scored by its log-likelihood."""
        batches = [self.served(name).collator.candidate_batch(examples) for name, examples in requests]
        inputs, capsules = self._batch(requests, batches)
        labels = inputs.pop("labels")
        extra = {"labels": labels} if self.spec.encoder_decoder else {}  # labels build T5's decoder inputs
        logits = self.bank(**inputs, **extra, capsule=capsules).logits
        scores = sequence_log_likelihood(logits, labels, shift=self.spec.shifts_labels).cpu()
        answers = []
        for (name, examples), block in zip(requests, scores.split([len(b["input_ids"]) for b in batches]),
                                           strict=True):
            block = block.view(len(examples), len(block) // max(1, len(examples)))  # (examples, candidates)
            answers.append(self._answer(name, rank_classify(block), block.tolist()))
        return answers

    def _classify(self, requests: Sequence[Request]) -> list[Answer]:
        """Encoder classifiers: one encoder pass, each row through its own task's head (`CapsuleBank.classify`)."""
        batches = [{k: v for k, v in self.served(name).collator(examples).items() if k != "labels"}
                   for name, examples in requests]  # (B,) placeholder labels: unused
        inputs, capsules = self._batch(requests, batches)
        logits = self.bank.classify(**inputs, capsule=capsules).float()  # (B, C_max); -inf past a task's labels
        scores = torch.log_softmax(logits, dim=-1).cpu()  # log-probability of each label, as the task's head gives
        answers = []
        for (name, _), block in zip(requests, scores.split([len(e) for _, e in requests]), strict=True):
            block = block[:, :task_spec(self.served(name).task).num_labels]  # (n, C) this task's own labels
            answers.append(self._answer(name, block.argmax(-1).tolist(), block.tolist()))
        return answers

    def _generate(self, requests: Sequence[Request]) -> list[Answer]:
        """Generation; prompts that generation continues in place (decoder-only models) are left-padded."""
        side = "left" if self.spec.generation_echoes_prompt else "right"
        batches = [self.served(name).collator.generation_batch(examples, padding_side=side)
                   for name, examples in requests]
        inputs, capsules = self._batch(requests, batches, side)
        longest = max(self.served(name).max_new_tokens for name, _ in requests)
        generated = self.bank.generate(**inputs, capsule=capsules, max_new_tokens=longest, do_sample=False,
                                       num_beams=1, pad_token_id=self.pad_id)
        if self.spec.generation_echoes_prompt:
            generated = generated[:, inputs["input_ids"].shape[1]:]  # keep the new tokens only
        answers = []
        for (name, examples), own in zip(requests, generated.split([len(e) for _, e in requests]), strict=True):
            served = self.served(name)
            # what this capsule's pyfunc would generate; T5's output starts with its decoder start token
            own = own[:, :served.max_new_tokens + int(self.spec.encoder_decoder)]
            texts = self.tokenizer.batch_decode(own, skip_special_tokens=True)
            answers.append(self._answer(name, texts_to_labels(served.task, texts, examples), None))
        return answers


def _emptied_then(unread: list[ServedCapsule], rest: Iterator[ServedCapsule]) -> Iterator[ServedCapsule]:
    """The capsules in `unread`, taken out as they are read, then `rest`'s."""
    while unread:
        yield unread.pop(0)
    yield from rest
