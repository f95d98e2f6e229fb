"""Packed training (#34): K CaPT jobs in one loop on one frozen base model.

Exactness: with dropout off, each member of a pack (mixed tasks, seeds, learning rates, step budgets) ends with the
capsule (and head), per-step losses and validation scores of the same member trained alone by the same code (K=1),
within relative 1e-5 in fp32; and a pack of one equals the single job `pipelines.training.loop.run` on the same config
(the capsule after its last step, the validation history). Real tiny models and MiniLM, real task files when
CAPT_DATA_DIR is set (generated data otherwise).
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from safetensors.torch import load_file

from pipelines.config.load import load_job_config
from pipelines.training.pack_setup import PackError, PackOptions, build_pack
from pipelines.training.packed import train_pack

RTOL = 1e-5
MODELS = ("tiny-t5", "tiny-llama", "minilm")
NO_DROPOUT = PackOptions(dropout=False)


def job(model: str, task: str, seed: int, folder, *overrides: str):
    """A small resolved job: 24 train examples, batches of 8, 5 steps, validation at each epoch end."""
    source = "local" if os.environ.get("CAPT_DATA_DIR") else "generated"
    return load_job_config(None, [
        f"model.name={model}", f"task.name={task}", f"task.source={source}", "task.generated_size=24",
        "task.max_train_examples=24", "task.max_eval_examples=8", "train.batch_size=8", "train.eval_batch_size=8",
        "train.max_steps=5", "train.eval_mode=rank", "train.patience=null", "model.max_length=96", "train.cpu=true",
        f"seed={seed}", f"output_dir={folder}/{task}-s{seed}", *overrides])


def members(model: str, folder) -> list:
    """Three members of a mixed-task pack: other task, other seeds, other learning rates; the third validates every
    step and, at a learning rate too small to change its score, runs out of patience at its second validation."""
    return [job(model, "rte", 0, folder),
            job(model, "cb", 1, folder, "optim.lr=0.05"),
            job(model, "rte", 2, folder, "optim.lr=1e-6", "optim.head_lr=1e-6", "train.max_steps=4",
                "train.eval_every_steps=1", "train.patience=1")]


def assert_same_run(packed: dict, alone: dict) -> None:
    """Per-step losses, validation records and the final trainable tensors agree within `RTOL`."""
    assert packed["steps"] == alone["steps"] and len(packed["losses"]) == len(alone["losses"])
    torch.testing.assert_close(torch.tensor(packed["losses"]), torch.tensor(alone["losses"]), rtol=RTOL, atol=0)
    for mine, theirs in zip(packed["history"], alone["history"], strict=True):
        assert mine == pytest.approx(theirs, rel=RTOL)
    for name, tensor in alone["final_state"].items():
        scale = tensor.abs().max().item()
        torch.testing.assert_close(packed["final_state"][name], tensor, rtol=RTOL, atol=RTOL * scale)


@pytest.fixture(scope="module", params=MODELS)
def pack_and_alone(request, tmp_path_factory):
    """(model, the pack's results, each member's results alone), dropout off."""
    folder = tmp_path_factory.mktemp("pack")
    configs = members(request.param, folder)
    return (request.param, train_pack(configs, NO_DROPOUT),
            [train_pack([config], NO_DROPOUT)[0] for config in configs])


@pytest.mark.slow
def test_each_member_trains_as_it_would_alone(pack_and_alone):
    _, packed, alone = pack_and_alone
    assert [r["task"] for r in packed] == ["rte", "cb", "rte"]
    for mine, theirs in zip(packed, alone, strict=True):
        assert_same_run(mine, theirs)
        assert mine["metrics"] == pytest.approx(theirs["metrics"], rel=RTOL)


@pytest.mark.slow
def test_members_leave_the_pack_at_their_own_step(pack_and_alone):
    _, packed, _ = pack_and_alone
    assert [r["total_steps"] for r in packed] == [5, 5, 4]
    assert [r["stopped_early"] for r in packed] == [False, False, True]
    assert packed[2]["steps"] == 2 and packed[0]["steps"] == packed[1]["steps"] == 5
    assert all(len(r["losses"]) == r["steps"] for r in packed)
    assert all(r["best_state"] and r["history"][-1]["step"] == r["steps"] for r in packed)


@pytest.mark.slow
def test_members_learn_their_own_capsule(pack_and_alone):
    _, packed, _ = pack_and_alone
    vectors = [r["final_state"]["capsule.vectors"] for r in packed]
    assert all(v.abs().max() > 0 for v in vectors)
    assert not torch.equal(vectors[0], vectors[1]) and not torch.equal(vectors[0], vectors[2])


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_a_pack_of_one_is_the_single_job(model, tmp_path):
    """`pipelines.training.loop.run` on the same config: same optimiser, schedule, batch order and validation points,
    so the capsule after the last step (its latest checkpoint) and the history agree. Dropout stays on, as in the job:
    MiniLM's masks come from the same seeded stream in the same order, so they agree too."""
    from pipelines.training.loop import run

    config = job(model, "cb", 3, tmp_path, "optim.lr=0.05", "train.max_steps=4", "train.eval_every_steps=2")
    single = run(config)
    saved = load_file(str(tmp_path / "cb-s3" / "checkpoints" / "latest" / "trainable_0.safetensors"))
    packed = train_pack([config])[0]
    torch.testing.assert_close(packed["final_state"]["capsule.vectors"], saved["capsules.0.vectors"],
                               rtol=RTOL, atol=RTOL * saved["capsules.0.vectors"].abs().max().item())
    for mine, theirs in zip(packed["history"], single["history"], strict=True):
        assert mine == pytest.approx(theirs, rel=RTOL)
    assert packed["metrics"]["test_score"] == pytest.approx(single["metrics"]["test_score"], rel=RTOL)


@pytest.mark.slow
def test_dropout_masks_are_drawn_per_row(tmp_path):
    """Two members with the same config and seed see the same rows; with dropout on their first losses differ (each
    row draws its own masks from the pack's stream), with dropout off they are equal."""
    config = job("minilm", "rte", 0, tmp_path, "train.max_steps=1")
    twins = train_pack([config, config], PackOptions(write_artifacts=False))  # one output_dir: nothing written
    assert twins[0]["losses"] != twins[1]["losses"]
    still = train_pack([config, config], PackOptions(dropout=False, write_artifacts=False))
    assert still[0]["losses"] == pytest.approx(still[1]["losses"], rel=RTOL)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-t5", "minilm"])
def test_each_member_writes_an_artifact_a_job_loads(model, tmp_path):
    """Each member's best capsule (and head) in its own output_dir, loaded as any job's artifact, answers as the
    member does in the pack (MiniLM: a 2-label and a 3-label head on one base loaded with 2 labels)."""
    from pipelines.adapted import load_artifact, model_inputs
    from pipelines.models.loading import load_model
    from pipelines.training.packed import fit_pack
    from pipelines.training.setup import num_labels

    pack = build_pack([job(model, "rte", 0, tmp_path, "train.max_steps=2", "optim.lr=0.1"),
                       job(model, "cb", 1, tmp_path, "train.max_steps=2", "optim.lr=0.1")], NO_DROPOUT)
    results = fit_pack(pack)
    for member, result in zip(pack.members, results, strict=True):
        assert result["artifact_dir"] == str(tmp_path / f"{member.config.task.name}-s{member.config.seed}" / "artifact")
        adapted = load_artifact(load_model(model, num_labels(member.config)).model, result["artifact_dir"])
        batch = member.collator(list(member.splits.test)[:4])
        inputs = {**model_inputs(batch), **({} if pack.spec.classifier_head else {"labels": batch["labels"]})}
        with torch.no_grad():
            expected = pack.model.member(member.index)(**inputs).logits
            loaded = adapted.eval()(**inputs).logits
        torch.testing.assert_close(loaded, expected, rtol=RTOL, atol=RTOL * expected.abs().max().item())


def small(*overrides: str):
    return load_job_config(None, ["task.source=generated", "train.cpu=true", *overrides])


@pytest.mark.parametrize(("other", "reason"), [
    (["model.name=tiny-llama"], "member 1: model.name='tiny-llama' differs from member 0's 'tiny-t5'"),
    (["model.dtype=bfloat16"], "member 1: model.dtype='bfloat16' differs"),
    (["train.precision=bf16"], "member 1: train.precision='bf16' differs"),
    (["method.name=lora"], "member 1: method 'lora' does not pack: only CaPT and its ablations"),
    (["method.name=prompt_tuning", "method.options.instance_token=true"],
     "member 1: method 'prompt_tuning' does not pack"),
    (["method.options.length=2"], "members' capsules occupy different numbers of slots [1, 2]"),
    (["train.grad_accum_steps=2"], "member 1: train.grad_accum_steps=2"),
    (["train.resume=true"], "member 1: train.resume=true is not supported in a pack"),
])
def test_members_that_cannot_share_a_base_are_refused(other, reason):
    with pytest.raises(PackError, match=re.escape(reason)):
        build_pack([small(), small(*other)])


def test_ablations_of_capt_pack_together():
    from pipelines.training.setup import pack_problems

    ablations = [["method.options.layers=odd"], ["method.options.fusion=project"], ["method.options.init=normal"],
                 ["method.options.instance_mean=false"], ["method.options.fusion=conv"], ["seed=4", "optim.lr=0.01"],
                 ["task.name=cb"]]
    assert pack_problems([small(), *[small(*a) for a in ablations]]) == []


def test_members_writing_to_one_folder_are_refused(tmp_path):
    config = small(f"output_dir={tmp_path / 'one'}")
    with pytest.raises(PackError, match="member 1 writes to output_dir=.*as member 0 does"):
        train_pack([config, small("seed=1", f"output_dir={tmp_path / 'one'}")])
    assert not (tmp_path / "one").exists()


def test_an_empty_pack_is_refused():
    with pytest.raises(PackError, match="at least one member"):
        build_pack([])
