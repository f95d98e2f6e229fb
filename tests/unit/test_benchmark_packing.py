"""The packing benchmark (`python -m benchmarks.run --only packing`) at its smallest: it runs the real pack and the
real sequential routes, and reports capsules per hour for every K."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import packing  # noqa: E402
from benchmarks.run import BENCHMARKS  # noqa: E402


def test_packing_is_a_registered_benchmark():
    assert BENCHMARKS["packing"] is packing
    assert packing.settings(quick=False)["ks"] == [1, 3, 9] and "minilm" in packing.settings(quick=False)["models"]


def test_members_differ_in_task_seed_and_learning_rate(tmp_path):
    overrides = [packing.member_overrides(packing.settings(quick=True), "minilm", i, tmp_path) for i in range(3)]
    assert [o for o in overrides[0] if o.startswith(("task.name", "seed", "optim.lr"))] == \
        ["task.name=rte", "seed=0", "optim.lr=0.03"]
    assert "task.name=cb" in overrides[1] and "seed=1" in overrides[1] and "optim.lr=0.1" in overrides[1]


def test_the_mixed_pack_has_one_member_per_task(tmp_path):
    config = packing.settings(quick=False)
    assert config["mix"] and not packing.settings(quick=True)["mix"]
    tasks = [next(o for o in packing.member_overrides(config, "minilm", i, tmp_path, packing.MIX_TASKS)
                  if o.startswith("task.name=")) for i in range(len(packing.MIX_TASKS))]
    assert tasks == [f"task.name={task}" for task in ("boolq", "cb", "copa", "multirc", "rte", "wic", "csqa")]


@pytest.mark.slow
def test_the_quick_benchmark_times_packs_and_sequential_members(tmp_path, monkeypatch):
    monkeypatch.delenv("CAPT_DATA_DIR", raising=False)
    # the mixed pack at two tasks of different layouts (a passage question, a choice of two)
    monkeypatch.setattr(packing, "MIX_TASKS", ("boolq", "copa"))
    config = {**packing.settings(quick=True), "steps": 1, "max_train_examples": 16, "max_eval_examples": 2,
              "mix": True}
    result = packing.run(config, tmp_path)
    (table,) = result.tables
    assert [(row["K"], row["tasks"]) for row in table.rows] == [(1, "rte/cb in turn"), (2, "rte/cb in turn"),
                                                                  (2, "boolq, copa")]
    for row in table.rows:
        assert row["packed_s"] > 0 and row["sequential_run_s"] > 0 and row["sequential_pack_of_one_s"] > 0
        assert row["capsules_per_hour_packed"] == pytest.approx(3600 * row["K"] / row["packed_s"])
    assert not result.targets, "the MiniLM target is stated only when MiniLM at K=9 was measured"
