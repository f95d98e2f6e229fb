"""The seven tasks of the CaPT paper: label names, verbalizers, metrics and the fixed templates.

Templates are `str.format` strings over an example's fields (see `capt.tasks.formats` for the two
derived fields `choices` and `choice_lines`). They are fixed on purpose: a capsule trained with one
template is only valid with that template.

Families:

- ``"t5"``: source text ``"<task> field: ... field: ..."`` (the T5 paper style), target = verbalizer.
- ``"decoder"``: prompt ending in ``"\\nAnswer:"``, answer = ``" " + verbalizer`` (leading space, so a
  byte-level BPE (Llama 3, Qwen2) or SentencePiece tokeniser sees the same token as in running text).
- ``"encoder"``: ``(text, text_pair)`` for a BERT-style ``[CLS] text [SEP] pair [SEP]`` classifier; the
  label is the class id (verbalizers unused).

Verbalizers (label id -> word):

=========  ==========================================  =====================================
task       label names (id order)                      verbalizers
=========  ==========================================  =====================================
boolq      False, True                                 no, yes
cb         entailment, contradiction, neutral          entailment, contradiction, neutral
copa       choice1, choice2                            1, 2
multirc    False, True                                 no, yes
rte        entailment, not_entailment                  entailment, not_entailment
wic        False, True                                 no, yes
csqa       A, B, C, D, E                               1, 2, 3, 4, 5
=========  ==========================================  =====================================

The label-id order equals the Hugging Face hub (`aps/super_glue`) integer labels. COPA and CSQA are
choice tasks: their options appear numbered in the input text, ``(1) ... (2) ...``, and the answer is
the option number. Numbers, not letters, because `normalize_text` drops the article "a".

With `capt.tasks.tokenizers.test_tokenizer()` every verbalizer is one token (and one token with the
decoder's leading space) except ``not_entailment``, which the byte-level pre-tokeniser splits into
``not``, ``_``, ``entailment``. With the MiniLM WordPiece tokeniser: ``yes``, ``no``, ``contradiction``,
``neutral`` and the digits are one token; ``entailment`` is ``en ##tail ##ment`` and
``not_entailment`` is ``not _ en ##tail ##ment``.
"""

from __future__ import annotations

from dataclasses import dataclass

from capt.tasks.errors import TaskUsageError, UnknownTaskError

FAMILIES: tuple[str, ...] = ("t5", "decoder", "encoder")
"""The model families every task renders for."""


@dataclass(frozen=True)
class Templates:
    """The fixed per-family templates of one task (`str.format` strings over the example fields)."""

    t5: str
    """Source text for encoder-decoder models; the target is the verbalizer."""
    decoder: str
    """Prompt for decoder-only models; the answer is ``" " + verbalizer``."""
    encoder_text: str
    """First segment for encoder classifiers."""
    encoder_pair: str | None
    """Second segment for encoder classifiers (None: single-segment input)."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything task-specific that is not data: labels, verbalizers, metrics, templates."""

    name: str
    """Registry name, e.g. "rte"."""
    label_names: tuple[str, ...]
    """Label names in label-id order (the dataset's own names)."""
    verbalizers: tuple[str, ...]
    """Label word per label id, generated or scored by text-to-text models."""
    metrics: tuple[str, ...]
    """Metric names computed by `capt.tasks.metrics.compute_metrics`; the task score is their mean."""
    fields: tuple[str, ...]
    """Text fields every normalised `Example` of this task carries."""
    long_field: str | None
    """The field truncation shortens first (passage/premise/paragraph); None: no long field."""
    templates: Templates
    """Fixed per-family templates."""
    hub_path: str
    """Dataset id on the Hugging Face hub."""
    hub_config: str | None = None
    """Dataset config on the hub (None: the default config)."""
    choice_based: bool = False
    """True when the options are rendered in the input and the answer is an option number."""
    remove_markup: bool = False
    """Remove HTML markup from the rendered T5 input (T5's own MultiRC format, `capt.tasks.input_formats`)."""

    @property
    def num_labels(self) -> int:
        """Number of classes."""
        return len(self.label_names)

    def template(self, family: str) -> str | tuple[str, str | None]:
        """The template(s) for one family: a string, or (text, pair) for "encoder"."""
        check_family(family)
        if family == "encoder":
            return (self.templates.encoder_text, self.templates.encoder_pair)
        return getattr(self.templates, family)


def check_family(family: str) -> str:
    """Return `family` if it is one of `FAMILIES`, else raise `TaskUsageError` naming the valid ones."""
    if family not in FAMILIES:
        raise TaskUsageError(f"Unknown model family {family!r}; valid families: {', '.join(FAMILIES)}.")
    return family


_YES_NO = ("no", "yes")
_BOOL = ("False", "True")

_SPECS: tuple[TaskSpec, ...] = (
    TaskSpec(
        name="boolq",
        label_names=_BOOL,
        verbalizers=_YES_NO,
        metrics=("accuracy",),
        fields=("question", "passage"),
        long_field="passage",
        templates=Templates(
            t5="boolq question: {question} passage: {passage}",
            decoder="Passage: {passage}\nQuestion: {question}?\nAnswer (yes or no):",
            encoder_text="{question}",
            encoder_pair="{passage}",
        ),
        hub_path="aps/super_glue",
        hub_config="boolq",
    ),
    TaskSpec(
        name="cb",
        label_names=("entailment", "contradiction", "neutral"),
        verbalizers=("entailment", "contradiction", "neutral"),
        metrics=("accuracy", "macro_f1"),
        fields=("premise", "hypothesis"),
        long_field="premise",
        templates=Templates(
            t5="cb hypothesis: {hypothesis} premise: {premise}",
            decoder=(
                "Premise: {premise}\nHypothesis: {hypothesis}\n"
                "Answer (entailment, contradiction or neutral):"
            ),
            encoder_text="{premise}",
            encoder_pair="{hypothesis}",
        ),
        hub_path="aps/super_glue",
        hub_config="cb",
    ),
    TaskSpec(
        name="copa",
        label_names=("choice1", "choice2"),
        verbalizers=("1", "2"),
        metrics=("accuracy",),
        fields=("premise", "question", "choice1", "choice2"),
        long_field="premise",
        templates=Templates(
            t5="copa premise: {premise} question: What was the {question}? choices: {choices}",
            decoder="Premise: {premise}\nWhat was the {question}?\n{choice_lines}\nAnswer (1 or 2):",
            encoder_text="{premise} What was the {question}?",
            encoder_pair="{choices}",
        ),
        hub_path="aps/super_glue",
        hub_config="copa",
        choice_based=True,
    ),
    TaskSpec(
        name="multirc",
        label_names=_BOOL,
        verbalizers=_YES_NO,
        metrics=("f1a", "em"),
        fields=("paragraph", "question", "answer"),
        long_field="paragraph",
        templates=Templates(
            t5="multirc question: {question} answer: {answer} paragraph: {paragraph}",
            decoder=(
                "Paragraph: {paragraph}\nQuestion: {question}\nCandidate answer: {answer}\n"
                "Is the candidate answer correct?\nAnswer (yes or no):"
            ),
            encoder_text="{paragraph}",
            encoder_pair="{question} {answer}",
        ),
        hub_path="aps/super_glue",
        hub_config="multirc",
    ),
    TaskSpec(
        name="rte",
        label_names=("entailment", "not_entailment"),
        verbalizers=("entailment", "not_entailment"),
        metrics=("accuracy",),
        fields=("premise", "hypothesis"),
        long_field="premise",
        templates=Templates(
            t5="rte sentence1: {premise} sentence2: {hypothesis}",
            decoder="Premise: {premise}\nHypothesis: {hypothesis}\nAnswer (entailment or not_entailment):",
            encoder_text="{premise}",
            encoder_pair="{hypothesis}",
        ),
        hub_path="aps/super_glue",
        hub_config="rte",
    ),
    TaskSpec(
        name="wic",
        label_names=_BOOL,
        verbalizers=_YES_NO,
        metrics=("accuracy",),
        fields=("word", "sentence1", "sentence2"),
        long_field=None,
        templates=Templates(
            t5="wic word: {word} sentence1: {sentence1} sentence2: {sentence2}",
            decoder=(
                "Sentence 1: {sentence1}\nSentence 2: {sentence2}\n"
                'Does "{word}" mean the same in both sentences?\nAnswer (yes or no):'
            ),
            encoder_text="{word}: {sentence1}",
            encoder_pair="{sentence2}",
        ),
        hub_path="aps/super_glue",
        hub_config="wic",
    ),
    TaskSpec(
        name="csqa",
        label_names=("A", "B", "C", "D", "E"),
        verbalizers=("1", "2", "3", "4", "5"),
        metrics=("accuracy",),
        fields=("question", "concept", "choice1", "choice2", "choice3", "choice4", "choice5"),
        long_field=None,
        templates=Templates(
            t5="csqa question: {question} choices: {choices}",
            decoder="Question: {question}\n{choice_lines}\nAnswer (1, 2, 3, 4 or 5):",
            encoder_text="{question}",
            encoder_pair="{choices}",
        ),
        hub_path="tau/commonsense_qa",
        choice_based=True,
    ),
)

_REGISTRY: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}

TASK_NAMES: tuple[str, ...] = tuple(_REGISTRY)
"""The registered task names, in the paper's order (SuperGLUE tasks, then CommonsenseQA): the one list."""
SUPERGLUE_TASKS: tuple[str, ...] = tuple(spec.name for spec in _SPECS if spec.hub_path == "aps/super_glue")
"""The SuperGLUE tasks (the paper's average is over these)."""


def names() -> tuple[str, ...]:
    """The registered task names, in the paper's order (SuperGLUE tasks, then CommonsenseQA)."""
    return TASK_NAMES


def get(name: str) -> TaskSpec:
    """The `TaskSpec` of `name`; raises `UnknownTaskError` (a KeyError) listing the valid names for an unknown one."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownTaskError(f"Unknown task {name!r}; valid tasks: {', '.join(_REGISTRY)}.") from None
