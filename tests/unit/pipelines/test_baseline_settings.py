"""The README's baseline-settings table is what jobs resolve: regenerated from resolved plain and preset jobs and
compared; every method states its optimiser, schedule, clipping, batch, epoch, init and dropout settings; a job
gets its method's authors' training values only where its config is silent."""

from __future__ import annotations

import dataclasses

import pytest

from capt.methods import METHODS
from pipelines.baseline_settings import BEGIN, CHECKED_KEYS, END, README, main, method_rows, table
from pipelines.config import load_job_config, validate_job_config

STATED_OPTIONS = ("init", "dropout", "base_dropout")
"""Method options every method's rows must state where the method has them."""


@pytest.mark.slow
def test_the_readme_table_is_the_one_resolved_jobs_give():
    block = README.read_text().split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == table(), "README.md's table is stale: run python -m pipelines.baseline_settings --write"


def test_every_method_states_its_optimiser_schedule_clipping_batch_epochs_init_and_dropout():
    for name, method in METHODS.items():
        stated = {key for row in method_rows(name) for key in row.keys}
        options = {f.name for f in dataclasses.fields(method.config_class)}
        wanted = {*CHECKED_KEYS, *(f"method.options.{o}" for o in STATED_OPTIONS if o in options)}
        assert wanted <= stated, (name, sorted(wanted - stated))
        assert all(row.source.strip() for row in method_rows(name)), name


def _job(method: str, *overrides: str):
    return load_job_config(None, ["model.name=tiny-t5", "task.source=generated", f"method.name={method}", *overrides])


def test_a_job_gets_its_authors_training_values_where_its_config_is_silent():
    residual = _job("residual_prompt")
    assert (residual.optim.weight_decay, residual.optim.schedule, residual.optim.warmup_ratio,
            residual.optim.max_grad_norm, residual.train.batch_size, residual.train.max_epochs) == (
        1e-5, "constant", 0.0, None, 8, 20)
    given = _job("residual_prompt", "optim.weight_decay=0.0", "train.batch_size=32", "optim.max_grad_norm=2.0")
    assert (given.optim.weight_decay, given.train.batch_size, given.optim.max_grad_norm) == (0.0, 32, 2.0)
    assert given.optim.schedule == "constant", "the keys the config leaves unset still get the authors' values"
    assert _job("dept").method.options["init"] == "text"
    assert _job("dept", "method.options.init=normal").method.options["init"] == "normal"
    capt = _job("capt")
    assert (capt.optim.weight_decay, capt.optim.schedule, capt.optim.max_grad_norm, capt.train.batch_size) == (
        0.0, "linear", 1.0, 32), "a method that declares nothing keeps the pipeline's defaults"


def test_resolving_a_resolved_job_again_changes_nothing():
    for method in ("residual_prompt", "smop", "dept", "xprompt", "prompt_tuning"):
        resolved = _job(method, "optim.max_grad_norm=3.0")
        assert validate_job_config(resolved.to_dict()) == resolved, method


def test_a_training_default_without_a_source_is_refused_at_registration():
    from capt.baselines.config import LoraConfig
    from capt.methods import Method

    @dataclasses.dataclass(frozen=True)
    class Unsourced(LoraConfig):
        training_defaults = {"optim.weight_decay": 0.1}

    with pytest.raises(ValueError, match="optim.weight_decay without a provenance row"):
        Method(Unsourced, "capt.baselines.lora:LoraModel")


def test_vfpt_keeps_the_frozen_base_in_eval_mode_unless_asked():
    from tiny_models import tiny_model

    from capt.baselines.vfpt.config import VfptConfig
    from capt.methods import apply_method

    tiny_t5_model = tiny_model("t5")
    adapted = apply_method(tiny_t5_model, VfptConfig(num_tokens=4))
    adapted.train()
    assert not any(m.training for m in tiny_t5_model.modules()), "the authors train the backbone in eval mode"
    adapted.detach()
    adapted = apply_method(tiny_t5_model, VfptConfig(num_tokens=4, base_dropout=True))
    adapted.train()
    assert tiny_t5_model.training


def test_the_command_prints_the_table(capsys):
    assert main([]) == 0
    assert capsys.readouterr().out.strip() == table()
