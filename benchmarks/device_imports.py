"""What each device-check part imports, checked before any device time is spent on it.

A lent GPU machine brings its own Python packages (its torch, often no Ray or MLflow), and what is carried there
can clash with what it has: a carried grpcio-reflection refused the machine's grpcio at `from ray import serve`,
after the other parts had run. `bash benchmarks/device_check.sh --check-imports` imports every module the chosen
parts load lazily, reports every failure at once, and exits 2 when one fails, in seconds.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

PART_MODULES: dict[str, tuple[str, ...]] = {
    "device_step_cost": ("torch", "transformers", "peft", "capt", "benchmarks.device_steps", "benchmarks.step_cost",
                         "benchmarks.models", "benchmarks.profiling"),
    "device_packing": ("accelerate", "datasets", "pipelines.train", "pipelines.training.packed", "benchmarks.packing"),
    "device_serving": ("ray", "ray.serve", "mlflow", "pipelines.serving.app", "pipelines.services.ray_connect",
                       "benchmarks.serving", "benchmarks.serving_app", "benchmarks.serving_engine"),
    "device_sweep": ("ray.tune", "ray.train", "mlflow", "mlflow.server", "pipelines.sweeps.run",
                     "pipelines.tracking", "benchmarks.device_sweep"),
}
"""Part name -> the modules its code imports (directly or inside functions) beyond the device check itself."""


def import_problems(parts: Sequence[str]) -> list[str]:
    """One line per module of `parts` that fails to import (its part, its name and the error); empty when all do."""
    problems, seen = [], set()
    for part in parts:
        for module in PART_MODULES[part]:
            if module in seen:
                continue
            seen.add(module)
            try:
                importlib.import_module(module)
            except Exception as err:  # noqa: BLE001 - any failure to import is what this reports
                problems.append(f"{part}: import {module} failed: {type(err).__name__}: {err}")
    return problems
