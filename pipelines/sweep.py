"""Sweep tasks x models x methods x seeds with Ray Tune; each trial trains with Accelerate (on Ray Train for N workers).

    RAY_AUTH_MODE=token ray job submit --working-dir . -- \\
        python pipelines/sweep.py --config pipelines/configs/paper/t5-base.yaml
    python pipelines/sweep.py                      # laptop: local Ray + local MLflow, embedded smoke sweep
    python pipelines/sweep.py --config FILE --resume   # finish an interrupted sweep, no trial twice
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (`python pipelines/sweep.py`, as `ray job submit` does)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.cli_errors import cli_main  # noqa: E402
from pipelines.services.ray_connect import ray_cluster  # noqa: E402
from pipelines.services.reaper import reap_on_death  # noqa: E402
from pipelines.sweeps.config import (  # noqa: E402
    SweepConfig,
    ignored_data_dir_note,
    load_sweep_config,
    trial_process_env,
    trials,
)
from pipelines.sweeps.interrupt import StopRequest, SweepInterrupted, stop_on_signals  # noqa: E402
from pipelines.sweeps.parent_run import SweepRun  # noqa: E402
from pipelines.sweeps.run import (  # noqa: E402
    hold_sweep_folder,
    promote_champions,
    refuse_a_running_sweep,
    run_sweep,
    sweep_folder_problems,
    tracking_server,
    unpromoted,
)
from pipelines.sweeps.summary import data_kinds, results_table, write_summary  # noqa: E402

logger = logging.getLogger("pipelines.sweep")
DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "smoke.yaml"
LOCAL_UI = "http://127.0.0.1:5000"
"""Where `make mlflow-ui` serves a local sweep's tracking data once the sweep's own server has stopped."""


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (also the `ray job submit` entrypoint): exit 0 when every trial is done and tracked, 1 when a
    trial failed, 2 on bad input (a trial refused by its own input, not retried, included), 3 when every trial is
    done but tracking operations wait for `tracking sync`,
    130 or 143 when SIGINT or SIGTERM stopped it (`--resume` finishes it)."""
    parser = argparse.ArgumentParser(prog="python pipelines/sweep.py", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="sweep YAML (default: the smoke sweep)")
    parser.add_argument("--resume", action="store_true", help="restore an interrupted sweep (Tuner.restore)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (no RAY_ADDRESS)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the sweep config")
    return cli_main(parser, argv, _sweep_from_cli)


def _sweep_from_cli(args: argparse.Namespace) -> int:
    sweep = load_sweep_config(args.config, args.overrides, more_checks=sweep_folder_problems)  # folders checked too
    logger.info("Sweep folder: %s", sweep.folder())
    if note := ignored_data_dir_note(sweep):
        logger.warning(note)
    try:
        with reap_on_death(), stop_on_signals() as stop:
            return _run_and_report(sweep, args, stop)
    except SweepInterrupted as interrupted:
        print(_stopped_message(interrupted, args), file=sys.stderr)
        return interrupted.exit_status


def _run_and_report(sweep: SweepConfig, args: argparse.Namespace, stop: StopRequest) -> int:
    # The local MLflow server boots while Ray starts; both are up before the first trial.
    refuse_a_running_sweep(sweep)  # at once; the lock itself is taken once the services answered
    with (tracking_server(sweep, wait=False) as endpoint, ray_cluster(args.num_cpus, trial_process_env(sweep)),
          hold_sweep_folder(sweep)):
        stop.install()  # ray.init's core replaced the SIGTERM handler
        uri = endpoint.ready()
        experiment_id, run_context = _describe_tracking(sweep, args.config, uri)
        parent = SweepRun(sweep, uri, experiment_id, run_context["tags"] if run_context else {})
        parent.nest(run_context)
        if run_context is not None:
            run_context["moved_from"] = endpoint.moved_from
        grid = run_sweep(sweep, uri, args.resume, run_context)
        if stop.signum is not None and uri:
            from pipelines.tracking.sweep_run import end_stopped_runs

            ended = end_stopped_runs(sweep.folder() / "jobs", uri, endpoint.moved_from)
            logger.info("Ended the runs of the stopped trials as KILLED: %s", ", ".join(ended) or "none")
            parent.stop()
        stop.raise_if_stopped()
        # imported here, with MLflow's client: a sweep refused before its trials ran (its config, a running driver,
        # resources) ends without that import's seconds
        from pipelines.sweeps.leftover import EXIT_NOT_FULLY_TRACKED, leftover_lines, upload_spooled

        uploaded = upload_spooled(sweep, uri, endpoint.moved_from)  # before promotion reads the registry
        table, rows = results_table(grid, data_kinds(sweep))
        table += "\n" + write_summary(sweep, rows)
        promoting = uri and sweep.tracking.register and sweep.tracking.promote
        champions = promote_champions(sweep, uri, rows) if promoting else []
        parent.finish(rows, unpromoted(sweep, rows, champions) if promoting else [])  # kept for sync if not closed
        endpoint.release()  # the local server shuts down while Ray does
    leftover = leftover_lines(sweep, uri, endpoint.local_server is not None)
    print("\n".join(["", table, *uploaded, *leftover, ""]))
    _print_where_to_look(sweep, uri, champions, experiment_id, parent.run_id)
    if any(r["status"] == "error" for r in rows):
        return 1
    if any(r["status"].startswith("refused") for r in rows):
        return 2  # refused by their own input: the closing table says why; nothing to retry
    if not all(r["status"] == "done" for r in rows):
        return 1
    return EXIT_NOT_FULLY_TRACKED if leftover else 0


def _stopped_message(interrupted: SweepInterrupted, args: argparse.Namespace) -> str:
    """What a stopped sweep says: what happened to the running trials, and the command that finishes it."""
    command = ["python", "pipelines/sweep.py", "--config", args.config, *args.overrides, "--resume"]
    if args.num_cpus is not None:
        command[4:4] = ["--num-cpus", str(args.num_cpus)]
    return (f"stopped: {interrupted} received; the trials that were running stopped and keep their last "
            "checkpoint, finished trials keep their results, and the services this sweep started are stopped. "
            f"Finish the sweep (no finished trial trains again) with:\n  {shlex.join(command)}")


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


def _print_where_to_look(sweep: SweepConfig, uri: str | None, champions: list[str], experiment_id: str | None,
                         sweep_run_id: str | None) -> None:
    print(f"Trial outputs: {sweep.folder() / 'jobs'}")
    if uri is None:
        return
    ui = _ui_uri(sweep, uri)
    if ui != uri:
        db = Path(sweep.tracking.local_dir).resolve()
        print("The sweep's local MLflow server has stopped. Start the UI on the same data (`make mlflow-ui` does this):"
              f"\n  mlflow server --backend-store-uri sqlite:///{db}/mlflow.db "
              f"--serve-artifacts --artifacts-destination {db}/artifacts --host 127.0.0.1 --port 5000")
    if experiment_id is not None:
        from pipelines.tracking.experiment import runs_url, sweep_run_url

        print(f"MLflow experiment {sweep.experiment_name()}, its runs: {runs_url(ui, experiment_id)}")
        if sweep_run_id is not None:
            own_run = sweep_run_url(ui, experiment_id, sweep_run_id)
            print(f"  That table lists the trials' runs best validation score first (Sort: validation/best_score); "
                  f"sorted by time they nest under the sweep's run {sweep.name} (sweep), whose report.png puts the "
                  f"scores side by side: {own_run}")
    else:
        print(f"MLflow experiment: {sweep.experiment_name()}  ({ui})")
    for name in champions:
        print(registry_line(name, ui, stopped=ui != uri))
    for line in serve_lines(sweep, champions, ui, stopped=ui != uri):
        print(line)


def serve_lines(sweep: SweepConfig, champions: list[str], uri: str, stopped: bool) -> list[str]:
    """The command that serves the champions, one per base model (a Serve app holds one base model and mixes its
    tasks): without --tracking-uri where serve finds the store by itself (the default local store), else the server's
    address (a local store elsewhere needs the `mlflow server` printed above)."""
    from pipelines.config.schema import model_slug
    from pipelines.provenance import registered_model_name
    from pipelines.services.mlflow_server import LOCAL_STORE

    if not stopped:
        where = f" --tracking-uri {uri}"
    elif Path(sweep.tracking.local_dir).absolute() == LOCAL_STORE.absolute():
        where = ""
    else:
        where = f" --tracking-uri {uri}   (with the `mlflow server` above running)"
    lines = []
    for model in sweep.models:
        tasks = [task for task in sweep.tasks if registered_model_name(model_slug(model), task) in champions]
        if tasks:
            lines.append(f"Serve: python -m pipelines.serve --model {model} --tasks {','.join(tasks)}{where}")
    return lines


def registry_line(name: str, uri: str, stopped: bool) -> str:
    """How to load a champion: the server it needs (the sweep's own has stopped: `make mlflow-ui` serves the store
    again) and a row of its task's fields, so that the line runs as printed."""
    from capt.tasks import example_rows

    task = name.rsplit("-", 1)[-1]
    row = repr(example_rows(task, 1))  # Python's quotes, inside the shell's double quotes
    needs = "with `make mlflow-ui` running (the sweep's server has stopped), " if stopped else ""
    # no retries and a 10 s timeout: with no server answering, the line fails in seconds instead of minutes
    return (f"Registry: {name}@champion   ({needs}rows are the task's fields: MLFLOW_TRACKING_URI={uri} "
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES=0 MLFLOW_HTTP_REQUEST_TIMEOUT=10 python -c "
            f"\"from pipelines.tracking import load_capsule_model; "
            f"print(load_capsule_model('models:/{name}@champion').predict({row}))\")")


if __name__ == "__main__":
    sys.exit(main())
