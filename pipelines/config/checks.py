"""Pre-flight checks of a job across its keys and against its base model's config (read without loading weights):
method options, capsule layers the model lacks, sequences longer than its positions, methods, readouts and input
formats the model does not support."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from capt.methods import METHODS, get_method
from capt.tasks.config import DATA_DIR_ENV
from pipelines.config.readout import readout_problems
from pipelines.config.schema import raw_value
from pipelines.models.shape import ModelShape, model_name_problems, model_shape


def model_fit_problems(raw: dict[str, Any], method_ok: bool) -> list[str]:
    """What the model's own config refuses: capsule layers it lacks, sequences longer than its positions."""
    name, method_name = raw_value(raw, "model.name"), raw_value(raw, "method.name")
    try:
        shape = model_shape(name)
    except ValueError as err:
        return [str(err)]
    problems = []
    if method_ok:
        problems += _method_fit_problems(name, shape, method_name, raw_value(raw, "method.options"))
    problems += _length_problems(raw, shape, method_ok)
    return problems


def _method_fit_problems(name: str, shape: ModelShape, method_name: str, options: dict[str, Any]) -> list[str]:
    """Layers the method's options name that the model lacks, and a model type the method refuses."""
    entry = get_method(method_name)
    problems = []
    bad = entry.missing_layers(options, shape.capsule_layers)
    if bad:
        layers, stack = options.get("layers"), shape.spec.capsule_stack_name
        problems.append(f"method.options.layers={list(layers)}: model.name={name!r} has {shape.capsule_layers} "
                        f"{stack}, so {bad} do not exist (allowed: indices 0..{shape.capsule_layers - 1}, or all, "
                        "first_half, odd)")
    reason = entry.unsupported_reason(shape.model_type)
    if reason:
        problems.append(f"method.name={method_name!r} with model.name={name!r}: {reason}")
    return problems


def _length_problems(raw: dict[str, Any], shape: ModelShape, method_ok: bool) -> list[str]:
    """`model.max_length` (slots and virtual tokens included) against the model's positions and the method."""
    max_length, new_tokens = raw_value(raw, "model.max_length"), raw_value(raw, "model.max_new_tokens")
    if not isinstance(max_length, int) or not isinstance(new_tokens, int) or max_length < 1:
        return []  # the schema reports the type
    problems = []
    generates = shape.spec.generation_echoes_prompt and raw_value(raw, "train.eval_mode") == "generate"
    generated = new_tokens if generates else 0  # new tokens take positions after the prompt
    if shape.position_limit is not None and max_length + generated > shape.position_limit:
        extra = f" + model.max_new_tokens={new_tokens} generated after it" if generated else ""
        problems.append(f"model.max_length={max_length}{extra}: model.name={raw_value(raw, 'model.name')!r} has "
                        f"positions for {shape.position_limit} tokens (capsule slots and virtual tokens count "
                        f"toward max_length); allowed: at most {shape.position_limit - generated}")
    if method_ok:
        method = raw_value(raw, "method.name")
        overhead = get_method(method).sequence_overhead(raw_value(raw, "method.options"))
        if overhead >= max_length:
            problems.append(f"model.max_length={max_length}: method {method!r} adds {overhead} "
                            f"positions to every input, leaving none for the text; allowed: more than {overhead}")
    return problems


def cross_field_problems(raw: dict[str, Any]) -> list[str]:
    """Rules across keys, checked on the raw values so they are reported alongside schema problems."""
    problems: list[str] = []
    name, options, model = raw_value(raw, "method.name"), raw_value(raw, "method.options"), raw_value(raw, "model.name")
    options_ok = name in METHODS and isinstance(options, dict)
    if options_ok:
        problems += _method_option_problems(name, options)
    if isinstance(model, str):
        name_problems = model_name_problems(model)
        problems += name_problems or model_fit_problems(raw, options_ok and not problems)
        if not name_problems:
            problems += _readout_problems(raw) + _input_format_problems(raw)
    if raw_value(raw, "task.source") == "local" and not (raw_value(raw, "task.data_dir")
                                                         or os.environ.get("CAPT_DATA_DIR")):
        problems.append("task.data_dir=None with task.source='local': set task.data_dir or CAPT_DATA_DIR, "
                        "or use task.source=generated (or hub)")
    return problems


def ignored_data_dir_note(source: str | None, data_dir: str | None, reader: str, fix: str) -> str | None:
    """One line when CAPT_DATA_DIR is set but jobs of task `source` and `data_dir` (`reader`, with its verb: "this
    job reads") will not read it, saying how they would (`fix`); None when it is unset or read. A user who set it
    expects it to be used: silence would let a run on generated data pass for one on real data."""
    env = os.environ.get(DATA_DIR_ENV)
    if not env or (source == "local" and (not data_dir or _same_folder(data_dir, env))):
        return None
    reads = f"task.data_dir={data_dir}" if source == "local" else f"{source} data (task.source={source})"
    return f"{DATA_DIR_ENV}={env} is ignored: {reader} {reads}; to train on the files in {env}, {fix}."


def _same_folder(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _method_option_problems(name: str, options: dict[str, Any]) -> list[str]:
    """Problems of `method.options` for method `name`, e.g. a prompt-tuning option given to LoRA."""
    try:
        get_method(name).build_config(options)
    except (ValueError, TypeError) as err:
        return [f"method.options for method {name!r}: {err}"]
    return []


def _input_format_problems(raw: dict[str, Any]) -> list[str]:
    from capt.tasks.input_formats import INPUT_FORMATS, input_format_problems

    input_format, name, task = (raw_value(raw, k) for k in ("task.input_format", "model.name", "task.name"))
    if input_format not in INPUT_FORMATS or not isinstance(task, str):
        return []  # the schema reports it
    try:
        family = model_shape(name).family
    except ValueError:
        return []
    return [f"task.{problem} (model.name={name!r})"
            for problem in input_format_problems(input_format, family, task)]


def _readout_problems(raw: dict[str, Any]) -> list[str]:
    try:
        spec = model_shape(raw_value(raw, "model.name")).spec
    except ValueError:
        return []  # model_fit_problems reported it
    return readout_problems(raw, spec)
