"""What a sweep's trials ask of Ray (`ResourcesSection`) and whether they get it: a trial the local Ray the
sweep starts cannot hold is refused before it starts; on a cluster a wait is reported, then given up on.

Where a trial waits (`trial_resources` decides what a trial asks Tune for):
- One worker: the job runs in the Tune trial's own process (`pipelines.sweeps.trial`), which asks for that
  worker's resources, so the whole trial is on one node by construction. Tune reserves a placement group
  [resources of one worker] for the trial and waits for it.
- Several workers: the Tune trial itself (the trial driver) asks only `driver_resources` and starts at once:
  one unit of `TRIAL_DRIVER_RESOURCE`, which only the cluster's CPU head declares (so a driver never takes a
  slice of a GPU node and splits its trial over two nodes), or `TRIAL_CPU` where no node declares it. Inside
  it, Ray Train's `TorchTrainer` (Train V2) reserves one placement group for its worker group, bundles =
  [resources of one worker] * num_workers, and waits for it. Train drops that placement group after
  RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (60 s) and asks again, without end (`controller_failure_limit=-1`).
Either way a request no node can meet waits forever, and its only trace is a PENDING placement group of that
shape in the GCS. That is what `pipelines.sweeps.pending.PendingWatch` reads (`ray.util.placement_group_table`):
the same demand `ray status` lists under "Pending Demands" and an autoscaler adds nodes for.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator
from pydantic.dataclasses import dataclass

from pipelines.config.schema import STRICT
from pipelines.config.sources import PipelineConfigError

logger = logging.getLogger(__name__)

TRIAL_CPU = 0.1  # a trial of several workers only drives its TorchTrainer; Tune needs a non-zero request
# Declared by the head of ray_cluster.yaml and infra/kuberay/rayjob.yaml (a CPU node): one unit per trial driver,
# so drivers stay off GPU workers, and the amount declared bounds the drivers (processes) the head hosts.
TRIAL_DRIVER_RESOURCE = "capt_trial_driver"


@dataclass(config=STRICT)
class ResourcesSection:
    """Resources of one trial: Ray Train workers, each running one Accelerate process."""

    num_workers: PositiveInt = 1
    """Ray Train workers (processes) per trial."""
    gpus_per_worker: NonNegativeFloat = 0.0
    """GPUs per worker (0: CPU training with gloo)."""
    cpus_per_worker: PositiveFloat = 1.0
    """CPUs per worker."""
    custom_per_worker: dict[str, PositiveFloat] = Field(default_factory=dict)
    """Custom Ray resources per worker, e.g. {"accelerator_type:A100": 0.001} to land on A100 nodes, or a
    resource your nodes declare with `ray start --resources`."""
    max_concurrent_trials: PositiveInt | None = None
    """Upper bound on trials at once. On the local Ray the sweep starts: as many as it holds (every resource
    of a trial counted), and a larger value is lowered to that. On a cluster (RAY_ADDRESS): no bound by
    default, so Tune queues every trial and an autoscaler sees the whole demand and adds nodes up to its
    max_workers; a value given here is kept as given (it caps the nodes a sweep takes)."""
    pending_timeout_s: NonNegativeFloat | None = None
    """Seconds the trials' Ray Train workers may wait for their resources with no worker group of the sweep
    starting meanwhile; then the sweep stops (state saved for --resume) with an error naming the resources
    it waited for. null: 300 on the local Ray the sweep starts (nothing else frees resources there; a trial
    that can never fit is refused before it starts), off on a cluster (RAY_ADDRESS), which may be adding
    nodes; 0 (or off): wait forever. Either way the wait is reported every minute (a third of the timeout
    when shorter)."""

    @field_validator("gpus_per_worker")
    @classmethod
    def _whole_gpus_above_one(cls, value: float) -> float:
        if value > 1 and not float(value).is_integer():
            raise ValueError(f"{value:g} GPUs per worker: Ray gives a worker either a fraction of one GPU (at most 1) "
                             "or a whole number of GPUs")
        return value

    @field_validator("custom_per_worker")
    @classmethod
    def _custom_names(cls, value: dict[str, float]) -> dict[str, float]:
        built_in = sorted(set(value) & {"CPU", "GPU", "memory", "object_store_memory"})
        if built_in:
            raise ValueError(f"{', '.join(built_in)}: built into Ray, set by cpus_per_worker and gpus_per_worker "
                             "(custom_per_worker is for resources that nodes declare themselves)")
        if TRIAL_DRIVER_RESOURCE in value:
            raise ValueError(f"{TRIAL_DRIVER_RESOURCE}: the trial drivers' own resource, declared by the cluster's "
                             "head for them; name a resource your worker nodes declare")
        return value


class ResourcesError(PipelineConfigError):
    """One trial asks for resources the Ray cluster cannot give; the message names the request and the cluster."""


def worker_bundle(resources) -> dict[str, float]:
    """Ray resources of one Ray Train worker (a `ResourcesSection`): CPU, GPU when asked, custom resources."""
    bundle = {"CPU": float(resources.cpus_per_worker)}
    if resources.gpus_per_worker:
        bundle["GPU"] = float(resources.gpus_per_worker)
    return bundle | {name: float(amount) for name, amount in resources.custom_per_worker.items()}


def pack_resources(resources: ResourcesSection, members: int) -> ResourcesSection:
    """What a pack trial of `members` trials asks for (`pack:`; one process, one device): a trial's CPUs and custom
    resources (the process's threads and what it holds), and its share of a GPU once per member, up to one whole
    GPU (a share of 1 or more stays as given). The pack so reserves the device its members would hold as separate
    trials, and never more than the one device it trains on; it saves them the base model's copies."""
    gpus = resources.gpus_per_worker
    return dataclasses.replace(resources, gpus_per_worker=min(1.0, gpus * members) if 0 < gpus < 1 else gpus)


def runs_in_trial_process(resources) -> bool:
    """Whether a trial runs its job in the Tune trial's own process (one worker) rather than on Ray Train."""
    return resources.num_workers == 1


def trial_resources(resources, cluster: dict[str, float]):
    """What one Tune trial asks for (`tune.with_resources`): its worker's bundle when it runs the job itself,
    else `driver_resources(cluster)` for the process that drives the Ray Train worker group."""
    if runs_in_trial_process(resources):
        from ray.tune import PlacementGroupFactory

        return PlacementGroupFactory([worker_bundle(resources)])
    return driver_resources(cluster)


def driver_resources(cluster: dict[str, float]) -> dict[str, float]:
    """Ray resources of a multi-worker trial's driver (the Tune trial that runs its TorchTrainer), decided once
    from `cluster` (`ray.cluster_resources()`): one unit of `TRIAL_DRIVER_RESOURCE` where a node declares it
    (the head of this project's cluster files), else `TRIAL_CPU` (the local Ray, a cluster without it)."""
    if cluster.get(TRIAL_DRIVER_RESOURCE, 0.0) >= 1:
        return {TRIAL_DRIVER_RESOURCE: 1.0}
    return {"CPU": TRIAL_CPU}


def trial_demand(resources, driver: dict[str, float] | None = None) -> dict[str, float]:
    """What one trial holds while it trains: its workers, plus its driver (default: `TRIAL_CPU`) for a trial
    that drives Ray Train (a one-worker trial is its own worker)."""
    demand = {name: amount * resources.num_workers for name, amount in worker_bundle(resources).items()}
    if runs_in_trial_process(resources):
        return demand
    for name, amount in (driver or {"CPU": TRIAL_CPU}).items():
        demand[name] = demand.get(name, 0.0) + amount
    return demand


def trials_that_fit(resources, cluster: dict[str, float]) -> int:
    """How many trials the resources `cluster` has (e.g. `ray.cluster_resources()`) hold at once."""
    fits = min(math.floor(cluster.get(name, 0.0) / amount + 1e-9) for name, amount in trial_demand(resources).items())
    if per_worker := resources.gpus_per_worker:  # a fraction below 1 never spans two GPUs
        gpus = cluster.get("GPU", 0.0)
        workers = (round(gpus) * math.floor(1 / per_worker + 1e-9) if per_worker < 1
                   else math.floor(gpus / per_worker + 1e-9))
        fits = min(fits, workers // resources.num_workers)
    return int(fits)


def max_concurrent(resources, cluster: dict[str, float], local: bool = True) -> int | None:
    """Tune's `max_concurrent_trials`. Local Ray: the trials that fit now, `max_concurrent_trials` lowering
    that. Cluster: `max_concurrent_trials` as given, None (no bound) without it: the nodes present at start
    say nothing of what an autoscaler can add, and it adds nodes only for demand it sees queued."""
    wanted = resources.max_concurrent_trials
    if not local:
        return wanted
    fits = max(1, trials_that_fit(resources, cluster))
    return fits if wanted is None else min(fits, wanted)


def check_local_fit(resources, cluster: dict[str, float]) -> None:
    """Refuse a trial the local Ray (fixed resources, nothing to scale) can never start: one paragraph."""
    if trials_that_fit(resources, cluster) >= 1:
        return
    demand = trial_demand(resources)
    short = [f"{name} needs {amount:g}, has {cluster.get(name, 0.0):g}" for name, amount in demand.items()
             if amount > cluster.get(name, 0.0) + 1e-9]
    if not short:  # every total fits: the fractional GPUs cannot be packed onto whole GPUs
        short = [f"{resources.num_workers} workers of GPU {resources.gpus_per_worker:g} do not fit on "
                 f"{cluster.get('GPU', 0.0):g} GPU(s) (a fraction of a GPU never spans two)"]
    cpus_short = demand["CPU"] > cluster.get("CPU", 0.0) + 1e-9
    driver = "" if runs_in_trial_process(resources) else f" plus CPU {TRIAL_CPU:g} for the trial itself"
    raise ResourcesError(
        f"resources: one trial needs {fmt(demand)} ({resources.num_workers} worker(s) x {fmt(worker_bundle(resources))}"
        f"{driver}), but the local Ray this sweep started has "
        f"{fmt({name: cluster.get(name, 0.0) for name in demand})}: {'; '.join(short)}. Lower resources.num_workers, "
        "cpus_per_worker, gpus_per_worker or custom_per_worker, "
        + ("give the local Ray more CPUs with --num-cpus, or " if cpus_short else "")
        + "run on a cluster that has them (RAY_ADDRESS).")


def fmt(resources: dict[str, float]) -> str:
    """`{CPU: 1.1, GPU: 1}`: resource amounts as a user reads them."""
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in resources.items()) + "}"
