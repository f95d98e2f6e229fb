"""Sizes of the device check (`benchmarks/device_check.py`): real shapes in bf16 on one GPU, or tiny shapes on CPU.

The CPU smoke keeps every architecture and code path of the GPU run (bf16 frozen weights under bf16 autocast, a
local T5 checkpoint loaded by path, a served capsule bank, a sweep of 4 fractional trials) at sizes that run in
about a minute on 2 CPUs, on one torch thread (tiny steps on two threads of a loaded 2-CPU machine took 100 times
longer: 2.5 s against 27 ms).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ARCHS = ("t5-base", "llama-3.2-1b", "qwen2.5-1.5b")
"""The step-cost architectures (keys of `benchmarks.models.ARCHS`)."""
TINY = {"t5-base": {"d_model": 64, "d_ff": 128, "d_kv": 16, "num_heads": 4, "num_layers": 2,
                    "num_decoder_layers": 2, "vocab_size": 1024},
        "llama-3.2-1b": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024},
        "qwen2.5-1.5b": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}}
"""Smoke shapes: 2 layers, width 64 and the test tokenizer's 1,024-token vocabulary, each architecture's own kind."""
SMOKE_METHODS = ["capt", "lora-r8", "ptuning_v2-20"]
"""Step-cost rows of the smoke run besides the floor (the GPU run has every `step_cost.METHODS` row)."""
PACK_GOAL = 4.0
"""Packing target: capsules per hour packed over sequential at the largest K (16 on the GPU)."""
STEP_GOAL = 1.05
"""Step-cost target: CaPT's step over the floor's."""


@dataclass(frozen=True)
class Mode:
    """Every size of one device-check run."""

    name: str
    """"gpu" (real shapes, CUDA) or "cpu-smoke" (tiny shapes, CPU)."""
    device: str
    """Torch device of the step-cost table and of the jobs."""
    dtype: str = "bfloat16"
    """Dtype of the frozen weights and of autocast."""
    archs: list[dict[str, Any]] = field(default_factory=list)
    """Step-cost architectures: arch, shape changes, batch, input tokens, target tokens (and methods: a subset)."""
    rounds: int = 5
    """Interleaved timing rounds of the step-cost table."""
    warmup: int = 2
    """Untimed steps of each method first."""
    t5_changes: dict[str, Any] = field(default_factory=dict)
    """Changes to T5-Base's shape of the checkpoint that packing, serving and the sweep load by path."""
    pack_ks: list[int] = field(default_factory=lambda: [1, 4, 16])
    """Pack sizes K."""
    pack_steps: int = 8
    """Training steps of each pack member."""
    pack_examples: tuple[int, int] = (200, 16)
    """(train, validation and test) examples per pack member."""
    serve_tasks: list[str] = field(default_factory=lambda: ["boolq", "cb", "copa", "multirc", "rte", "wic", "csqa"])
    """Tasks whose capsules are served."""
    serve_counts: dict[str, list[int]] = field(default_factory=lambda: {"rte": [1, 1000], "mix": [7, 1000]})
    """Capsules per application by workload (the first of each its baseline)."""
    serve_requests: int = 300
    """Requests per application and round."""
    serve_rounds: int = 2
    """Interleaved serving rounds."""
    serve_gpus: float = 0.2
    """GPU share of each serving replica (0: CPU replicas)."""
    sweep_steps: int = 30
    """Training steps of each sweep trial."""
    sweep_cpus: float = 2.0
    """CPUs per sweep trial."""
    sweep_gpus: float = 0.25
    """GPUs per sweep trial (4 trials share one GPU)."""
    sweep_register: bool = True
    """Whether the sweep registers its capsules and promotes champions in MLflow."""
    ray_cpus: int = 16
    """CPUs of the local Ray the sweep starts (no --ray-address)."""
    timeout_s: float = 300.0
    """Most seconds the sweep subprocess may run."""
    threads: int | None = None
    """Torch threads of this process and OMP_NUM_THREADS of its children (None: torch's default)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings."""
        return asdict(self)

    def job_overrides(self) -> list[str]:
        """Job overrides of every packed member: the dtype, bf16 autocast and, on the GPU, CUDA."""
        device = ["train.cpu=false"] if self.device.startswith("cuda") else ["train.cpu=true"]
        return [*device, f"model.dtype={self.dtype}", "train.precision=bf16"]


def gpu_mode() -> Mode:
    """Full T5-Base, Llama-3.2-1B (all 16 layers) and Qwen2.5-1.5B (all 28) on one GPU, batch 8, n = 128."""
    archs = [{"arch": arch, "changes": {}, "batch": 8, "seq": 128, "target": 4} for arch in ARCHS]
    return Mode("gpu", "cuda", archs=archs)


def smoke_mode() -> Mode:
    """The same parts at tiny shapes on the CPU: K = 1 and 2, 2 steps, 1 and 3 RTE capsules served (no task mix: one
    replica fewer), 4 trials at 0.25 CPU."""
    archs = [{"arch": arch, "changes": TINY[arch], "batch": 2, "seq": 16, "target": 4, "methods": SMOKE_METHODS}
             for arch in ARCHS]
    return Mode("cpu-smoke", "cpu", archs=archs, rounds=1, warmup=1, t5_changes=TINY["t5-base"], pack_ks=[1, 2],
                pack_steps=2, pack_examples=(32, 4), serve_tasks=["rte"],
                serve_counts={"rte": [1, 3]}, serve_requests=4, serve_rounds=1, serve_gpus=0.0,
                sweep_steps=2, sweep_cpus=0.25, sweep_gpus=0.0, sweep_register=False, ray_cpus=2, timeout_s=240.0,
                threads=1)
