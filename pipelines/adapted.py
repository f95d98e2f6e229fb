"""A job's adapted model: CaPT and the paper's baselines through the one method registry (`capt.methods`), built
(adapt, optimiser groups), saved and loaded as an artifact, and scored.

Scoring follows the paper's protocol (generate, normalise, map to a label), rank classification, or a head.
Examples are split across processes and predictions gathered back in order, so every rank gets the same metrics.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

import capt
from capt import digest
from capt.arch import ArchSpec, head_parameters, spec_for
from capt.arch.readout import ReadoutError, install_readout, installed_readout
from capt.artifact import read_safetensors
from capt.heads import TaskHead, head_from_weights
from capt.methods import MethodModel, apply_method, get_method
from capt.tasks import Example, compute_metrics, rank_classify, texts_to_labels
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


def model_inputs(batch: dict, keys=("input_ids", "attention_mask", "token_type_ids", "prompt_mask")) -> dict:
    """The batch entries every adapted model's `forward` takes (each method accepts `prompt_mask`)."""
    return {k: batch[k] for k in keys if k in batch}


def artifact_readout(info: dict[str, Any], model: nn.Module) -> str:
    """The readout recorded in an artifact's method.json; artifacts from before readouts were recorded read the
    pooler (encoder classifiers) or the language-model head."""
    return info.get("readout") or ("pooler" if head_parameters(model) else LM_HEAD)


def install_job_readout(adapted: nn.Module, model: nn.Module, readout: str) -> None:
    """Make the head of the encoder classifier `model` (adapted as `adapted`) read `readout`; nothing for
    models without a classifier head, whose readout is "lm_head"."""
    if not head_parameters(model):
        if readout != LM_HEAD:
            raise ReadoutError(f"readout={readout!r}: {type(model).__name__} has no classifier head "
                               f"(allowed: {LM_HEAD}).")
        return
    start = spec_for(model).slot_offset  # the positions the method inserts (capsule slots, soft-prompt tokens)
    install_readout(model, readout, (start, start + adapted.added_positions))


# Scoring: the loss, the paper's protocol, rank classification, a head


def per_example_nll(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """Mean token negative log-likelihood per example: (B, T, V), (B, T) -> (B,).

    A per-example mean (not a per-token mean over the batch) makes the loss of a batch split across
    processes average to exactly the loss of the whole batch.
    """
    if shift:  # causal LM: position t predicts token t+1
        logits, labels = logits[:, :-1], labels[:, 1:]
    mask = labels != -100
    token_nll = nn.functional.cross_entropy(
        logits.float().transpose(1, 2), labels.clamp_min(0), reduction="none"
    )  # (B, T)
    return (token_nll * mask).sum(1) / mask.sum(1).clamp_min(1)


def sequence_log_likelihood(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """Summed log-likelihood of the labelled tokens per row: (B, T, V), (B, T) -> (B,)."""
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    mask = labels != -100
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return (logp * mask).sum(1)


@torch.no_grad()
def predict(model: nn.Module, examples: Sequence[Example], collator, spec: ArchSpec, mode: str,
            batch_size: int, max_new_tokens: int, tokenizer: Any, device: torch.device) -> list[int]:
    """Label predictions for `examples` on this process (no gathering)."""
    predictions: list[int] = []
    for start in range(0, len(examples), batch_size):
        chunk = list(examples[start:start + batch_size])
        if spec.classifier_head:
            predictions += model(**_to(collator(chunk), device)).logits.argmax(-1).tolist()
        elif mode == "rank":
            batch = collator.candidate_batch(chunk)
            inputs, labels = _to(batch, device), batch["labels"].to(device)
            # An encoder-decoder's labels build its decoder inputs; a causal LM scores its own input sequence.
            logits = model(**inputs, labels=labels).logits if spec.encoder_decoder else model(**inputs).logits
            scores = sequence_log_likelihood(logits, labels, shift=spec.shifts_labels)  # (N*C,)
            predictions += rank_classify(scores.view(len(chunk), -1))
        else:
            inputs = _to(collator.generation_batch(chunk), device)
            generated = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                       pad_token_id=tokenizer.pad_token_id)
            if spec.generation_echoes_prompt:
                generated = generated[:, inputs["input_ids"].shape[1]:]  # keep the new tokens only
            predictions += texts_to_labels(chunk[0].task, tokenizer.batch_decode(generated, skip_special_tokens=True),
                                           chunk)
    return predictions


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in model_inputs(batch).items()}


def evaluate(accelerator, model, examples: Sequence[Example], collator, spec: ArchSpec, mode: str,
             batch_size: int, max_new_tokens: int, tokenizer: Any) -> dict[str, float]:
    """Task metrics (percent, plus "score") over `examples`, computed with every process's share."""
    from accelerate.utils import gather_object

    model.eval()
    with accelerator.split_between_processes(list(examples)) as shard:
        local = predict(accelerator.unwrap_model(model), shard, collator, spec, mode,
                        max(1, batch_size // accelerator.num_processes), max_new_tokens, tokenizer,
                        accelerator.device)
    return metrics_of(examples, list(gather_object(local)))  # every process's share, in process order


def metrics_of(examples: Sequence[Example], predictions: Sequence[int]) -> dict[str, float]:
    """Task metrics (percent, plus "score") of `predictions`, one per example of `examples` (MultiRC's groups too)."""
    labels = [e.label for e in examples]
    groups = [e.group for e in examples] if any(e.group is not None for e in examples) else None
    return compute_metrics(examples[0].task, predictions, labels, groups)
