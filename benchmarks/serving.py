"""Benchmark 6: the Ray Serve app under a bounded local load, 1 capsule against 50 and 1,000 on the same rows.

Per base model, real capsules (one short CaPT job per task) and perturbed copies (`serving_capsules`) are served by
`serving_app.TimedServer`, the app's replica timed, one application per (workload, count) on one local Ray + Serve:
"rte" sends RTE rows to 1, 50 and 1,000 RTE capsules, "mix" each task's rows to the 7 tasks' capsules and 1,000.
Rounds are interleaved and every ratio is taken within one round (README, `serving`).
"""

from __future__ import annotations

import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Table, at_least, at_most
from benchmarks.serving_capsules import MIX, SINGLE, capsule_sets, extra_capsule, train_capsules, weight_bytes

logger = logging.getLogger(__name__)

NAME = "serving"
TITLE = "Serving: Ray Serve app, one frozen base model, 1 capsule vs 50 and 1,000 on the same rows (and the task mix)"
TASKS = ("boolq", "cb", "copa", "multirc", "rte", "wic", "csqa")
MEMORY_TARGET_FROM_BYTES = 4096
"""The smallest capsule (capsule and head files) the replica-memory target applies to: below it, what a replica grows
per capsule measures CPython's per-object overhead more than the capsule's values (tiny-t5's are 512 bytes; MiniLM's
12 KB), so the figure is reported without a target."""


def settings(quick: bool) -> dict[str, Any]:
    """Load shape and repetitions (quick: the tiny BERT, whose capsules bring their task heads, 2 tasks, 1 and 2 RTE
    capsules and the 2-task mix, 1 round: three deployments, the test's end-to-end run; the code is the same for every
    base model, and the sets of larger counts have a test of their own)."""
    common = {"rows_per_request": 2, "concurrency": 8, "max_batch_requests": 8, "batch_wait_s": 0.005,
              "train_steps": 2, "memory_slack": 0.10, "ratio_goal": 0.9, "num_cpus": 0.2}
    # task_counts: {workload: capsule counts}, the first of each the like-for-like baseline of the others;
    # engine_rounds: rounds of the in-process batches (`serving_engine`); requests: about 10 s of load per application
    # and round on 2 CPUs (windows of 3-4 s moved a baseline by up to 1.2x between rounds), sent in `slices` turns
    # (`one_round`): in 6 turns of 1-2 s an application's windows lie closer in time to its baseline's than in 3
    # (three runs each at 4104396: the rounds' ratios scattered by a standard deviation of 0.029-0.061 in 3 turns,
    # two runs with a round under 0.9, and of 0.023-0.038 in 6, every round at 0.926 or more)
    if quick:
        return {**common, "models": ["tiny-bert"], "tasks": ["rte", "cb"],
                "task_counts": {SINGLE: [1, 2], MIX: [2]}, "requests": {"tiny-bert": 8}, "rounds": 1, "slices": 2,
                "duration_s": 30.0, "engine_rounds": 2}
    return {**common, "models": ["tiny-t5", "minilm"], "tasks": list(TASKS),
            "task_counts": {SINGLE: [1, 50, 1000], MIX: [len(TASKS), 1000]},
            "requests": {"tiny-t5": 900, "minilm": 360}, "rounds": 3, "slices": 6, "duration_s": 60.0,
            "engine_rounds": 5}


def for_model(config: dict[str, Any], model: str) -> dict[str, Any]:
    """The settings on one model. SmolLM2 serves RTE only (1 capsule against 1,000): its answers take ~20x MiniLM's
    time on 2 CPUs, so a request count of about 10 s of load per application and round is 30."""
    if model != "smollm2-135m":
        return {**config, "models": [model]}
    return {**config, "models": [model], "tasks": [SINGLE], "task_counts": {SINGLE: [1, 1000]},
            "requests": {model: 30}, "engine_rounds": 3}


def schedule(apps: list[Any], rounds: int) -> list[list[Any]]:
    """Each round runs every application once, starting a further share of the list on each round."""
    shift = max(1, len(apps) // max(1, rounds))
    return [apps[(r * shift) % len(apps):] + apps[:(r * shift) % len(apps)] for r in range(rounds)]


App = tuple[str, int]  # (workload, capsule count): one Serve application of a model


def deploy(config: dict[str, Any], sets: dict[str, dict[App, list]], rows: dict[str, list], port: int,
           folder: Path) -> tuple[dict[str, dict[App, dict[str, Any]]], dict, dict]:
    """Every (model, workload, count) application deployed (its capsules listed in a manifest file in `folder`) and
    warmed up: ({model: {app: its load readings}}, {(model, app): url}, {(model, app): request bodies})."""
    from benchmarks import serving_app
    from benchmarks.serving_capsules import write_manifest
    from pipelines.services import LOCALHOST
    from pipelines.serving.auth import digest
    from pipelines.serving.settings import ServeSettings

    apps: dict[str, dict[App, dict[str, Any]]] = {model: {} for model in sets}
    bodies, urls = {}, {}
    for model, by_app in sets.items():
        for (workload, count), capsules in by_app.items():
            options = ServeSettings(model=model, tasks=[c.name for c in capsules], tracking_uri="local capsules",
                                    token_sha256=digest(serving_app.TOKEN),
                                    max_rows_per_request=config["rows_per_request"],
                                    max_batch_requests=config["max_batch_requests"],
                                    batch_wait_s=config["batch_wait_s"], num_cpus=config["num_cpus"],
                                    num_gpus=config.get("num_gpus", 0.0))
            key, name = (model, (workload, count)), f"{model}-{workload}-{count}"
            manifest = write_manifest(capsules, folder / f"{name.replace('/', '_')}.jsonl")
            prefix, ready_s = serving_app.deploy(options, manifest, name)
            urls[key] = f"http://{LOCALHOST}:{port}{prefix}"
            bodies[key] = [{"task": c.name, "inputs": rows[c.task]} for c in capsules]
            serving_app.load(urls[key], bodies[key], config["concurrency"], config["concurrency"],
                             config["duration_s"])  # warm-up
            described = serving_app.status(urls[key])
            apps[model][workload, count] = {"ready_s": ready_s, "rounds": [], "capsule_bytes": sum(
                weight_bytes(c.capsule_dir) for c in capsules), **{k: described[k] for k in (
                    "init_s", "start_rss_mb", "base_rss_mb", "loaded_rss_mb")}}
            logger.info("%s, %s x %d: running %.1f s after serve.run (constructor %.1f s)", model, workload, count,
                        ready_s, described["init_s"])
    return apps, urls, bodies


def measure(config: dict[str, Any], sets: dict[str, dict[App, list]], rows: dict[str, list],
            extras: dict[str, Any], folder: Path) -> tuple[dict[str, dict[App, dict[str, Any]]], dict[str, Any]]:
    """Deploy every application (manifests written to `folder`), load them round by round, add one capsule to each
    model's largest RTE application: ({model: {app: its readings}}, {model: its hot add})."""
    from ray import serve

    from benchmarks import serving_app
    from pipelines.services import LOCALHOST, free_port

    port = free_port(LOCALHOST)
    serve.start(http_options={"host": LOCALHOST, "port": port})
    apps, urls, bodies = deploy(config, sets, rows, port, folder)
    for number, order in enumerate(schedule([(m, a) for m in sets for a in sets[m]], config["rounds"])):
        for key, got in one_round(config, order, urls, bodies, number).items():
            model, (workload, count) = key
            apps[model][workload, count]["rounds"].append({**got, "round": number})
            logger.info("round %d, %s, %s x %d: %.1f rows/s", number, model, workload, count,
                        got["requests"] * config["rows_per_request"] / got["elapsed"])
    adds = {}
    for model, by_app in sets.items():
        for app in by_app:
            apps[model][app]["rss_mb"] = serving_app.status(urls[model, app])["rss_mb"]
        most = SINGLE, max(config["task_counts"][SINGLE])
        added = extras[model]
        adds[model] = {"tasks": most[1], **serving_app.hot_add(f"{model}-{most[0]}-{most[1]}", urls[model, most],
                                                               added, {"task": added.name,
                                                                       "inputs": rows[added.task]})}
    serve.shutdown()
    return apps, adds


def one_round(config: dict[str, Any], order: list, urls: dict, bodies: dict, number: int) -> dict[Any, dict[str, Any]]:
    """One round: each application's requests sent in `slices` parts, the applications taking turns part by part, so
    that a slow spell of the shared machine falls on all of them alike; {application: its parts' requests, wall time
    and latencies, summed}."""
    from benchmarks import serving_app

    slices = config["slices"]
    parts: dict[Any, list[dict[str, Any]]] = {key: [] for key in order}
    for part in range(slices):
        for key in order:
            total = config["requests"][key[0]]
            sent = part * total // slices  # the turns' shares differ by at most one; they add up to `total`
            parts[key].append(serving_app.load(urls[key], bodies[key], (part + 1) * total // slices - sent,
                                               config["concurrency"], config["duration_s"],
                                               offset=number * total + sent))
    return {key: {"requests": sum(p["requests"] for p in got), "elapsed": sum(p["elapsed"] for p in got),
                  "latencies": [t for p in got for t in p["latencies"]]} for key, got in parts.items()}


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Train the capsules, serve them on a local Ray, load the applications round by round, tabulate."""
    from benchmarks import serving_engine
    from capt.tasks import example_rows
    from pipelines.services.ray_connect import ray_cluster

    result = BenchResult(NAME, TITLE, config)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        sets, extras = {}, {}
        for model in config["models"]:
            folder = Path(tmp) / model
            trained = train_capsules(folder, model, config["tasks"], config["train_steps"],
                                     config.get("dtype", "float32"))
            sets[model] = capsule_sets(trained, config["task_counts"], folder)
            extras[model] = extra_capsule(trained, folder)
        rows = {task: example_rows(task, config["rows_per_request"]) for task in config["tasks"]}
        with ray_cluster(2):
            apps, adds = measure(config, sets, rows, extras, Path(tmp))
        counts = config["task_counts"]
        mixed = (MIX, max(counts[MIX])) if MIX in counts else (SINGLE, max(counts[SINGLE]))  # no mix: RTE only
        engine = {model: serving_engine.measure(model, by_app[mixed], rows, config["engine_rounds"])
                  for model, by_app in sets.items()}
    return tabulate(result, apps, adds, engine)


def _rates(got: dict[str, Any], rows_per_request: int) -> list[float]:
    return [r["requests"] * rows_per_request / r["elapsed"] for r in got["rounds"]]


def _app_rows(config: dict[str, Any], model: str, app: App, by_app: dict[App, dict[str, Any]]
              ) -> tuple[dict[str, Any], list[dict[str, Any]], list[float]]:
    """An application's summary row, its per-round rows and its ratios to its workload's baseline, round by round."""
    workload, count = app
    per = config["rows_per_request"]
    got, rates = by_app[app], _rates(by_app[app], per)
    base = _rates(by_app[workload, config["task_counts"][workload][0]], per)
    single = _rates(by_app[SINGLE, 1], per)
    vs_base = [rate / b for rate, b in zip(rates, base, strict=True)]
    vs_single = [rate / b for rate, b in zip(rates, single, strict=True)]
    latencies = sorted(t for r in got["rounds"] for t in r["latencies"])  # in order, for the 99th percentile
    summary = {"model": model, "workload": workload, "tasks": count, "requests": len(latencies),
               "rows_per_s": statistics.median(rates), "vs_base_min": min(vs_base),
               "vs_base_median": statistics.median(vs_base), "vs_base_max": max(vs_base),
               "vs_1_rte_median": statistics.median(vs_single), "p50_ms": 1000 * statistics.median(latencies),
               "p99_ms": 1000 * latencies[round(0.99 * (len(latencies) - 1))],
               **{k: got[k] for k in ("ready_s", "init_s", "start_rss_mb", "base_rss_mb", "loaded_rss_mb")},
               "rss_after_load_test_mb": got["rss_mb"], "capsule_bytes": got["capsule_bytes"]}
    rounds = [{"model": model, "workload": workload, "tasks": count, "round": r["round"], "rows_per_s": rate,
               "vs_base": ratio, "vs_1_rte": other}
              for r, rate, ratio, other in zip(got["rounds"], rates, vs_base, vs_single, strict=True)]
    return summary, rounds, vs_base


def _growth(most: dict[str, Any], fewest: dict[str, Any]) -> tuple[float, float]:
    """(MB that loading its capsules added to the `most` application's replica beyond the `fewest` one's, MB of the
    extra capsules' files): each replica's memory once loaded less its memory with the base model alone, both read
    in the replica, since the base model's own load moves a replica's memory by up to 1.5 MB from one replica to
    the next, which a difference of the two replicas' totals (`loaded_growth_mb`, also shown) carries in."""
    growth = (most["loaded_rss_mb"] - most["base_rss_mb"]) - (fewest["loaded_rss_mb"] - fewest["base_rss_mb"])
    return growth, (most["capsule_bytes"] - fewest["capsule_bytes"]) / 2**20


def _load_row(config: dict[str, Any], model: str, by_app: dict[App, dict[str, Any]],
              add: dict[str, Any]) -> dict[str, Any]:
    """Loading the most RTE capsules against one, the memory that grew (`_growth`; and the task mix's, the most
    capsules against the 7 tasks, when it ran), and the hot add."""
    counts = config["task_counts"]
    most, one = by_app[SINGLE, max(counts[SINGLE])], by_app[SINGLE, 1]
    growth, extra_mb = _growth(most, one)
    mix = {}
    if len(counts.get(MIX, ())) > 1:  # the quick run serves one mix application: nothing to compare
        mix_growth, mix_mb = _growth(by_app[MIX, max(counts[MIX])], by_app[MIX, counts[MIX][0]])
        mix = {"mix_growth_mb": mix_growth, "mix_capsules_mb": mix_mb, "mix_growth_over_bytes": mix_growth / mix_mb}
    return {"model": model, "tasks": max(counts[SINGLE]), "ready_s": most["ready_s"],
            "ready_1_task_s": one["ready_s"], "init_s": most["init_s"], "init_1_task_s": one["init_s"],
            "rss_growth_mb": growth, "capsules_mb": extra_mb, "growth_over_bytes": growth / extra_mb,
            "loaded_growth_mb": most["loaded_rss_mb"] - one["loaded_rss_mb"],
            "base_rss_mb": most["base_rss_mb"], "base_rss_1_task_mb": one["base_rss_mb"], **mix,
            "add_s": add["add_s"], "add_call_s": add["call_s"], "add_to_first_answer_s": add["first_answer_s"],
            "rss_after_add_mb": add["rss_mb"], "tasks_after_add": add["tasks"]}


def tabulate(result: BenchResult, apps: dict[str, dict[App, dict[str, Any]]], adds: dict[str, dict[str, Any]],
             engine: dict[str, dict[str, Any]]) -> BenchResult:
    """The tables (per application, per round, load and hot add, the engine alone) and the throughput and memory
    targets."""
    config = result.settings
    goal, rounds = config["ratio_goal"], config["rounds"]
    summary, per_round, loads, models = [], [], [], list(apps)
    for model, by_app in apps.items():
        for app in by_app:
            row, by_round, vs_base = _app_rows(config, model, app, by_app)
            summary.append(row)
            per_round += by_round
            workload, count = app
            base = config["task_counts"][workload][0]
            if count != base:
                result.targets.append(at_least(f"{model}: throughput, {workload} rows, {count} capsules / {base}, "
                                               f"worst of {rounds} round(s)", min(vs_base), goal))
        loads.append(_load_row(config, model, by_app, adds[model]))
        _memory_target(result, model, loads[-1], 1 + config["memory_slack"])
    alone = [row for model in models for row in engine[model]["table"]]
    ops = [row for model in models for row in engine[model]["extra_ops"]]
    shape = (f"{config['rows_per_request']} rows per request, {config['concurrency']} client threads, "
             f"{rounds} interleaved round(s), Serve batches up to {config['max_batch_requests']} requests")
    result.tables += [
        Table(f"Per application ({shape}); vs_base: ratio to the same round's rate of the workload's first "
              "application (rte: 1 capsule; mix: the 7 tasks), min, median, max over rounds", list(summary[0]),
              summary),
        Table("Per round (rows/s and its ratios within the round)", list(per_round[0]), per_round),
        Table("Loading the most RTE capsules and adding one to the running application", list(loads[0]), loads),
        Table("The engine alone (`serving_engine`: CapsuleEngine.answer in process, one torch thread, a batch of 8 "
              "requests of 2 rows)", list(alone[0]), alone),
        Table("Ops with the most extra self CPU time, task-mix batch against the 1-capsule batch (torch.profiler)",
              list(ops[0]), ops)]
    result.profiles.update({f"{m}: task-mix batch, CapsuleEngine.answer (one thread)": engine[m]["profile"]
                            for m in models})
    result.notes += NOTES
    return result


def _memory_target(result: BenchResult, model: str, load: dict[str, Any], bound: float) -> None:
    """The replica-memory target for capsules of `MEMORY_TARGET_FROM_BYTES` or more; smaller ones get the figure as
    a note, without a target."""
    label = f"{model}: replica memory, {load['tasks']} RTE capsules over 1, / the extra capsules' bytes"
    per_capsule = load["capsules_mb"] * 2**20 / max(1, load["tasks"] - 1)
    if per_capsule >= MEMORY_TARGET_FROM_BYTES:
        result.targets.append(at_most(label, load["growth_over_bytes"], bound))
    else:
        result.notes.append(f"{label}: {load['growth_over_bytes']:.3f}x, without a target: capsules of "
                            f"{per_capsule:.0f} bytes, under the {MEMORY_TARGET_FROM_BYTES} from which it applies")


NOTES = [
    "Each (model, workload, tasks) row is one Serve application (one replica, one base model, all its capsules in "
    "one CapsuleBank; encoder classifiers with each capsule's task head) on the same local Ray; requests cycle "
    "through the application's capsules, so every batch Serve forms mixes capsules. rte: every request RTE rows, "
    "whatever its capsule (1, 50, 1,000 distinct RTE capsules: the real one and copies with perturbed values); mix: "
    "every request its own task's rows, 7 real capsules or 1,000 (the 7 and perturbed copies in turn).",
    "ready_s: serve.run to the application running (replica actor start, imports, base model, capsules); "
    "init_s: the replica's constructor; start_rss_mb / base_rss_mb / loaded_rss_mb: the replica's resident memory "
    "at the constructor's start, with its base model loaded and no capsule yet, and once its capsules are loaded, "
    "before any request; "
    "rss_after_load_test_mb: after the rounds; capsule_bytes: the capsules' *.safetensors files (capsule and "
    "task head).",
    "Hot add: `CapsuleEngine.add` in the running replica through a Serve handle (`serving_app.TimedServer.add`, "
    "the call the registry poll makes for a new task; the app has no HTTP route to add a capsule): add_s in the "
    "replica, add_call_s through the handle, add_to_first_answer_s until the new capsule's first HTTP answer.",
]
