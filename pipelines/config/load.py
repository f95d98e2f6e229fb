"""THE entry to a job's configuration: sources merged -> schema -> cross-field checks -> defaults resolved, once.

`load_job_config` (a YAML file, a dict, `key.sub=value` overrides) and `validate_job_config` (a plain dict) are
the only ways to a `ResolvedJobConfig`: every problem is reported at once, the method's options are written out in
full (its defaults included), and what the config leaves empty is filled in, so training, result.json, the MLflow
params and the config hash all see the values actually used, never `None`. Everything below this module takes a
`ResolvedJobConfig` and never resolves again (`pipelines.config.schema.require_resolved` guards the entries).

What a job gets where its config names nothing:

- `optim.name` and `optim.lr` left empty are filled in from the entry its method's config class declares for the
  model's family (`resolve_optim`; where the values come from: `capt.optim_defaults`). `OPTIM_DEFAULTS`
  (`capt.methods`) shows every registered method's entries as one table. `resolve_training` first gives a job the
  rest of its method's authors' training values (`training_defaults`: weight decay, schedule, clipping, batch,
  epochs) where its config sets none.
- `model.readout`, what a job's classifier reads (`default_readout`): encoder-only models (BERT family) classify with
  a linear head, which reads one of `capt.arch.readout.READOUTS` (pooler, cls, mean, capsule); T5 and decoder-only
  models produce the label word with their language-model head, the one readout they have (`LM_HEAD`). An unset
  `model.readout` resolves to `ENCODER_READOUT` or `LM_HEAD` by the model's family.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import TypeAdapter, ValidationError

from capt.arch.readout import READOUTS
from capt.methods import METHODS, get_method, optim_default
from capt.tasks.config import DATA_DIR_ENV
from pipelines.config.schema import LM_HEAD, JobConfig, ResolvedJobConfig, raw_value
from pipelines.config.sources import PipelineConfigError, merge_sources
from pipelines.models.shape import ModelShape, model_name_problems, model_shape

if TYPE_CHECKING:
    from capt.arch import ArchSpec


def resolve_training(config: JobConfig, given: Mapping[str, Any]) -> JobConfig:
    """`config` with its method's authors' training values (`Method.training_defaults`: weight decay, schedule,
    clipping, batch, epochs) in every key that `given`, the job's merged sources, leaves unset; a key the job's
    config sets keeps its value."""
    given_options = (given.get("method") or {}).get("options") or {}
    for key, value in METHODS[config.method.name].training_defaults.items():
        section, _, field = key.rpartition(".")
        if section == "method.options":
            if field not in given_options:
                config = _replaced(config, "method", options={**config.method.options, field: value})
        elif field not in (given.get(section) or {}):
            config = _replaced(config, section, **{field: value})
    return config


def _replaced(config: JobConfig, section: str, **fields: Any) -> JobConfig:
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **fields)})


def resolve_optim(config: JobConfig) -> JobConfig:
    """`config` with `optim.name` and `optim.lr`, when empty, filled in from the method's default for the model's
    family (unchanged otherwise).

    ValueError when only `optim.name` is given and it is not the default optimiser (its lr would not fit).
    """
    optim = config.optim
    if optim.name is not None and optim.lr is not None:
        return config
    family = model_shape(config.model.name).family
    default = optim_default(config.method.name, family)
    if optim.lr is None and optim.name not in (None, default.optimizer):
        raise ValueError(f"optim.name={optim.name!r} with optim.lr unset: the default lr of method "
                         f"{config.method.name!r} on model.name={config.model.name!r} (family {family!r}) is "
                         f"{default.lr:g} for {default.optimizer}, not for {optim.name}; set optim.lr too")
    return _replaced(config, "optim", name=optim.name or default.optimizer, lr=optim.lr or default.lr)


# `model.readout`

ENCODER_READOUT = "mean"
"""Default readout of encoder-only models, chosen on validation (benchmarks/README.md, "Readout of MiniLM"):
the mean of the token states, the pooling MiniLM (all-MiniLM-L6-v2) was trained with."""


def default_readout(spec: ArchSpec) -> str:
    """The readout a job on a model of family `spec` gets when `model.readout` is unset."""
    return ENCODER_READOUT if spec.classifier_head else LM_HEAD


def allowed_readouts(spec: ArchSpec, method: str) -> tuple[str, ...]:
    """The readouts of a (family, method): the classifier readouts ("capsule" only where the registered method says its
    inputs carry a capsule slot, what that readout reads), else "lm_head"."""
    if not spec.classifier_head:
        return (LM_HEAD,)
    slot = isinstance(method, str) and method in METHODS and METHODS[method].has_capsule_slot
    return tuple(r for r in READOUTS if r != "capsule" or slot)


def readout_problems(raw: dict[str, Any], spec: ArchSpec) -> list[str]:
    """`model.readout` against the model's family and the method (the schema checks the spelling)."""
    readout, method = raw_value(raw, "model.readout"), raw_value(raw, "method.name")
    if readout is None or readout not in (*READOUTS, LM_HEAD):
        return []
    allowed = allowed_readouts(spec, method)
    if readout in allowed:
        return []
    if not spec.classifier_head:
        why = (f"{spec.family!r} models read the label word from their language-model head, so the readout options are "
               "for encoder-only (BERT-family) classifiers")
    elif readout == LM_HEAD:
        why = "encoder-only models classify with a linear head, not a language-model head"
    else:
        with_slot = [name for name, entry in METHODS.items() if entry.has_capsule_slot]
        why = (f"method {method!r} has no capsule slot (only {', '.join(with_slot)} "
               f"{'has' if len(with_slot) == 1 else 'have'} one)")
    return [f"model.readout={readout!r} with model.name={raw_value(raw, 'model.name')!r} and "
            f"method.name={method!r}: {why} (allowed: {', '.join(allowed)}, or leave it unset for "
            f"{default_readout(spec)!r})"]


def load_job_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                    base: dict[str, Any] | None = None,
                    more_checks: Callable[[dict[str, Any]], list[str]] | None = None) -> ResolvedJobConfig:
    """YAML file (optional) + `base` dict + `key.sub=value` overrides -> a validated, resolved job config.
    `more_checks` adds the caller's own problems of the merged dict (e.g. an output folder that cannot be written)
    to the same report."""
    raw = merge_sources(path, overrides, base)
    return validate_job_config(raw, more_checks(raw) if more_checks else [])


def validate_job_config(raw: dict[str, Any], more_problems: Sequence[str] = ()) -> ResolvedJobConfig:
    """Check types, ranges, unknown keys and the cross-field rules, then resolve the defaults; raise once with
    every problem (`PipelineConfigError`), `more_problems` (the caller's) among them."""
    if hint := other_kind_hint(raw, "job"):  # its keys would all be unknown: name the command instead
        raise PipelineConfigError(f"Invalid job config: {hint}.")
    problems: list[str] = list(more_problems)
    try:
        config = TypeAdapter(JobConfig).validate_python(raw)
    except ValidationError as err:
        problems += pydantic_problems(err)
    problems += cross_field_problems(raw)
    if not problems:
        try:
            return _resolve(config, raw)
        except ValueError as err:
            problems.append(str(err))
    count = len(problems)
    raise PipelineConfigError(f"Invalid job config ({count} problem{'s' if count > 1 else ''}): "
                              + "; ".join(problems) + ".")


def _resolve(config: JobConfig, raw: dict[str, Any]) -> ResolvedJobConfig:
    """`config` (validated from `raw`) as the one resolved type: `method.options` holding every option of the method,
    its defaults written out (so that a change of a method's default changes the config hash, output folder and
    logged params of exactly the jobs that ran with it), its authors' training values where `raw` sets none, and the
    optimiser and readout defaults filled in."""
    options = get_method(config.method.name).build_config(config.method.options).to_dict()
    plain = json.loads(json.dumps(options))  # tuples as lists, as YAML and result.json hold them
    resolved = resolve_optim(resolve_training(_replaced(config, "method", options=plain), raw))
    if resolved.model.readout is None:
        resolved = _replaced(resolved, "model", readout=default_readout(model_shape(resolved.model.name).spec))
    return ResolvedJobConfig(**{f.name: getattr(resolved, f.name) for f in dataclasses.fields(resolved)})


def pydantic_problems(err: ValidationError, root: type = JobConfig) -> list[str]:
    """One line per problem of `err` (raised validating `root`); an unknown key names the allowed keys of its
    section, since a typo is the usual cause and the list shows the spelling."""
    problems = []
    for item in err.errors(include_url=False):
        key = ".".join(str(part) for part in item["loc"])
        if item["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            allowed = ", ".join(section_keys(root, item["loc"][:-1]))
            problems.append(f"{key}: unknown key (value {item['input']!r}; allowed keys: {allowed})")
        else:
            problems.append(f"{key}={item['input']!r}: {item['msg'].removeprefix('Value error, ')}")
    return problems


def section_keys(root: type, path: tuple) -> list[str]:
    """Field names of the config section at `path` (e.g. ("train",), or ("methods", 0) for a list's item) of the
    dataclass `root`, read off the schema's type hints; none where `path` leads to no dataclass."""
    section: Any = root
    for part in (part for part in path if not isinstance(part, int)):  # a list's item: the list's own dataclass
        hint = typing.get_type_hints(section).get(part) if dataclasses.is_dataclass(section) else None
        # the dataclass itself, or the one in `PackSection | None` or `list[MethodEntry]`
        section = next((h for h in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(h)), None)
    return [f.name for f in dataclasses.fields(section)] if dataclasses.is_dataclass(section) else []


# Pre-flight checks of a job across its keys and against its base model's config (read without loading weights):
# method options, capsule layers the model lacks, sequences longer than its positions, methods, readouts and input
# formats the model does not support.

def model_fit_problems(raw: dict[str, Any], method_ok: bool) -> list[str]:
    """What the model's own config refuses: capsule layers it lacks, sequences longer than its positions, a method,
    readout or input format its family does not support."""
    name, method_name = raw_value(raw, "model.name"), raw_value(raw, "method.name")
    try:
        shape = model_shape(name)
    except ValueError as err:
        return [str(err)]
    problems = []
    if method_ok:
        problems += _method_fit_problems(name, shape, method_name, raw_value(raw, "method.options"))
    problems += _length_problems(raw, shape, method_ok)
    return problems + readout_problems(raw, shape.spec) + _input_format_problems(raw, shape.family)


def _method_fit_problems(name: str, shape: ModelShape, method_name: str, options: dict[str, Any]) -> list[str]:
    """Layers the method's options name that the model lacks, and a model type the method refuses."""
    entry = get_method(method_name)
    problems = []
    if bad := entry.missing_layers(options, shape.capsule_layers):
        layers, stack = options.get("layers"), shape.spec.capsule_stack_name
        problems.append(f"method.options.layers={list(layers)}: model.name={name!r} has {shape.capsule_layers} "
                        f"{stack}, so {bad} do not exist (allowed: indices 0..{shape.capsule_layers - 1}, or all, "
                        "first_half, odd)")
    if reason := entry.unsupported_reason(shape.model_type):
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
        try:  # e.g. a prompt-tuning option given to LoRA
            get_method(name).build_config(options)
        except (ValueError, TypeError) as err:
            problems.append(f"method.options for method {name!r}: {err}")
    if isinstance(model, str):
        problems += model_name_problems(model) or model_fit_problems(raw, options_ok and not problems)
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
    if not env or (source == "local" and (not data_dir or
                                          Path(data_dir).expanduser().resolve() == Path(env).expanduser().resolve())):
        return None
    reads = f"task.data_dir={data_dir}" if source == "local" else f"{source} data (task.source={source})"
    return f"{DATA_DIR_ENV}={env} is ignored: {reader} {reads}; to train on the files in {env}, {fix}."


def _input_format_problems(raw: dict[str, Any], family: str) -> list[str]:
    from capt.tasks.input_formats import INPUT_FORMATS, input_format_problems

    input_format, name, task = (raw_value(raw, k) for k in ("task.input_format", "model.name", "task.name"))
    if input_format not in INPUT_FORMATS or not isinstance(task, str):
        return []  # the schema reports it
    return [f"task.{problem} (model.name={name!r})"
            for problem in input_format_problems(input_format, family, task)]


# Which command a config file is for: a job's sections (model, task, method, ...) or a sweep's grid (tasks,
# models, methods, seeds, job). A file given to the other command gets one sentence naming the right one, before
# its keys are listed as unknown.

KIND_KEYS = {"job": ("model", "task", "method", "optim", "train"),
             "sweep": ("tasks", "models", "methods", "seeds", "job")}
"""The keys only a config of each kind has at its top level."""
RUN = {"job": "python -m pipelines.train --config FILE",
       "sweep": "python pipelines/sweep.py --config FILE (a sweep runs one job per grid point; its `job:` section "
                "holds what every job shares)"}


def other_kind_hint(raw: Any, expected: Literal["job", "sweep"]) -> str | None:
    """A sentence when `raw` (a config's top-level mapping, given where a `expected` config goes) has the keys of the
    other kind and none of its own; None otherwise."""
    if not isinstance(raw, dict):
        return None
    kind = "sweep" if expected == "job" else "job"
    found = [key for key in KIND_KEYS[kind] if key in raw]
    if len(found) < 2 or any(key in raw for key in KIND_KEYS[expected]):
        return None
    return f"this is a {kind} config, not a {expected} config (it has {', '.join(found)}): run it with {RUN[kind]}"
