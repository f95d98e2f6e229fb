"""Packed evaluation: the members of a pack that score at the same point (a validation, the untrained or the final
test) share their batches, as their training steps do.

Scoring one member at a time runs one small forward per member per batch of examples; on an accelerator those
forwards are bound by launching work, not by computing it, so a pack of K members would validate at K times the
cost of one. Here batch n of every member's examples is merged into one batch (`capt.packing.merge_batches`), each
row routed to its member's capsule (and head), and each member's predictions are read from its own rows.

A member's predictions are the ones it gets alone within float noise (its rows are the same, only the batch's
padding and size differ). Members scoring alone: a pack of one (exactly the single job's evaluation) and members
that generate their answers (`train.eval_mode: generate`: decoding runs per member).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from capt.packing import member_rows, merge_batches
from capt.tasks import Example, rank_classify
from pipelines.adapted import evaluate, metrics_of, model_inputs, sequence_log_likelihood
from pipelines.training.pack_setup import Member, Pack


def evaluate_members(pack: Pack, requests: Mapping[int, Sequence[Example]]) -> dict[int, dict[str, float]]:
    """Task metrics of each member i over its examples `requests[i]`, members sharing batches where they can."""
    together = {i: examples for i, examples in requests.items() if _shares_batches(pack, pack.members[i])}
    if len(together) < 2:
        together = {}
    metrics = {i: evaluate_alone(pack, pack.members[i], examples)
               for i, examples in requests.items() if i not in together}
    if together:
        metrics.update(_evaluate_together(pack, together))
    return {i: metrics[i] for i in requests}


def evaluate_alone(pack: Pack, member: Member, examples: Sequence[Example]) -> dict[str, float]:
    """Member `member`'s metrics over `examples`, scored on its own as a single job scores them."""
    cfg = member.config
    return evaluate(pack.accelerator, pack.model.member(member.index), examples, member.collator, pack.spec,
                    cfg.train.eval_mode, cfg.train.eval_batch_size, cfg.model.max_new_tokens, pack.loaded.tokenizer)


def _shares_batches(pack: Pack, member: Member) -> bool:
    return pack.spec.classifier_head or member.config.train.eval_mode == "rank"


def _evaluate_together(pack: Pack, requests: Mapping[int, Sequence[Example]]) -> dict[int, dict[str, float]]:
    predictions = predict_together(pack, requests)
    return {i: metrics_of(examples, predictions[i]) for i, examples in requests.items()}


@torch.no_grad()
def predict_together(pack: Pack, requests: Mapping[int, Sequence[Example]]) -> dict[int, list[int]]:
    """Each member i's label predictions for `requests[i]`: batch n of each member (its own
    `train.eval_batch_size`) merged into one forward, for every n."""
    pack.model.eval()
    chunks = {i: _chunks(examples, pack.members[i].config.train.eval_batch_size) for i, examples in requests.items()}
    predictions: dict[int, list[int]] = {i: [] for i in requests}
    for n in range(max(len(member_chunks) for member_chunks in chunks.values())):
        present = [i for i in requests if n < len(chunks[i])]
        for i, found in _predict_merged(pack, {i: chunks[i][n] for i in present}).items():
            predictions[i] += found
    return predictions


def _chunks(examples: Sequence[Example], size: int) -> list[list[Example]]:
    return [list(examples[start:start + size]) for start in range(0, len(examples), size)]


def _predict_merged(pack: Pack, chunks: Mapping[int, list[Example]]) -> dict[int, list[int]]:
    """Each member's label predictions for its chunk of examples, from one merged forward."""
    scores = member_scores(pack, chunks)
    if pack.spec.classifier_head:
        return {i: member_logits.argmax(-1).tolist() for i, member_logits in scores.items()}
    return {i: rank_classify(scores[i].view(len(chunk), -1)) for i, chunk in chunks.items()}


def member_scores(pack: Pack, chunks: Mapping[int, list[Example]]) -> dict[int, torch.Tensor]:
    """From one merged forward over the members' chunks of examples, on the host: each member's head logits
    (N_i, C_i) (encoder classifiers), or its candidates' summed log-likelihoods (N_i * C_i,) for rank
    classification, each through its own capsule."""
    order = list(chunks)
    if pack.spec.classifier_head:
        batches = [pack.members[i].collator(chunks[i]) for i in order]
    else:
        batches = [pack.members[i].collator.candidate_batch(chunks[i]) for i in order]
    merged, positions = merge_batches(batches, pack.members[order[0]].collator.pad_id)
    device = pack.accelerator.device
    batch = {k: v.to(device) for k, v in merged.items()}
    rows = torch.tensor(order, dtype=torch.long)[positions]  # (B,) member of each row, on the host
    if pack.spec.classifier_head:
        logits = pack.model.member_logits(batch, rows)
        return {i: logits[i].float().cpu() for i in order}
    labels = batch["labels"]
    # An encoder-decoder's labels build its decoder inputs; a causal LM scores its own input sequence.
    extra = {"labels": labels} if pack.spec.encoder_decoder else {}
    logits = pack.model(**model_inputs(batch), **extra, capsule=rows).logits
    scores = sequence_log_likelihood(logits, labels, shift=pack.spec.shifts_labels).cpu()  # (B,) one transfer
    picks = member_rows(rows, len(pack.members), scores.device)
    return {i: scores[picks[i]] for i in order}
