"""The device check's sweep: `python pipelines/sweep.py` in a subprocess, as a user starts it, and its trials'
result.json files as the table.

Its Ray is a local one of its own (`--num-cpus`) unless `ray_address` is given (then RAY_ADDRESS), and its MLflow
server a local one unless `tracking_uri` is given (`tracking.uri`): a test passes the session's Ray head and
server, so the smoke run starts neither.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import OFFLINE_ENV, REPO, BenchResult, Table, at_least, log_tail, run_logged

logger = logging.getLogger(__name__)

COLUMNS = ["trial", "model", "seed", "steps", "wall_time_s", "tokens_per_second", "peak_memory_mb", "dtype",
           "precision", "test_score"]
TRIALS = 4
"""Trials the sweep config holds (seeds 0-3)."""


def command(config: dict[str, Any], overrides: list[str]) -> tuple[list[str], dict[str, str]]:
    """The sweep's command line and its extra environment."""
    cmd = [sys.executable, "pipelines/sweep.py", "--config", config["config"]]
    env = dict(OFFLINE_ENV)
    if config.get("ray_address"):
        env["RAY_ADDRESS"] = config["ray_address"]
    else:
        cmd += ["--num-cpus", str(config["num_cpus"])]
    return [*cmd, *overrides], env


def trial_row(result: dict[str, Any]) -> dict[str, Any]:
    """One trial's table row from its result.json."""
    job = result["config"]
    return {"trial": Path(result["artifact_dir"]).parent.name, "model": result["model"], "seed": result["seed"],
            "steps": result["steps"], "wall_time_s": result["wall_time_s"],
            "tokens_per_second": result.get("tokens_per_second"), "peak_memory_mb": result.get("peak_memory_mb"),
            "dtype": job["model"]["dtype"], "precision": job["train"]["precision"],
            "test_score": result["metrics"].get("test_score")}


def run(config: dict[str, Any], tmp: Path) -> BenchResult:
    """Run the sweep; one row per finished trial, and the sweep's wall time against the trials' own."""
    from pipelines.sweeps.config import load_sweep_config

    overrides = [*config["overrides"], "name=device-check", f"storage_path={tmp / 'sweeps'}",
                 f"tracking.local_dir={tmp / 'mlflow'}",
                 *([f"tracking.uri={config['tracking_uri']}"] if config.get("tracking_uri") else [])]
    sweep = load_sweep_config(REPO / config["config"], overrides)
    cmd, env = command(config, overrides)
    log = Path(config["log"])
    logger.info("sweep: %s", " ".join(cmd))
    code, wall = run_logged(cmd, log, env=env, timeout=config["timeout_s"])
    if code != 0:
        raise RuntimeError(f"the sweep exited with {code}; last lines of its log:\n{log_tail(log)}")
    results = [json.loads(p.read_text()) for p in sorted((sweep.storage_root() / sweep.name / "jobs").glob(
        "*/result.json"))]
    rows = [trial_row(r) for r in results]
    fit = sum(r["wall_time_s"] for r in rows)
    result = BenchResult("device_sweep", "A sweep of 4 trials sharing the device", config)
    result.tables += [Table("Trials (result.json)", COLUMNS, rows),
                      Table("The sweep", ["trials", "sweep_wall_s", "trials_fit_s", "fit_over_wall"],
                            [{"trials": len(rows), "sweep_wall_s": wall, "trials_fit_s": fit,
                              "fit_over_wall": fit / wall}])]
    result.targets.append(at_least("sweep trials finished", len(rows), TRIALS))
    result.notes.append("sweep_wall_s: the whole `pipelines/sweep.py` process (services' start-up and shutdown "
                        "included when it starts its own); fit_over_wall above 1 means trials overlapped.")
    return result
