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


def test_a_thousand_tasks_are_on_disk_copies_of_the_seven_real_capsules(tmp_path: Path) -> None:
    results = {}
    for task in serving.TASKS:
        folder = tmp_path / "jobs" / task / "artifact"
        folder.mkdir(parents=True)
        (folder / "capsule.safetensors").write_bytes(task.encode())
        (folder / "head.safetensors").write_bytes(b"h")
        results[task] = {"task": task, "artifact_dir": str(folder)}
    sets = capsule_sets(results, [1, 7, 50, 1000], tmp_path / "copies")
    assert [c.name for c in sets[1]] == ["rte"] and [c.name for c in sets[7]] == list(serving.TASKS)
    for count in (50, 1000):
        many = sets[count]
        assert len({c.name for c in many}) == count and len({c.capsule_dir for c in many}) == count
        assert all((c.capsule_dir / "capsule.safetensors").read_bytes() == c.task.encode() for c in many)
        assert [c.task for c in many[:14]] == list(serving.TASKS) * 2  # the same mix of tasks at every count
    assert weight_bytes(sets[1][0].capsule_dir) == len("rte") + 1  # the capsule and its task head


def test_every_round_runs_every_application_once_from_a_rotated_start() -> None:
    apps = [(model, count) for model in ("a", "b") for count in (1, 7, 50, 1000)]
    rounds = serving.schedule(apps, 3)
    assert all(sorted(order) == sorted(apps) for order in rounds)
    assert len({order[0] for order in rounds}) == 3


def _app(rates: list[float], rss: float, capsule_bytes: int) -> dict:
    return {"ready_s": 5.0, "init_s": 4.0, "start_rss_mb": 300.0, "loaded_rss_mb": rss, "rss_mb": rss + 10,
            "capsule_bytes": capsule_bytes,
            "rounds": [{"round": r, "requests": 10, "elapsed": 20 / rate, "latencies": [0.1] * 9 + [0.5]}
                       for r, rate in enumerate(rates)]}


def test_the_targets_take_the_worst_round_and_the_memory_beyond_the_capsules() -> None:
    config = {**serving.settings(quick=False), "models": ["m"], "rounds": 3}
    mib = 2**20
    apps = {"m": {1: _app([100, 50, 100], 400.0, mib), 7: _app([90, 45, 90], 400.0, 7 * mib),
                  50: _app([95, 50, 80], 449.0, 50 * mib), 1000: _app([92, 46, 95], 1400.0, 1000 * mib)}}
    adds = {"m": {"tasks": 1000, "add_s": 3.0, "call_s": 3.1, "first_answer_s": 3.3, "rss_mb": 1510.0,
                  "first_request_s": 0.2}}
    engine = {"m": {"table": [{"model": "m", "batch": "1 capsule", "ms_per_batch": 10.0}],
                    "extra_ops": [{"model": "m", "op": "aten::nonzero", "extra_ms": 1.0}], "profile": "top ops"}}
    result = serving.tabulate(BenchResult(serving.NAME, serving.TITLE, config), apps, adds, engine)
    rows = {row["tasks"]: row for row in result.tables[0].rows}
    assert (rows[50]["vs_single_min"], rows[50]["vs_single_max"]) == (0.8, 1.0) and rows[1000]["p99_ms"] == 500.0
    assert rows[7]["vs_7_median"] == 1.0 and len(result.tables[1].rows) == 12
    met = {t.name: (t.met, round(t.measured, 3)) for t in result.targets}
    assert met == {"m: throughput, 50 tasks mixed / 1 task, worst of 3 round(s)": (False, 0.8),
                   "m: throughput, 1000 tasks mixed / 1 task, worst of 3 round(s)": (True, 0.92),
                   "m: replica memory, 1000 tasks over 1 task, / the extra capsules' bytes": (True, 1.001)}
    load = result.tables[2].rows[0]
    assert (load["rss_growth_mb"], load["capsules_mb"], load["add_s"]) == (1000.0, 999.0, 3.0)
    assert result.tables[3].rows == engine["m"]["table"] and list(result.profiles.values()) == ["top ops"]


def test_the_engine_batches_separate_distinct_capsules_other_tasks_and_bank_size(tmp_path: Path) -> None:
    (tmp_path / "artifact").mkdir()
    results = {task: {"task": task, "artifact_dir": str(tmp_path / "artifact")} for task in serving.TASKS}
    capsules = capsule_sets(results, [1000], tmp_path / "copies")[1000]
    rows = {task: [{"task": task}] for task in serving.TASKS}
    chosen = serving_engine.batches(capsules, rows, 8)
    engine, alone = chosen["1 capsule"]
    assert engine == "small" and alone == [("rte", rows["rte"])] * 8
    distinct = chosen["8 RTE capsules"][1]
    assert len({name for name, _ in distinct}) == 8 and all(given == rows["rte"] for _, given in distinct)
    assert chosen["task mix"][1] == chosen["task mix, all capsules loaded"][1]
    assert {name for name, _ in chosen["task mix"][1]} == {*serving.TASKS, "boolq-7"}
    assert chosen["task mix, all capsules loaded"][0] == "all"


@pytest.mark.slow
def test_quick_mode_serves_both_kinds_of_model_and_adds_a_capsule_while_running(tmp_path: Path) -> None:
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
    apps = [(row["model"], row["tasks"]) for row in summary.rows]
    assert apps == [(model, count) for model in config["models"] for count in config["task_counts"]]
    for row in summary.rows:
        assert row["requests"] == config["requests"][row["model"]] * config["rounds"]
        assert row["rows_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["loaded_rss_mb"] > row["start_rss_mb"] > 0 and row["capsule_bytes"] > 0
    assert {(row["model"], row["tasks"]) for row in per_round.rows} == set(apps)
    assert [row["model"] for row in loads.rows] == config["models"]
    assert all(row["tasks_after_add"] == max(config["task_counts"]) + 1 and row["add_s"] > 0 for row in loads.rows)
    beyond_the_mix = sum(count > len(config["tasks"]) for count in config["task_counts"])
    assert len(result.targets) == (beyond_the_mix + 1) * len(config["models"])  # throughput beyond the mix, memory
    labels = ["1 capsule", "8 RTE capsules", "task mix", "task mix, all capsules loaded"]
    assert [row["batch"] for row in engine.rows] == labels * len(config["models"])
    assert all(row["ms_per_batch"] > 0 for row in engine.rows) and ops.rows and len(result.profiles) == 2
    assert (tmp_path / "serving.json").is_file()
