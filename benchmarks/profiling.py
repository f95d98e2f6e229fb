"""One step under torch.profiler: peak tensor memory (CPU allocator events) and the top ops by self time.

The peak is the highest running total of the step's allocation events above its starting level: tensor memory
only, the CPU analogue of ``torch.cuda.max_memory_allocated``. Not RSS: glibc keeps freed memory, so RSS deltas
under-count a second step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate


@dataclass
class StepProfile:
    """What one profiled step tells."""

    peak_bytes: int  # highest tensor memory in use during the step above the level at its start
    self_cpu_us: dict[str, float]  # op name -> self CPU time (microseconds)
    table: str  # torch.profiler's key_averages table, sorted by self CPU time


def profile_step(step: Callable[[], object], row_limit: int = 12) -> StepProfile:
    """Run `step` once under the profiler with memory tracking; the peak is that of the running total of the
    allocation events (frees are negative), in time order."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, int(node.extra_fields.alloc_size)))
        stack.extend(node.children)
    averages = prof.key_averages()
    self_cpu = {event.key: float(event.self_cpu_time_total) for event in averages}
    table = averages.table(sort_by="self_cpu_time_total", row_limit=row_limit, max_name_column_width=48)
    return StepProfile(max([0, *accumulate(size for _, size in sorted(events))]), self_cpu, table)


def op_difference(method: dict[str, float], floor: dict[str, float], top: int = 8) -> list[dict[str, object]]:
    """Ops whose self CPU time grew most from `floor` to `method` (where the extra time goes)."""
    rows = [{"op": op, "method_ms": method.get(op, 0.0) / 1e3, "floor_ms": floor.get(op, 0.0) / 1e3,
             "extra_ms": (method.get(op, 0.0) - floor.get(op, 0.0)) / 1e3} for op in set(method) | set(floor)]
    rows.sort(key=lambda r: r["extra_ms"], reverse=True)
    return rows[:top]


def count_flops(step: Callable[[], None]) -> int:
    """Floating-point operations of one call of ``step`` (matmuls and attention, forward and backward), counted from
    op shapes by ``FlopCounterMode``: exact, untouched by other processes. Its registry lacks SDPA's CPU kernels,
    added here with torch's own SDPA formulas, or attention on CPU would count zero."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    cpu_attention = {  # (the counter passes the op's other arguments and `out_shape` too)
        aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *_, **__: sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda grad, q, k, v, *_, **__: sdpa_backward_flop_count(grad, q, k, v)}
    with FlopCounterMode(display=False, custom_mapping=cpu_attention) as counter:
        step()
    return int(counter.get_total_flops())
