"""Optimiser defaults: one table by method and family, resolved before training, visible everywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.jobs import tiny_job

from capt.methods import OPTIM_DEFAULTS
from capt.optim_defaults import FAMILIES
from pipelines.config.load import load_job_config, resolve_optim
from pipelines.config.schema import METHOD_NAMES, JobConfig, flatten
from pipelines.config.sources import PipelineConfigError
from pipelines.training.loop import run
from pipelines.training.outputs import config_hash

ROOT = Path(__file__).resolve().parents[3]


def test_the_table_covers_every_method_on_every_family_and_names_its_source():
    assert set(OPTIM_DEFAULTS) == {(m, f) for m in METHOD_NAMES for f in FAMILIES}
    assert all(entry.optimizer in ("adafactor", "adamw") and entry.lr > 0 and len(entry.source) > 20
               for entry in OPTIM_DEFAULTS.values())


@pytest.mark.parametrize(("model", "optimizer", "lr"), [("tiny-t5", "adafactor", 0.3), ("tiny-bert", "adamw", 3e-2),
                                                         ("tiny-llama", "adamw", 1e-2), ("minilm", "adamw", 3e-2)])
def test_a_capsule_job_with_no_optimiser_given_gets_its_family_default(model, optimizer, lr):
    config = load_job_config(None, ["task.source=generated", f"model.name={model}"])
    assert (config.optim.name, config.optim.lr) == (optimizer, lr)


def test_the_measured_encoder_defaults_are_the_lrs_the_learning_benchmark_chose_on_cb():
    """Each "measured" entry holds the CB lr of benchmarks/results/learning_fair150/report.md, the shipped result."""
    report = (ROOT / "benchmarks/results/learning_fair150/report.md").read_text(encoding="utf-8")
    score_table = report[:report.index("# The same trials")]
    header = next(line for line in score_table.splitlines() if line.startswith("| method |"))
    cb = [cell.strip() for cell in header.split("|")].index("cb")
    chosen = {}
    for line in score_table.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > cb and (match := re.search(r"\[optim\.lr=([0-9.e-]+)\]", cells[cb])):
            chosen[cells[1]] = float(match.group(1))
    measured = {m: d.lr for (m, family), d in OPTIM_DEFAULTS.items() if family == "encoder"
                and d.source.startswith("measured")}
    assert {"capt", "prompt_tuning", "ptuning_v2", "lora", "full_finetune"} <= set(measured)
    assert measured == {m: chosen[m] for m in measured}


def test_minilm_shaped_cb_job_without_lr_logs_and_stores_a_concrete_optimiser(tmp_path):
    """tiny-bert has MiniLM's architecture (BERT, encoder-only): the job's params and result.json say what ran."""
    config = tiny_job(tmp_path / "job", "tiny-bert", "capt", task={"name": "cb"}, train={"max_steps": 4})
    params = flatten(config.to_dict())  # what the sweep's tracker logs as MLflow params
    assert params["optim.name"] == "adamw" and params["optim.lr"] == 3e-2 and params["optim.schedule"] == "linear"
    result = run(config)
    saved = json.loads((tmp_path / "job" / "result.json").read_text())
    assert saved["config"]["optim"]["name"] == "adamw" and saved["config"]["optim"]["lr"] == 3e-2
    assert saved["optimizer"] == result["optimizer"]
    assert {k: saved["optimizer"][k] for k in ("name", "lr", "schedule", "total_steps")} == {
        "name": "adamw", "lr": 3e-2, "schedule": "linear", "total_steps": 4}
    assert saved["optimizer"]["default"]["source"] == OPTIM_DEFAULTS[("capt", "encoder")].source


def test_an_unresolved_config_is_refused_by_run_and_by_the_hash(tmp_path):
    config = tiny_job(tmp_path / "job", train={"max_steps": 2})
    bare = JobConfig(model=config.model, task=config.task, method=config.method, train=config.train,
                     output_dir=config.output_dir)
    assert bare.optim.lr is None
    for refused in (lambda: run(bare), lambda: config_hash(bare)):
        with pytest.raises(TypeError, match="load_job_config"):
            refused()
    assert not (tmp_path / "job").exists(), "a refused config claims no folder"


def test_the_hash_keys_the_resolved_config(tmp_path):
    implicit = tiny_job(tmp_path)
    explicit = tiny_job(tmp_path, optim={"name": "adafactor", "lr": 0.3})
    other = tiny_job(tmp_path, optim={"lr": 0.1})
    bare = JobConfig(model=implicit.model, task=implicit.task, method=implicit.method, train=implicit.train,
                     output_dir=implicit.output_dir)
    assert config_hash(implicit) == config_hash(explicit) != config_hash(other)
    assert resolve_optim(bare).optim == implicit.optim


def test_an_optimiser_without_its_lr_is_refused_naming_both():
    with pytest.raises(PipelineConfigError) as err:
        load_job_config(None, ["task.source=generated", "optim.name=adamw"])
    message = str(err.value)
    assert "optim.name='adamw'" in message and "optim.lr" in message and "0.3" in message and "adafactor" in message


def test_a_constant_schedule_keeps_the_lr_after_warm_up(tmp_path):
    config = tiny_job(tmp_path / "job", optim={"schedule": "constant", "warmup_ratio": 0.5}, train={"max_steps": 4})
    from pipelines.training.setup import build_job

    job = build_job(config)
    lrs = []
    for _ in range(4):
        lrs.append(job.scheduler.get_last_lr()[0])
        job.optimizer.step()
        job.scheduler.step()
    assert lrs == pytest.approx([0.0, 0.15, 0.3, 0.3])
