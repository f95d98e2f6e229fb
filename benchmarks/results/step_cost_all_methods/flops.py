"""FLOP ratio to the frozen floor of every step_cost row at full T5-Base size (deterministic counts)."""
from benchmarks import models
from benchmarks.profiling import count_flops
from benchmarks.step_cost import FLOOR, METHODS, MethodRunner, floor_step, make_batch

config = models.config_for("t5-base")
base = models.build(config)
batch = make_batch(config, 8, 128, 4)
floor = count_flops(floor_step(models.shared_copy(base), batch))
print(f"floor {floor/1e9:.1f} GFLOPs")
for label, (method, options) in METHODS.items():
    runner = MethodRunner(base, method, options, batch)
    flops = count_flops(runner.step)
    print(f"{label:22s} trainable {sum(p.numel() for p in runner.params):>12,}  {flops/1e9:8.1f} GFLOPs  ratio {flops/floor:.4f}")
    del runner
