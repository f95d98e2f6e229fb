"""The benchmark harness at minimal sizes: every module's pieces run and produce what the report needs.

The real benchmarks (`python -m benchmarks.run [--quick]`) are never run here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import (  # noqa: E402
    common,
    inference,
    learning,
    pipeline_overhead,
    report,
    step_cost,
    time_to_result,
)
from benchmarks.common import BenchResult, Table, Target  # noqa: E402
from capt.methods import method_names  # noqa: E402

TINY_T5 = {"num_layers": 1, "num_decoder_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 2, "d_kv": 16,
           "vocab_size": 128}
TINY_LLAMA = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 128}


def test_interleaved_times_every_callable_each_round_and_pairs_ratios():
    calls = []
    wall, cpu = common.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3,
                                   warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then a rotating start
    assert len(wall["a"]) == len(cpu["b"]) == 3
    ratios = common.paired_ratios({"ref": [1.0, 2.0], "m": [1.5, 2.0]}, "ref")
    assert ratios["m"] == [1.5, 1.0] and ratios["ref"] == [1.0, 1.0]


def test_a_missed_target_says_by_how_much():
    assert common.at_most("x", 1.0, 1.05).met
    missed = common.at_most("x", 1.26, 1.05)
    assert not missed.met and "0.210x" in missed.detail and "20.0 %" in missed.detail


def test_a_missed_lower_bound_says_by_how_much():
    assert common.at_least("efficiency", 0.85, 0.8).met
    missed = common.at_least("efficiency", 0.6, 0.8)
    assert not missed.met and missed.goal == ">= 0.8" and "0.200" in missed.detail and "25.0 %" in missed.detail


def test_pipeline_overhead_states_both_targets_for_the_minute_trials():
    row = {"trials": 3, "trial_s": 61.2, "overhead_per_trial_net_s": 6.5, "sweep_efficiency": 0.83}
    overhead, efficiency = pipeline_overhead.minute_targets(row)
    assert not overhead.met and overhead.goal == "<= 5 s" and "3 trial(s) of 61 s" in overhead.name
    assert efficiency.met and efficiency.measured == 0.83
    for quick in (True, False):
        overrides = pipeline_overhead.settings(quick)["minute_overrides"]
        assert any(o.startswith("job.train.max_steps=") for o in overrides)


@pytest.mark.slow
def test_step_cost_gives_a_ratio_to_the_floor_for_every_method(tmp_path):
    config = {"archs": [{"arch": "t5-base", "changes": TINY_T5, "batch": 2, "seq": 8, "target": 2},
                        {"arch": "llama-3.2-1b", "changes": TINY_LLAMA, "batch": 2, "seq": 8, "target": 2}],
              "rounds": 1, "warmup": 1, "profile_passes": 1, "target_ratio": 1.05}
    result = step_cost.run(config, tmp_path)
    costs = [t for t in result.tables if "method" in t.columns]
    assert len(costs) == 2
    for table in costs:
        assert [r["method"] for r in table.rows] == ["floor", *step_cost.METHODS]
        assert all(r["ratio_to_floor"] > 0 and r["peak_step_mb"] > 0 for r in table.rows)
        rows = {r["method"]: r for r in table.rows}
        assert rows["capt"]["trainable"] == 32  # one vector, one layer
        # Exact work: CaPT's step is the floor's; 100 prompt tokens and full fine-tuning cost more.
        assert rows["capt"]["flop_ratio_to_floor"] == pytest.approx(1.0, abs=1e-3)
        assert rows["prompt_tuning-100"]["flop_ratio_to_floor"] > 2
        assert rows["full_finetune"]["flop_ratio_to_floor"] > 1.2
    assert len(result.targets) == 4 and (tmp_path / "step_cost.png").is_file()
    assert any("CaPT step" in title and "Self CPU" in text for title, text in result.profiles.items())


def test_flops_count_attention_on_cpu_forward_and_backward():
    from benchmarks.profiling import count_flops

    q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))  # (B, H, T, d)
    forward = 2 * (2 * 2 * 8 * 8 * 4)  # scores and output: two (T x d) @ (d x T)-sized products per head
    with torch.no_grad():
        assert count_flops(lambda: F.scaled_dot_product_attention(q, k, v)) == forward
    assert count_flops(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward()) > 2 * forward


def test_the_floor_step_gives_only_the_input_a_gradient():
    from benchmarks import models

    config = models.config_for("llama-3.2-1b", **TINY_LLAMA)
    model = models.build(config)
    step_cost.floor_step(model, step_cost.make_batch(config, 2, 6, 2))()
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())


def test_time_to_result_schedule_spreads_the_capt_runs_and_ratios_use_their_median():
    order = [m for m, _ in time_to_result.schedule([1, 5], capt_runs=3)]
    assert order == ["capt", "prompt_tuning", "ptuning_v2", "capt", "prompt_tuning", "ptuning_v2", "capt"]
    runs = [{"method": "capt", "wall_s": w, "fit_s": w} for w in (1.0, 2.0, 9.0)]
    runs += [{"method": m, "length": n, "wall_s": 3.0, "fit_s": 3.0} for m in time_to_result.GRID_METHODS
             for n in (1, 5)]
    rows, ratios = time_to_result.summarise(runs)
    assert ratios == {"prompt_tuning": 3.0, "ptuning_v2": 3.0} and rows[1]["paper"] == 8.77


def test_time_to_result_runs_the_pipeline_jobs(tmp_path, monkeypatch):
    monkeypatch.delenv("CAPT_DATA_DIR", raising=False)
    config = {**time_to_result.settings(quick=True), "lengths": [1], "capt_runs": 1, "steps": 1,
              "max_eval_examples": 4, "max_train_examples": 16, "batch_size": 4}
    result = time_to_result.run(config, tmp_path)
    assert [r["method"] for r in result.tables[0].rows] == ["capt", "prompt_tuning", "ptuning_v2"]
    assert all(r["ratio"] > 0 for r in result.tables[1].rows)


def test_inference_throughput_of_every_mode_and_artifact_sizes(tmp_path):
    config = {"arch": "t5-small", "changes": TINY_T5, "rows_per_task": 1, "seq": 8, "target": 2, "rounds": 1}
    rows, _ = inference.throughput(config)
    assert {r["mode"] for r in rows} >= {inference.BARE, inference.MIXED}
    assert all(r["rows"] == 7 and r["rows_per_s"] > 0 for r in rows)
    size = inference.artifact_row("t5-base", tmp_path)
    assert size["capsule_parameters"] == 12 * 768 and size["tensor_bytes"] == 36864
    assert 36864 < size["capsule.safetensors_bytes"] < 36864 + 512


def test_learning_splits_boolq_and_skips_without_data(tmp_path, monkeypatch):
    source = tmp_path / "data"
    (source / "boolq").mkdir(parents=True)
    (source / "boolq" / "val.jsonl").write_text("".join(json.dumps({"idx": i}) + "\n" for i in range(9)))
    (source / "cb").mkdir()
    for split in ("train", "val"):
        (source / "cb" / f"{split}.jsonl").write_text("{}\n")
    ready, notes = learning.prepare_data(source, tmp_path / "ready", ["cb", "boolq", "wic"],
                                         learning.settings(quick=True))
    assert ready == ["cb", "boolq"] and any("wic: skipped" in n for n in notes)
    assert len((tmp_path / "ready" / "boolq" / "train.jsonl").read_text().splitlines()) == 6
    assert len((tmp_path / "ready" / "boolq" / "val.jsonl").read_text().splitlines()) == 3
    monkeypatch.delenv("CAPT_DATA_DIR", raising=False)
    assert "CAPT_DATA_DIR" in learning.run(learning.settings(quick=True), tmp_path).skipped


@pytest.mark.skipif(not os.environ.get("CAPT_DATA_DIR"), reason="needs the real task files (CAPT_DATA_DIR)")
def test_the_quick_learning_route_tabulates_the_trials_it_ran(tmp_path):
    # the trial folders are keyed by configs that hold the benchmark's own data dir, not the caller's CAPT_DATA_DIR
    config = learning.settings(quick=True)
    config["overrides"] = [*config["overrides"], "job.train.max_steps=1", "job.train.eval_every_steps=1",
                           "methods=[{name: capt, label: head-only+anchor, options: {task_vector: false}, "
                           "select: {optim.head_lr: [0.01, 0.03]}}]"]
    result = learning.run(config, tmp_path)
    assert not result.skipped and not result.error
    (trials,) = [table.rows for table in result.tables if table.title == "Every trial"]
    assert [(row["method"], row["task"], row["steps"]) for row in trials] == [("head-only+anchor", "cb", 1)]
    assert trials[0]["test_score"] is not None and trials[0]["head_lr"] == 0.01, "the first combination ran"
    assert trials[0]["majority"] > 0 and trials[0]["chance"] > 0, "the job's reference levels, for the merge"
    settings = trials[0]["settings"]  # what produced the cell: its resolved config's hash and training values
    assert isinstance(trials[0]["config_hash"], str) and len(trials[0]["config_hash"]) >= 8
    assert settings["optim"]["head_lr"] == 0.01 and settings["optim"]["schedule"] and settings["max_steps"] == 1
    assert settings["method"]["options"]["task_vector"] is False
    assert "head-only+anchor" in (tmp_path / "learning" / "report.md").read_text()


def test_the_sweep_configs_of_the_benchmarks_are_valid(monkeypatch, tmp_path):
    from pipelines.sweeps.config import load_sweep_config, trials

    monkeypatch.setenv("CAPT_DATA_DIR", str(tmp_path))
    grid = trials(load_sweep_config(ROOT / learning.CONFIG, []))
    # every row selects among 3 lrs (head-only: its head's lr) per task and seed, at MiniLM's validated readout
    assert len(grid) == 5 * 3 * 14 * 3
    for method in {t.method for t in grid}:
        assert len({t.select.get("optim.lr", t.select.get("optim.head_lr")) for t in grid if t.method == method}) >= 3
    assert {t.job["model"]["readout"] for t in grid} == {"mean"}
    assert {t.job["method"]["name"] for t in grid} == set(method_names()), \
        "CaPT and every registered baseline are rows of the grid"
    assert len(learning.first_combinations(grid)) == 5 * 14 * 3, "the quick route runs one combination per row"
    assert len(trials(load_sweep_config(ROOT / "pipelines/configs/bench/overhead.yaml", []))) == 4
    for name in ("learning", "overhead"):
        first = (ROOT / f"pipelines/configs/bench/{name}.yaml").read_text().splitlines()[0]
        assert first.startswith("#") and "pipelines/sweep.py --config pipelines/configs/bench/" in first


def test_pipeline_overhead_reads_the_sweep_log_and_runs_the_trial_jobs_in_process(tmp_path):
    log = tmp_path / "sweep.log"
    log.write_text("2026-01-01 10:00:00,000 INFO x: starting MLflow server at http://127.0.0.1:1\n"
                   "2026-01-01 10:00:12,500 INFO x: MLflow server ready at http://127.0.0.1:1\n")
    assert pipeline_overhead.mlflow_start_in_log(log) == 12.5
    starts = [{"component": "ray.init (local)", "median_s": 5.0}, {"component": "ray.shutdown", "median_s": 1.0},
              {"component": pipeline_overhead.MLFLOW_IN_SWEEP, "median_s": 12.5}]
    assert pipeline_overhead.fixed_costs(starts) == 13.5, "Ray starts while the server does: counted once"
    probes = [*starts[:2], {"component": pipeline_overhead.MLFLOW_PROBE, "median_s": 6.0},
              {"component": "mlflow server stop", "median_s": 1.5}]
    assert pipeline_overhead.fixed_costs(probes) == 12.5
    config = pipeline_overhead.settings(quick=True)
    measured = pipeline_overhead.run_in_process(config, tmp_path, 0, limit=1)
    assert measured["trials"] == 1 and measured["wall_s"] >= measured["fit_s"] > 0


@pytest.mark.parametrize("missed", [False, True])
def test_the_report_states_machine_versions_and_misses(tmp_path, missed):
    target = Target("CaPT step / floor (t5-base)", "<= 1.05x", 1.2 if missed else 1.0, not missed,
                    "missed by 0.150x (14.3 % over the limit)" if missed else "met")
    result = BenchResult("step_cost", "Step cost", {"rounds": 1, "mode": "quick"},
                         tables=[Table("costs", ["method", "ratio_to_floor"],
                                       [{"method": "capt", "ratio_to_floor": 1.2}])],
                         targets=[target], profiles={"CaPT step, t5-base": "aten::mm 80%"}, duration_s=3.0)
    info = {"date": common.now_iso(), "command": "python -m benchmarks.run --quick", "machine": common.machine(),
            "versions": common.versions(), "total_s": 3.0}
    text = report.write_report([result], info, tmp_path).read_text()
    assert "## Machine and versions" in text and "CPU:" in text and "RAM:" in text and "torch " in text
    assert "| capt | 1.2 |" in text and "quick mode" in text
    assert ("missed by 0.150x" in text and "aten::mm 80%" in text) == missed


def test_learning_overrides_reach_the_learning_settings(monkeypatch, tmp_path):
    from benchmarks.run import parse, run_benchmark

    args = parse(["--only", "learning", "--learning-override", "seeds=[0]", "--learning-override", "tasks=[cb]"])
    assert args.learning_override == ["seeds=[0]", "tasks=[cb]"]
    monkeypatch.delenv("CAPT_DATA_DIR", raising=False)
    result = run_benchmark(learning, False, tmp_path, args.learning_override)
    assert result.skipped and result.settings["overrides"] == ["seeds=[0]", "tasks=[cb]"]
    assert json.loads((tmp_path / "learning.json").read_text())["settings"]["overrides"] == ["seeds=[0]", "tasks=[cb]"]


def test_learning_rows_pick_the_grids_own_rows_and_refuse_unknown_ones(capsys, monkeypatch, tmp_path):
    from benchmarks.run import parse
    from pipelines.sweeps.config import load_sweep_config, trials

    args = parse(["--only", "learning", "--learning-override", "tasks=[cb]", "--learning-rows", "head-only+anchor",
                  "lora"])
    monkeypatch.setenv("CAPT_DATA_DIR", str(tmp_path))
    picked = trials(load_sweep_config(ROOT / learning.CONFIG, args.learning_override))
    full = [t for t in trials(load_sweep_config(ROOT / learning.CONFIG, ["tasks=[cb]"]))
            if t.method in ("head-only+anchor", "lora")]
    assert {t.method for t in picked} == {"head-only+anchor", "lora"} and len(picked) == 2 * 3 * 3
    assert sorted(t.job["output_dir"] for t in picked) == sorted(t.job["output_dir"] for t in full), \
        "a piece's trials are the whole grid's trials, config for config"
    with pytest.raises(SystemExit) as exit_info:
        parse(["--only", "learning", "--learning-rows", "lora", "dora", "ia3"])
    message = capsys.readouterr().err
    assert exit_info.value.code == 2 and "dora, ia3" in message and "head-only+anchor" in message


def test_a_bad_out_folder_and_bad_learning_overrides_are_refused_together_before_any_benchmark(capsys):
    from benchmarks.run import parse

    with pytest.raises(SystemExit) as exit_info:
        parse(["--only", "learning", "--quick", "--out", "/proc/capt-bench", "--learning-override", "nope=1",
               "--learning-override", "job.train.max_steps=-2", "--learning-rows", "dora"])
    message = capsys.readouterr().err
    assert exit_info.value.code == 2, message
    for problem in ("--out='/proc/capt-bench' is on a kernel file system", "unknown row(s) dora",
                    "nope: unknown key (value 1; allowed keys: name, tasks,", "train.max_steps=-2"):
        assert problem in message, problem


def test_time_to_result_and_serving_run_on_a_named_model_and_refuse_an_unknown_one(capsys):
    from benchmarks import serving
    from benchmarks.run import parse

    args = parse(["--only", "time_to_result", "serving", "--time-to-result-model", "smollm2-135m",
                  "--serving-model", "smollm2-135m"])
    ttr = time_to_result.for_model(time_to_result.settings(False), args.time_to_result_model)
    assert (ttr["model"], ttr["steps"], ttr["lengths"]) == ("smollm2-135m", 10, [1, 5, 10, 20, 50, 100])
    assert time_to_result.for_model(time_to_result.settings(False), "minilm") == time_to_result.settings(False)
    served = serving.for_model(serving.settings(False), args.serving_model)
    assert served["models"] == ["smollm2-135m"] and served["task_counts"] == {"rte": [1, 1000]}
    assert set(served["requests"]) == {"smollm2-135m"} and served["tasks"] == ["rte"]
    for option in ("--time-to-result-model", "--serving-model"):
        with pytest.raises(SystemExit) as exit_info:
            parse([option, "llama-7b"])
        assert exit_info.value.code == 2 and "smollm2-135m" in capsys.readouterr().err


def test_a_run_records_the_commit_it_ran_at():
    from benchmarks.run import run_info

    info = run_info(["--quick"], 1.0)
    assert len(info["commit"]) == 40 and isinstance(info["tree_clean"], bool)
    assert info["commit"] == common.commit_info()["commit"]
