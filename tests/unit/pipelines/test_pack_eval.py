"""Packed evaluation (`pipelines.training.packed`): members that score at the same point share merged batches, and
each member's metrics are the ones it gets scored on its own; members that generate their answers score alone."""

from __future__ import annotations

import os

import pytest
import torch

from pipelines.adapted import model_inputs, sequence_log_likelihood
from pipelines.config.load import load_job_config
from pipelines.training.pack_setup import PackOptions, build_pack
from pipelines.training.packed import evaluate_alone, evaluate_members, member_scores

RTOL = 1e-5


def job(model: str, task: str, seed: int, folder, *overrides: str):
    source = "local" if os.environ.get("CAPT_DATA_DIR") else "generated"
    return load_job_config(None, [
        f"model.name={model}", f"task.name={task}", f"task.source={source}", "task.generated_size=24",
        "task.max_train_examples=24", "task.max_eval_examples=12", "train.batch_size=8", "train.eval_batch_size=5",
        "train.eval_mode=rank", "model.max_length=96", "train.cpu=true",
        f"seed={seed}", f"output_dir={folder}/{task}-s{seed}", *overrides])


def _members_differ(pack) -> None:
    """Each member's capsule (and head) takes values of its own, so that routing a row to the wrong one shows."""
    torch.manual_seed(0)
    with torch.no_grad():
        for member in pack.members:
            for param in pack.model.member_parameters(member.index).values():
                param.normal_(0.0, 0.5)


def _scores_alone(pack, member, examples) -> torch.Tensor:
    """As `pipelines.adapted.predict` scores `examples` for the member alone, before it picks a label."""
    view, collator = pack.model.member(member.index), member.collator
    with torch.no_grad():
        if pack.spec.classifier_head:
            return view(**model_inputs(collator(examples))).logits
        batch = collator.candidate_batch(examples)
        logits = view(**model_inputs(batch), labels=batch["labels"]).logits  # the T5 family: labels build its inputs
        return sequence_log_likelihood(logits, batch["labels"], shift=False)


@pytest.mark.parametrize("model", ["tiny-t5", "minilm"])
def test_members_scored_together_score_as_each_alone(model, tmp_path):
    """Three members of two tasks and two eval batch sizes; members 0 and 2 asked about the same examples. Each
    member's scores (head logits, or candidates' log-likelihoods) are the ones it gets alone, and 0's differ from
    2's, so a row sent through the wrong capsule would show; the predictions and metrics follow."""
    pack = build_pack([job(model, "rte", 0, tmp_path), job(model, "cb", 1, tmp_path, "train.eval_batch_size=3"),
                       job(model, "rte", 2, tmp_path)], PackOptions(dropout=False, write_artifacts=False))
    _members_differ(pack)
    examples = {0: pack.members[0].splits.validation[:5], 1: pack.members[1].splits.validation[:3],
                2: pack.members[0].splits.validation[:5]}
    together = member_scores(pack, examples)
    for member in pack.members:
        alone = _scores_alone(pack, member, examples[member.index])
        torch.testing.assert_close(together[member.index], alone, rtol=RTOL, atol=RTOL * alone.abs().max().item())
    assert not torch.allclose(together[0], together[2], rtol=1e-3), "members 0 and 2 must score differently"
    requests = {0: pack.members[0].splits.validation, 1: pack.members[1].splits.validation}
    metrics = evaluate_members(pack, requests)
    for index, split in requests.items():
        assert metrics[index] == pytest.approx(evaluate_alone(pack, pack.members[index], split), rel=RTOL)
    pack.model.detach()


def test_a_member_that_generates_scores_alone_beside_members_scored_together(tmp_path):
    pack = build_pack([job("tiny-t5", "rte", 0, tmp_path), job("tiny-t5", "rte", 1, tmp_path),
                       job("tiny-t5", "cb", 2, tmp_path, "train.eval_mode=generate", "model.max_new_tokens=3")],
                      PackOptions(dropout=False, write_artifacts=False))
    _members_differ(pack)
    requests = {m.index: m.splits.test for m in pack.members[::-1]}
    together = evaluate_members(pack, requests)
    assert list(together) == [2, 1, 0], "answers in the order asked"
    for member in pack.members:
        assert together[member.index] == pytest.approx(evaluate_alone(pack, member, member.splits.test), rel=RTOL)
    pack.model.detach()
