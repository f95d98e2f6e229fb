"""What a capsule layer adds to a training step, in operations: on an accelerator at the batch sizes CaPT trains with,
a step is bound by launching work, not by computing it (benchmarks/README.md, the H200 run: CaPT's extra time is
its extra operations), so the count of operations per capsule layer is the cost to keep down. Counted, not timed:
the top-level aten operations of one forward and backward with a capsule at every layer, less the same step with a
capsule at the first layer only, per layer added."""

from __future__ import annotations

import pytest
import torch
from tiny_models import random_batch, tiny_model

import capt

LAYERS = 8
BUDGET_PER_LAYER = 25
"""Operations one capsule layer may add to a step, forward and backward: 22.6 (fp32) and 24.6 (bf16) when this test
was written, 35 and 37 before the mean masks were prepared once per pass and the slots written with one
`slice_scatter` (the same arithmetic: the losses and capsules of 3 steps agree bit for bit, 42 configurations)."""


def _top_level_ops(model, batch) -> int:
    model(**batch).logits.float().square().mean().backward()  # warm-up: lazy first-call work stays out of the count
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(**batch).logits.float().square().mean().backward()
    return sum(1 for e in prof.events()
               if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_a_capsule_layer_adds_few_operations_to_a_training_step(kind, dtype):
    batch = random_batch(kind, batch=4)
    counts = {}
    for layers in ((0,), "all"):
        model = capt.attach(tiny_model(kind, layers=LAYERS).to(dtype), capt.CapsuleConfig(layers=layers))
        counts[layers] = (_top_level_ops(model, batch), len(model.capsules.capsule_layers()))
        model.detach()
    (one, _), (every, count) = counts[(0,)], counts["all"]
    per_layer = (every - one) / (count - 1)
    assert count == LAYERS and per_layer <= BUDGET_PER_LAYER, f"{per_layer:.1f} operations per capsule layer"
