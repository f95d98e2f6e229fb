"""Benchmark 6: the Ray Serve app under a bounded local load, 1 task alone against 7 and 50 tasks mixed.

Seven real capsules (one tiny-t5 CaPT job per task on generated data, a few steps each) are served by
`pipelines.serving.app` exactly as `python -m pipelines.serve` serves registry versions, minus the
registry: three applications on one local Ray + Serve, HTTP on 127.0.0.1 only, holding 1 capsule (RTE),
the 7, and 50 (copies of the 7 on disk, each loaded as its own capsule). A fixed number of requests
(each a few raw rows of its capsule's task, cycling through the capsules) is sent by a fixed number of
client threads, stopped early at a time limit; the three are measured round-robin, several rounds.
Reported: rows per second, request latency p50/p99, the replica's resident memory and the capsules' bytes.
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Table, at_least, at_most

TOKEN = secrets.token_urlsafe(32)
"""The bearer token of the applications under load (checked on every request, as when served)."""
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}

logger = logging.getLogger(__name__)

NAME = "serving"
TITLE = "Serving: Ray Serve app, one frozen base model, 1 task alone vs 7 and 50 tasks mixed"
TASKS = ("boolq", "cb", "copa", "multirc", "rte", "wic", "csqa")
SINGLE = "rte"


def settings(quick: bool) -> dict[str, Any]:
    """Load shape and repetitions (quick: fewer requests and rounds)."""
    common = {"model": "tiny-t5", "task_counts": [1, 7, 50], "rows_per_request": 2, "concurrency": 8,
              "max_batch_requests": 8, "batch_wait_s": 0.005, "train_steps": 2, "memory_limit_mb": 16.0}
    if quick:
        return {**common, "requests": 40, "rounds": 1, "duration_s": 60.0}
    return {**common, "requests": 240, "rounds": 3, "duration_s": 120.0}


def train_capsules(directory: Path, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One short real CaPT job per task; {task: its result dict}."""
    from pipelines.config.load import load_job_config
    from pipelines.train import run

    results = {}
    for task in TASKS:
        job = load_job_config(None, [], base={
            "model": {"name": config["model"], "max_length": 96},
            "task": {"name": task, "source": "generated", "generated_size": 16, "max_eval_examples": 4},
            "method": {"name": "capt"}, "output_dir": str(directory / task),
            "train": {"batch_size": 8, "eval_batch_size": 8, "max_steps": config["train_steps"],
                      "eval_every_steps": config["train_steps"], "eval_mode": "rank", "patience": None}})
        results[task] = run(job)
    return results


def capsule_sets(results: dict[str, dict[str, Any]], counts: list[int], directory: Path) -> dict[int, list]:
    """{count: served capsules}: 1 is RTE alone, 7 the real ones, more are on-disk copies of them in turn."""
    from pipelines.serving.engine import ServedCapsule

    def served(name: str, task: str, folder: Path) -> ServedCapsule:
        return ServedCapsule(name, task, f"local-{name}", 1, folder, results[task])

    sets = {}
    for count in counts:
        if count == 1:
            sets[count] = [served(SINGLE, SINGLE, Path(results[SINGLE]["artifact_dir"]))]
            continue
        chosen = []
        for i in range(count):
            task = TASKS[i % len(TASKS)]
            folder = Path(results[task]["artifact_dir"])
            if i >= len(TASKS):
                folder = Path(shutil.copytree(folder, directory / f"copy-{i}-{task}"))
            chosen.append(served(task if i < len(TASKS) else f"{task}-{i}", task, folder))
        sets[count] = chosen
    return sets


def _post(url: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=HEADERS)
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
    return time.perf_counter() - started


def load(url: str, capsules: list, rows: dict[str, list], config: dict[str, Any]) -> dict[str, Any]:
    """Send the fixed request count (stopping at the time limit); rows/s and per-request latencies."""
    bodies = [{"task": c.name, "inputs": rows[c.task]} for c in capsules]
    deadline = time.perf_counter() + config["duration_s"]

    def one(i: int) -> float | None:
        return None if time.perf_counter() > deadline else _post(url, bodies[i % len(bodies)])

    started = time.perf_counter()
    with ThreadPoolExecutor(config["concurrency"]) as pool:
        latencies = [t for t in pool.map(one, range(config["requests"])) if t is not None]
    elapsed = time.perf_counter() - started
    return {"rows": len(latencies) * config["rows_per_request"], "elapsed": elapsed, "latencies": latencies}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(urllib.request.Request(url + "/tasks", headers=HEADERS), timeout=30) as response:
        return json.loads(response.read())


def measure(config: dict[str, Any], sets: dict[int, list], rows: dict[str, list]) -> dict[int, dict[str, Any]]:
    """Deploy one application per capsule set, then load them round-robin; per set the pooled measurements."""
    from ray import serve

    from pipelines.services import LOCALHOST, free_port
    from pipelines.serving.app import deployment
    from pipelines.serving.auth import digest
    from pipelines.serving.settings import ServeSettings

    port = free_port(LOCALHOST)
    serve.start(http_options={"host": LOCALHOST, "port": port})
    urls = {}
    for count, capsules in sets.items():
        options = ServeSettings(model=config["model"], tasks=[c.name for c in capsules], tracking_uri="local capsules",
                                token_sha256=digest(TOKEN),
                                max_rows_per_request=config["rows_per_request"],
                                max_batch_requests=config["max_batch_requests"], batch_wait_s=config["batch_wait_s"],
                                num_cpus=0.5)
        serve.run(deployment(options, capsules), name=f"tasks{count}", route_prefix=f"/tasks{count}")
        urls[count] = f"http://{LOCALHOST}:{port}/tasks{count}"
        load(urls[count], capsules, rows, {**config, "requests": config["concurrency"]})  # warm-up
    pooled = {count: {"rows": 0, "elapsed": 0.0, "latencies": []} for count in sets}
    for _ in range(config["rounds"]):
        for count, capsules in sets.items():
            got = load(urls[count], capsules, rows, config)
            for key in pooled[count]:
                pooled[count][key] += got[key]
    for count in sets:
        status = _get(urls[count])
        pooled[count].update(rss_mb=status["rss_mb"], loaded_rss_mb=status["loaded_rss_mb"])
    serve.shutdown()
    return pooled


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Train the capsules, serve them on a local Ray, load the three applications, tabulate."""
    from pipelines.capsule_predictor import example_rows
    from pipelines.services.ray_connect import ray_cluster
    from pipelines.serving.engine import capsule_bytes

    result = BenchResult(NAME, TITLE, config)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        sets = capsule_sets(train_capsules(Path(tmp), config), config["task_counts"], Path(tmp))
        rows = {task: example_rows(task, config["rows_per_request"]) for task in TASKS}
        with ray_cluster(2):
            pooled = measure(config, sets, rows)
        sizes = {count: sum(capsule_bytes(c.capsule_dir) for c in capsules) for count, capsules in sets.items()}
    return tabulate(result, pooled, sizes)


def tabulate(result: BenchResult, pooled: dict[int, dict[str, Any]], sizes: dict[int, int]) -> BenchResult:
    """The table, the throughput targets (mixed over single) and the memory target, from pooled measurements."""
    config = result.settings
    single = pooled[1]["rows"] / pooled[1]["elapsed"]
    table = []
    for count, got in pooled.items():
        speed = got["rows"] / got["elapsed"]
        table.append({"tasks": count, "requests": len(got["latencies"]), "rows_per_s": speed,
                      "vs_single": speed / single, "p50_ms": 1000 * statistics.median(got["latencies"]),
                      "p99_ms": 1000 * _percentile(got["latencies"], 0.99), "loaded_rss_mb": got["loaded_rss_mb"],
                      "rss_after_load_test_mb": got["rss_mb"],
                      "capsule_bytes": sizes[count]})
    result.tables.append(Table(
        f"{config['model']}, {config['rows_per_request']} rows per request, {config['concurrency']} client threads, "
        f"{config['rounds']} round(s) round-robin, Serve batches up to {config['max_batch_requests']} requests",
        ["tasks", "requests", "rows_per_s", "vs_single", "p50_ms", "p99_ms", "loaded_rss_mb", "rss_after_load_test_mb",
         "capsule_bytes"], table))
    for row in table[1:]:
        result.targets.append(at_least(f"throughput, {row['tasks']} tasks mixed / 1 task", row["vs_single"], 0.9))
    most = table[-1]
    capsules_mb = (most["capsule_bytes"] - table[0]["capsule_bytes"]) / 2**20
    growth = most["loaded_rss_mb"] - table[0]["loaded_rss_mb"] - capsules_mb
    result.targets.append(at_most(f"replica memory, {most['tasks']} tasks over 1 task beyond the capsules' bytes",
                                  growth, config["memory_limit_mb"], " MB"))
    result.notes += [
        "Each row is one Serve application (one replica, one base model, all its capsules in one CapsuleBank) on the "
        "same local Ray; requests cycle through the application's capsules, so every batch Serve forms mixes tasks.",
        "loaded_rss_mb: the replica's resident memory once its base model and capsules are loaded, before any request "
        "(the memory target compares it); rss_after_load_test_mb: after the load test (allocator caches of the batch "
        "shapes seen included); capsule_bytes: its capsule.safetensors files.",
    ]
    return result
