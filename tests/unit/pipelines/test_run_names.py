"""Run names tell apart jobs that differ in a hyper-parameter: a single job's name carries its lr and every other
hyper-parameter it sets away from its method's own settings; a sweep's trials carry the values their grid varies,
and the demo's trials keep their plain names. Real configs, resolved as the job and sweep commands resolve them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.config.load import load_job_config
from pipelines.sweeps.config import load_sweep_config, trials
from pipelines.sweeps.trial_process import trial_tracking
from pipelines.tracking.jobs import MAX_SETTINGS_CHARS, job_run_name, single_job_run_name
from pipelines.training.outputs import config_hash

SMOKE = Path(__file__).resolve().parents[3] / "pipelines" / "configs" / "smoke.yaml"
JOB = ["model.name=tiny-t5", "task.name=cb", "seed=7", "task.source=generated"]


def _name(*overrides: str) -> str:
    return single_job_run_name(load_job_config(None, [*JOB, *overrides]))


@pytest.mark.parametrize(("override", "shown"), [
    ("optim.lr=0.05", "lr=0.05"),
    ("train.batch_size=8", "batch_size=8"),
    ("train.max_steps=200", "max_steps=200"),
    ("optim.weight_decay=0.01", "weight_decay=0.01"),
    ("method.options.length=4", "length=4"),
    ("train.patience=null", "patience=null"),
    ("train.grad_accum_steps=2", "grad_accum_steps=2"),
    ("model.dtype=bfloat16", "dtype=bfloat16"),
])
def test_a_single_job_that_sets_one_hyper_parameter_says_it_in_its_name(override: str, shown: str) -> None:
    lr = load_job_config(None, JOB).optim.lr
    name = _name(override)
    assert name.startswith("cb/tiny-t5/capt/s7 lr=") and name.endswith(f" {shown}"), name
    assert name != _name(), "told apart from the job with its method's own settings"
    assert _name() == f"cb/tiny-t5/capt/s7 lr={lr:g}", "the method's own settings: the lr alone"


def test_values_equal_to_the_methods_own_and_evaluation_settings_leave_the_name_as_it_is() -> None:
    config = load_job_config(None, JOB)
    same = [f"train.batch_size={config.train.batch_size}", f"optim.lr={config.optim.lr}",
            "train.eval_every_steps=2", "train.eval_mode=rank", "train.log_every_steps=1", "task.generated_size=24"]
    assert _name(*same) == _name()


def test_many_settings_end_the_name_with_how_many_more_and_the_config_hash() -> None:
    overrides = ["optim.weight_decay=0.1", "optim.warmup_ratio=0.2", "optim.max_grad_norm=2.0", "optim.head_lr=0.01",
                 "optim.schedule=constant", "train.batch_size=3", "train.max_epochs=3", "train.max_steps=9",
                 "train.grad_accum_steps=2", "train.patience=3", "model.max_length=64"]
    name = _name(*overrides)
    prefix, _, settings = name.partition(" ")
    assert prefix == "cb/tiny-t5/capt/s7" and len(settings) <= MAX_SETTINGS_CHARS + 20 and len(name) < 250
    digest = config_hash(load_job_config(None, [*JOB, *overrides]))[:8]
    assert settings.startswith("lr=") and settings.endswith(f" more #{digest}"), name
    assert name != _name(*overrides[:-1]), "the hash tells apart what the listed keys do not"


def test_a_sweeps_trials_carry_the_values_their_grid_varies_and_the_demos_names_stay_plain() -> None:
    def run_names(*overrides: str) -> list[str]:
        sweep = load_sweep_config(SMOKE, list(overrides))
        entries = {entry.key: entry for entry in sweep.methods}
        return [trial_tracking(sweep, t.job, {"task": t.task, "model": t.model, "seed": t.seed, "select": t.select},
                               entries[t.method], t.select, "trial", None)["run_name"] for t in trials(sweep)]

    demo = run_names()
    assert demo == [f"{task}/{model}/capt/s0" for task in ("cb", "rte") for model in ("tiny-t5", "minilm")]
    assert run_names("tasks=[rte]", "models=[tiny-t5]", "select={train.batch_size: [8, 16]}") == [
        "rte/tiny-t5/capt/s0/train.batch_size=8", "rte/tiny-t5/capt/s0/train.batch_size=16"]
    rows = "methods=[{name: capt}, {name: capt, label: capt-wd, overrides: {optim.weight_decay: 0.01}}]"
    assert run_names("tasks=[rte]", "models=[tiny-t5]", rows) == ["rte/tiny-t5/capt/s0", "rte/tiny-t5/capt-wd/s0"]


def test_the_identity_part_is_the_same_for_a_job_and_a_trial() -> None:
    config = load_job_config(None, [*JOB, "train.batch_size=8"])
    assert single_job_run_name(config).startswith(job_run_name(config) + " ")
