"""Evaluation: the paper protocol (generate, normalise, map to a label), rank classification, or a head.

Examples are split across processes and predictions gathered back in order, so every rank gets the
same metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from capt.arch import ArchSpec
from capt.tasks import Example, compute_metrics, rank_classify, texts_to_labels
from pipelines.methods import model_inputs


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
            predictions += _head_predictions(model, collator(chunk), device)
        elif mode == "rank":
            predictions += _rank_predictions(model, collator.candidate_batch(chunk), spec, device, len(chunk))
        else:
            predictions += _generated_predictions(model, collator.generation_batch(chunk), chunk, spec,
                                                  max_new_tokens, tokenizer, device)
    return predictions


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in model_inputs(batch).items()}


def _head_predictions(model, batch, device) -> list[int]:
    logits = model(**_to(batch, device)).logits
    return logits.argmax(-1).tolist()


def _rank_predictions(model, batch, spec: ArchSpec, device, count) -> list[int]:
    inputs = _to(batch, device)
    labels = batch["labels"].to(device)
    # An encoder-decoder's labels build its decoder inputs; a causal LM scores its own input sequence.
    logits = model(**inputs, labels=labels).logits if spec.encoder_decoder else model(**inputs).logits
    scores = sequence_log_likelihood(logits, labels, shift=spec.shifts_labels)  # (N*C,)
    return rank_classify(scores.view(count, -1))


def _generated_predictions(model, batch, examples, spec: ArchSpec, max_new_tokens, tokenizer, device) -> list[int]:
    inputs = _to(batch, device)
    generated = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                               pad_token_id=tokenizer.pad_token_id)
    if spec.generation_echoes_prompt:
        generated = generated[:, inputs["input_ids"].shape[1]:]  # keep the new tokens only
    texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
    return texts_to_labels(examples[0].task, texts, examples)


def evaluate(accelerator, model, examples: Sequence[Example], collator, spec: ArchSpec, mode: str,
             batch_size: int, max_new_tokens: int, tokenizer: Any) -> dict[str, float]:
    """Task metrics (percent, plus "score") over `examples`, computed with every process's share."""
    model.eval()
    with accelerator.split_between_processes(list(examples)) as shard:
        local = predict(accelerator.unwrap_model(model), shard, collator, spec, mode,
                        max(1, batch_size // accelerator.num_processes), max_new_tokens, tokenizer,
                        accelerator.device)
    return metrics_of(examples, _gather_in_order(accelerator, local))


def metrics_of(examples: Sequence[Example], predictions: Sequence[int]) -> dict[str, float]:
    """Task metrics (percent, plus "score") of `predictions`, one per example of `examples` (MultiRC's groups too)."""
    labels = [e.label for e in examples]
    groups = [e.group for e in examples] if any(e.group is not None for e in examples) else None
    return compute_metrics(examples[0].task, predictions, labels, groups)


def _gather_in_order(accelerator, local: list[int]) -> list[int]:
    if accelerator.num_processes == 1:
        return local
    from accelerate.utils import gather_object

    return list(gather_object(local))
