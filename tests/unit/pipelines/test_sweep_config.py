"""Sweep configs: every shipped YAML parses, grids expand to valid jobs, problems are listed at once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.config import JobConfigError, validate_job_config
from pipelines.job_outputs import config_hash
from pipelines.sweep import max_concurrent
from pipelines.sweep_config import load_sweep_config, trials

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "pipelines" / "configs"
SWEEPS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "job")


@pytest.fixture(autouse=True)
def _hub_ids_allowed(monkeypatch, tmp_path):
    # Paper configs name hub checkpoints; offline validation would (rightly) refuse uncached ones.
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("CAPT_DATA_DIR", str(tmp_path))  # configs that read local data need a data dir


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_shipped_sweep_parses_and_names_its_command(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and f"--config pipelines/configs/{path.relative_to(CONFIGS)}" in first
    assert "pipelines/sweep.py" in first
    assert trials(load_sweep_config(path))


@pytest.mark.parametrize("name", ["t5-base", "t5-large", "llama-3.2-1b", "qwen2.5-1.5b"])
def test_paper_grids_are_seven_tasks_five_methods_three_seeds(name):
    sweep = load_sweep_config(CONFIGS / "paper" / f"{name}.yaml")
    points = trials(sweep)
    assert len(points) == 7 * 5 * 3
    assert {p.method for p in points} == {"capt", "prompt_tuning", "ptuning_v2", "lora", "full_finetune"}
    boolq = next(p for p in points if p.task == "boolq")
    assert boolq.job["task"]["source"] == "hub", "BoolQ's train split comes from the hub"
    lora = next(p for p in points if p.method == "lora")
    assert lora.job["optim"]["name"] == "adamw" and lora.job["method"]["options"]["r"] == 8
    assert sweep.resources.gpus_per_worker >= 1


def test_ablations_cover_every_row_of_the_table():
    points = trials(load_sweep_config(CONFIGS / "ablations.yaml"))
    options = {p.method: p.job["method"]["options"] for p in points}
    assert {o.get("layers") for o in options.values()} >= {"all", "first_half", "odd"}
    assert {o.get("fusion") for o in options.values()} >= {"project", "prepend", "conv"}
    assert any(o.get("task_vector") is False for o in options.values())
    assert any(o.get("instance_mean") is False for o in options.values())
    assert any(o.get("length", 1) > 1 for o in options.values())
    assert any(o.get("instance_token") for o in options.values())
    assert {p.model for p in points if p.method.startswith("capt-length")} == {"meta-llama/Llama-3.2-1B"}


def test_a_bad_sweep_lists_every_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [rte, squad]\nmethods: [{name: capt, options: {fusion: glue}}]\nresources: {num_workers: 0}\n")
    with pytest.raises(JobConfigError) as err:
        load_sweep_config(bad)
    assert "resources.num_workers=0" in str(err.value)
    bad.write_text("tasks: [rte, squad]\nmethods: [{name: capt, options: {fusion: glue}}]\n")
    with pytest.raises(JobConfigError) as err:
        load_sweep_config(bad, ["data_source=generated"])
    message = str(err.value)
    assert "task.name='squad'" in message and "fusion='glue'" in message
    bad.write_text("tasks: [rte]\nseeds: [0, 1, 2]\nmethods: [{name: capt, options: {fusion: glue}}]\n")
    with pytest.raises(JobConfigError) as err:
        load_sweep_config(bad, ["data_source=generated"])
    assert str(err.value).count("fusion='glue'") == 1 and "3 trial(s)" in str(err.value), "reported once"


def test_trial_names_and_output_dirs_are_stable(tmp_path):
    sweep = load_sweep_config(CONFIGS / "smoke.yaml", [f"storage_path={tmp_path}", "data_source=generated"])
    names = [t.name for t in trials(sweep)]
    assert names == ["cb-tiny-t5-capt-s0", "cb-minilm-capt-s0", "rte-tiny-t5-capt-s0", "rte-minilm-capt-s0"]
    first = trials(sweep)[0].job
    digest = config_hash(validate_job_config(first))
    assert first["output_dir"] == str(tmp_path / "smoke" / "jobs" / f"cb-tiny-t5-capt-s0-{digest[:10]}")
    assert [t.job["output_dir"] for t in trials(sweep)] == [t.job["output_dir"] for t in trials(sweep)]
    assert all(t.job["train"]["resume"] for t in trials(sweep))


def test_a_trial_whose_config_changed_gets_its_own_folder(tmp_path):
    base = [f"storage_path={tmp_path}", "data_source=generated"]
    folders = {t.name: t.job["output_dir"] for t in trials(load_sweep_config(CONFIGS / "smoke.yaml", base))}
    changed_job = {t.name: t.job["output_dir"]
                   for t in trials(load_sweep_config(CONFIGS / "smoke.yaml", [*base, "job.optim.weight_decay=0.01"]))}
    assert set(changed_job) == set(folders) and not set(changed_job.values()) & set(folders.values())
    one_task = {t.name: t.job["output_dir"]
                for t in trials(load_sweep_config(CONFIGS / "smoke.yaml", [*base, "task_overrides.cb.optim.weight_decay=0.01"]))}
    assert [n for n in folders if one_task[n] != folders[n]] == ["cb-tiny-t5-capt-s0", "cb-minilm-capt-s0"]
    logging_only = {t.name: t.job["output_dir"]
                    for t in trials(load_sweep_config(CONFIGS / "smoke.yaml", [*base, "job.train.log_every_steps=3"]))}
    assert logging_only == folders, "a key that cannot change the result keeps the folder"


def test_concurrency_follows_the_cluster():
    sweep = load_sweep_config(CONFIGS / "smoke.yaml", ["data_source=generated"])
    assert max_concurrent(sweep, {"CPU": 2.0}) == 1
    assert max_concurrent(sweep, {"CPU": 16.0}) == 14
    gpu = load_sweep_config(CONFIGS / "paper" / "qwen2.5-1.5b.yaml", ["data_source=generated"])
    assert max_concurrent(gpu, {"CPU": 64.0, "GPU": 8.0}) == 4


def test_relative_paths_are_resolved_on_the_driver(tmp_path, monkeypatch):
    # Tune runs each trial in its own working directory: a relative path there would land in Ray's temp dir.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CAPT_DATA_DIR", "data")
    sweep = load_sweep_config(CONFIGS / "smoke.yaml", ["storage_path=runs", "data_source=generated"])
    assert sweep.storage_path == str(tmp_path / "runs")
    assert trials(sweep)[0].job["output_dir"].startswith(str(tmp_path / "runs" / "smoke" / "jobs"))
    assert os.environ["CAPT_DATA_DIR"] == str(tmp_path / "data")
