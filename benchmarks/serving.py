"""Benchmark 6: the Ray Serve app under a bounded local load, 1 task alone against 7, 50 and 1,000 tasks mixed.

Per base model (tiny-t5 and MiniLM, an encoder whose capsules each bring their task head), seven real capsules
(one CaPT job per task on generated data, a few steps each) are served by `pipelines.serving.app`'s replica
(`serving_app.TimedServer`: the same class, timed) as `python -m pipelines.serve` serves registry versions,
minus the registry: one application per task count on one local Ray + Serve, HTTP on 127.0.0.1 only, holding
1 capsule (RTE), the 7, 50 and 1,000 (copies of the 7 on disk, each loaded as its own capsule). A fixed number
of requests (each a few raw rows of its capsule's task, cycling through the capsules) is sent by a fixed number
of client threads, stopped early at a time limit. Rounds are interleaved: each round loads every (model, count)
application once, in an order rotated from round to round, and every ratio is taken within one round.
Reported: rows per second and its ratio to the round's 1-task and 7-task rates, request latency p50/p99, the
time from `serve.run` to a running application, the replica's resident memory before and after its capsules
load against the capsules' bytes, and the time to add one capsule to the running 1,000-task application.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Table, at_least, at_most
from benchmarks.serving_capsules import capsule_sets, extra_capsule, train_capsules, weight_bytes

logger = logging.getLogger(__name__)

NAME = "serving"
TITLE = "Serving: Ray Serve app, one frozen base model, 1 task alone vs 7, 50 and 1,000 tasks mixed"
TASKS = ("boolq", "cb", "copa", "multirc", "rte", "wic", "csqa")


def settings(quick: bool) -> dict[str, Any]:
    """Load shape and repetitions (quick: tiny models, 2 tasks, counts 1 and 2, 1 round: four deployments, the
    test's end-to-end run; the copies that make larger counts have a test of their own)."""
    common = {"rows_per_request": 2, "concurrency": 8, "max_batch_requests": 8, "batch_wait_s": 0.005,
              "train_steps": 2, "memory_slack": 0.10, "ratio_goal": 0.9, "num_cpus": 0.2}
    # engine_rounds: rounds of the in-process batches (`serving_engine`)
    if quick:
        return {**common, "models": ["tiny-t5", "tiny-bert"], "tasks": ["rte", "cb"], "task_counts": [1, 2],
                "requests": {"tiny-t5": 8, "tiny-bert": 8}, "rounds": 1, "duration_s": 30.0, "engine_rounds": 2}
    return {**common, "models": ["tiny-t5", "minilm"], "tasks": list(TASKS), "task_counts": [1, 7, 50, 1000],
            "requests": {"tiny-t5": 360, "minilm": 144}, "rounds": 3, "duration_s": 60.0, "engine_rounds": 5}


def schedule(apps: list[tuple[str, int]], rounds: int) -> list[list[tuple[str, int]]]:
    """Each round runs every application once, starting a further share of the list on each round."""
    shift = max(1, len(apps) // max(1, rounds))
    return [apps[(r * shift) % len(apps):] + apps[:(r * shift) % len(apps)] for r in range(rounds)]


def measure(config: dict[str, Any], sets: dict[str, dict[int, list]], rows: dict[str, list],
            extras: dict[str, Any]) -> tuple[dict[str, dict[int, dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Deploy every (model, count) application, load them round by round, add one capsule to each model's largest;
    ({model: {count: measurements}}, {model: hot add})."""
    from ray import serve

    from benchmarks import serving_app
    from pipelines.services import LOCALHOST, free_port
    from pipelines.serving.auth import digest
    from pipelines.serving.settings import ServeSettings

    port = free_port(LOCALHOST)
    serve.start(http_options={"host": LOCALHOST, "port": port})
    apps: dict[str, dict[int, dict[str, Any]]] = {model: {} for model in sets}
    bodies, urls = {}, {}
    for model, by_count in sets.items():
        for count, capsules in by_count.items():
            options = ServeSettings(model=model, tasks=[c.name for c in capsules], tracking_uri="local capsules",
                                    token_sha256=digest(serving_app.TOKEN),
                                    max_rows_per_request=config["rows_per_request"],
                                    max_batch_requests=config["max_batch_requests"],
                                    batch_wait_s=config["batch_wait_s"], num_cpus=config["num_cpus"])
            prefix, ready_s = serving_app.deploy(options, capsules, f"{model}-{count}")
            urls[model, count] = f"http://{LOCALHOST}:{port}{prefix}"
            bodies[model, count] = [{"task": c.name, "inputs": rows[c.task]} for c in capsules]
            serving_app.load(urls[model, count], bodies[model, count], config["concurrency"], config["concurrency"],
                             config["duration_s"])  # warm-up
            described = serving_app.status(urls[model, count])
            apps[model][count] = {"ready_s": ready_s, "rounds": [], "capsule_bytes": sum(
                weight_bytes(c.capsule_dir) for c in capsules), **{k: described[k] for k in (
                    "init_s", "start_rss_mb", "loaded_rss_mb")}}
            logger.info("%s, %d tasks: running %.1f s after serve.run (constructor %.1f s)", model, count, ready_s,
                        described["init_s"])
    for number, order in enumerate(schedule([(m, c) for m in sets for c in sets[m]], config["rounds"])):
        for model, count in order:
            requests = config["requests"][model]
            got = serving_app.load(urls[model, count], bodies[model, count], requests, config["concurrency"],
                                   config["duration_s"], offset=number * requests)
            apps[model][count]["rounds"].append({**got, "round": number})
            logger.info("round %d, %s, %d tasks: %.1f rows/s", number, model, count,
                        got["requests"] * config["rows_per_request"] / got["elapsed"])
    adds = {}
    for model, by_count in sets.items():
        for count in by_count:
            apps[model][count]["rss_mb"] = serving_app.status(urls[model, count])["rss_mb"]
        most = max(by_count)
        added = extras[model]
        adds[model] = {"tasks": most, **serving_app.hot_add(f"{model}-{most}", urls[model, most], added,
                                                            {"task": added.name, "inputs": rows[added.task]})}
    serve.shutdown()
    return apps, adds


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Train the capsules, serve them on a local Ray, load the applications round by round, tabulate."""
    from benchmarks import serving_engine
    from pipelines.capsule_predictor import example_rows
    from pipelines.services.ray_connect import ray_cluster

    result = BenchResult(NAME, TITLE, config)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        sets, extras = {}, {}
        for model in config["models"]:
            folder = Path(tmp) / model
            trained = train_capsules(folder, model, config["tasks"], config["train_steps"])
            sets[model] = capsule_sets(trained, config["task_counts"], folder)
            extras[model] = extra_capsule(trained, folder)
        rows = {task: example_rows(task, config["rows_per_request"]) for task in config["tasks"]}
        with ray_cluster(2):
            apps, adds = measure(config, sets, rows, extras)
        engine = {model: serving_engine.measure(model, by_count[max(by_count)], rows, config["engine_rounds"])
                  for model, by_count in sets.items()}
    return tabulate(result, apps, adds, engine)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def _rates(got: dict[str, Any], rows_per_request: int) -> list[float]:
    return [r["requests"] * rows_per_request / r["elapsed"] for r in got["rounds"]]


def tabulate(result: BenchResult, apps: dict[str, dict[int, dict[str, Any]]], adds: dict[str, dict[str, Any]],
             engine: dict[str, dict[str, Any]]) -> BenchResult:
    """The tables (per application, per round, load and hot add, the engine alone) and the throughput and memory
    targets."""
    config = result.settings
    mix, goal, rounds = len(config["tasks"]), config["ratio_goal"], config["rounds"]
    summary, per_round, loads, models = [], [], [], list(apps)
    for model, by_count in apps.items():
        single, mixed = _rates(by_count[1], config["rows_per_request"]), _rates(by_count[mix],
                                                                                  config["rows_per_request"])
        for count, got in by_count.items():
            rates = _rates(got, config["rows_per_request"])
            vs_single = [rate / base for rate, base in zip(rates, single, strict=True)]
            vs_mix = [rate / base for rate, base in zip(rates, mixed, strict=True)]
            latencies = [t for r in got["rounds"] for t in r["latencies"]]
            summary.append({
                "model": model, "tasks": count, "requests": len(latencies), "rows_per_s": statistics.median(rates),
                "vs_single_min": min(vs_single), "vs_single_median": statistics.median(vs_single),
                "vs_single_max": max(vs_single), f"vs_{mix}_median": statistics.median(vs_mix),
                "p50_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * _percentile(latencies, 0.99),
                "ready_s": got["ready_s"], "init_s": got["init_s"], "start_rss_mb": got["start_rss_mb"],
                "loaded_rss_mb": got["loaded_rss_mb"],
                "rss_after_load_test_mb": got["rss_mb"], "capsule_bytes": got["capsule_bytes"]})
            per_round += [{"model": model, "tasks": count, "round": r["round"], "rows_per_s": rate,
                           "vs_single": ratio, f"vs_{mix}": other}
                          for r, rate, ratio, other in zip(got["rounds"], rates, vs_single, vs_mix, strict=True)]
            if count > mix:
                result.targets.append(at_least(f"{model}: throughput, {count} tasks mixed / 1 task, worst of "
                                               f"{rounds} round(s)", min(vs_single), goal))
        most, one = by_count[max(by_count)], by_count[1]
        growth = most["loaded_rss_mb"] - one["loaded_rss_mb"]
        extra_mb = (most["capsule_bytes"] - one["capsule_bytes"]) / 2**20
        add = adds[model]
        loads.append({"model": model, "tasks": max(by_count), "ready_s": most["ready_s"],
                      "ready_1_task_s": one["ready_s"], "init_s": most["init_s"], "init_1_task_s": one["init_s"],
                      "rss_growth_mb": growth,
                      "capsules_mb": extra_mb, "growth_over_bytes": growth / extra_mb, "add_s": add["add_s"],
                      "add_call_s": add["call_s"], "add_to_first_answer_s": add["first_answer_s"],
                      "rss_after_add_mb": add["rss_mb"], "tasks_after_add": add["tasks"]})
        result.targets.append(at_most(f"{model}: replica memory, {max(by_count)} tasks over 1 task, / the extra "
                                      "capsules' bytes", growth / extra_mb, 1 + config["memory_slack"]))
    alone = [row for model in models for row in engine[model]["table"]]
    ops = [row for model in models for row in engine[model]["extra_ops"]]
    shape = (f"{config['rows_per_request']} rows per request, {config['concurrency']} client threads, "
             f"{rounds} interleaved round(s), Serve batches up to {config['max_batch_requests']} requests")
    result.tables += [
        Table(f"Per application ({shape}); vs_*: ratio to the same round's 1-task / {mix}-task rate, min, median, max "
              "over rounds", list(summary[0]), summary),
        Table("Per round (rows/s and its ratios within the round)", list(per_round[0]), per_round),
        Table("Loading the most capsules and adding one to the running application", list(loads[0]), loads),
        Table("The engine alone (`serving_engine`: CapsuleEngine.answer in process, one torch thread, a batch of 8 "
              "requests of 2 rows)", list(alone[0]), alone),
        Table("Ops with the most extra self CPU time, task-mix batch against the 1-capsule batch (torch.profiler)",
              list(ops[0]), ops)]
    result.profiles.update({f"{m}: task-mix batch, CapsuleEngine.answer (one thread)": engine[m]["profile"]
                            for m in models})
    result.notes += [
        "Each (model, tasks) row is one Serve application (one replica, one base model, all its capsules in one "
        "CapsuleBank; encoder classifiers with each capsule's task head) on the same local Ray; requests cycle "
        f"through the application's capsules, so every batch Serve forms mixes tasks; the {mix}-task, 50- and "
        "1,000-task applications send the same mix of the tasks' rows, the 1-task one only RTE rows.",
        "ready_s: serve.run to the application running (replica actor start, imports, base model, capsules); "
        "init_s: the replica's constructor; start_rss_mb / loaded_rss_mb: the replica's resident memory at the "
        "constructor's start and once its base model and capsules are loaded, before any request; "
        "rss_after_load_test_mb: after the rounds; capsule_bytes: the capsules' *.safetensors files (capsule and "
        "task head).",
        "Hot add: `CapsuleEngine.add` in the running replica through a Serve handle (`serving_app.TimedServer.add`, "
        "the call the registry poll makes for a new task; the app has no HTTP route to add a capsule): add_s in the "
        "replica, add_call_s through the handle, add_to_first_answer_s until the new capsule's first HTTP answer.",
    ]
    return result
