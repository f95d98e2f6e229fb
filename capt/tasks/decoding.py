"""From model outputs to label ids: generated text (paper protocol) or candidate scores (ranking)."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

import numpy as np

from capt.tasks.errors import TaskUsageError
from capt.tasks.formats import choice_texts
from capt.tasks.records import Example
from capt.tasks.registry import get

INVALID = -1
"""Label id of a generation that matches no verbalizer (always scored wrong)."""

_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_text(text: str) -> str:
    """Lower-case, drop ASCII punctuation and the articles a/an/the, collapse whitespace (SQuAD style)."""
    text = _PUNCTUATION.sub("", text.lower())
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def text_to_label(task: str, text: str, example: Example | None = None) -> int:
    """The label id whose verbalizer equals the normalised `text`, else `INVALID` (-1).

    Also accepted: the task's label names (``true``/``false``, ``not_entailment``) and, for choice tasks
    when `example` is given, the text of one of its options.
    """
    spec = get(task)
    wanted = normalize_text(text)
    if not wanted:
        return INVALID
    for words in (spec.verbalizers, spec.label_names):
        for label, word in enumerate(words):
            if normalize_text(word) == wanted:
                return label
    if spec.choice_based and example is not None:
        for label, option in enumerate(choice_texts(spec, example.fields)):
            if normalize_text(option) == wanted:
                return label
    return INVALID


def texts_to_labels(task: str, texts: Sequence[str], examples: Sequence[Example] | None = None) -> list[int]:
    """`text_to_label` over a batch."""
    if examples is None:
        return [text_to_label(task, t) for t in texts]
    return [text_to_label(task, t, e) for t, e in zip(texts, examples, strict=True)]


def rank_classify(scores: Sequence[Sequence[float]] | np.ndarray) -> list[int]:
    """Label ids of the best-scoring candidate per row of an (N, C) score matrix (ties: lowest id)."""
    if hasattr(scores, "detach"):  # a torch tensor (any device, any float dtype)
        scores = scores.detach().cpu().double().numpy()
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] == 0:
        raise TaskUsageError(f"Expected scores of shape (N, C) with C >= 1, got {array.shape}.")
    return np.argmax(array, axis=1).astype(int).tolist()
