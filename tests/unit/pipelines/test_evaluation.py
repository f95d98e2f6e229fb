"""The paper protocol (generate -> normalise -> label) and rank classification agree on a model that
generates exactly the verbalizers; the training loss stops the job on NaN."""

from __future__ import annotations

import pytest
from helpers.jobs import tiny_job

from capt import tasks
from pipelines.adapted import predict
from pipelines.training.loop import TrainingDivergedError, fit, run
from pipelines.training.setup import build_job


@pytest.mark.parametrize("model", ["tiny-t5", "tiny-llama"])
@pytest.mark.slow
def test_generation_and_rank_classification_agree(tmp_path, model):
    # Full fine-tuning memorises the 14 training examples, so the model generates exact verbalizers.
    config = tiny_job(tmp_path, model, "full_finetune", optim={"lr": 3e-3},
                      train={"max_epochs": 60, "eval_every_steps": 60})
    job = build_job(config)
    fit(job)
    model_ = job.accelerator.unwrap_model(job.model)
    examples = job.splits.train
    generated = predict(model_, examples, job.collator, job.spec, "generate", 8, 10, job.tokenizer, "cpu")
    ranked = predict(model_, examples, job.collator, job.spec, "rank", 8, 10, job.tokenizer, "cpu")
    assert tasks.INVALID not in generated, "the premise: every generation is a verbalizer"
    assert generated == [e.label for e in examples], "the premise: the model memorised the training set"
    assert ranked == generated


def test_nan_loss_stops_the_job_and_keeps_the_checkpoint(tmp_path):
    config = tiny_job(tmp_path, "tiny-t5", "full_finetune", optim={"lr": 1e30, "max_grad_norm": None},
                      train={"eval_every_steps": 1})
    with pytest.raises(TrainingDivergedError, match=r"became (nan|inf).*last good checkpoint"):
        run(config)
    assert (tmp_path / "checkpoints" / "latest" / "loop_state.json").is_file()
    assert not (tmp_path / "result.json").exists()
