"""Sweep tasks x models x methods x seeds with Ray Tune; each trial trains with Accelerate (on Ray Train for N workers).

    RAY_AUTH_MODE=token ray job submit --working-dir . -- python pipelines/sweep.py --config pipelines/configs/paper/t5-base.yaml
    python pipelines/sweep.py                      # laptop: local Ray + local MLflow, embedded smoke sweep
    python pipelines/sweep.py --config FILE --resume   # finish an interrupted sweep, no trial twice
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __package__ in (None, ""):  # run as a script (`python pipelines/sweep.py`, as `ray job submit` does)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.cli_errors import add_debug_flag, run_cli  # noqa: E402
from pipelines.config import JobConfigError, model_slug  # noqa: E402
from pipelines.ray_connect import ray_cluster  # noqa: E402
from pipelines.sweep_config import SweepConfig, load_sweep_config, trials  # noqa: E402
from pipelines.sweep_pending import PendingWatch, pending_timeout  # noqa: E402
from pipelines.sweep_resources import (  # noqa: E402
    check_local_fit,
    runs_in_trial_process,
    trial_resources,
)
from pipelines.sweep_resources import max_concurrent as _trials_at_once  # noqa: E402
from pipelines.sweep_select import chosen_labels, select_label  # noqa: E402

logger = logging.getLogger("pipelines.sweep")
DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "smoke.yaml"
LOCAL_UI = "http://127.0.0.1:5000"
"""Where `make mlflow-ui` serves a local sweep's tracking data once the sweep's own server has stopped."""


def param_space(sweep: SweepConfig) -> dict:
    """Tune's space: one grid axis over the valid (task, model, method, seed) points, plus the search."""
    from ray import tune

    points = [{"task": t.task, "model": t.model, "method": t.method, "seed": t.seed, "select": t.select}
              for t in trials(sweep)]
    space = {"point": tune.grid_search(points)}
    for key, spec in sweep.search.items():
        kind, values = next(iter(spec.items()))
        space[key] = tune.grid_search(values) if kind == "grid" else getattr(tune, kind)(*(
            [values] if kind == "choice" else values))
    return space


def _trial_name(trial) -> str:
    point = trial.config["point"]
    name = f"{point['task']}-{model_slug(point['model'])}-{point['method']}-s{point['seed']}"
    extra = sorted([*point.get("select", {}).items(), *((k, v) for k, v in trial.config.items() if k != "point")])
    return name + "".join(f"-{k}={v:.3g}" if isinstance(v, float) else f"-{k}={v}" for k, v in extra)


def max_concurrent(sweep: SweepConfig, cluster: dict[str, float], local: bool = True) -> int | None:
    """Tune's bound on trials at once (None: none, on a cluster that may scale; see `ResourcesSection`)."""
    return _trials_at_once(sweep.resources, cluster, local)


def run_sweep(sweep: SweepConfig, tracking_uri: str | None, resume: bool, run_context: dict | None = None):
    """Fit (or restore and finish) the Tune experiment of `sweep`; returns Tune's ResultGrid.

    `run_context`: source tags and the UI's URI for every trial's run (`pipelines.sweep_trial.run_trial`).

    Raises `ResourcesError` before the first trial when the local Ray cannot hold one, and after
    `resources.pending_timeout_s` when the trials' workers wait that long for resources.
    """
    import ray
    from ray import tune

    from pipelines.sweep_trial import run_trial

    local = not os.environ.get("RAY_ADDRESS")  # as `ray_cluster` decides: no address, a local Ray of our own
    cluster = ray.cluster_resources()
    if local:
        check_local_fit(sweep.resources, cluster)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, sweep=asdict(sweep), tracking_uri=tracking_uri, run_context=run_context), trial_resources(sweep.resources, cluster))
    path = sweep.storage_root() / sweep.name
    if resume and tune.Tuner.can_restore(str(path)):
        logger.info("Resuming sweep %s from %s", sweep.name, path)
        tuner = tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True)
    else:
        scheduler = tune.schedulers.ASHAScheduler(grace_period=1) if sweep.scheduler == "asha" else None
        tuner = tune.Tuner(
            trainable, param_space=param_space(sweep),
            tune_config=tune.TuneConfig(
                metric="validation_score", mode="max", num_samples=sweep.num_samples, scheduler=scheduler,
                max_concurrent_trials=max_concurrent(sweep, cluster, local),
                # one-worker trials run in the trial process: reusing it skips a process start and a model load
                reuse_actors=runs_in_trial_process(sweep.resources),
                trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
            run_config=tune.RunConfig(name=sweep.name, storage_path=str(sweep.storage_root()),
                                      failure_config=tune.FailureConfig(max_failures=trial_retries(sweep))),
        )
    with PendingWatch(sweep.resources, pending_timeout(sweep.resources, local)) as watch:
        grid = tuner.fit()
    watch.raise_if_gave_up()
    return grid


def trial_retries(sweep: SweepConfig) -> int:
    """Tune's retries of a failed trial. A one-worker trial has no Ray Train worker group to restart: Tune retries
    it as often as both levels together would have started its worker, (trial + 1) x (worker + 1) - 1 times."""
    failure = sweep.failure
    if runs_in_trial_process(sweep.resources):
        return (failure.trial_max_failures + 1) * (failure.worker_max_failures + 1) - 1
    return failure.trial_max_failures


@contextlib.contextmanager
def tracking_server(sweep: SweepConfig, wait: bool = True) -> Iterator[TrackingEndpoint]:
    """The MLflow server to use: the configured one (checked now), or a local server started and stopped here.

    With ``wait=False`` the local server is only launched: the caller starts Ray meanwhile and calls
    `TrackingEndpoint.ready` before the first trial. Leaving the block stops the server.
    """
    from pipelines.services import LocalMlflowServer
    from pipelines.services.mlflow_probe import check_mlflow_server

    uri = sweep.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not sweep.tracking.enabled:
        yield TrackingEndpoint(None)
        return
    if uri:
        refuse_credentials_in_uri(uri)
        check_mlflow_server(uri, "MLflow tracking server (tracking.uri or MLFLOW_TRACKING_URI)")
        yield TrackingEndpoint(uri)
        return
    server = LocalMlflowServer(Path(sweep.tracking.local_dir)).start(wait=wait)
    try:
        yield TrackingEndpoint(server.uri, server)
    finally:
        server.stop()


@dataclass
class TrackingEndpoint:
    """The sweep's tracking URI (None: tracking off) and, for a local server, the server behind it."""

    uri: str | None
    """What trials log to."""
    local_server: Any = None
    """The `LocalMlflowServer` this sweep started, if any."""

    def release(self) -> None:
        """Nothing more will be logged: a local server may begin shutting down (the block's end waits for it)."""
        if self.local_server is not None:
            self.local_server.terminate()

    def ready(self) -> str | None:
        """The URI, once the server answers (a local server still starting is waited for)."""
        if self.local_server is not None:
            self.local_server.wait_ready()
        return self.uri


def refuse_credentials_in_uri(uri: str) -> None:
    """A tracking URI with `user:password@` would travel to every trial in Ray's metadata and run records."""
    parts = urlsplit(uri)
    if parts.username or parts.password:
        shown = parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl()
        raise JobConfigError(
            f"tracking.uri (or MLFLOW_TRACKING_URI) holds credentials ({shown} with a user name or password in "
            "it): they would be visible in Ray's job metadata and in every trial's run record. Give the URI "
            "without them and set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD in the environment of the "
            "driver and of the cluster's nodes (infra/README.md).")


def results_table(grid) -> tuple[str, list[dict]]:
    """A plain-text table of the trials (task, model, method, seed, validation, test, status).

    With `select:`, each (task, model, method) shows only the trials of the value chosen on validation
    (`pipelines.sweep_select`) and failed trials; every row is returned, marked `chosen`.
    """
    rows = []
    for result in grid:
        point, metrics = result.config["point"], result.metrics or {}
        rows.append({"task": point["task"], "model": model_slug(point["model"]), "method": point["method"],
                     "seed": point["seed"], "select": select_label(point.get("select", {})),
                     "validation": metrics.get("best_validation_score"),
                     "test": metrics.get("test_score"), "status": "error" if result.error else "done"})
    chosen = chosen_labels(rows)
    for r in rows:
        r["chosen"] = chosen.get((r["model"], r["task"], r["method"]), r["select"]) == r["select"]  # no score: no choice
    rows.sort(key=lambda r: (r["model"], r["task"], r["method"], r["select"], r["seed"]))
    width = max([6, *(len(r["select"]) for r in rows)]) if any(r["select"] for r in rows) else 0
    header = f"{'task':<8} {'model':<16} {'method':<22} {'select':<{width}} {'seed':>4} {'valid':>7} {'test':>7}  status"
    lines = [header, "-" * len(header)]
    for r in rows:
        if r["chosen"] or r["status"] != "done":
            lines.append(f"{r['task']:<8} {r['model']:<16} {r['method']:<22} {r['select']:<{width}} {r['seed']:>4} "
                         f"{_fmt(r['validation']):>7} {_fmt(r['test']):>7}  {r['status']}")
    if width:
        lines.append(f"select: per (task, model, method), the value with the best mean validation score over seeds; "
                     f"{sum(not r['chosen'] and r['status'] == 'done' for r in rows)} trials of other values not shown.")
    return "\n".join(lines), rows


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def promote_champions(sweep: SweepConfig, tracking_uri: str, rows: list[dict]) -> list[str]:
    """Promote the best capsule by validation score of every (model, task) this sweep registered; returns the
    model names."""
    from pipelines.promote import SELECTION_METRIC, PromotionError, promote

    capsule_rows = {e.key for e in sweep.methods if e.name == "capt"}
    names = []
    for model, task in sorted({(r["model"], r["task"]) for r in rows if r["status"] == "done" and r["method"] in capsule_rows}):
        try:
            promote(tracking_uri=tracking_uri, model=model, task=task, metric=SELECTION_METRIC)
            names.append(f"capt-{model}-{task}")
        except PromotionError as err:
            logger.warning("Not promoted: %s", err)
    return names


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (also the `ray job submit` entrypoint); exit 2 on bad input, 1 when a trial failed."""
    parser = argparse.ArgumentParser(prog="python pipelines/sweep.py", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="sweep YAML (default: the smoke sweep)")
    parser.add_argument("--resume", action="store_true", help="restore an interrupted sweep (Tuner.restore)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (no RAY_ADDRESS)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the sweep config")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_cli(lambda: _sweep_from_cli(args), args.debug)


def _sweep_from_cli(args: argparse.Namespace) -> int:
    sweep = load_sweep_config(args.config, args.overrides)
    # The local MLflow server boots while Ray starts; both are up before the first trial.
    with tracking_server(sweep, wait=False) as endpoint, ray_cluster(args.num_cpus):
        uri = endpoint.ready()
        experiment_id, run_context = _describe_tracking(sweep, args.config, uri)
        grid = run_sweep(sweep, uri, args.resume, run_context)
        table, rows = results_table(grid)
        promoting = uri and sweep.tracking.register and sweep.tracking.promote
        champions = promote_champions(sweep, uri, rows) if promoting else []
        endpoint.release()  # the local server shuts down while Ray does
    print(f"\n{table}\n")
    _print_where_to_look(sweep, uri, champions, experiment_id)
    return 0 if all(r["status"] == "done" for r in rows) else 1


def _ui_uri(sweep: SweepConfig, uri: str) -> str:
    """Where a person browses this sweep's tracking data: `make mlflow-ui`'s address for a local server (it stops
    with the sweep), else the configured server."""
    return LOCAL_UI if not (sweep.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")) else uri


def _describe_tracking(sweep: SweepConfig, config_file: str, uri: str | None) -> tuple[str | None, dict | None]:
    """(experiment id, run context): the experiment described in MLflow, the source tags of every run."""
    if uri is None:
        return None, None
    from pipelines.tracking.experiment import describe_sweep, source_tags

    shown = os.path.relpath(config_file) if Path(config_file).is_absolute() else config_file
    experiment_id = describe_sweep(sweep, shown, len(trials(sweep)), uri)
    return experiment_id, {"tags": {**source_tags("pipelines/sweep.py"), "config_file": shown},
                           "ui_uri": _ui_uri(sweep, uri)}


def _print_where_to_look(sweep: SweepConfig, uri: str | None, champions: list[str], experiment_id: str | None) -> None:
    print(f"Trial outputs: {sweep.storage_root() / sweep.name / 'jobs'}")
    if uri is None:
        return
    ui = _ui_uri(sweep, uri)
    if ui != uri:
        db = Path(sweep.tracking.local_dir).resolve()
        print("The sweep's local MLflow server has stopped. Start the UI on the same data (`make mlflow-ui` does this):"
              f"\n  mlflow server --backend-store-uri sqlite:///{db}/mlflow.db "
              f"--serve-artifacts --artifacts-destination {db}/artifacts --host 127.0.0.1 --port 5000")
    if experiment_id is not None:
        from pipelines.tracking.experiment import runs_url

        print(f"MLflow experiment {sweep.experiment_name()}, its runs: {runs_url(ui, experiment_id)}")
    else:
        print(f"MLflow experiment: {sweep.experiment_name()}  ({ui})")
    uri = ui
    for name in champions:
        print(f"Registry: {name}@champion   (MLFLOW_TRACKING_URI={uri}; "
              f"mlflow.pyfunc.load_model('models:/{name}@champion').predict(rows))")


if __name__ == "__main__":
    sys.exit(main())
