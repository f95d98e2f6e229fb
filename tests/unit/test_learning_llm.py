"""The SmolLM2 learning benchmark (benchmarks/learning_llm.py): it resumes without retraining a recorded trial,
selects on validation only, and its shipped report and README table are what its records give, cell by cell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import learning_llm
from pipelines.training.outputs import RESULT_DIGEST_KEY, result_digest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / learning_llm.OUT
TINY = ["models=[tiny-llama]", "data_source=generated", "tasks=[cb]", "seeds=[0]", "job.train.max_steps=1",
        "job.train.eval_every_steps=1", "job.task.generated_size=16", "job.task.max_eval_examples=4",
        "job.model.max_length=48", 'methods=[{"name": "capt", "select": {"optim.lr": [0.01, 0.1]}}]']


def _record(task: str, row: str, seed: int, lr: float, validation: float, test: float,
            untrained: float | None = None) -> dict:
    result = {"config_hash": f"{task}{row}{seed}{lr}", "metrics": {
        "best_validation_score": validation, "test_score": test, "test_majority_score": 50.0,
        **({"test_untrained_score": untrained} if untrained is not None else {})}}
    result[RESULT_DIGEST_KEY] = result_digest(result)
    return {"task": task, "row": row, "seed": seed, "select": {"optim.lr": lr}, "result": result}


def test_selection_uses_validation_and_pairs_capt_with_each_row_by_seed():
    records = []
    for seed in (0, 1, 2):
        # lr 0.1 validates better, lr 0.01 tests better: the report must show lr 0.1's test scores
        records += [_record("cb", "capt", seed, 0.1, 80.0, 60.0 + seed), _record("cb", "capt", seed, 0.01, 70.0, 90.0),
                    _record("cb", "lora", seed, 0.001, 75.0, 55.0, untrained=40.0 + seed),
                    _record("cb", "lora", seed, 0.01, 60.0, 95.0, untrained=40.0 + seed)]
        records.append(_record("cb", learning_llm.STEP0_FROM, seed, 0.05, 10.0, 99.0, untrained=50.0 + 2 * seed))
    report = learning_llm.build_report(records)
    assert report["cells"]["cb|capt-step0"]["test"] == [50.0, 52.0, 54.0]  # the capsule before its first step
    assert report["paired"]["cb|capt-step0"] == [10.0, 9.0, 8.0]
    assert learning_llm.STEP0_FROM not in report["rows"] and "99.0" not in learning_llm.markdown(report)
    assert report["cells"]["cb|capt"]["select"] == "optim.lr=0.1"
    assert report["cells"]["cb|capt"]["test"] == [60.0, 61.0, 62.0]
    assert report["cells"]["cb|lora"]["test"] == [55.0, 55.0, 55.0]
    assert report["cells"]["cb|untrained"]["test"] == [40.0, 41.0, 42.0]
    assert report["paired"]["cb|lora"] == [5.0, 6.0, 7.0]
    assert report["paired"]["cb|untrained"] == [20.0, 20.0, 20.0]
    text = learning_llm.markdown(report)
    assert "| capt | 61.0 ± 1.0 (3) | 61.0 |" in text and "| lora | 6.0 ± 1.0 (3) |" in text


def test_an_ordering_holds_only_where_every_seed_agrees():
    """A higher mean is not enough: an ordering holds where CaPT is above the row on every seed (paired, averaged over
    the claim's tasks), is reversed where it is below on every seed, and is not told apart where seeds disagree."""
    records = []
    for seed, (capt, ptuning, length4) in enumerate([(60.0, 50.0, 70.0), (60.0, 55.0, 71.0), (60.0, 70.0, 72.0)]):
        records += [_record("cb", "capt", seed, 0.1, 80.0, capt),
                    _record("cb", "lora", seed, 0.1, 80.0, 50.0, untrained=40.0 + seed),  # the untrained row's source
                    _record("cb", "ptuning_v2", seed, 0.1, 80.0, ptuning),
                    _record("cb", "capt-length4", seed, 0.1, 80.0, length4)]
    verdicts = dict(learning_llm.orderings(learning_llm.build_report(records)))
    by_row = {row: verdicts[claim] for claim, _, row in learning_llm.ORDERINGS}
    assert by_row["ptuning_v2"].startswith("not told apart (the seeds disagree;")  # means 60.0 against 58.3
    assert "paired by seed +1.7 ± 10.4 (3)" in by_row["ptuning_v2"]
    assert by_row["capt-length4"].startswith("does not hold (the other row is above on every seed;")
    assert by_row["untrained"].startswith("holds (on every seed;")
    assert by_row["capt-task-only"].startswith("not measured yet")
    unpaired = [_record("csqa", row, seed + shift, 0.1, 80.0, 30.0)  # 3 seeds each, not the same ones
                for row, shift in (("capt", 0), ("capt-task-only", 5)) for seed in range(3)]
    verdicts = dict(learning_llm.orderings(learning_llm.build_report(unpaired)))
    assert verdicts[learning_llm.ORDERINGS[1][0]] == "not measured yet (3 seeds paired in every cell needed)"


@pytest.mark.slow
def test_a_stopped_grid_resumes_without_retraining_a_recorded_trial(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPT_DATA_DIR", str(tmp_path / "unused"))  # the generated grid reads no files
    out, work = tmp_path / "out", tmp_path / "work"
    args = ["--out", str(out), "--work", str(work), *TINY]
    assert learning_llm.main([*args[:4], "--limit", "1", *TINY]) == 0
    first = sorted((out / "trials").glob("*.json"))
    assert len(first) == 1
    stamp = first[0].stat().st_mtime_ns
    assert learning_llm.main(args) == 0
    trials = sorted((out / "trials").glob("*.json"))
    assert len(trials) == 2 and first[0].stat().st_mtime_ns == stamp, "the recorded trial was trained again"
    runs = json.loads((out / "run.json").read_text())
    assert len(runs) == 2 and all(len(r["commit"]) == 40 for r in runs)
    # a record whose result was edited is not believed: its trial runs again
    record = json.loads(trials[0].read_text())
    record["result"]["metrics"]["test_score"] = 100.0
    trials[0].write_text(json.dumps(record))
    assert learning_llm.main(args) == 0
    assert learning_llm.intact(json.loads(trials[0].read_text()))


@pytest.mark.skipif(not (SHIPPED / "trials").is_dir(), reason="no shipped SmolLM2 results yet")
def test_the_shipped_report_and_readme_table_are_what_the_records_give():
    records = learning_llm.load_records(SHIPPED)
    assert len(records) == len(list((SHIPPED / "trials").glob("*.json"))), "a shipped record is damaged"
    expected = learning_llm.markdown(learning_llm.build_report(records))
    assert (SHIPPED / "report.md").read_text() == expected
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    block = re.search(f"{learning_llm.README_START}(.*?){learning_llm.README_END}", readme, re.S)
    assert block, "benchmarks/README.md holds the SmolLM2 report between its markers"
    assert block.group(1) == expected.split("\n", 2)[2]  # the report without its title line
    assert all(len(run["commit"]) == 40 for run in json.loads((SHIPPED / "run.json").read_text()))
