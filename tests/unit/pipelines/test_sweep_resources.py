"""What a trial needs against what a cluster has, and the watch over worker placement groups that wait."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipelines.sweeps.config import ResourcesSection, load_sweep_config
from pipelines.sweeps.pending import LOCAL_PENDING_TIMEOUT_S, PendingWatch, pending_timeout
from pipelines.sweeps.resources import (
    TRIAL_CPU,
    TRIAL_DRIVER_RESOURCE,
    ResourcesError,
    check_local_fit,
    driver_resources,
    trial_demand,
    trial_resources,
    worker_bundle,
)
from pipelines.sweeps.run import max_concurrent

CONFIGS = Path(__file__).resolve().parents[3] / "pipelines" / "configs"


def test_a_ray_train_trial_needs_its_workers_and_its_own_cpu():
    res = ResourcesSection(num_workers=2, cpus_per_worker=1.5, gpus_per_worker=0.5, custom_per_worker={"tpu": 1})
    assert worker_bundle(res) == {"CPU": 1.5, "GPU": 0.5, "tpu": 1.0}
    assert trial_demand(res) == {"CPU": 3.1, "GPU": 1.0, "tpu": 2.0}
    assert trial_resources(res, {"CPU": 2.0}) == {"CPU": 0.1}, "the trial process only drives its worker group"
    assert trial_resources(res, {"CPU": 0.0, TRIAL_DRIVER_RESOURCE: 4.0}) == {TRIAL_DRIVER_RESOURCE: 1.0}
    assert "GPU" not in worker_bundle(ResourcesSection())


def test_a_one_worker_trial_asks_tune_for_its_worker_and_nothing_more():
    res = ResourcesSection(cpus_per_worker=1.5, gpus_per_worker=0.5, custom_per_worker={"tpu": 1})
    assert trial_demand(res) == {"CPU": 1.5, "GPU": 0.5, "tpu": 1.0}
    factory = trial_resources(res, {"CPU": 2.0, TRIAL_DRIVER_RESOURCE: 4.0})
    assert factory.bundles == [{"CPU": 1.5, "GPU": 0.5, "tpu": 1.0}] and factory.strategy == "PACK"


def test_a_gpu_trial_on_a_cpu_machine_is_refused_with_the_numbers():
    with pytest.raises(ResourcesError) as err:
        check_local_fit(ResourcesSection(gpus_per_worker=1), {"CPU": 2.0})
    message = str(err.value)
    assert "one trial needs {CPU: 1, GPU: 1} (1 worker(s) x {CPU: 1, GPU: 1}), but" in message
    assert "has {CPU: 2, GPU: 0}: GPU needs 1, has 0" in message and "--num-cpus" not in message


def test_too_many_cpus_are_refused_and_point_at_num_cpus():
    with pytest.raises(ResourcesError, match=r"CPU needs 4.1, has 2.*--num-cpus"):
        check_local_fit(ResourcesSection(num_workers=2, cpus_per_worker=2), {"CPU": 2.0})
    check_local_fit(ResourcesSection(num_workers=2, cpus_per_worker=0.9), {"CPU": 2.0})  # 1.9 + 0.1 fits


def test_gpu_fractions_never_span_two_gpus():
    res = ResourcesSection(num_workers=3, gpus_per_worker=0.6)
    with pytest.raises(ResourcesError, match=r"3 workers of GPU 0.6 do not fit on 2 GPU"):
        check_local_fit(res, {"CPU": 8.0, "GPU": 2.0})  # 1.8 GPUs in total, but only one 0.6 per GPU
    check_local_fit(ResourcesSection(num_workers=4, gpus_per_worker=0.5), {"CPU": 8.0, "GPU": 2.0})


def test_concurrency_counts_every_resource_locally_and_is_kept_on_a_cluster():
    gpu = load_sweep_config(CONFIGS / "paper" / "t5-base.yaml", ["data_source=generated", "models=[tiny-t5]"])
    # 8 GPUs hold 8 trials, but 16 CPUs only 4 (one worker of 4 CPUs each, run in the trial process).
    assert max_concurrent(gpu, {"CPU": 16.0, "GPU": 8.0}) == 4
    two_workers = load_sweep_config(CONFIGS / "paper" / "t5-base.yaml", ["data_source=generated", "models=[tiny-t5]",
                                                                        "resources.num_workers=2"])
    assert max_concurrent(two_workers, {"CPU": 16.0, "GPU": 8.0}) == 1, "8.1 CPUs a trial: its 2 workers + 0.1"
    capped = load_sweep_config(CONFIGS / "smoke.yaml", ["data_source=generated",
                                                       "resources.max_concurrent_trials=6"])
    assert max_concurrent(capped, {"CPU": 2.0}) == 2, "lowered to what the local Ray holds"
    assert max_concurrent(capped, {"CPU": 2.0}, local=False) == 6, "kept on a cluster that may scale up"


@pytest.mark.parametrize("cluster", [{"CPU": 0.0, TRIAL_DRIVER_RESOURCE: 16.0}, {"CPU": 8.0}, {"CPU": 4.0, "GPU": 1.0}])
def test_a_cluster_queues_every_trial_whatever_it_holds_at_start(cluster):
    """A head with min_workers 0 has no GPU at start: a cap from the nodes present would run one trial at a
    time and the autoscaler would never see the queued demand it scales on."""
    gpu = load_sweep_config(CONFIGS / "paper" / "t5-base.yaml", ["data_source=generated", "models=[tiny-t5]"])
    assert max_concurrent(gpu, cluster, local=False) is None, "no bound: Tune queues every trial"
    assert max_concurrent(gpu, cluster, local=True) == 1, "the local Ray keeps the trials that fit (at least one)"


def test_a_trial_driver_takes_the_heads_own_resource_where_a_node_declares_it():
    assert driver_resources({"CPU": 0.0, TRIAL_DRIVER_RESOURCE: 16.0}) == {TRIAL_DRIVER_RESOURCE: 1.0}
    assert driver_resources({"CPU": 8.0, "GPU": 2.0}) == {"CPU": TRIAL_CPU}, "local Ray, a cluster without it"
    assert driver_resources({"CPU": 8.0, TRIAL_DRIVER_RESOURCE: 0.5}) == {"CPU": TRIAL_CPU}, "not one whole unit"
    res = ResourcesSection(num_workers=2, cpus_per_worker=4, gpus_per_worker=1)
    # On the head's resource the driver adds no CPU: the worker group alone is what a GPU node must hold.
    assert trial_demand(res, {TRIAL_DRIVER_RESOURCE: 1.0}) == {"CPU": 8.0, "GPU": 2.0, TRIAL_DRIVER_RESOURCE: 1.0}
    assert trial_demand(res) == trial_demand(res, {"CPU": TRIAL_CPU}) == {"CPU": 8.1, "GPU": 2.0}


def test_workers_cannot_ask_for_the_trial_drivers_resource():
    with pytest.raises(ValueError, match=rf"{TRIAL_DRIVER_RESOURCE}: the trial drivers' own resource"):
        ResourcesSection(custom_per_worker={TRIAL_DRIVER_RESOURCE: 1})


def test_the_pending_timeout_defaults_to_on_locally_and_off_on_a_cluster():
    assert pending_timeout(ResourcesSection(), local=True) == LOCAL_PENDING_TIMEOUT_S
    assert pending_timeout(ResourcesSection(), local=False) is None
    assert pending_timeout(ResourcesSection(pending_timeout_s=30), local=False) == 30
    assert pending_timeout(ResourcesSection(pending_timeout_s=0), local=True) is None


def _pg(pg_id: str, state: str, bundle: dict[str, float], count: int = 1) -> dict:
    return {"placement_group_id": pg_id, "state": state, "strategy": "PACK",
            "bundles": dict.fromkeys(range(count), bundle), "stats": {"scheduling_state": "INFEASIBLE"}}


def _table(*pgs: dict) -> dict:
    return {pg["placement_group_id"]: pg for pg in pgs}


WORKER = {"CPU": 1.0, "gpu_x": 1.0}


def test_the_watch_reports_then_gives_up_on_a_worker_group_that_waits(caplog):
    watch = PendingWatch(ResourcesSection(custom_per_worker={"gpu_x": 1}, pending_timeout_s=30), 30.0)
    tune_trial = _pg("t", "CREATED", {"CPU": 0.1})
    with caplog.at_level(logging.WARNING, logger="pipelines.sweeps.pending"):
        for now, pg in ((0, "a"), (9, "a"), (11, "b"), (20, "b")):  # Train replaces its placement group
            watch.check(float(now), _table(tune_trial, _pg(pg, "PENDING", WORKER)))
    reports = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(reports) == 2 and "waited 11 s" in reports[0] and "waited 20 s" in reports[1]
    assert "placement group {CPU: 1, gpu_x: 1} * 1 (PACK)" in reports[0] and "INFEASIBLE" in reports[0]
    assert watch.verdict is None
    watch.check(30.0, _table(tune_trial, _pg("b", "PENDING", WORKER)))
    gave_up = r"gave up after resources.pending_timeout_s=30: the trial processes .* waited 30 s .*--resume"
    with pytest.raises(ResourcesError, match=gave_up):
        watch.raise_if_gave_up()


def test_a_worker_group_that_starts_resets_the_wait():
    watch = PendingWatch(ResourcesSection(custom_per_worker={"gpu_x": 1}), 30.0)
    watch.check(0.0, _table(_pg("a", "PENDING", WORKER), _pg("b", "PENDING", WORKER)))
    watch.check(25.0, _table(_pg("a", "CREATED", WORKER), _pg("b", "PENDING", WORKER)))  # progress
    watch.check(50.0, _table(_pg("a", "CREATED", WORKER), _pg("b", "PENDING", WORKER)))
    assert watch.verdict is None
    watch.check(56.0, _table(_pg("a", "REMOVED", WORKER), _pg("b", "PENDING", WORKER)))
    assert watch.verdict is not None


def test_other_placement_groups_are_not_the_sweeps():
    watch = PendingWatch(ResourcesSection(num_workers=2), 5.0)
    for now in (0.0, 10.0):
        watch.check(now, _table(_pg("other", "PENDING", {"CPU": 1.0}), _pg("shape", "PENDING", {"CPU": 2.0}, 2)))
    assert watch.verdict is None
    for now in (20.0, 30.0):
        watch.check(now, _table(_pg("ours", "PENDING", {"CPU": 1.0}, 2)))
    assert watch.verdict is not None


def test_a_one_worker_trial_gets_as_many_attempts_from_tune_as_both_levels_gave():
    from pipelines.sweeps.run import trial_retries

    one = load_sweep_config(CONFIGS / "smoke.yaml", ["data_source=generated", "failure.trial_max_failures=2",
                                                     "failure.worker_max_failures=1"])
    assert trial_retries(one) == 5, "3 Tune attempts x 2 worker starts = 6 attempts"
    two = load_sweep_config(CONFIGS / "smoke.yaml", ["data_source=generated", "failure.trial_max_failures=2",
                                                     "resources.num_workers=2"])
    assert trial_retries(two) == 2, "Ray Train restarts the workers itself"
