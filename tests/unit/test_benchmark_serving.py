"""The serving benchmark: its capsule sets, its rotation of rounds, its table and targets, and its quick mode run end
to end (real CaPT jobs, a local Ray + Serve, HTTP load, a hot add) with the structure of what it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import serving, serving_engine  # noqa: E402
from benchmarks.common import BenchResult  # noqa: E402
from benchmarks.serving_capsules import capsule_sets, weight_bytes  # noqa: E402


def _jobs(folder: Path, model) -> dict:
    """A real capsule artifact per task (tiny model, values random), as a trained job's result names it."""
    import torch

    import capt

    results = {}
    for seed, task in enumerate(serving.TASKS):
        torch.manual_seed(seed)
        attached = capt.attach(model, capt.CapsuleConfig(init="normal"))
        artifact = capt.save_capsule(attached, folder / task / "artifact", task=task)
        attached.detach()
        results[task] = {"task": task, "artifact_dir": str(artifact)}
    return results


def test_the_sets_compare_like_with_like_and_every_copy_is_a_distinct_sealed_capsule(tmp_path: Path) -> None:
    """rte: N distinct RTE capsules (the real one, then perturbed copies); mix: the 7 tasks in the same proportions
    at every count; a smaller set is the start of the larger; each copy loads (its digest checks) as its own
    values."""
    from tiny_models import BUILDERS

    import capt

    base = BUILDERS["t5"]()
    results = _jobs(tmp_path / "jobs", base)
    sets = capsule_sets(results, {"rte": [1, 50], "mix": [7, 20]}, tmp_path / "copies")
    assert [c.name for c in sets["rte", 1]] == ["rte"] and [c.name for c in sets["mix", 7]] == list(serving.TASKS)
    rte = sets["rte", 50]
    assert len({c.name for c in rte}) == 50 and {c.task for c in rte} == {"rte"} and rte[:1] == sets["rte", 1]
    assert [c.task for c in sets["mix", 20][:14]] == list(serving.TASKS) * 2 and sets["mix", 20][:7] == sets["mix", 7]
    vectors = []
    for served in rte[:3]:
        model = capt.load_capsule(base, served.capsule_dir)
        vectors.append(model.capsules[0].vectors.detach().clone())
        model.detach()
    assert not torch_equal(vectors[0], vectors[1]) and not torch_equal(vectors[1], vectors[2])
    assert (vectors[1] - vectors[0]).abs().max() < 0.01  # a copy, moved a little
    assert weight_bytes(rte[1].capsule_dir) == weight_bytes(rte[0].capsule_dir)


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_every_round_runs_every_application_once_from_a_rotated_start() -> None:
    apps = [(model, count) for model in ("a", "b") for count in (1, 7, 50, 1000)]
    rounds = serving.schedule(apps, 3)
    assert all(sorted(order) == sorted(apps) for order in rounds)
    assert len({order[0] for order in rounds}) == 3


def _app(rates: list[float], rss: float, capsule_bytes: int, base: float = 350.0) -> dict:
    return {"ready_s": 5.0, "init_s": 4.0, "start_rss_mb": 300.0, "base_rss_mb": base, "loaded_rss_mb": rss,
            "rss_mb": rss + 10,
            "capsule_bytes": capsule_bytes,
            "rounds": [{"round": r, "requests": 10, "elapsed": 20 / rate, "latencies": [0.1] * 9 + [0.5]}
                       for r, rate in enumerate(rates)]}


def test_capsules_under_4_kb_get_their_memory_figure_without_a_target() -> None:
    """tiny-t5's 512-byte capsules: the replica's growth per capsule measures CPython, not the design."""
    config = {**serving.settings(quick=False), "models": ["t"], "rounds": 1,
              "task_counts": {"rte": [1, 1000], "mix": [7]}}
    apps = {"t": {("rte", 1): _app([100], 400.0, 512), ("rte", 1000): _app([95], 402.0, 512 * 1000),
                  ("mix", 7): _app([40], 400.0, 7 * 512)}}
    adds = {"t": {"tasks": 1000, "add_s": 0.1, "call_s": 0.1, "first_answer_s": 0.2, "rss_mb": 402.0}}
    engine = {"t": {"table": [{"model": "t", "batch": "1 capsule", "ms_per_batch": 1.0}],
                    "extra_ops": [{"model": "t", "op": "aten::add", "extra_ms": 0.1}], "profile": "top ops"}}
    result = serving.tabulate(BenchResult(serving.NAME, serving.TITLE, config), apps, adds, engine)
    assert [t.name for t in result.targets] == ["t: throughput, rte rows, 1000 capsules / 1, worst of 1 round(s)"]
    [note] = [n for n in result.notes if "replica memory" in n]
    assert note.startswith("t: replica memory, 1000 RTE capsules over 1") and "4.100x, without a target" in note
    assert "capsules of 512 bytes" in note


def test_the_targets_take_the_worst_round_against_the_same_rows_and_the_memory_beyond_the_capsules() -> None:
    config = {**serving.settings(quick=False), "models": ["m"], "rounds": 3}
    mib = 2**20
    apps = {"m": {("rte", 1): _app([100, 50, 100], 400.0, mib), ("rte", 50): _app([95, 50, 80], 449.0, 50 * mib),
                  ("rte", 1000): _app([92, 46, 95], 1401.5, 1000 * mib, base=351.5),
                  ("mix", 7): _app([40, 20, 40], 400.0, 7 * mib),
                  ("mix", 1000): _app([36, 19, 40], 1400.0, 1000 * mib)}}
    adds = {"m": {"tasks": 1000, "add_s": 3.0, "call_s": 3.1, "first_answer_s": 3.3, "rss_mb": 1510.0,
                  "first_request_s": 0.2}}
    engine = {"m": {"table": [{"model": "m", "batch": "1 capsule", "ms_per_batch": 10.0}],
                    "extra_ops": [{"model": "m", "op": "aten::nonzero", "extra_ms": 1.0}], "profile": "top ops"}}
    result = serving.tabulate(BenchResult(serving.NAME, serving.TITLE, config), apps, adds, engine)
    rows = {(row["workload"], row["tasks"]): row for row in result.tables[0].rows}
    assert (rows["rte", 50]["vs_base_min"], rows["rte", 50]["vs_base_max"]) == (0.8, 1.0)
    assert rows["rte", 1000]["p99_ms"] == 500.0 and rows["mix", 7]["vs_base_median"] == 1.0
    assert rows["mix", 7]["vs_1_rte_median"] == 0.4 and len(result.tables[1].rows) == 15
    met = {t.name: (t.met, round(t.measured, 3)) for t in result.targets}
    assert met == {"m: throughput, rte rows, 50 capsules / 1, worst of 3 round(s)": (False, 0.8),
                   "m: throughput, rte rows, 1000 capsules / 1, worst of 3 round(s)": (True, 0.92),
                   "m: throughput, mix rows, 1000 capsules / 7, worst of 3 round(s)": (True, 0.9),
                   "m: replica memory, 1000 RTE capsules over 1, / the extra capsules' bytes": (True, 1.001)}
    load = result.tables[2].rows[0]
    # what the capsules added within each replica: the 1,000-capsule replica's base model came out 1.5 MB larger
    assert (load["rss_growth_mb"], load["capsules_mb"], load["add_s"]) == (1000.0, 999.0, 3.0)
    assert (load["loaded_growth_mb"], load["base_rss_mb"], load["base_rss_1_task_mb"]) == (1001.5, 351.5, 350.0)
    # the task mix's: its 1,000-capsule replica against the 7-task one
    assert (load["mix_growth_mb"], load["mix_capsules_mb"]) == (1000.0, 993.0)
    assert result.tables[3].rows == engine["m"]["table"] and list(result.profiles.values()) == ["top ops"]


def test_the_engine_batches_separate_distinct_capsules_other_tasks_and_bank_size(tmp_path: Path) -> None:
    from tiny_models import BUILDERS

    results = _jobs(tmp_path / "jobs", BUILDERS["t5"]())
    capsules = capsule_sets(results, {"mix": [30]}, tmp_path / "copies")["mix", 30]
    rows = {task: [{"task": task}] for task in serving.TASKS}
    chosen = serving_engine.batches(capsules, rows, 4)
    engine, alone = chosen["1 capsule"]
    assert engine == "small" and alone == [("rte", rows["rte"])] * 4
    distinct = chosen["4 RTE capsules"][1]
    assert len({name for name, _ in distinct}) == 4 and all(given == rows["rte"] for _, given in distinct)
    assert chosen["task mix"][1] == chosen["task mix, all capsules loaded"][1]
    assert {name for name, _ in chosen["task mix"][1]} == {"boolq", "cb", "copa", "multirc"}
    assert chosen["task mix, all capsules loaded"][0] == "all"


@pytest.mark.slow
def test_quick_mode_serves_encoder_capsules_with_their_heads_and_adds_one_while_running(tmp_path: Path) -> None:
    # As a user runs it, in a process of its own: Ray reads its auth mode once per process, and earlier tests in
    # this one may have run Ray clients without token auth.
    done = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", "serving", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = BenchResult.from_dict(json.loads((tmp_path / "serving.json").read_text()))
    assert result.error is None, result.error
    config = result.settings
    summary, per_round, loads, engine, ops = result.tables
    apps = [(row["model"], row["workload"], row["tasks"]) for row in summary.rows]
    assert apps == [(model, workload, count) for model in config["models"]
                    for workload, counts in config["task_counts"].items() for count in counts]
    for row in summary.rows:
        assert row["requests"] == config["requests"][row["model"]] * config["rounds"]
        assert row["rows_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["loaded_rss_mb"] > row["base_rss_mb"] > row["start_rss_mb"] > 0 and row["capsule_bytes"] > 0
    assert {(row["model"], row["workload"], row["tasks"]) for row in per_round.rows} == set(apps)
    assert [row["model"] for row in loads.rows] == config["models"]
    most = max(config["task_counts"]["rte"])
    assert all(row["tasks_after_add"] == most + 1 and row["add_s"] > 0 for row in loads.rows)
    beyond_a_baseline = sum(len(counts) - 1 for counts in config["task_counts"].values())
    sized = [row for row in loads.rows
             if row["capsules_mb"] * 2**20 / (row["tasks"] - 1) >= serving.MEMORY_TARGET_FROM_BYTES]
    assert len(result.targets) == beyond_a_baseline * len(config["models"]) + len(sized)  # throughput, memory
    assert sum("replica memory" in note and "without a target" in note for note in result.notes) == \
        len(loads.rows) - len(sized)
    labels = ["1 capsule", "8 RTE capsules", "task mix", "task mix, all capsules loaded"]
    assert [row["batch"] for row in engine.rows] == labels * len(config["models"])
    assert all(row["ms_per_batch"] > 0 for row in engine.rows) and ops.rows
    assert len(result.profiles) == len(config["models"]) == 1
    assert (tmp_path / "serving.json").is_file()
