"""The step-cost table on one device in one dtype: `step_cost`'s floor and methods, timed with the device synchronised.

Each method is adapted on the CPU (as a job adapts its base model before Accelerate moves it) and then moved to
the device, where it holds a copy of its own of the base weights (on the CPU all methods share one copy). Steps run
under autocast in the base model's dtype, as a job with `train.precision=bf16` does. Peak step memory on CUDA is
`torch.cuda.max_memory_allocated` above the level at the step's start (not measured on the CPU, where `step_cost`
reads it from the profiler's allocation events).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import models, step_cost
from benchmarks.common import BenchResult, Table, at_most, interleaved, median, paired_ratios
from benchmarks.profiling import count_flops

logger = logging.getLogger(__name__)

COLUMNS = ["method", "trainable", "model_tokens", "median_step_s", "ratio_to_floor", "ratio_range", "gflops",
           "flop_ratio_to_floor", "peak_step_mb", "persistent_mb"]


def synced(step: Callable[[], None], device: torch.device, dtype: torch.dtype) -> Callable[[], None]:
    """`step` under autocast to `dtype`, returning once the device has finished it (so wall time is its time)."""

    def run() -> None:
        with torch.autocast(device.type, dtype=dtype):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return run


def peak_step_bytes(step: Callable[[], None], device: torch.device) -> float:
    """Peak CUDA memory of one step above the level at its start (NaN elsewhere: `step_cost` measures the CPU's)."""
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    step()
    return torch.cuda.max_memory_allocated(device) - start


def measure_arch(spec: dict[str, Any], device: torch.device, dtype: torch.dtype, rounds: int,
                 warmup: int) -> list[dict[str, Any]]:
    """The table rows of every `step_cost` method and the floor on one architecture, on `device` in `dtype`."""
    config = models.config_for(spec["arch"], **spec["changes"])
    base = models.build(config).to(dtype)
    batch = {k: v.to(device) for k, v in step_cost.make_batch(config, spec["batch"], spec["seq"],
                                                              spec["target"]).items()}
    methods = {k: step_cost.METHODS[k] for k in spec.get("methods", step_cost.METHODS)}
    runners = {label: step_cost.MethodRunner(base, method, options, batch, device)
               for label, (method, options) in methods.items()}
    floor = step_cost.floor_step(models.shared_copy(base).to(device), batch)
    steps = {label: synced(step, device, dtype)
             for label, step in {step_cost.FLOOR: floor, **{k: r.step for k, r in runners.items()}}.items()}
    del base
    wall, _ = interleaved(steps, rounds=rounds, warmup=warmup)
    ratios = paired_ratios(wall, step_cost.FLOOR)
    peaks = {label: peak_step_bytes(step, device) for label, step in steps.items()}
    flops = {label: count_flops(step) for label, step in steps.items()}
    rows = [step_cost._row(label, runners.get(label), wall[label], ratios[label], peaks[label], spec["seq"])
            | {"gflops": flops[label] / 1e9, "flop_ratio_to_floor": flops[label] / flops[step_cost.FLOOR]}
            for label in steps]
    del runners, steps, floor
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def run(config: dict[str, Any]) -> BenchResult:
    """Every architecture of `config` on its device and dtype: one table each, and CaPT's step against the floor."""
    result = BenchResult("device_step_cost", "Training step cost against the frozen floor, on the device", config)
    device, dtype = torch.device(config["device"]), getattr(torch, config["dtype"])
    for spec in config["archs"]:
        rows = measure_arch(spec, device, dtype, config["rounds"], config["warmup"])
        shape = models.describe(models.config_for(spec["arch"], **spec["changes"]))
        result.tables.append(Table(f"{spec['arch']} ({shape}), {config['dtype']} on {device.type}: batch "
                                   f"{spec['batch']}, n = {spec['seq']}, {spec['target']} target tokens",
                                   COLUMNS, rows))
        capt = next(r for r in rows if r["method"] == "capt")
        result.targets.append(at_most(f"CaPT step / floor ({spec['arch']}, {device.type})", capt["ratio_to_floor"],
                                      config["target_ratio"]))
        logger.info("%s: CaPT / floor %.3f", spec["arch"], capt["ratio_to_floor"])
    result.notes.append(f"ratio_to_floor: median over {config['rounds']} round(s) of the method's step time over the "
                        "floor's in the same round (methods interleaved), each step waited for on the device; "
                        "gflops counted from op shapes (torch.utils.flop_counter); peak_step_mb above the step's "
                        "starting level, gradients included.")
    result.notes.append(f"CaPT step over floor median: {median([t.measured for t in result.targets]):.3f}.")
    return result
