"""Raw rows -> validated `Example` records: the one code path shared by every data source.

A raw row is either in the official release layout (SuperGLUE v2 jsonl, CommonsenseQA
``*_rand_split.jsonl``; what local files and the generator produce) or in the Hugging Face hub layout
(`aps/super_glue`, `tau/commonsense_qa`). Both only differ for MultiRC (the hub is already flattened)
and CSQA (choices as two parallel lists); labels may be names, ids or bools (see `parse_label`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from capt.tasks.records import GENERATED_KEY, GENERATED_PREFIX, Example
from capt.tasks.registry import TaskSpec, get
from capt.tasks.validation import (
    Where,
    check_split,
    parse_label,
    require_id,
    require_list,
    require_mapping,
    require_span,
    require_text,
)

COPA_QUESTIONS = ("cause", "effect")


@dataclass(frozen=True)
class Parsed:
    """One normalised record before it gets its uid: official idx, fields, label id, question group."""

    idx: str
    fields: dict[str, str]
    label: int
    group: str | None = None


Parser = Callable[[TaskSpec, Mapping[str, Any], Where], list[Parsed]]


def _parse_flat(spec: TaskSpec, row: Mapping[str, Any], where: Where) -> list[Parsed]:
    """BoolQ, CB, RTE, COPA, WiC: one record per row, text fields at the top level."""
    fields = {name: require_text(row, name, where) for name in spec.fields}
    if spec.name == "copa" and fields["question"] not in COPA_QUESTIONS:
        raise where.error(f"expected one of {COPA_QUESTIONS}, got {fields['question']!r}", "question")
    if spec.name == "wic":
        require_span(row, "start1", "end1", row["sentence1"], where)
        require_span(row, "start2", "end2", row["sentence2"], where)
    label = parse_label(spec, row.get("label"), where)
    return [Parsed(require_id(row, "idx", where), fields, label)]


def _parse_multirc(spec: TaskSpec, row: Mapping[str, Any], where: Where) -> list[Parsed]:
    """MultiRC: official nested rows expand to one record per answer; hub rows are already flat."""
    if "paragraph" in row and "passage" not in row:
        return [_parse_multirc_hub(spec, row, where)]
    passage = require_mapping(row, "passage", where)
    paragraph = require_text(passage, "text", where, "passage.text")
    p_idx = require_id(row, "idx", where)
    out: list[Parsed] = []
    for qi, question in enumerate(require_list(passage, "questions", where, "passage.questions")):
        qname = f"passage.questions[{qi}]"
        q_text = require_text(question, "question", where, f"{qname}.question")
        q_idx = require_id(question, "idx", where, f"{qname}.idx")
        for ai, answer in enumerate(require_list(question, "answers", where, f"{qname}.answers")):
            aname = f"{qname}.answers[{ai}]"
            # The official MultiRC train split has 3 answers with empty text (all labelled 0).
            a_text = require_text(answer, "text", where, f"{aname}.text", allow_empty=True)
            a_idx = require_id(answer, "idx", where, f"{aname}.idx")
            label = parse_label(spec, answer.get("label"), where, f"{aname}.label")
            fields = {"paragraph": paragraph, "question": q_text, "answer": a_text}
            out.append(Parsed(f"{p_idx}-{q_idx}-{a_idx}", fields, label, f"{p_idx}-{q_idx}"))
    return out


def _parse_multirc_hub(spec: TaskSpec, row: Mapping[str, Any], where: Where) -> Parsed:
    fields = {name: require_text(row, name, where, allow_empty=name == "answer") for name in spec.fields}
    idx = require_mapping(row, "idx", where)
    p, q, a = (require_id(idx, key, where, f"idx.{key}") for key in ("paragraph", "question", "answer"))
    return Parsed(f"{p}-{q}-{a}", fields, parse_label(spec, row.get("label"), where), f"{p}-{q}")


def _parse_csqa(spec: TaskSpec, row: Mapping[str, Any], where: Where) -> list[Parsed]:
    """CommonsenseQA: official rows nest the question; hub rows keep choices as parallel lists."""
    question = row.get("question")
    if isinstance(question, Mapping):
        stem = require_text(question, "stem", where, "question.stem")
        concept = require_text(question, "question_concept", where, "question.question_concept")
        choices = require_list(question, "choices", where, "question.choices")
        pairs = [(require_text(c, "label", where, f"question.choices[{i}].label"),
                  require_text(c, "text", where, f"question.choices[{i}].text"))
                 for i, c in enumerate(choices)]
    else:
        stem = require_text(row, "question", where)
        concept = require_text(row, "question_concept", where)
        choices_obj = require_mapping(row, "choices", where)
        labels = require_list(choices_obj, "label", where, "choices.label")
        texts = require_list(choices_obj, "text", where, "choices.text")
        pairs = _hub_choice_pairs(labels, texts, where)
    return [_csqa_record(spec, row, where, stem, concept, pairs)]


def _hub_choice_pairs(labels: list[Any], texts: list[Any], where: Where) -> list[tuple[str, str]]:
    if len(labels) != len(texts):
        raise where.error(f"{len(labels)} labels but {len(texts)} texts", "choices")
    for i, (label, text) in enumerate(zip(labels, texts, strict=True)):
        if not isinstance(label, str) or not isinstance(text, str):
            raise where.error("expected a string label and text", f"choices[{i}]")
    return [(label.strip(), text) for label, text in zip(labels, texts, strict=True)]


def _csqa_record(spec: TaskSpec, row: Mapping[str, Any], where: Where, stem: str, concept: str,
                 pairs: list[tuple[str, str]]) -> Parsed:
    if [label for label, _ in pairs] != list(spec.label_names):
        raise where.error(f"expected choices labelled {', '.join(spec.label_names)}, "
                          f"got {[label for label, _ in pairs]}", "question.choices")
    texts = [text.strip() for _, text in pairs]
    if not all(texts):
        raise where.error("empty choice text", "question.choices")
    fields = {"question": stem, "concept": concept}
    fields.update({f"choice{i + 1}": text for i, text in enumerate(texts)})
    label = parse_label(spec, row.get("answerKey"), where, "answerKey")
    return Parsed(require_id(row, "id", where), fields, label)


_PARSERS: dict[str, Parser] = {
    "boolq": _parse_flat, "cb": _parse_flat, "copa": _parse_flat, "rte": _parse_flat,
    "wic": _parse_flat, "multirc": _parse_multirc, "csqa": _parse_csqa,
}


def examples_from_rows(task: str, split: str, rows: Iterable[tuple[int, Any]],
                       source: str) -> list[Example]:
    """Normalise and validate raw rows of one official split.

    `rows` yields (1-based row number, raw row). `split` is the official split name used in uids
    (``train`` or ``val``); rows flagged ``"generated": true`` get uids starting with ``gen:``. Raises
    `TaskDataError` (naming `source`, the row number and the field) on the first bad row, on a duplicate
    id and on an empty split.
    """
    spec = get(task)
    parse = _PARSERS[task]
    examples: list[Example] = []
    seen: set[str] = set()
    for number, row in rows:
        where = Where(source, number)
        if not isinstance(row, Mapping):
            raise where.error(f"expected a JSON object, got {type(row).__name__}")
        prefix = GENERATED_PREFIX if row.get(GENERATED_KEY) is True else ""
        base = f"{prefix}{task}/{split}/"
        for parsed in parse(spec, row, where):
            uid = base + parsed.idx
            if uid in seen:
                raise where.error(f"duplicate example id {parsed.idx!r}", "idx")
            seen.add(uid)
            group = None if parsed.group is None else base + parsed.group
            examples.append(Example(task, uid, parsed.fields, parsed.label, group))
    check_split(task, examples, source)
    return examples
