"""A method's own learning rates (`MethodModel.parameter_groups`) reach the job's optimiser and result.json."""

from __future__ import annotations

import json

import pytest
from helpers.jobs import tiny_job

from pipelines.training.loop import run
from pipelines.training.setup import build_job

DEPT = {"num_tokens": 4, "rank": 4, "max_length": 96, "embedding_lr": 2e-3}


def test_a_dept_jobs_optimiser_trains_the_prompt_and_the_low_rank_matrices_at_their_own_rates(tmp_path):
    config = tiny_job(tmp_path / "job", "tiny-t5", "dept", method={"options": DEPT}, optim={"lr": 0.05},
                      train={"max_steps": 2})
    job = build_job(config)
    d = job.base_model.config.d_model
    groups = [(group["initial_lr"], sum(p.numel() for p in group["params"])) for group in job.optimizer.param_groups]
    assert groups == [(0.05, 4 * d), (2e-3, 4 * (96 + d))]


@pytest.mark.slow
def test_result_json_records_both_learning_rates(tmp_path):
    config = tiny_job(tmp_path / "job", "tiny-llama", "dept", method={"options": DEPT}, optim={"lr": 0.05},
                      train={"max_steps": 2})
    result = run(config)
    saved = json.loads((tmp_path / "job" / "result.json").read_text())
    assert [g["lr"] for g in saved["optimizer"]["groups"]] == [0.05, 2e-3]
    assert saved["optimizer"]["lr"] == 0.05 and saved["optimizer"] == result["optimizer"]
    assert sum(g["parameters"] for g in saved["optimizer"]["groups"]) == saved["trainable_parameters"]


def test_a_one_group_method_keeps_one_group_at_the_jobs_rate(tmp_path):
    config = tiny_job(tmp_path / "job", "tiny-t5", "adapter", method={"options": {"bottleneck": 4}},
                      optim={"lr": 1e-3}, train={"max_steps": 2})
    job = build_job(config)
    assert [group["initial_lr"] for group in job.optimizer.param_groups] == [1e-3]
