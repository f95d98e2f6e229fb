"""Benchmark 1: training step time and peak memory of every method, as ratios to the frozen floor.

The floor is forward + backward through the frozen model at n+1 tokens with only the input's gradient: the least any
method training something inside the model can cost. Every method steps through `pipelines.adapted.adapt` with the
pipeline's default optimizer, on weight-sharing copies of one random model, timed round-robin (README).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import models
from benchmarks.common import BenchResult, Table, at_most, interleaved, median, paired_ratios, spread
from benchmarks.plots import grouped_bars
from benchmarks.profiling import StepProfile, count_flops, op_difference, profile_step

NAME = "step_cost"
TITLE = "Training step cost against the frozen floor"
FLOOR = "floor"
CPU = torch.device("cpu")
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "capt": ("capt", {}),
    "prompt_tuning-100": ("prompt_tuning", {"num_tokens": 100}),
    "ptuning_v2-20": ("ptuning_v2", {"num_tokens": 20}),
    "ptuning_v2-100": ("ptuning_v2", {"num_tokens": 100}),
    "lora-r8": ("lora", {"r": 8, "alpha": 16}),
    "full_finetune": ("full_finetune", {}),
    "adapter-24": ("adapter", {"bottleneck": 24}),
    "dept-60-r30": ("dept", {"num_tokens": 60, "rank": 30, "max_length": 256}),
    "residual_prompt-10": ("residual_prompt", {"num_tokens": 10}),
    "superpos_prompt-10": ("superpos_prompt", {"num_tokens": 10, "num_sampled": 128}),
    "vfpt-100": ("vfpt", {"num_tokens": 100, "fourier_fraction": 0.5}),
    "smop-4x5": ("smop", {"num_tokens": 5, "num_prompts": 4}),
    "ept-60-r30": ("ept", {"num_tokens": 60, "rank": 30, "max_length": 256}),
    "xprompt-100": ("xprompt", {"num_tokens": 100}),
}
"""Row label -> (pipeline method name, method options)."""
NOTES = [
    "Random weights built from the published configs; ratio_to_floor is the median over rounds of "
    "method wall time / floor wall time in the same round (methods interleaved, rotating start); "
    "ratio_range is its min-max over rounds. cpu_ratio_to_floor: the same with process CPU time "
    "(all threads), far less sensitive to other processes competing for the cores.",
    "The op table (self CPU time, CaPT minus floor) keeps, per op, the least time over the profiled "
    "steps; under load a few ms of noise per op remain.",
    "peak_step_mb: peak CPU tensor memory during one step above the level at its start, from "
    "torch.profiler allocation events (profile_memory=True), not RSS; it includes gradients. "
    "persistent_mb: optimizer state kept between steps. Model weights (shared by all rows) are excluded.",
    "Why LoRA and P-Tuning v2 can sit at or below the floor: their first trained tensors are inside "
    "layer 1's attention (LoRA's A/B on q and v; P-Tuning v2's prefix keys and values), so backward "
    "stops there and never computes the gradient of layer 1's input through its q/k/v projections. The "
    "floor and CaPT must (the first capsule is an input of layer 1); and they run at n tokens, not n+1. "
    "Together that is 1-1.5 % of a full-size step's FLOPs (flop_ratio_to_floor), far more in quick "
    "mode's one-layer models.",
    "gflops: floating-point operations of one step (matmuls and attention, forward and backward), "
    "counted from op shapes by torch.utils.flop_counter, so flop_ratio_to_floor is exact and free of "
    "noise: when wall-time ratios of two methods are closer than their ratio_range, it says which "
    "step does less work.",
    "Optimizers: the pipeline's defaults for the method and model family (each method's declared entry, "
    "resolved by pipelines/config/load.py: "
    "on T5, Adafactor for the prompt methods and full fine-tuning, AdamW for LoRA; on decoder-only models, "
    "AdamW); no gradient clipping.",
]
"""What the report says about the method of this benchmark."""
COLUMNS = ["method", "trainable", "model_tokens", "median_step_s", "ratio_to_floor", "ratio_range",
           "cpu_ratio_to_floor", "gflops", "flop_ratio_to_floor", "peak_step_mb", "persistent_mb"]


def settings(quick: bool) -> dict[str, Any]:
    """Architectures, batch shapes and repetitions (quick: fewer layers, smaller batches)."""
    if quick:
        archs = [{"arch": "t5-base", "changes": {"num_layers": 1, "num_decoder_layers": 1},
                  "batch": 2, "seq": 32, "target": 4},
                 {"arch": "llama-3.2-1b", "changes": {"num_hidden_layers": 1, "vocab_size": 8192},
                  "batch": 1, "seq": 16, "target": 4}]
        return {"archs": archs, "rounds": 3, "warmup": 1, "profile_passes": 1, "target_ratio": 1.05}
    archs = [{"arch": "t5-base", "changes": {}, "batch": 8, "seq": 128, "target": 4},
             {"arch": "llama-3.2-1b", "changes": {"num_hidden_layers": 2}, "batch": 2, "seq": 128, "target": 4},
             # the real LLM of the pipeline at its full shape (issue #52's target for it: 1.03x)
             {"arch": "smollm2-135m", "changes": {}, "batch": 8, "seq": 64, "target": 4, "target_ratio": 1.03}]
    return {"archs": archs, "rounds": 4, "warmup": 1, "profile_passes": 2, "target_ratio": 1.05}


def make_batch(config, batch: int, seq: int, target: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids; T5 gets `target` label tokens, decoder-only models label the last `target` tokens."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, config.vocab_size, (batch, seq), generator=generator)
    if models.family(config) == "t5":
        labels = torch.randint(3, config.vocab_size, (batch, target), generator=generator)
    else:
        labels = ids.clone()
        labels[:, : seq - target] = -100  # the prompt: only the answer is supervised
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def floor_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], None]:
    """Forward + backward of the frozen `model` at n+1 tokens; the only gradient is the input's."""
    model.requires_grad_(False)
    ids = batch["input_ids"]
    with torch.no_grad():
        embeds = model.get_input_embeddings()(torch.cat([ids[:, :1], ids], dim=1))  # (B, n+1, D)
    mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    labels = batch["labels"]
    if models.family(model.config) != "t5":
        labels = torch.cat([torch.full_like(labels[:, :1], -100), labels], dim=1)

    def step() -> None:
        inputs = embeds.detach().requires_grad_(True)
        model(inputs_embeds=inputs, attention_mask=mask, labels=labels).loss.backward()

    return step


class MethodRunner:
    """One method on its own weight-sharing copy of the base model, with the pipeline's default optimizer and
    learning rate for the method on the model's family, over the method's own parameter groups (DePT's low-rank
    offset trains at its second lr), as a job builds it."""

    def __init__(self, base: torch.nn.Module, method: str, options: dict[str, Any],
                 batch: dict[str, torch.Tensor], device: torch.device) -> None:
        """`device`: where the adapted model runs (adapted on `base`'s device first, then moved, as a job's
        Accelerate does: on another device it is a copy of its own, no longer sharing `base`'s storage)."""
        from capt.methods import optim_default
        from pipelines.adapted import adapt, parameter_groups
        from pipelines.training.setup import new_optimizer

        self.model = adapt(models.shared_copy(base), method, options).to(device)
        self.params = list(self.model.trainable_parameters())
        default = optim_default(method, models.family(base.config))
        groups = parameter_groups(self.model, self.model.base_model, default.lr, default.lr, 0.0)
        self.optimizer = new_optimizer(default.optimizer, groups, default.lr)
        self.batch = batch

    def step(self) -> None:
        """Forward + backward + optimizer step + zero_grad."""
        self.model(**self.batch).loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def persistent_bytes(self) -> int:
        """Optimizer state held between steps (gradients are freed by zero_grad)."""
        return sum(t.numel() * t.element_size() for state in self.optimizer.state.values()
                   for t in state.values() if isinstance(t, torch.Tensor))


def model_tokens(label: str, runner: MethodRunner | None, seq: int) -> str:
    """The sequence the frozen stack sees for a method (virtual tokens or prefix keys included)."""
    added = 1 if runner is None else runner.model.added_positions  # the floor carries the capsule's one slot
    if label.startswith("ptuning_v2"):
        return f"n = {seq} (+{label.split('-')[1]} prefix keys/layer)"
    return f"n+{added} = {seq + added}" if added else f"n = {seq}"


def profile_all(steps: dict[str, Callable[[], None]], passes: int) -> dict[str, StepProfile]:
    """Profile every step `passes` times round-robin; per op the least self time of the passes (noise is additive)."""
    best: dict[str, StepProfile] = {}
    for _ in range(passes):
        for label, step in steps.items():
            profile = profile_step(step)
            if label in best:
                kept = best[label]
                profile.self_cpu_us = {op: min(t, kept.self_cpu_us.get(op, t)) for op, t in profile.self_cpu_us.items()}
                profile.peak_bytes = max(profile.peak_bytes, kept.peak_bytes)
            best[label] = profile
    return best


def method_steps(spec: dict[str, Any], methods: dict[str, tuple[str, dict[str, Any]]] = METHODS,
                 device: torch.device = CPU,
                 dtype: torch.dtype = torch.float32) -> tuple[dict[str, MethodRunner], dict[str, Callable[[], None]]]:
    """(runners, steps): the floor's and each method's step on one architecture, every one on a copy of one random
    base model in `dtype` (moving to the CPU, where they are built, keeps one shared copy)."""
    config = models.config_for(spec["arch"], **spec["changes"])
    base = models.build(config).to(dtype)
    batch = {k: v.to(device) for k, v in make_batch(config, spec["batch"], spec["seq"], spec["target"]).items()}
    runners = {label: MethodRunner(base, method, options, batch, device) for label, (method, options) in
               methods.items()}
    floor = floor_step(models.shared_copy(base).to(device), batch)
    return runners, {FLOOR: floor, **{k: r.step for k, r in runners.items()}}


def measure_arch(spec: dict[str, Any], rounds: int, warmup: int, passes: int) -> dict[str, Any]:
    """Time and profile every method on one architecture; returns rows, the op difference and profiles."""
    runners, steps = method_steps(spec)
    wall, cpu = interleaved(steps, rounds=rounds, warmup=warmup)
    ratios, cpu_ratios = paired_ratios(wall, FLOOR), paired_ratios(cpu, FLOOR)
    profiles = profile_all(steps, passes)
    flops = {label: count_flops(step) for label, step in steps.items()}
    rows = [_row(label, runners.get(label), wall[label], ratios[label], profiles[label].peak_bytes, spec["seq"])
            | {"cpu_ratio_to_floor": median(cpu_ratios[label]), "gflops": flops[label] / 1e9,
               "flop_ratio_to_floor": flops[label] / flops[FLOOR]} for label in steps]
    diff = op_difference(profiles["capt"].self_cpu_us, profiles[FLOOR].self_cpu_us)
    del runners, steps
    gc.collect()
    return {"rows": rows, "wall": wall, "cpu": cpu, "op_diff": diff,
            "profile_capt": profiles["capt"].table, "profile_floor": profiles[FLOOR].table}


def _row(label: str, runner: MethodRunner | None, times: list[float], ratios: list[float], peak: float,
         seq: int) -> dict[str, Any]:
    """One table row of a method (the floor has no runner)."""
    return {"method": label, "trainable": sum(p.numel() for p in runner.params) if runner else 0,
            "model_tokens": model_tokens(label, runner, seq), "median_step_s": median(times),
            "ratio_to_floor": median(ratios), "ratio_range": spread(ratios), "peak_step_mb": peak / 2**20,
            "persistent_mb": runner.persistent_bytes() / 2**20 if runner else 0.0}


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Measure every architecture of `config`; tables, targets, profiles and a ratio plot."""
    result = BenchResult(NAME, TITLE, config)
    ratios: dict[str, dict[str, float]] = {}
    for spec in config["archs"]:
        label = f"{spec['arch']} ({models.describe(models.config_for(spec['arch'], **spec['changes']))})"
        measured = measure_arch(spec, config["rounds"], config["warmup"], config.get("profile_passes", 1))
        shape = f"batch {spec['batch']}, n = {spec['seq']} input tokens" + (
            f", {spec['target']} target tokens" if spec["arch"].startswith("t5") else
            f" (the last {spec['target']} supervised)")
        result.tables.append(Table(f"{label}: {shape}", COLUMNS, measured["rows"]))
        result.tables.append(Table(f"{label}: where CaPT's extra time goes (self CPU time, CaPT minus floor)",
                                   ["op", "method_ms", "floor_ms", "extra_ms"], measured["op_diff"]))
        ratios[spec["arch"]] = by_method = {r["method"]: r["ratio_to_floor"] for r in measured["rows"]}
        others = {m: v for m, v in by_method.items() if m not in (FLOOR, "capt")}
        fastest = min(others, key=others.get)
        result.targets += [at_most(f"CaPT step / floor ({spec['arch']})", by_method["capt"],
                                   spec.get("target_ratio", config["target_ratio"])),
                           at_most(f"CaPT step / fastest other method ({spec['arch']}: {fastest})",
                                   by_method["capt"] / others[fastest], 1.0)]
        result.profiles[f"CaPT step, {label}"] = measured["profile_capt"]
        result.profiles[f"floor step, {label}"] = measured["profile_floor"]
    grouped_bars(ratios, out_dir / "step_cost.png", "Training step time / frozen floor", "ratio to floor",
                 hline=config["target_ratio"], hline_label=f"CaPT target {config['target_ratio']}x")
    result.plots.append("step_cost.png")
    result.notes += NOTES
    return result
