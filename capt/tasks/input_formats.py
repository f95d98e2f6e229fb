"""Input formats: this package's templates ("capt") or T5's own SuperGLUE format ("t5_superglue").

The google-t5 checkpoints (t5-small ... t5-11b) were pre-trained on a multi-task mixture that included
SuperGLUE, rendered by T5's preprocessors, so a T5 checkpoint has already seen each task in that exact form.
"t5_superglue" renders the six SuperGLUE tasks that way, with T5's label words, taken from
google-research/text-to-text-transfer-transformer:

- `t5/data/glue_utils.py` `get_glue_text_preprocessor` -> `t5/data/preprocessors.py` `glue`: the input is the
  benchmark name, then ``"<feature>: <value>"`` for each feature, joined by single spaces; features are sorted by
  name, except MultiRC (question, answer, paragraph) and WiC (sentence1, sentence2, word; the word's character
  offsets are ignored). For MultiRC the joined text loses its HTML markup (``<br>`` becomes a space, ``<b>`` and
  ``</b>`` are dropped). The target is the label name at the label id (``tfds`` `super_glue` `label_classes`,
  "False"/"True" when a config names none).
- Features are those of `tfds` `super_glue`: RTE has premise and hypothesis (so "rte hypothesis: ... premise:
  ..."; GLUE's RTE, also in T5's mixture, rendered the same data as "rte sentence1: ... sentence2: ..."); COPA's
  question is "cause" or "effect".

=========  ===================================================================  ==============================
task       input                                                                label words (id order)
=========  ===================================================================  ==============================
boolq      ``boolq passage: P question: Q``                                     False, True
cb         ``cb hypothesis: H premise: P``                                      entailment, contradiction, neutral
copa       ``copa choice1: A choice2: B premise: P question: cause``            choice1, choice2
multirc    ``multirc question: Q answer: A paragraph: P`` (markup removed)      False, True
rte        ``rte hypothesis: H premise: P``                                     entailment, not_entailment
wic        ``wic sentence1: S1 sentence2: S2 word: W``                          False, True
=========  ===================================================================  ==============================

CommonsenseQA was not part of T5's mixture: it has no T5 format (asking for one is an error). Every label word is
also a label name of its task, so `capt.tasks.decoding.text_to_label` maps generated T5 words back to label ids.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from capt.tasks.registry import TaskSpec, get

INPUT_FORMATS = ("capt", "t5_superglue")
"""Input formats: this package's templates, or T5's SuperGLUE format (T5 checkpoints only)."""
_BOOL = ("False", "True")
_T5_SUPERGLUE: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolq": ("boolq passage: {passage} question: {question}", _BOOL),
    "cb": ("cb hypothesis: {hypothesis} premise: {premise}", ("entailment", "contradiction", "neutral")),
    "copa": ("copa choice1: {choice1} choice2: {choice2} premise: {premise} question: {question}",
             ("choice1", "choice2")),
    "multirc": ("multirc question: {question} answer: {answer} paragraph: {paragraph}", _BOOL),
    "rte": ("rte hypothesis: {hypothesis} premise: {premise}", ("entailment", "not_entailment")),
    "wic": ("wic sentence1: {sentence1} sentence2: {sentence2} word: {word}", _BOOL),
}
_MARKUP = re.compile(r"<(/)?b>")


def input_format_problems(input_format: str, family: str, task: str | None = None) -> list[str]:
    """Why `input_format` cannot render `task` (any task when None) for a model of `family` (empty when it can)."""
    if input_format not in INPUT_FORMATS:
        return [f"input_format={input_format!r} (allowed: {', '.join(INPUT_FORMATS)})"]
    if input_format == "capt":
        return []
    problems = []
    if family != "t5":
        problems.append(f"input_format='t5_superglue' with a {family!r} model: it is the format T5 checkpoints were "
                        "pre-trained on, for T5-family models only (allowed here: capt)")
    if task is not None and task not in _T5_SUPERGLUE:
        problems.append(f"input_format='t5_superglue' with task {task!r}: T5's mixture had no {task} format "
                        f"(allowed tasks: {', '.join(_T5_SUPERGLUE)}; use input_format=capt for {task})")
    return problems


@functools.cache
def formatted_spec(task: str, input_format: str = "capt") -> TaskSpec:
    """The `TaskSpec` of `task` whose T5 template and verbalizers are those of `input_format`."""
    spec = get(task)
    if input_format == "capt":
        return spec
    problems = input_format_problems(input_format, "t5", task)
    if problems:
        raise ValueError("; ".join(problems) + ".")
    template, words = _T5_SUPERGLUE[task]
    return dataclasses.replace(spec, verbalizers=words, templates=dataclasses.replace(spec.templates, t5=template),
                               remove_markup=task == "multirc")


def remove_markup(text: str) -> str:
    """MultiRC's HTML markup removed as T5's preprocessor does: ``<br>`` -> space, ``<b>``/``</b>`` dropped."""
    return _MARKUP.sub("", text.replace("<br>", " "))
