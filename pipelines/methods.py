"""CaPT and the paper's baselines through the one method registry (`capt.methods`): build, adapt, optimise,
save and load."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import nn

import capt
from capt import digest
from capt.arch import head_parameters, spec_for
from capt.arch.readout import ReadoutError, install_readout, installed_readout
from capt.artifact import read_safetensors
from capt.heads import TaskHead, head_from_weights
from capt.methods import MethodModel, apply_method, get_method
from pipelines.config.schema import LM_HEAD

HEAD_WEIGHTS = "head.safetensors"
METHOD_FILE = "method.json"


def build_method_config(name: str, options: dict[str, Any]):
    """The typed config of method `name` from its options (raises with every bad option named)."""
    return get_method(name).build_config(options)


def adapt(model: nn.Module, method: str, options: dict[str, Any], tokenizer: Any = None) -> MethodModel:
    """Wrap the frozen `model` with `method`; encoder classifier heads are trainable for every method. A text
    initialisation (DePT's ``init: text``) takes its token ids from the job's `tokenizer`, the one its inputs use
    (a model alone names no tokenizer to load: the tiny and converted ones)."""
    if options.get("init") == "text" and not options.get("init_text_ids") and tokenizer is not None:
        options = {**options, "init_text_ids": list(tokenizer(options["init_text"])["input_ids"])}
    adapted = apply_method(model, build_method_config(method, options))
    for param in head_parameters(model):
        param.requires_grad_(True)
    return adapted


def parameter_groups(adapted: nn.Module, model: nn.Module, lr: float, head_lr: float,
                     weight_decay: float) -> list[dict[str, Any]]:
    """Optimiser groups: the method's groups (`MethodModel.parameter_groups`: each at its own lr, or at `lr`
    when it names none), and a classifier head (if any) at `head_lr`."""
    head = head_parameters(model)
    head_ids = {id(p) for p in head}
    groups = [{"params": [p for p in params if id(p) not in head_ids],
               "lr": lr if group_lr is None else group_lr, "weight_decay": weight_decay}
              for params, group_lr in adapted.parameter_groups()]
    if head:
        groups.append({"params": head, "lr": head_lr, "weight_decay": weight_decay})
    return [g for g in groups if g["params"]]


def save_artifact(adapted: MethodModel, model: nn.Module, method: str, directory: str | os.PathLike,
                  task: str, metrics: dict[str, float], readout: str | None = None) -> Path:
    """Write the method's artifact (a capsule or an adapter), plus a trained head and its readout, to `directory`."""
    directory = Path(directory)
    adapted.save(directory, task=task, metrics=metrics, overwrite=True)
    head = _named_head(model)
    if head:
        save_file({n: p.detach().cpu().contiguous() for n, p in head.items()}, str(directory / HEAD_WEIGHTS))
    readout = readout or (installed_readout(model) if head else LM_HEAD)
    info = {"method": method, "task": task, "metrics": metrics, "readout": readout}
    (directory / METHOD_FILE).write_text(json.dumps(info, indent=2))
    digest.seal(directory)  # the method's own manifest, re-written to cover the head and method.json too
    return directory


def load_artifact(model: nn.Module, directory: str | os.PathLike, readout: str | None = None,
                  label: str | None = None, expected_digest: str | None = None,
                  expected_from: str = "result.json") -> MethodModel:
    """Rebuild the adapted model saved by `save_artifact` on a fresh copy of its base model, its head reading
    what it was trained to read; `readout`, when given, must be that readout (a mismatch is refused).

    Every file is first verified against the artifact's digest manifest and, when given, `expected_digest`
    (recorded in `expected_from`); `label` names the artifact in a refusal (`capt.digest.verify`).
    """
    directory = Path(directory)
    digest.verify(directory, label, expected_digest, expected_from=expected_from)
    info = json.loads((directory / METHOD_FILE).read_text())
    trained = artifact_readout(info, model)
    if readout is not None and readout != trained:
        raise capt.CapsuleArtifactError(
            f"{directory / METHOD_FILE} was trained with readout={trained!r}, but readout={readout!r} was asked for: "
            f"its head weights only fit what they were trained to read. Load it with readout={trained!r} (or none).")
    if (directory / HEAD_WEIGHTS).is_file():
        head = _named_head(model)
        weights = read_safetensors(directory / HEAD_WEIGHTS)
        if set(weights) != set(head):
            raise capt.CapsuleArtifactError(f"{directory / HEAD_WEIGHTS} holds {sorted(weights)}, the model's "
                                            f"head is {sorted(head)}.")
        for name, param in head.items():
            param.data.copy_(weights[name])
    adapted = get_method(info["method"]).model_class.load(model, directory)
    install_job_readout(adapted, model, trained)
    return adapted


def load_task_head(model: nn.Module, directory: str | os.PathLike) -> TaskHead:
    """The trained head of the encoder-classifier artifact in `directory` and the readout it was trained to read,
    for a bank that applies many tasks' heads in one batch (`capt.CapsuleBank(heads=...)`); `model` is the base."""
    directory = Path(directory)
    info = json.loads((directory / METHOD_FILE).read_text())
    if not (directory / HEAD_WEIGHTS).is_file():
        raise capt.CapsuleArtifactError(f"{directory} holds no {HEAD_WEIGHTS}: an encoder classifier's capsule "
                                        "needs the head it was trained with.")
    return head_from_weights(model, read_safetensors(directory / HEAD_WEIGHTS), artifact_readout(info, model))


def _named_head(model: nn.Module) -> dict[str, nn.Parameter]:
    head_ids = {id(p) for p in head_parameters(model)}
    return {name: p for name, p in model.named_parameters() if id(p) in head_ids}


def sequence_overhead(method: str, options: dict[str, Any]) -> int:
    """Positions the method adds to every input sequence (capsule slots, soft-prompt tokens)."""
    return get_method(method).sequence_overhead(options)


def registers_model(method: str) -> bool:
    """Whether sweeps publish `method`'s artifacts as registry versions (`capt-<model>-<task>`)."""
    return get_method(method).model_class.registers_model


def model_inputs(batch: dict, keys=("input_ids", "attention_mask", "token_type_ids", "prompt_mask")) -> dict:
    """The batch entries every adapted model's `forward` takes (each method accepts `prompt_mask`)."""
    return {k: batch[k] for k in keys if k in batch}


def artifact_readout(info: dict[str, Any], model: nn.Module) -> str:
    """The readout recorded in an artifact's method.json; artifacts from before readouts were recorded read the
    pooler (encoder classifiers) or the language-model head."""
    return info.get("readout") or ("pooler" if head_parameters(model) else LM_HEAD)


def adapted_span(adapted: MethodModel, model: nn.Module) -> tuple[int, int]:
    """[start, stop) of the positions the method of `adapted` inserts into the input of the encoder `model`
    (capsule slots, soft-prompt tokens; empty for methods that insert none)."""
    start = spec_for(model).slot_offset
    return start, start + adapted.added_positions


def install_job_readout(adapted: nn.Module, model: nn.Module, readout: str) -> None:
    """Make the head of the encoder classifier `model` (adapted as `adapted`) read `readout`; nothing for
    models without a classifier head, whose readout is "lm_head"."""
    if not head_parameters(model):
        if readout != LM_HEAD:
            raise ReadoutError(f"readout={readout!r}: {type(model).__name__} has no classifier head "
                               f"(allowed: {LM_HEAD}).")
        return
    install_readout(model, readout, adapted_span(adapted, model))
