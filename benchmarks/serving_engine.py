"""Where a mixed batch's time goes, in process: `CapsuleEngine.answer` on the batches the Serve applications form.

No Ray, no HTTP: a batch of 8 requests (2 rows each) on one torch thread (as a replica with a fraction of a CPU),
timed round-robin: 1 capsule, 8 distinct RTE capsules, the task mix, and the task mix in an engine holding every
capsule. The ratios separate what the Serve ratios mix: distinct capsules, other tasks' rows, a larger bank.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.common import interleaved
from benchmarks.profiling import op_difference, profile_step
from benchmarks.serving_capsules import SINGLE


def batches(capsules: list, rows: dict[str, list], width: int) -> dict[str, tuple[str, list[tuple[str, list]]]]:
    """{label: (engine, [(capsule name, raw rows)] * width)}; engine "small" holds the batches' capsules only."""
    same_task = [c for c in capsules if c.task == SINGLE][:width]
    return {"1 capsule": ("small", [(SINGLE, rows[SINGLE])] * width),
            f"{width} {SINGLE.upper()} capsules": ("small", [(c.name, rows[SINGLE]) for c in same_task]),
            "task mix": ("small", [(c.name, rows[c.task]) for c in capsules[:width]]),
            "task mix, all capsules loaded": ("all", [(c.name, rows[c.task]) for c in capsules[:width]])}


def measure(model: str, capsules: list, rows: dict[str, list], rounds: int, width: int = 8) -> dict[str, Any]:
    """Per batch label: ms per batch (median of `rounds`), distinct capsules and bank size; the profile of the
    task mix against the 1-capsule batch (top ops by extra self CPU time)."""
    import torch

    from pipelines.serving.engine import CapsuleEngine

    chosen = batches(capsules, rows, width)
    names = {name for _, requests in chosen.values() for name, _ in requests}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engines = {"small": CapsuleEngine([c for c in capsules if c.name in names]), "all": CapsuleEngine(capsules)}
        calls: dict[str, Callable[[], object]] = {}
        for label, (engine_name, requests) in chosen.items():
            engine = engines[engine_name]
            examples = [(name, engine.examples(name, given)) for name, given in requests]
            calls[label] = lambda engine=engine, examples=examples: engine.answer(examples)
        wall, _ = interleaved(calls, rounds)
        single = statistics.median(wall["1 capsule"])
        table = [{"model": model, "batch": label, "capsules_in_bank": len(engines[chosen[label][0]].names),
                  "distinct_in_batch": len({name for name, _ in chosen[label][1]}),
                  "ms_per_batch": 1000 * statistics.median(times), "vs_1_capsule": statistics.median(times) / single}
                 for label, times in wall.items()]
        mixed, alone = profile_step(calls["task mix"]), profile_step(calls["1 capsule"])
    finally:
        torch.set_num_threads(threads)
    extra = [{"model": model, "op": row["op"], "task_mix_ms": row["method_ms"], "one_capsule_ms": row["floor_ms"],
              "extra_ms": row["extra_ms"]} for row in op_difference(mixed.self_cpu_us, alone.self_cpu_us)]
    return {"table": table, "extra_ops": extra, "profile": mixed.table}
