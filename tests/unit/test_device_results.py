"""The GPU run's shipped results: benchmarks/README.md's numbers are the shipped JSONs', and the device check's
`--merge` builds one folder from several partial device-check calls."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.markdown import table_rows

from benchmarks import device_check
from benchmarks.common import BenchResult, Table, at_least, save_result

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "benchmarks/README.md"
RESULTS = ROOT / "benchmarks/results/device_check"
ARCHS = {"T5-Base": "t5-base", "Llama-3.2-1B": "llama-3.2-1b", "Qwen2.5-1.5B": "qwen2.5-1.5b"}


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    return text[text.index("### The run on one H200"):].split("\n## ")[0]


def _table_after(heading: str) -> list[list[str]]:
    """The body rows of the first Markdown table after `heading` in the GPU run's section."""
    lines = _section().split(heading, 1)[1].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = lines[first: next(i for i in range(first, len(lines)) if not lines[i].startswith("|"))]
    return table_rows(table)[1:]


def _result(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


def test_the_step_cost_table_is_the_shipped_json():
    tables = {table["title"].split(" ")[0]: {row["method"]: row for row in table["rows"]}
              for table in _result("device_step_cost")["tables"]}
    body = _table_after("**Step cost**")
    assert [row[0] for row in body] == list(ARCHS)
    for arch, floor_ms, capt_ms, ratio, spread, flops, tflops, peaks in body:
        rows = tables[ARCHS[arch]]
        floor, capt = rows["floor"], rows["capt"]
        assert float(floor_ms) == round(floor["median_step_s"] * 1000, 1)
        assert float(capt_ms) == round(capt["median_step_s"] * 1000, 1)
        assert (float(ratio), spread) == (round(capt["ratio_to_floor"], 3), capt["ratio_range"])
        assert float(flops) == round(capt["flop_ratio_to_floor"], 3)
        assert float(tflops) == round(floor["gflops"] / floor["median_step_s"] / 1000, 1)
        assert peaks == f"{floor['peak_step_mb']:.0f} / {capt['peak_step_mb']:.0f}"
        assert capt["trainable"] and capt["gflops"] == floor["gflops"]


def test_the_packing_table_is_the_shipped_json():
    result = _result("device_packing")
    rows = result["tables"][0]["rows"]
    body = _table_after("**Packing**")
    assert len(body) == len(rows) == 3
    for (k, packed, sequential, per_hour, ratio), row in zip(body, rows, strict=True):
        assert int(k) == row["K"] and float(packed) == round(row["packed_s"], 1)
        assert sequential == f"{row['sequential_run_s']:.1f} / {row['sequential_pack_of_one_s']:.1f}"
        assert per_hour == f"{row['capsules_per_hour_packed']:.0f} / {row['capsules_per_hour_sequential']:.0f}"
        assert float(ratio) == round(row["ratio"], 2)
    assert f"**missed** ({rows[-1]['ratio']:.2f}x)" in _section()
    assert [t["met"] for t in result["targets"]] == [False]


def test_the_serving_table_is_the_shipped_json():
    result = _result("device_serving")
    rows = result["tables"][0]["rows"]
    body = _table_after("**Serving**")
    assert len(body) == len(rows) == 4
    for (workload, capsules, rate, worst, median, p50, ready), row in zip(body, rows, strict=True):
        assert (workload, int(capsules.replace(",", ""))) == (row["workload"], row["tasks"])
        assert float(rate) == round(row["rows_per_s"], 1) and int(p50) == round(row["p50_ms"])
        assert (float(worst), float(median)) == (round(row["vs_base_min"], 3), round(row["vs_base_median"], 3))
        assert float(ready) == round(row["ready_s"], 1)
    assert all(t["met"] for t in result["targets"]) and len(result["targets"]) == 3
    memory = result["targets"][2]["measured"]
    assert f"replica memory {memory:.2f}x" in _section()


def test_the_sweep_sentence_is_the_shipped_json():
    trials, sweep = (t["rows"] for t in _result("device_sweep")["tables"])
    section = " ".join(_section().split())
    walls = sorted(row["wall_time_s"] for row in trials)
    rates = sorted(row["tokens_per_second"] for row in trials)
    assert len(trials) == 4 and {row["steps"] for row in trials} == {30}
    assert f"each 30 steps in {walls[0]:.1f}-{walls[-1]:.1f} s" in section
    assert f"({rates[0]:.0f}-{rates[-1]:.0f} tokens/s, peak {trials[0]['peak_memory_mb']:.0f} MB" in section
    assert f"the sweep took {sweep[0]['sweep_wall_s']:.1f} s" in section
    assert "Created version '4' of model 'capt-t5-base-shape-cb'" in (RESULTS / "device_sweep.log").read_text()


def test_the_shipped_run_lists_every_call_and_the_gpu():
    run = json.loads((RESULTS / "run.json").read_text(encoding="utf-8"))
    assert run["machine"]["gpu"].startswith("NVIDIA H200") and run["settings"]["name"] == "gpu"
    assert len(run["calls"]) == 3 and run["versions"]["ray"] == "2.60.0"
    assert re.search(r"\(step cost and packing, 186 s; the sweep, 69 s; serving, 279 s", " ".join(_section().split()))
    assert [round(call["total_s"]) for call in run["calls"]] == [186, 96, 281]


def _partial(folder: Path, parts: dict[str, str | None], ray: str) -> Path:
    """A device-check folder holding `parts` (name -> error or None) and its run.json."""
    for name, error in parts.items():
        result = BenchResult(name, name, {"from": folder.name}, error=error)
        result.tables = [Table("t", ["x"], [{"x": folder.name}])]
        result.targets = [at_least(f"{name} target", 1.0, 1.0)]
        save_result(result, folder)
    (folder / "device_sweep.log").write_text(f"log of {folder.name}\n")
    versions = {"torch": "2.11.0", "ray": ray}
    run = {"date": f"2026-12-04T{folder.name}", "command": f"call {folder.name}", "machine": {"cpu_model": "x"},
           "versions": versions, "settings": {"name": "gpu"}, "total_s": 10.0}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def test_merge_keeps_each_parts_last_success_and_lists_every_call(tmp_path):
    first = _partial(tmp_path / "a", {"device_step_cost": None, "device_sweep": None}, ray="not installed")
    second = _partial(tmp_path / "b", {"device_serving": "grpc", "device_sweep": "failed again"}, "2.60.0")
    third = _partial(tmp_path / "c", {"device_serving": None}, ray="2.60.0")
    out = tmp_path / "merged"
    assert device_check.main(["--out", str(out), "--merge", str(first), str(second), str(third)]) == 0
    loaded = {name: json.loads((out / f"{name}.json").read_text())["settings"]["from"]
              for name in ("device_step_cost", "device_serving", "device_sweep")}
    assert loaded == {"device_step_cost": "a", "device_serving": "c", "device_sweep": "a"}
    assert (out / "device_sweep.log").read_text() == "log of a\n"
    run = json.loads((out / "run.json").read_text())
    assert [call["command"] for call in run["calls"]] == ["call a", "call b", "call c"]
    assert run["versions"]["ray"] == "2.60.0" and run["total_s"] == 30.0 and run["date"].endswith("a")
    report = (out / "report.md").read_text()
    assert "`device_step_cost`" in report and "`device_sweep`" in report and "**Failed:**" not in report


def test_merge_keeps_a_failure_when_no_call_succeeded(tmp_path):
    only = _partial(tmp_path / "a", {"device_packing": "OOM"}, ray="2.60.0")
    device_check.merge([only], tmp_path / "out")
    assert json.loads((tmp_path / "out/device_packing.json").read_text())["error"] == "OOM"
    assert "**Failed:** OOM" in (tmp_path / "out/report.md").read_text()


@pytest.mark.parametrize("broken_run_json", [False, True])
def test_merge_of_nothing_usable_is_exit_2_with_one_line(tmp_path, capsys, broken_run_json):
    source = tmp_path / "empty"
    source.mkdir()
    if broken_run_json:  # a part, but a run.json cut short
        _partial(source, {"device_packing": None}, ray="2.60.0")
        (source / "run.json").write_text("{")
    assert device_check.main(["--out", str(tmp_path / "out"), "--merge", str(source)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot merge") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_smollm2_step_cost_table_is_the_shipped_runs():
    """benchmarks/README.md's SmolLM2 step-cost rows are the shipped step_cost_smollm2 run's, rounded as shown."""
    root = Path(__file__).resolve().parents[2]
    result = json.loads((root / "benchmarks/results/step_cost_smollm2/step_cost.json").read_text())
    rows = {r["method"]: r for r in result["tables"][0]["rows"]}
    readme = (root / "benchmarks/README.md").read_text()
    section = readme.split("### Step cost at SmolLM2's shape", 1)[1].split("Target CaPT", 1)[0]
    labels = {"floor": "floor", "CaPT": "capt", "P-Tuning v2 (20)": "ptuning_v2-20", "LoRA r=8": "lora-r8",
              "prompt tuning (100)": "prompt_tuning-100", "full fine-tuning": "full_finetune"}
    shown = re.findall(r"^\| ([^|]+?) \| ([\d.]+) \| ([\d.]+) \| ([^|]+?) \| ([\d.]+) \| ([\d.]+) \|$", section, re.M)
    assert len(shown) == len(labels)
    for label, step, ratio, spread, cpu, flops in shown:
        row = rows[labels[label]]
        assert (step, ratio, spread, cpu, flops) == (f"{row['median_step_s']:.3f}", f"{row['ratio_to_floor']:.3f}",
                                                      row["ratio_range"], f"{row['cpu_ratio_to_floor']:.3f}",
                                                      f"{row['flop_ratio_to_floor']:.3f}"), label
    [target] = [t for t in result["targets"] if t["name"] == "CaPT step / floor (smollm2-135m)"]
    assert not target["met"] and f"({target['measured']:.3f})" in readme


def test_the_smollm2_time_to_result_table_is_the_shipped_run():
    """benchmarks/README.md's SmolLM2 time-to-result rows are the shipped time_to_result_smollm2 run's summary."""
    root = Path(__file__).resolve().parents[2]
    result = json.loads((root / "benchmarks/results/time_to_result_smollm2/time_to_result.json").read_text())
    assert result["settings"]["model"] == "smollm2-135m" and result["settings"]["capt_runs"] == 3
    summary = next(t for t in result["tables"] if t["title"].startswith("Time to a result"))["rows"]
    readme = (root / "benchmarks/README.md").read_text()
    block = readme.split("<!-- time_to_result_smollm2 -->", 1)[1].split("<!-- end time_to_result_smollm2 -->")[0]
    shown = re.findall(r"^\| [^|]+ \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", block, re.M)
    assert shown == [(str(row["runs"]), f"{row['total_s']:.1f}", f"{row['ratio']:.2f}", f"{row['paper']:g}")
                     for row in summary]


def test_the_smollm2_serving_table_is_the_shipped_run():
    """benchmarks/README.md's SmolLM2 serving rows and targets are the shipped serving_smollm2 run's."""
    root = Path(__file__).resolve().parents[2]
    result = json.loads((root / "benchmarks/results/serving_smollm2/serving.json").read_text())
    assert result["settings"]["models"] == ["smollm2-135m"] and result["error"] is None
    rows = result["tables"][0]["rows"]
    readme = (root / "benchmarks/README.md").read_text()
    block = readme.split("<!-- serving_smollm2 -->", 1)[1].split("<!-- end serving_smollm2 -->")[0]
    shown = re.findall(r"^\| ([\d,]+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \|$", block, re.M)
    assert shown == [(f"{row['tasks']:,}", f"{row['rows_per_s']:.2f}", f"{row['vs_base_min']:.3f}",
                      f"{row['p50_ms']:.0f}", f"{row['p99_ms']:.0f}", f"{row['loaded_rss_mb']:.0f}",
                      f"{row['capsule_bytes'] / 2**20:.2f}") for row in rows]
    assert all(target["met"] for target in result["targets"]) and len(result["targets"]) == 2
