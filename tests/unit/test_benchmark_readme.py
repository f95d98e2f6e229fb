"""benchmarks/README.md's headline learning table shows the shipped merged report's numbers, every one of them."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.markdown import table_rows

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "benchmarks/README.md"
REPORT = ROOT / "benchmarks/results/learning_fair150/report.md"
HEADLINE = "### At 150 steps: every row on CB, COPA and RTE"

# The README's row labels, and the method (or reference row) each one names in the merged report.
ROW_METHODS = {
    "majority class": "majority class", "chance": "chance", "CaPT": "capt", "head-only+anchor": "head-only+anchor",
    "prompt tuning (20)": "prompt_tuning", "P-Tuning v2 (20)": "ptuning_v2", "LoRA r=8": "lora",
    "full fine-tuning": "full_finetune", "adapter (bottleneck 24)": "adapter", "DePT (12, rank 6)": "dept",
    "EPT (12, rank 6)": "ept", "ResPrompt (20)": "residual_prompt", "SuperPos-Prompt (20)": "superpos_prompt",
    "SMoP (4 x 5)": "smop", "VFPT (20)": "vfpt", "XPrompt (20)": "xprompt",
}
# Headline columns: (README header, report table, task); each value column but CB accuracy is followed by its lr.
COLUMNS = [("CB score", "test_score", "cb"), ("CB accuracy", "test_accuracy", "cb"),
           ("COPA accuracy", "test_score", "copa"), ("RTE accuracy", "test_score", "rte")]


def _report_cells() -> dict[tuple[str, str, str], str]:
    """(report table, method, task) -> the merged report's cell, e.g. '60.16 ± 0.84 [optim.lr=0.03]'."""
    text = REPORT.read_text(encoding="utf-8")
    score, accuracy = text.split("# The same trials: test_accuracy")
    cells = {}
    for name, part in (("test_score", score), ("test_accuracy", accuracy)):
        header, *body = table_rows(part.split("## Pieces")[0].splitlines())
        for row in body:
            cells.update({(name, row[0], task): cell for task, cell in zip(header[1:], row[1:], strict=True)})
    return cells


def _headline() -> tuple[list[str], list[list[str]]]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(HEADLINE):].split("\nWhat comes out")[0]
    header, *body = table_rows(section.splitlines())
    return header, body


def _value(cell: str) -> tuple[float, float | None]:
    match = re.fullmatch(r"([0-9.]+)(?: ± ([0-9.]+))?(?: \[.*\])?", cell)
    assert match, f"not a score cell: {cell!r}"
    return float(match.group(1)), None if match.group(2) is None else float(match.group(2))


def _chosen_lr(report_cell: str) -> float:
    return float(re.search(r"\[optim\.(?:head_)?lr=([0-9.e-]+)\]", report_cell).group(1))


def _check_cell(where: str, cell: str, lr: str | None, reported: str | None) -> None:
    if reported is None:  # the accuracy table has no reference rows
        assert cell == "", where
    elif reported == "-":
        assert cell == "not run yet", where
    else:
        (mean, std), (reported_mean, reported_std) = _value(cell), _value(reported)
        assert mean == reported_mean and (std == reported_std or (std is None and reported_std == 0.0)), where
        if lr is not None and "[" in reported:
            assert float(lr.removeprefix("head ")) == _chosen_lr(reported), where


OTHER_SETTINGS = " †"
"""A label's mark for a method's cells trained under earlier settings (`benchmarks.learning_merge.OTHER_SETTINGS`)."""


def _method(label: str) -> str:
    """The merged report's method for a README row label; "X †" names X's cells under earlier settings."""
    return ROW_METHODS[label.removesuffix(OTHER_SETTINGS)] + (OTHER_SETTINGS if label.endswith(OTHER_SETTINGS) else "")


def test_every_headline_cell_is_the_merged_reports_and_every_report_cell_is_in_the_headline():
    report = _report_cells()
    header, body = _headline()
    labels = [label for label, *_ in body]
    assert [label for label in labels if not label.endswith(OTHER_SETTINGS)] == list(ROW_METHODS)
    assert sorted(map(_method, labels)) == sorted({method for table, method, _ in report if table == "test_score"})
    for label, *cells in body:
        for column, table, task in COLUMNS:
            at = header.index(column)
            lr = cells[at] if at + 1 < len(header) and header[at + 1] == "lr" else None
            _check_cell(f"{label} / {column}", cells[at - 1], lr, report.get((table, _method(label), task)))


SERVING_JSON = ROOT / "benchmarks/results/serving_1000/serving.json"
SERVING_LATEST = "**Latest run: "


def test_the_latest_serving_table_is_the_shipped_serving_json():
    """Every cell of the README's latest serving table is the shipped `serving.json`'s value at the shown precision."""
    import json

    rows = json.loads(SERVING_JSON.read_text(encoding="utf-8"))["tables"][0]["rows"]
    by_key = {(row["model"], row["workload"], row["tasks"]): row for row in rows}
    text = README.read_text(encoding="utf-8")
    section = text[text.index(SERVING_LATEST):].split("\n\n- Throughput")[0]
    header, *body = table_rows(section.splitlines())
    assert header == ["model", "workload", "capsules", "rows/s (pooled)", "worst", "median", "best", "p50 ms"]
    assert len(body) == len(rows) == 10
    for model, workload, capsules, rate, worst, median, best, p50 in body:
        row = by_key[({"MiniLM": "minilm"}.get(model, model), workload, int(capsules.replace(",", "")))]
        assert float(rate) == round(row["rows_per_s"], 1), (model, workload, capsules)
        for cell, key in ((worst, "vs_base_min"), (median, "vs_base_median"), (best, "vs_base_max")):
            assert float(cell.strip("*")) == round(row[key], 3), (model, workload, capsules, key)
        assert int(p50) == round(row["p50_ms"]), (model, workload, capsules)


SERVING_REPLICAS = {"1 capsule": ("rte", 1), "1,000 capsules": ("rte", 1000), "7-task mix": ("mix", 7),
                    "1,000-capsule mix": ("mix", 1000)}
"""The memory table's replica labels: (workload, capsules)."""


def test_the_latest_serving_memory_table_is_the_shipped_serving_json():
    """Every cell of the README's latest memory table is the shipped `serving.json`'s value at the shown precision:
    each replica's base-model-alone and loaded memory, their difference, and the growth the target reads (RTE; the
    task mix's beside it)."""
    import json

    tables = json.loads(SERVING_JSON.read_text(encoding="utf-8"))["tables"]
    apps = {(row["model"], row["workload"], row["tasks"]): row for row in tables[0]["rows"]}
    loads = {row["model"]: row for row in tables[2]["rows"]}
    text = README.read_text(encoding="utf-8")
    section = "| model | replica |" + text[text.index(SERVING_LATEST):].split("| model | replica |")[1]
    header, *body = table_rows(section.split("\n\n")[0].splitlines())
    assert header[:4] == ["model", "replica", "base model alone MB", "once loaded MB"] and len(body) == 8
    for model, replica, base, loaded, share, growth, extra, ratio, totals in body:
        key = {"MiniLM": "minilm"}.get(model, model)
        workload, count = SERVING_REPLICAS[replica]
        app = apps[key, workload, count]
        assert (float(base), float(loaded)) == (round(app["base_rss_mb"], 1), round(app["loaded_rss_mb"], 1))
        assert float(share) == round(app["loaded_rss_mb"] - app["base_rss_mb"], 2)
        if count == 1000:
            load = loads[key]
            keys = (("rss_growth_mb", "capsules_mb", "growth_over_bytes") if workload == "rte" else
                    ("mix_growth_mb", "mix_capsules_mb", "mix_growth_over_bytes"))
            assert [float(growth), float(extra), float(ratio.strip("*"))] == [round(load[k], 2) for k in keys]
            assert totals == (f"{load['loaded_growth_mb']:.2f}" if workload == "rte" else "")


PACKING_JSON = ROOT / "benchmarks/results/packing/packing.json"


def test_the_packing_table_is_the_shipped_packing_json():
    """Every cell of the README's packing table is the shipped `packing.json`'s value at the shown precision."""
    import json

    rows = json.loads(PACKING_JSON.read_text(encoding="utf-8"))["tables"][0]["rows"]
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## What the packing run shows"):].split("\nTarget (")[0]
    header, *body = table_rows(section.splitlines())
    assert header[:3] == ["model", "K", "members"] and len(body) == len(rows) == 8
    for cells, row in zip(body, rows, strict=True):
        model, k, members, packed, sequential, per_hour, ratio, ratio_cpu = cells
        assert ({"MiniLM": "minilm", "tiny T5": "tiny-t5"}[model], int(k)) == (row["model"], row["K"])
        assert (members == "one per task") == (row["tasks"] != "rte/cb in turn")
        assert float(packed) == round(row["packed_s"], 1)
        assert sequential == f"{row['sequential_run_s']:.1f} / {row['sequential_pack_of_one_s']:.1f}"
        assert per_hour == f"{row['capsules_per_hour_packed']:.0f} / {row['capsules_per_hour_sequential']:.0f}"
        assert float(ratio.strip("*")) == round(row["ratio"], 2) and float(ratio_cpu.strip("*")) == round(
            row["ratio_cpu"], 2)


PACKED_CB = ROOT / "benchmarks/results/learning_packed_cb"


def _learning_rows(run: str) -> tuple[float, list[dict]]:
    import json

    data = json.loads((PACKED_CB / run / "learning.json").read_text(encoding="utf-8"))
    return data["duration_s"], data["tables"][0]["rows"]


def _report_cell(run: str, method: str) -> str:
    text = (PACKED_CB / run / "report.md").read_text(encoding="utf-8")
    [row] = [r for r in table_rows(text.splitlines()) if r[0] == method]
    return row[1]


def test_the_packed_cb_table_is_the_shipped_runs():
    """Every cell of the packed-against-unpacked CB table is its shipped run's: wall, fit times, ms per row, scores."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Packed learning rows"):].split("\n- **Packed is slower")[0]
    header, *body = table_rows(section.splitlines())
    assert header[0] == "run" and [row[0] for row in body] == ["unpacked", "packed (K = 9)"]
    for (run, wall, capt_fit, head_fit, ms_per_row, capt_score, head_score), folder in zip(
            body, ["unpacked", "packed"], strict=True):
        duration, rows = _learning_rows(folder)
        assert wall == f"{duration:.0f} s"
        fits = {m: sorted(r["fit_s"] for r in rows if r["method"] == m) for m in ("capt", "head-only+anchor")}
        for cell, times in ((capt_fit, fits["capt"]), (head_fit, fits["head-only+anchor"])):
            expected = (f"{times[0]:.0f} s, one pack" if len(set(times)) == 1 else
                        f"{times[0]:.0f}-{times[-1]:.0f} s each, 9 trials")
            assert len(times) == 9 and cell == expected, (run, cell, expected)
        members = 1 if folder == "unpacked" else 9
        capt_s = sum(fits["capt"]) / 9 if members == 1 else fits["capt"][0]
        assert int(ms_per_row) == round(1000 * capt_s / (150 * 16 * members)), run
        for cell, method in ((capt_score, "capt"), (head_score, "head-only+anchor")):
            shipped = _report_cell(folder, method)  # e.g. '58.64 ± 3.20 [optim.lr=0.3]'
            value, lr = shipped.split(" [")
            assert cell.split(" [")[0] == value and cell.split(" ")[-1].rstrip("]") == lr.split("=")[1].rstrip("]")
    packed, unpacked = _learning_rows("packed")[0], _learning_rows("unpacked")[0]
    assert f"**Packed is slower here: {unpacked / packed:.2f}x the capsules per hour**" in text
