"""Packed sweeps (#34, "In the sweep"): who packs with whom, the K limit, what a packed sweep refuses and why, the
Tune grid and summary rows of packs, and a pack of jobs tracked without a server (result.json per member, reuse).
The real sweep with MLflow: tests/integration/test_sweep_pack.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.config.sources import PipelineConfigError
from pipelines.sweeps.config import load_sweep_config, member_points, pack_point, sweep_packs, trials
from pipelines.sweeps.summary import result_rows

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "pipelines" / "configs"
BASE = ["data_source=generated", "tasks=[rte, cb]", "seeds=[0, 1, 2]", "job.train.score_untrained=false"]


def packed(tmp_path, *overrides: str):
    return load_sweep_config(None, [f"storage_path={tmp_path}", *BASE, *overrides])


def test_trials_sharing_a_base_pack_in_grid_order_at_most_k_each(tmp_path):
    sweep = packed(tmp_path, "models=[tiny-t5, minilm]", "pack.max_members=4")
    plans = sweep_packs(sweep)
    assert [p.name for p in plans] == ["pack000-tiny-t5-x4", "pack001-tiny-t5-x2", "pack002-minilm-x4",
                                       "pack003-minilm-x2"]
    assert [t.name for t in plans[0].members] == ["rte-tiny-t5-capt-s0", "rte-tiny-t5-capt-s1", "rte-tiny-t5-capt-s2",
                                                  "cb-tiny-t5-capt-s0"]
    assert all(len({t.model for t in p.members}) == 1 for p in plans), "one base model per pack"
    members = [t.name for p in plans for t in p.members]
    assert sorted(members) == sorted(t.name for t in trials(sweep)), "every trial in exactly one pack"
    assert [p.name for p in sweep_packs(sweep)] == [p.name for p in plans], "stable names (--resume meets them)"


def test_packing_changes_no_trial_config_hash_or_folder(tmp_path):
    plain = {t.name: t.job for t in trials(packed(tmp_path))}
    with_pack = {t.name: t.job for t in trials(packed(tmp_path, "pack.max_members=3"))}
    assert with_pack == plain


def test_members_that_cannot_share_a_base_go_to_different_packs(tmp_path):
    sweep = packed(tmp_path, "pack.max_members=8", "tasks=[rte]", "seeds=[0]",
                   'methods=[{name: capt}, {name: capt, label: capt-bf16, overrides: {train.precision: bf16}},'
                   ' {name: capt, label: capt-prepend, options: {fusion: prepend}}, {name: capt, label: capt-odd,'
                   ' options: {layers: odd}}]')
    groups = [[t.method for t in p.members] for p in sweep_packs(sweep)]
    assert groups == [["capt", "capt-odd"], ["capt-bf16"], ["capt-prepend"]], "precision, slot count split packs"


def test_a_packed_sweep_refuses_unpackable_methods_and_options_at_once(tmp_path):
    with pytest.raises(PipelineConfigError) as err:
        packed(tmp_path, "pack.max_members=3", "methods=[{name: capt}, {name: lora}]", "scheduler=asha",
               "search={optim.lr: {grid: [0.1, 0.3]}}", "resources.num_workers=2", "job.train.grad_accum_steps=2")
    message = str(err.value)
    assert "6 trial(s) (rte/tiny-t5/lora/s0, rte/tiny-t5/lora/s1, rte/tiny-t5/lora/s2 and 3 more): pack: method " \
           "'lora' does not pack: only CaPT and its ablations" in message
    assert "train.grad_accum_steps=2: a pack steps every member on each batch (allowed: 1)" in message
    assert "scheduler='asha': not supported with pack (allowed: fifo)" in message
    assert "search={'optim.lr': {'grid': [0.1, 0.3]}}: not supported with pack yet" in message
    assert "resources.num_workers=2: a pack trains in one process (allowed with pack: 1)" in message
    assert "'capt' does not pack" not in message, "the CaPT rows pack"


def test_k_must_be_positive_and_given(tmp_path):
    with pytest.raises(PipelineConfigError, match=r"pack.max_members=0: Input should be greater than 0"):
        packed(tmp_path, "pack.max_members=0")
    with pytest.raises(PipelineConfigError, match=r"pack.max_members.*Field required"):
        packed(tmp_path, "pack={}")


def test_a_packed_sweeps_trial_processes_start_with_the_tuned_heap_unless_told_otherwise(tmp_path):
    from pipelines.sweeps.config import TUNED_HEAP_ENV, trial_process_env

    assert trial_process_env(packed(tmp_path, "pack.max_members=3")) == TUNED_HEAP_ENV
    assert TUNED_HEAP_ENV["MALLOC_ARENA_MAX"] == "1" and TUNED_HEAP_ENV["MALLOC_MMAP_MAX_"] == "0"
    assert trial_process_env(packed(tmp_path, "pack.max_members=3", "pack.heap=default")) == {}
    assert trial_process_env(load_sweep_config(None, [f"storage_path={tmp_path}", *BASE])) == {}, "no pack"
    with pytest.raises(PipelineConfigError, match=r"pack.heap='huge': Input should be 'tuned' or 'default'"):
        packed(tmp_path, "pack.max_members=3", "pack.heap=huge")


def test_without_pack_the_grid_is_one_trial_per_point(tmp_path):
    from pipelines.sweeps.run import param_space

    space = param_space(packed(tmp_path))
    assert len(space["point"]["grid_search"]) == 6 and "pack" not in space["point"]["grid_search"][0]
    space = param_space(packed(tmp_path, "pack.max_members=4"))
    points = space["point"]["grid_search"]
    assert [p["pack"] for p in points] == ["pack000-tiny-t5-x4", "pack001-tiny-t5-x2"]
    assert points[1]["members"] == [{"task": "cb", "model": "tiny-t5", "method": "capt", "seed": s, "select": {}}
                                    for s in (1, 2)]


def test_summary_rows_list_each_member_with_its_pack(tmp_path):
    plan = sweep_packs(packed(tmp_path, "pack.max_members=2", "tasks=[rte]", "seeds=[0, 1]"))[0]
    metrics = {"validation_score": 60.0, "member0.best_validation_score": 50.0, "member0.test_score": 40.0,
               "member0.reused": 1.0, "member1.best_validation_score": 60.0, "member1.test_score": 30.0,
               "member1.reused": 0.0}
    point = pack_point(plan)
    assert [m[1] for m in member_points(point, metrics)][1] == {"best_validation_score": 60.0, "test_score": 30.0,
                                                                "reused": 0.0}
    rows = result_rows([SimpleNamespace(config={"point": point}, metrics=metrics, error=None)])
    assert [(r["seed"], r["validation"], r["test"], r["reused"], r["pack"]) for r in rows] == [
        (0, 50.0, 40.0, True, plan.name), (1, 60.0, 30.0, False, plan.name)]


@pytest.mark.slow
def test_a_tracked_pack_writes_each_members_result_and_reuses_finished_ones(tmp_path):
    from pipelines.config.load import validate_job_config
    from pipelines.tracking.jobs import RunPlan, tracked_pack
    from pipelines.training.outputs import finished_result
    from pipelines.training.packed import train_unfinished_members

    sweep = packed(tmp_path, "pack.max_members=3", "tasks=[rte]", "job.train.max_steps=3", "job.task.generated_size=24",
                   "job.task.max_eval_examples=8", "job.train.batch_size=8")
    configs = [validate_job_config(t.job) for t in trials(sweep)]
    done = tracked_pack(configs, [RunPlan(None)] * 3, train_unfinished_members, pack_info={"name": "p"})
    assert [d.reused for d in done] == [False] * 3
    for config, member in zip(configs, done, strict=True):
        stored = json.loads((config.resolved_output_dir() / "result.json").read_text())
        assert finished_result(config) == stored == member.result, "a job's result.json, verified as reusable"
        assert stored["steps"] == 3 and stored["pack"]["name"] == "p" and stored["config"]["seed"] == config.seed
    first = configs[0].resolved_output_dir()
    (first / "result.json").unlink()  # member 0 unfinished: it alone trains again
    kept = {c.seed: (c.resolved_output_dir() / "result.json").stat().st_mtime_ns for c in configs[1:]}
    again = tracked_pack(configs, [RunPlan(None)] * 3, train_unfinished_members)
    assert [d.reused for d in again] == [False, True, True]
    assert kept == {c.seed: (c.resolved_output_dir() / "result.json").stat().st_mtime_ns for c in configs[1:]}
    assert again[0].result["steps"] == 3 and again[0].result["pack"]["members"] == 1, "retrained, in a pack of one"


def test_each_member_is_tracked_as_its_trial_would_be(tmp_path):
    from pipelines.sweeps.config import trial_point
    from pipelines.sweeps.trial import PACK_TAG, _member
    from pipelines.training.outputs import config_hash

    sweep = packed(tmp_path, "pack.max_members=3", "tasks=[rte]")
    plan = sweep_packs(sweep)[0]
    context = {"tags": {"mlflow.parentRunId": "sweep-run"}, "ui_uri": "http://ui"}
    for trial in plan.members:
        config, tracking = _member(sweep, trial_point(trial), plan.name, "http://127.0.0.1:1", context)
        assert str(config.resolved_output_dir()) == trial.job["output_dir"] and config.train.resume
        assert tracking["run_name"] == f"rte/tiny-t5/capt/s{trial.seed}" and tracking["register"] is True
        assert tracking["tags"]["mlflow.parentRunId"] == "sweep-run", "nested under the sweep's run, as a trial is"
        assert tracking["tags"][PACK_TAG] == tracking["tags"]["trial"] == plan.name
        assert tracking["tags"]["config_hash"] == config_hash(config)


@pytest.mark.slow
def test_an_interrupted_pack_reopens_its_runs_and_trains_only_its_unfinished_members(tmp_path, monkeypatch):
    """MLflow here is a SQLite store in the test's folder (no server; the sweep over a server:
    tests/integration/test_sweep_pack.py). The interruption is injected where the pack trains."""
    from mlflow import MlflowClient

    from pipelines.config.load import validate_job_config
    from pipelines.tracking.jobs import RunPlan, job_run_name, job_run_tags, tracked_pack
    from pipelines.training import packed as pack_training
    from pipelines.training.packed import train_unfinished_members

    monkeypatch.chdir(tmp_path)  # the SQLite store's artifacts go under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = packed(tmp_path, "pack.max_members=3", "tasks=[rte]", "job.train.max_steps=2", "job.task.generated_size=16",
                   "job.task.max_eval_examples=4", "job.train.batch_size=8")
    configs = [validate_job_config(t.job) for t in trials(sweep)]
    plans = [RunPlan(uri, "packs", job_run_name(c), job_run_tags(c), system_metrics_interval_s=60.0) for c in configs]
    tracked_pack(configs[:1], plans[:1], train_unfinished_members)  # member 0 finished earlier

    def killed(pack, reports):
        raise KeyboardInterrupt("killed")

    real = pack_training.fit_pack
    monkeypatch.setattr(pack_training, "fit_pack", killed)
    with pytest.raises(KeyboardInterrupt):
        tracked_pack(configs, plans, train_unfinished_members)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("packs").experiment_id
    first = {r.data.tags["seed"]: r for r in client.search_runs([experiment])}
    assert {s: r.info.status for s, r in first.items()} == {"0": "FINISHED", "1": "FAILED", "2": "FAILED"}
    monkeypatch.setattr(pack_training, "fit_pack", real)
    done = tracked_pack(configs, plans, train_unfinished_members)  # the resumed pack
    assert [d.reused for d in done] == [True, False, False] and done[1].result["pack"]["members"] == 2
    again = {r.data.tags["seed"]: r for r in client.search_runs([experiment])}
    assert {s: r.info.run_id for s, r in again.items()} == {s: r.info.run_id for s, r in first.items()}, "reopened"
    assert all(r.info.status == "FINISHED" for r in again.values())
    assert again["1"].data.metrics["test/score"] == pytest.approx(done[1].result["metrics"]["test_score"])


def test_the_console_line_of_an_ended_pack_trial_counts_its_members():
    from pipelines.sweeps.console import _outcome

    line = _outcome({"members": 3.0, "members_trained": 2.0, "members_reused": 1.0, "validation_score": 62.5,
                     "member0.test_score": 50.0})
    assert line == "trained 2 of 3 pack members, reused 1: best validation 62.5"


@pytest.mark.slow
def test_a_members_untrained_score_is_the_one_its_single_job_measures(tmp_path):
    from pipelines.config.load import validate_job_config
    from pipelines.training.loop import run
    from pipelines.training.packed import train_members

    sweep = packed(tmp_path, "pack.max_members=2", "tasks=[cb]", "seeds=[0]", "job.train.score_untrained=true",
                   "job.train.max_steps=2", "job.task.generated_size=16", "job.task.max_eval_examples=8")
    [trial] = trials(sweep)
    alone = run(validate_job_config(trial.job))
    job = {**trial.job, "output_dir": str(tmp_path / "packed"), "train": {**trial.job["train"], "resume": False}}
    [member] = train_members([validate_job_config(job)])
    assert member["metrics"]["test_untrained_score"] == pytest.approx(alone["metrics"]["test_untrained_score"])


def test_select_values_pack_together_and_each_member_keeps_its_own(tmp_path):
    sweep = packed(tmp_path, "pack.max_members=4", "tasks=[rte]", "select={optim.lr: [0.01, 0.1]}")
    [first, second] = sweep_packs(sweep)
    assert [(t.select["optim.lr"], t.seed) for t in first.members] == [(0.01, 0), (0.01, 1), (0.01, 2), (0.1, 0)]
    assert [m["select"] for m in pack_point(second)["members"]] == [{"optim.lr": 0.1}] * 2
    assert {t.job["optim"]["lr"] for t in first.members} == {0.01, 0.1}, "members differ in lr within one pack"


def test_a_pack_asks_a_gpu_share_per_member_up_to_one_gpu_and_a_trials_cpus(tmp_path):
    """4 members at 0.25 GPU hold one GPU, as 4 separate trials would; CPUs and custom resources are the one
    process's; a share of a whole GPU or more is kept; every pack of a sweep asks what its largest pack needs."""
    from pipelines.sweeps.resources import ResourcesSection, pack_resources, trial_resources
    from pipelines.sweeps.run import max_concurrent, requested_resources

    quarter = ResourcesSection(gpus_per_worker=0.25, cpus_per_worker=2, custom_per_worker={"a100": 0.001})
    assert [pack_resources(quarter, k).gpus_per_worker for k in (1, 3, 4, 9)] == [0.25, 0.75, 1.0, 1.0]
    assert (pack_resources(quarter, 4).cpus_per_worker, pack_resources(quarter, 4).custom_per_worker) == (
        2, {"a100": 0.001})
    assert pack_resources(ResourcesSection(gpus_per_worker=2), 4).gpus_per_worker == 2
    assert pack_resources(ResourcesSection(), 4) == ResourcesSection(), "a CPU pack asks what a CPU trial asks"

    gpu = ["resources.gpus_per_worker=0.25", "job.train.cpu=false", "models=[tiny-t5]"]
    sweep = packed(tmp_path, *gpu, "pack.max_members=4")  # rte and cb x 3 seeds: packs of 4 and 2
    assert [len(plan.members) for plan in sweep_packs(sweep)] == [4, 2]
    asked = requested_resources(sweep)
    assert trial_resources(asked, {"CPU": 8.0, "GPU": 2.0}).bundles == [{"CPU": 1.0, "GPU": 1.0}]
    assert max_concurrent(sweep, {"CPU": 8.0, "GPU": 2.0}) == 2, "a pack a GPU"
    unpacked = load_sweep_config(None, [f"storage_path={tmp_path}", *BASE, *gpu])
    assert requested_resources(unpacked) == unpacked.resources
    assert max_concurrent(unpacked, {"CPU": 8.0, "GPU": 2.0}) == 8, "four 0.25-GPU trials a GPU"
    small = packed(tmp_path, *gpu, "pack.max_members=2", "tasks=[rte]", "seeds=[0]")  # one pack of one member
    assert requested_resources(small).gpus_per_worker == 0.25
