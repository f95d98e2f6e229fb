"""Benchmark 3: what the sweep machinery costs: Ray Tune + Ray Train + MLflow against plain `run()` calls.

`python pipelines/sweep.py --config pipelines/configs/bench/overhead.yaml` in a subprocess (its own local Ray and
MLflow) against the same trial jobs back to back in this warm process, repetitions alternating the order; Ray and
MLflow start-up measured on their own. Targets apply to trials of about a minute of their own work (`MINUTE_TRIALS`),
whose in-process reference runs torch on the trial's `resources.cpus_per_worker` threads (README).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import (
    OFFLINE_ENV,
    REPO,
    BenchResult,
    Table,
    at_least,
    at_most,
    median,
    run_logged,
    spread,
)
from benchmarks.plots import grouped_bars

NAME = "pipeline_overhead"
TITLE = "Pipeline overhead: a Ray + MLflow sweep against the same jobs in one process"
CONFIG = "pipelines/configs/bench/overhead.yaml"
MLFLOW_PROBE = "mlflow server start -> /health"
MLFLOW_IN_SWEEP = "MLflow server and Ray start (together) -> both ready, inside the sweep (its log)"
_MANY_EPOCHS = "job.train.max_epochs=1000"  # the step count, not the 8-step epochs, ends these jobs
MINUTE_TRIALS = {"quick": ["seeds=[0]", _MANY_EPOCHS, "job.train.max_steps=1200", "job.train.eval_every_steps=400"],
                 "full": ["seeds=[0,1,2]", _MANY_EPOCHS, "job.train.max_steps=3500", "job.train.eval_every_steps=500"]}
"""Overrides for trials of about a minute of their own work on one thread of the 2-CPU machine (quick: 20 s)."""
OVERHEAD_GOAL_S = 5.0
EFFICIENCY_GOAL = 0.8
RAY_PROBE = """
import json, logging, time
t0 = time.perf_counter(); import ray; t1 = time.perf_counter()
ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
t2 = time.perf_counter(); ray.shutdown(); t3 = time.perf_counter()
print(json.dumps({"ray import": t1 - t0, "ray.init (local)": t2 - t1, "ray.shutdown": t3 - t2}))
"""


def settings(quick: bool) -> dict[str, Any]:
    """Trials per sweep, repetitions and the sweep's time limit (quick: 1 trial, once)."""
    if quick:
        return {"config": CONFIG, "overrides": ["seeds=[0]"], "repeats": 1, "startup_repeats": 1,
                "mlflow_probe": False, "timeout_s": 600, "minute_overrides": MINUTE_TRIALS["quick"]}
    return {"config": CONFIG, "overrides": [], "repeats": 2, "startup_repeats": 3, "mlflow_probe": True,
            "timeout_s": 1200, "minute_overrides": MINUTE_TRIALS["full"]}


def _local_overrides(tmp: Path, index: int) -> list[str]:
    return [f"storage_path={tmp / f'sweeps{index}'}", f"tracking.local_dir={tmp / f'mlflow{index}'}"]


def run_sweep(config: dict[str, Any], tmp: Path, index: int) -> dict[str, Any]:
    """One sweep subprocess; its wall time and the fit times its trials wrote to result.json."""
    from pipelines.services.probe import log_tail
    from pipelines.sweeps.config import load_sweep_config

    overrides = [*config["overrides"], *_local_overrides(tmp, index)]
    sweep = load_sweep_config(REPO / config["config"], overrides)
    cmd = [sys.executable, "pipelines/sweep.py", "--config", config["config"], "--num-cpus", "2", *overrides]
    log = tmp / f"sweep{index}.log"
    code, wall = run_logged(cmd, log, env=OFFLINE_ENV, timeout=config["timeout_s"])
    if code != 0:
        raise RuntimeError(f"the sweep exited with {code}; last lines of {log}:\n{log_tail(log, lines=25)}")
    results = [json.loads(p.read_text()) for p in (sweep.storage_root() / sweep.name / "jobs").glob("*/result.json")]
    return {"wall_s": wall, "trials": len(results), "fit_s": sum(r["wall_time_s"] for r in results),
            "mlflow_start_s": mlflow_start_in_log(log)}


def mlflow_start_in_log(log: Path) -> float | None:
    """Seconds from the sweep's "starting MLflow server" log line to its "MLflow server ready" line: its whole
    start-up of both services (it starts Ray between the two and waits for the server only then)."""
    stamps = {}
    for line in log.read_text(errors="replace").splitlines():
        for key, marker in (("start", "starting MLflow server"), ("ready", "MLflow server ready")):
            if marker in line and key not in stamps:
                with contextlib.suppress(ValueError):
                    stamps[key] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return (stamps["ready"] - stamps["start"]).total_seconds() if len(stamps) == 2 else None


def run_in_process(config: dict[str, Any], tmp: Path, index: int, limit: int | None = None,
                   trial_threads: bool = False) -> dict[str, Any]:
    """The sweep's trial jobs, back to back through `pipelines.training.loop.run`; total wall and fit times. With
    `trial_threads`, torch uses the trial's `resources.cpus_per_worker` threads (as in the sweep)."""
    import torch

    from pipelines.config.load import validate_job_config
    from pipelines.sweeps.config import load_sweep_config, trials
    from pipelines.training.loop import run as train_run

    sweep = load_sweep_config(REPO / config["config"], [*config["overrides"], *_local_overrides(tmp, index)])
    walls, fits, threads = [], [], torch.get_num_threads()
    torch.set_num_threads(max(1, int(sweep.resources.cpus_per_worker)) if trial_threads else threads)
    try:
        for trial in trials(sweep)[:limit]:
            job = {**trial.job, "output_dir": str(tmp / f"inproc{index}" / trial.name)}
            start = time.perf_counter()
            result = train_run(validate_job_config(job))
            walls.append(time.perf_counter() - start)
            fits.append(result["wall_time_s"])
    finally:
        torch.set_num_threads(threads)
    return {"wall_s": sum(walls), "trials": len(walls), "fit_s": sum(fits)}


def ray_startup() -> dict[str, float]:
    """`import ray`, a local `ray.init` and `ray.shutdown`, timed in a fresh process."""
    done = subprocess.run([sys.executable, "-c", RAY_PROBE], capture_output=True, text=True, timeout=300,
                          cwd=REPO, start_new_session=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the Ray start-up probe failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mlflow_startup(directory: Path) -> dict[str, float]:
    """`LocalMlflowServer` on a fresh database: start until /health answers 200, then stop."""
    from pipelines.services import LocalMlflowServer

    server = LocalMlflowServer(directory)
    start = time.perf_counter()
    try:
        server.start()
        ready = time.perf_counter()
    finally:
        server.stop()
    return {MLFLOW_PROBE: ready - start, "mlflow server stop": time.perf_counter() - ready}


def side_by_side(sweep: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    """The columns of both comparisons: walls, overhead per trial, sweep efficiency, fit times, trials done."""
    return {"sweep_s": sweep["wall_s"], "in_process_s": local["wall_s"],
            "overhead_per_trial_s": (sweep["wall_s"] - local["wall_s"]) / local["trials"],
            "sweep_efficiency": local["wall_s"] / sweep["wall_s"], "fit_in_sweep_s": sweep["fit_s"],
            "fit_in_process_s": local["fit_s"], "trials_done_in_sweep": sweep["trials"]}


def compare(config: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    """Sweep and in-process runs, alternating which goes first; one row per repetition."""
    run_in_process(config, tmp, 99, limit=1)  # warm this process: imports, tokenizer, first-use caches
    rows = []
    for index in range(config["repeats"]):
        order = ("sweep", "in_process") if index % 2 else ("in_process", "sweep")
        measured = {kind: (run_sweep if kind == "sweep" else run_in_process)(config, tmp, index) for kind in order}
        sweep, local = measured["sweep"], measured["in_process"]
        rows.append({"repetition": index + 1, "trials": local["trials"], **side_by_side(sweep, local),
                     "mlflow_start_in_sweep_s": sweep["mlflow_start_s"]})
    return rows


def compare_minute_trials(config: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """One sweep of about-a-minute trials and the same jobs in process (trial threads); one row."""
    minute = {**config, "overrides": config["minute_overrides"]}
    local = run_in_process(minute, tmp, 50, trial_threads=True)
    sweep = run_sweep(minute, tmp, 51)
    return {"trials": local["trials"], "trial_s": local["wall_s"] / local["trials"], **side_by_side(sweep, local)}


def minute_targets(row: dict[str, Any]) -> list:
    """The issue's goals for trials of about a minute: net overhead per trial and sweep efficiency."""
    label = f"{row['trials']} trial(s) of {row['trial_s']:.0f} s"
    return [at_most(f"pipeline overhead per trial, net of start-up ({label})", row["overhead_per_trial_net_s"],
                    OVERHEAD_GOAL_S, " s"),
            at_least(f"sweep efficiency ({label})", row["sweep_efficiency"], EFFICIENCY_GOAL)]


def startups(config: dict[str, Any], tmp: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start-up and stop costs of Ray and MLflow (probes alternated; the sweep's own MLflow start from its log)."""
    samples: dict[str, list[float]] = {}
    for index in range(config["startup_repeats"]):
        measured = ray_startup()
        if config["mlflow_probe"]:
            measured |= mlflow_startup(tmp / f"mlflow-start{index}")
        for name, value in measured.items():
            samples.setdefault(name, []).append(value)
    in_sweep = [r["mlflow_start_in_sweep_s"] for r in rows if r["mlflow_start_in_sweep_s"] is not None]
    if in_sweep:
        samples[MLFLOW_IN_SWEEP] = in_sweep
    return [{"component": name, "median_s": median(values), "range_s": spread(values), "samples": len(values)}
            for name, values in samples.items()]


def fixed_costs(starts: list[dict[str, Any]]) -> float:
    """What a sweep pays once: its services' start-up (from its log, else the probes' ray.init + MLflow start) plus
    ray.shutdown (the MLflow server stops meanwhile)."""
    cost = {r["component"]: r["median_s"] for r in starts}
    start = cost.get(MLFLOW_IN_SWEEP, cost.get("ray.init (local)", 0.0) + cost.get(MLFLOW_PROBE, 0.0))
    return start + max(cost.get("ray.shutdown", 0.0), cost.get("mlflow server stop", 0.0))


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Both comparisons, the derived per-trial overhead net of start-up, and a plot."""
    result = BenchResult(NAME, TITLE, config)
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        rows = compare(config, Path(tmp))
        minute = compare_minute_trials(config, Path(tmp))
        starts = startups(config, Path(tmp), rows)
    start_cost = fixed_costs(starts)
    for row in [*rows, minute]:
        row["overhead_per_trial_net_s"] = (row["sweep_s"] - row["in_process_s"] - start_cost) / row["trials"]
    columns = ["sweep_s", "in_process_s", "overhead_per_trial_s", "overhead_per_trial_net_s", "sweep_efficiency",
               "fit_in_sweep_s", "fit_in_process_s"]
    result.tables.append(Table("Sweep (subprocess, local Ray + MLflow) against the same jobs in one process",
                               ["repetition", "trials", *columns], rows))
    result.tables.append(Table("Trials of about a minute: sweep against the same jobs in one process (trial threads)",
                               ["trials", "trial_s", *columns], [minute]))
    result.targets += minute_targets(minute)
    result.tables.append(Table("Start-up and stop costs", ["component", "median_s", "range_s", "samples"], starts))
    grouped_bars({f"rep {r['repetition']}": {"sweep": r["sweep_s"], "in process": r["in_process_s"]} for r in rows},
                 out_dir / "pipeline_overhead.png", f"{rows[0]['trials']} trial(s): sweep vs one process", "wall s")
    result.plots.append("pipeline_overhead.png")
    result.notes += [
        f"Config {config['config']} with overrides {config['overrides'] or 'none'} (tiny T5, generated CB data, "
        "8 steps, validation every 4); the sweep runs trials one at a time on --num-cpus 2.",
        "overhead_per_trial_s = (sweep wall - in-process wall) / trials; sweep_efficiency = in-process wall / "
        "sweep wall. The sweep wall includes the interpreter start, imports, MLflow and Ray start-up, Ray "
        "Train worker groups, MLflow logging, capsule registration and promotion, and shutdown.",
        "overhead_per_trial_net_s also subtracts the once-per-sweep costs (the sweep's start of Ray and its "
        "MLflow server, which overlap, from its log; then ray.shutdown, which the server's stop overlaps), "
        "leaving what each trial adds.",
        "fit_in_sweep_s / fit_in_process_s: the jobs' own `fit` time (result.json wall_time_s), summed. Inside "
        "the sweep it includes MLflow logging at each validation, and the Ray Train worker runs torch with "
        "cpus_per_worker (1) threads, where this process uses all cores.",
        f"Trials of about a minute: overrides {config['minute_overrides']}; trial_s is one in-process job's wall "
        "time, with torch on the trial's cpus_per_worker threads, as in the sweep. The targets (<= "
        f"{OVERHEAD_GOAL_S:g} s net overhead per trial, efficiency >= {EFFICIENCY_GOAL:g}) apply to this row; "
        "the efficiency includes the once-per-sweep start-up, so a quick run's single short trial misses it "
        "by construction.",
    ]
    return result
