"""The serving benchmark's pieces that need no Ray: capsule sets of 1, 7 and 50, and its table and targets.

The load test itself (`python -m benchmarks.run --only serving`) starts Ray Serve and is never run here.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.common import BenchResult  # noqa: E402


def test_fifty_tasks_are_on_disk_copies_of_the_seven_real_capsules(tmp_path: Path) -> None:
    results = {}
    for task in serving.TASKS:
        folder = tmp_path / "jobs" / task / "artifact"
        folder.mkdir(parents=True)
        (folder / "capsule.safetensors").write_bytes(task.encode())
        results[task] = {"task": task, "artifact_dir": str(folder)}
    sets = serving.capsule_sets(results, [1, 7, 50], tmp_path / "copies")
    assert [c.name for c in sets[1]] == ["rte"] and [c.name for c in sets[7]] == list(serving.TASKS)
    fifty = sets[50]
    assert len({c.name for c in fifty}) == 50 and len({c.capsule_dir for c in fifty}) == 50
    assert all((c.capsule_dir / "capsule.safetensors").read_bytes() == c.task.encode() for c in fifty)
    assert {c.task for c in fifty} == set(serving.TASKS)


def test_the_table_states_ratios_to_one_task_and_the_memory_beyond_the_capsules() -> None:
    config = serving.settings(quick=True)
    pooled = {1: {"rows": 100, "elapsed": 10.0, "latencies": [0.1] * 50, "rss_mb": 500.0, "loaded_rss_mb": 400.0},
              7: {"rows": 95, "elapsed": 10.0, "latencies": [0.1] * 49 + [0.5], "rss_mb": 501.0,
                  "loaded_rss_mb": 401.0},
              50: {"rows": 80, "elapsed": 10.0, "latencies": [0.2] * 50, "rss_mb": 530.0, "loaded_rss_mb": 430.0}}
    sizes = {1: 2**20, 7: 7 * 2**20, 50: 50 * 2**20}
    result = serving.tabulate(BenchResult(serving.NAME, serving.TITLE, config), pooled, sizes)
    rows = {row["tasks"]: row for row in result.tables[0].rows}
    assert rows[7]["vs_single"] == 0.95 and rows[50]["vs_single"] == 0.8 and rows[7]["p99_ms"] == 500.0
    met = {t.name: (t.met, round(t.measured, 3)) for t in result.targets}
    assert met == {"throughput, 7 tasks mixed / 1 task": (True, 0.95),
                   "throughput, 50 tasks mixed / 1 task": (False, 0.8),
                   "replica memory, 50 tasks over 1 task beyond the capsules' bytes": (True, -19.0)}
