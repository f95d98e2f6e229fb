"""Sweeps on more than one Ray node, all on this machine: Ray's multi-node test cluster (a 6-trial sweep
spreads over 3 worker nodes, and a worker node removed mid-sweep still leaves every trial
finished once, with one MLflow run each) and Ray's fake autoscaler (a 0-CPU head grows GPU-type nodes for the
queued trials, as many at once as the worker type allows, each trial on one node)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers.mlflow_runs import trial_runs
from helpers.multinode import (
    ROOT,
    FakeAutoscalingHead,
    cluster_records,
    job_folder,
    local_cluster,
    node_running,
    peak_overlap,
    sweep_command,
    trainer_pid,
    training_interval,
    trial_pid,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
TIMEOUT_S = 840
SMALL = ["models=[tiny-t5]", "tasks=[rte]", "data_source=generated", "job.task.generated_size=32",
         "job.task.max_eval_examples=8", "tracking.register=false", "tracking.promote=false"]


def _trial_names(seeds: range) -> list[str]:
    return [f"rte-tiny-t5-capt-s{seed}" for seed in seeds]


def _env(cluster_env: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **cluster_env, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _node_of_pid(records: dict) -> dict[int, str]:
    """Pid of every actor process the cluster ran -> its node id (one machine: pids name processes)."""
    nodes: dict[int, str] = {}
    for actor in records["actors"]:
        if actor["pid"]:
            assert nodes.setdefault(actor["pid"], actor["node"]) == actor["node"], f"pid {actor['pid']} on two nodes"
    return nodes


# ---- Ray's multi-node test cluster: spread, and a worker node removed mid-sweep ---------------------------

SEEDS = range(6)  # twice the worker nodes: trials still wait for a node when one is removed mid-sweep
SPREAD = [*SMALL, f"seeds={list(SEEDS)}", "job.train.max_steps=20", "job.train.eval_every_steps=5",
          # A worker node (1 CPU) holds one trial's training at a time; three train at once.
          "resources.cpus_per_worker=0.9", "resources.max_concurrent_trials=3", "failure.trial_max_failures=3",
          "failure.worker_max_failures=1"]


def _check_every_trial_finished_once(storage: Path, name: str, mlflow_uri: str) -> dict[str, Path]:
    """6 trials, one finished job folder each (config-keyed, trained to the last step), one MLflow run each."""
    import mlflow

    jobs = storage / name / "jobs"
    folders = {trial: job_folder(jobs, trial) for trial in _trial_names(SEEDS)}
    assert len(list(jobs.iterdir())) == len(SEEDS), sorted(p.name for p in jobs.iterdir())
    for trial, folder in folders.items():
        result = json.loads((folder / "result.json").read_text())
        assert result["steps"] == 20 and result["config_hash"].startswith(folder.name.removeprefix(f"{trial}-"))
    client = mlflow.MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name(f"capt-{name}")
    runs = trial_runs(client, [experiment.experiment_id], max_results=1000)
    per_trial = {trial: [r for r in runs if r.data.tags.get("trial") == trial] for trial in folders}
    assert {trial: len(found) for trial, found in per_trial.items()} == dict.fromkeys(folders, 1), \
        "one MLflow run per trial"
    assert len(runs) == len(SEEDS) and all(r.info.status == "FINISHED" for r in runs)
    return folders


def _run_sweep(env: dict[str, str], storage: Path, name: str, mlflow_uri: str) -> subprocess.Popen:
    """The sweep driver; its output goes to `<storage>/<name>.log` (a pipe nobody reads would stall it)."""
    command = sweep_command(*SPREAD, f"name={name}", f"storage_path={storage}", f"tracking.uri={mlflow_uri}")
    with open(storage / f"{name}.log", "w") as log:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _finish(driver: subprocess.Popen, log: Path) -> None:
    driver.wait(timeout=TIMEOUT_S)
    assert driver.returncode == 0, log.read_text(errors="replace")[-6000:]


def _remove_a_training_node(cluster, driver: subprocess.Popen, jobs: Path, results: dict[Path, float]):
    """Wait for a trial that trains now (folder claimed, no result yet) and remove its worker node: (the trial's
    folder name, the removed node's id)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and driver.poll() is None:
        _note_results(jobs, results)
        for folder in jobs.glob("*/job.lock"):
            if (folder.parent / "result.json").exists() or not (folder.parent / "checkpoints").exists():
                continue
            try:
                node = node_running(cluster, trainer_pid(folder.parent))
            except (OSError, ValueError):
                continue
            if node is not None and node in cluster.worker_nodes:
                cluster.remove_node(node)  # kills its raylet and every process it started, as chaos tests do
                return folder.parent.name, node.node_id
        time.sleep(0.1)
    pytest.fail("no trial was seen training before the sweep ended")


def _note_results(jobs: Path, results: dict[Path, float]) -> None:
    """Remember when each job's result.json was first seen: a later change means it trained again."""
    for path in jobs.glob("*/result.json"):
        try:
            results.setdefault(path, path.stat().st_mtime_ns)
        except FileNotFoundError:
            continue


@pytest.fixture
def three_nodes():
    """Ray's multi-node test cluster: a head with no CPU for trials and 3 worker nodes of 1 CPU each (the test's own:
    it removes one)."""
    with local_cluster(workers=3, worker_cpus=1) as cluster_and_env:
        yield cluster_and_env


def test_a_6_trial_sweep_spreads_over_the_nodes_and_survives_losing_one(three_nodes, mlflow_server, tmp_path):
    """One sweep proves both: a worker node is removed while it trains a trial; every trial still finishes exactly
    once, and every one of the three worker nodes trained a trial (the removed one, the one it held; the other two,
    the finished trials): Tune spread them, one per 1-CPU node."""
    cluster, cluster_env = three_nodes
    workers = {node.node_id for node in cluster.worker_nodes}
    started, results = time.monotonic(), {}
    driver = _run_sweep(_env(cluster_env), tmp_path, "mn-chaos", mlflow_server.uri)
    jobs = tmp_path / "mn-chaos" / "jobs"
    try:
        hit, removed = _remove_a_training_node(cluster, driver, jobs, results)
        while driver.poll() is None:
            _note_results(jobs, results)
            time.sleep(0.1)
        _finish(driver, tmp_path / "mn-chaos.log")
    finally:
        if driver.poll() is None:
            driver.kill()
    wall_s = time.monotonic() - started
    folders = _check_every_trial_finished_once(tmp_path, "mn-chaos", mlflow_server.uri)
    rewritten = [p.parent.name for p, mtime in results.items() if p.stat().st_mtime_ns != mtime]
    assert not rewritten, f"trained to completion twice: {rewritten}"
    assert (folders[hit.rsplit("-", 1)[0]] / "result.json").is_file()
    where = _node_of_pid(cluster_records(cluster_env))
    trained_on = {trial: where.get(trainer_pid(folder)) for trial, folder in folders.items()}
    assert removed in workers, "the removed node was one of the three the sweep started on"
    assert set(trained_on.values()) | {removed} == workers, f"finished trials by node: {trained_on}; {removed=}"
    print(f"\n6-trial sweep on 3 worker nodes, one removed mid-sweep (it trained {hit}): {wall_s:.0f} s")


# ---- Ray's fake autoscaler: a 0-CPU head grows GPU-type nodes for the queued trials ---------------------

MAX_WORKERS = 3
GROW_SEEDS = range(6)  # twice the nodes the worker type allows: with fewer, two trials seldom overlap under load
# Each node is a GPU node ({"CPU": 2, "GPU": 1}) that also declares `fake_gpu: 1`: the trials ask for that
# custom resource instead of the GPU, since a Ray Train worker given a GPU sets up NCCL, which the CPU build
# of torch has not. One trial's worker (2 CPUs, 1 fake GPU) fills a node, as a 4-CPU worker fills a 4-CPU node.
GROW = [*SMALL, f"seeds={list(GROW_SEEDS)}", "job.train.max_steps=120", "job.train.eval_every_steps=40",
        "resources.cpus_per_worker=2", "resources.custom_per_worker.fake_gpu=1", "tracking.enabled=false"]


def test_an_autoscaling_cluster_grows_for_the_queued_trials_one_node_each(tmp_path):
    head = FakeAutoscalingHead({"CPU": 2, "GPU": 1, "fake_gpu": 1}, MAX_WORKERS).start()
    try:
        cluster_env = {**head.client_env(), "RAY_ADDRESS": head.address}
        before = cluster_records(cluster_env)
        started = time.monotonic()
        proc = subprocess.run(sweep_command(*GROW, "name=mn-grow", f"storage_path={tmp_path}"), cwd=ROOT,
                              env=_env(cluster_env), capture_output=True, text=True, timeout=TIMEOUT_S)
        wall_s = time.monotonic() - started
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        after = cluster_records(cluster_env)
    finally:
        head.stop()
    assert [n["resources"].get("CPU", 0) for n in before["nodes"] if n["alive"]] == [0], "the head alone, 0 CPUs"
    grown = {n["node"] for n in after["nodes"] if "fake_gpu" in n["resources"]}
    assert len(grown) >= 1, "the autoscaler added GPU-type nodes"
    where = _node_of_pid(after)
    jobs = tmp_path / "mn-grow" / "jobs"
    folders = {trial: job_folder(jobs, trial) for trial in _trial_names(GROW_SEEDS)}
    peak = peak_overlap([training_interval(folder) for folder in folders.values()])
    assert peak == MAX_WORKERS, f"{peak} trials trained at once; the worker type allows {MAX_WORKERS}"
    for trial, folder in folders.items():
        driver_node = where.get(trial_pid(tmp_path / "mn-grow" / trial))
        trainer_node = where.get(trainer_pid(folder))
        assert trainer_node in grown, f"{trial} trained on {trainer_node}, not on an added GPU-type node"
        assert driver_node == trainer_node, f"{trial}: its driver on {driver_node}, its train worker on {trainer_node}"
    print(f"\n{len(GROW_SEEDS)} trials on an autoscaling cluster (0 -> {len(grown)} GPU-type nodes, at most "
          f"{MAX_WORKERS} at once): "
          f"peak {peak} trials at once, {wall_s:.0f} s")
