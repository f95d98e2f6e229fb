"""A job says at start how many steps it trains and which limit sets them; a given max_steps that max_epochs cuts
short is a warning, not silence."""

from __future__ import annotations

from pipelines.config.load import load_job_config
from pipelines.training.setup import step_budget


def _config(*overrides: str):
    return load_job_config(None, ["model.name=tiny-t5", "task.source=generated", *overrides])


def test_max_epochs_reached_before_a_given_max_steps_is_said_and_flagged():
    total, sentence, cut = step_budget(_config("train.max_epochs=2", "train.max_steps=50"), batches_per_epoch=7)
    assert (total, cut) == (14, True)
    assert sentence == ("training 14 steps, not max_steps=50: max_epochs=2 (7 steps per epoch) is reached first; "
                        "raise train.max_epochs to train longer")


def test_max_steps_first_and_no_max_steps_say_which_limit_applies():
    assert step_budget(_config("train.max_epochs=2", "train.max_steps=10"), 7) == (
        10, "training 10 steps: max_steps=10, before max_epochs=2 (7 steps per epoch) is reached", False)
    assert step_budget(_config("train.max_epochs=3", "train.grad_accum_steps=2"), 7) == (
        12, "training 12 steps: max_epochs=3 (4 steps per epoch)", False)
