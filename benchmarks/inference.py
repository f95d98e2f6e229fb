"""Benchmark 4: serving many tasks on one frozen model with `CapsuleBank`, and capsule artifact sizes.

Throughput: one teacher-forced batch whose row i uses task capsule i mod 7, against the bare model, one capsule for
all rows and one task at a time, interleaved. Artifacts: capsule sizes from the real configs on the meta device, the
files saved by `capt.save_capsule` from stand-ins of the same hidden size and layer count (the same tensors).
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

import capt
from benchmarks import models
from benchmarks.common import BenchResult, Table, interleaved, median, paired_ratios, spread
from benchmarks.plots import grouped_bars
from capt.tasks.registry import TASK_NAMES

NAME = "inference"
TITLE = "Inference: CapsuleBank with 7 tasks mixed in one batch, and capsule artifact sizes"
MIXED = "bank, 7 tasks mixed"
BARE = "bare model (no capsule)"
ARTIFACT_ARCHS = ("t5-base", "t5-large", "llama-3.2-1b", "qwen2.5-1.5b")


def settings(quick: bool) -> dict[str, Any]:
    """Model size, batch shape and repetitions (quick: a 2+2-layer T5-Small)."""
    if quick:
        return {"arch": "t5-small", "changes": {"num_layers": 2, "num_decoder_layers": 2}, "rows_per_task": 2,
                "seq": 64, "target": 2, "rounds": 3, "artifact_archs": list(ARTIFACT_ARCHS)}
    return {"arch": "t5-base", "changes": {}, "rows_per_task": 4, "seq": 128, "target": 2, "rounds": 5,
            "artifact_archs": list(ARTIFACT_ARCHS)}


def make_bank(base: torch.nn.Module, directory: Path) -> capt.CapsuleBank:
    """Seven capsules with random task vectors, saved as artifacts and loaded into one bank."""
    dirs = {}
    for index, task in enumerate(TASK_NAMES):
        torch.manual_seed(index)
        model = capt.attach(base, capt.CapsuleConfig(init="normal"))
        dirs[task] = capt.save_capsule(model, directory / task, task=task)
        model.detach()
    return capt.CapsuleBank(base, dirs)


def make_modes(bank: capt.CapsuleBank, batch: dict[str, torch.Tensor]) -> dict[str, Callable[[], None]]:
    """The four ways to score the batch; every callable scores all rows once."""
    rows = batch["input_ids"].shape[0]
    names = [TASK_NAMES[i % len(TASK_NAMES)] for i in range(rows)]
    per_task = {task: {k: v[[i for i in range(rows) if names[i] == task]] for k, v in batch.items()}
                for task in TASK_NAMES}

    def one_task_at_a_time() -> None:
        for task, part in per_task.items():
            bank(**part, capsule=task)

    return {BARE: lambda: bank.base_model(**batch), MIXED: lambda: bank(**batch, capsule=names),
            "bank, one capsule for all rows": lambda: bank(**batch, capsule=TASK_NAMES[0]),
            "one task at a time (7 batches)": one_task_at_a_time}


def throughput(config: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """Rows per second of every mode, and ratios to the mixed bank (paired per round)."""
    model_config = models.config_for(config["arch"], **config["changes"])
    base = models.build(model_config).eval()
    rows = config["rows_per_task"] * len(TASK_NAMES)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model_config.vocab_size, (rows, config["seq"]), generator=generator)
    labels = torch.randint(3, model_config.vocab_size, (rows, config["target"]), generator=generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    with tempfile.TemporaryDirectory(prefix="bench-bank-") as tmp, torch.inference_mode():
        bank = make_bank(base, Path(tmp))
        wall, _ = interleaved(make_modes(bank, batch), rounds=config["rounds"], warmup=1)
    versus_bare = paired_ratios(wall, BARE)  # mode time / bare time, per round
    versus_mixed = paired_ratios(wall, MIXED)
    table = [{"mode": mode, "rows": rows, "median_s": median(times), "rows_per_s": rows / median(times),
              "throughput_vs_bare": median([1 / r for r in versus_bare[mode]]),
              "throughput_vs_mixed": median([1 / r for r in versus_mixed[mode]]),
              "vs_mixed_range": spread([1 / r for r in versus_mixed[mode]])}
             for mode, times in wall.items()]
    del bank, base
    gc.collect()
    return table, models.describe(model_config)


def artifact_row(arch: str, directory: Path) -> dict[str, Any]:
    """Capsule size of `arch` from the meta-device model, and the real artifact from its stand-in: the same hidden
    size and layer count, tiny everything else (real weights in a few MB)."""
    if models.ARCHS[arch]["kind"] == "t5":
        stand_in = models.config_for(arch, d_ff=8, num_heads=1, d_kv=8, vocab_size=64, num_decoder_layers=1)
    else:
        stand_in = models.config_for(arch, intermediate_size=8, num_attention_heads=1, num_key_value_heads=1,
                                     head_dim=8, vocab_size=64)
    meta = models.build_meta(models.config_for(arch))
    on_meta = capt.attach(meta)
    numel = sum(p.numel() for p in on_meta.trainable_parameters())
    layers = len(on_meta.capsules[0].layers)
    total = models.count_parameters(meta)
    saved = capt.save_capsule(capt.attach(models.build(stand_in)), directory / arch, task="rte")
    stand_in_numel = sum(t.numel() for t in load_file(str(saved / "capsule.safetensors")).values())
    if stand_in_numel != numel:
        raise RuntimeError(f"{arch}: the stand-in capsule has {stand_in_numel} values, the real one {numel}")
    return {"architecture": arch, "capsule_layers": layers, "hidden": numel // layers,
            "capsule_parameters": numel, "share_of_model_pct": 100 * numel / total, "model_parameters": total,
            "tensor_bytes": numel * 4, "capsule.safetensors_bytes": (saved / "capsule.safetensors").stat().st_size,
            "capsule.json_bytes": (saved / "capsule.json").stat().st_size}


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Throughput table and plot, and the artifact size table."""
    result = BenchResult(NAME, TITLE, config)
    table, described = throughput(config)
    shape = (f"{config['rows_per_task'] * len(TASK_NAMES)} rows ({config['rows_per_task']} per task), "
             f"{config['seq']} input tokens, {config['target']} label tokens")
    result.tables.append(Table(f"{config['arch']} ({described}), random weights: {shape}",
                               ["mode", "rows", "median_s", "rows_per_s", "throughput_vs_bare", "throughput_vs_mixed",
                                "vs_mixed_range"],
                               table))
    with tempfile.TemporaryDirectory(prefix="bench-artifacts-") as tmp:
        sizes = [artifact_row(arch, Path(tmp)) for arch in config["artifact_archs"]]
    result.tables.append(Table("Capsule artifact per architecture (float32)",
                               ["architecture", "capsule_layers", "hidden", "capsule_parameters",
                                "share_of_model_pct", "tensor_bytes", "capsule.safetensors_bytes",
                                "capsule.json_bytes"], sizes))
    grouped_bars({"throughput": {r["mode"]: r["rows_per_s"] for r in table}}, out_dir / "inference.png",
                 f"Scoring throughput, {config['arch']} ({described})", "rows / s")
    result.plots.append("inference.png")
    result.notes += [
        "throughput_vs_bare / throughput_vs_mixed: this mode's throughput over the bare model's / the mixed "
        "bank's, median of the per-round ratios (modes interleaved round-robin; >1 means faster); "
        "vs_mixed_range: min-max over rounds.",
        "Artifact sizes: capsule_parameters and tensor_bytes come from the real configuration on the "
        "meta device; the file sizes are those of a real `capt.save_capsule` from a stand-in model with "
        "the same hidden size and layer count (its capsule has the same tensors, checked).",
    ]
    return result
