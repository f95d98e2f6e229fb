"""Render an `Example` for a model family with its task's fixed template (see `capt.tasks.registry`).

Choice tasks get two derived template fields: ``choices`` = ``"(1) first (2) second ..."`` (one line)
and ``choice_lines`` = the same options one per line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from capt.tasks.input_formats import remove_markup
from capt.tasks.records import Example
from capt.tasks.registry import TaskSpec, check_family, get


class T5Input(NamedTuple):
    """Encoder-decoder pair: source text and target text (the verbalizer)."""

    source: str
    target: str


class DecoderInput(NamedTuple):
    """Decoder-only pair: prompt and answer (``" " + verbalizer``); the model sees prompt + answer."""

    prompt: str
    answer: str


class EncoderInput(NamedTuple):
    """Encoder classifier input: first segment, optional second segment, class id."""

    text: str
    text_pair: str | None
    label: int


Rendered = T5Input | DecoderInput | EncoderInput


def choice_texts(spec: TaskSpec, fields: Mapping[str, str]) -> list[str]:
    """The option texts of a choice task, in option order."""
    return [fields[f"choice{i + 1}"] for i in range(spec.num_labels)]


def template_fields(spec: TaskSpec, fields: Mapping[str, str]) -> dict[str, str]:
    """The fields a template may use: the example's fields plus ``choices``/``choice_lines``."""
    values = dict(fields)
    if spec.choice_based:
        options = [f"({i + 1}) {text}" for i, text in enumerate(choice_texts(spec, fields))]
        values["choices"] = " ".join(options)
        values["choice_lines"] = "\n".join(options)
    return values


def answer_text(spec: TaskSpec, label: int, family: str) -> str:
    """The target text of a label id: the verbalizer (with a leading space for "decoder")."""
    word = spec.verbalizers[label]
    return " " + word if family == "decoder" else word


def render_input(spec: TaskSpec, fields: Mapping[str, str], family: str) -> str | tuple[str, str | None]:
    """The model input without the answer: source (t5), prompt (decoder) or (text, pair) (encoder)."""
    values = template_fields(spec, fields)
    template = spec.template(check_family(family))
    if isinstance(template, tuple):
        text, pair = template
        return text.format(**values), None if pair is None else pair.format(**values)
    rendered = template.format(**values)
    return remove_markup(rendered) if spec.remove_markup and family == "t5" else rendered


def render(example: Example, family: str) -> Rendered:
    """The example in the format of `family`: `T5Input`, `DecoderInput` or `EncoderInput`."""
    spec = get(example.task)
    rendered = render_input(spec, example.fields, family)
    if family == "encoder":
        text, pair = rendered
        return EncoderInput(text, pair, example.label)
    answer = answer_text(spec, example.label, family)
    return T5Input(rendered, answer) if family == "t5" else DecoderInput(rendered, answer)
