"""The README's baseline-settings table, generated: each method's settings as a plain job and the paper presets
resolve them, each with where its value comes from.

    python -m pipelines.baseline_settings            # print the table
    python -m pipelines.baseline_settings --write    # write it into README.md, between its markers

The sources are the `Setting` rows each method's config class declares (`provenance`, `capt.optim_defaults`); the
values are never written by hand: every cell is read from jobs resolved by `validate_job_config`, plain on a model
of each family and as each paper preset's trials, so the table cannot state a value that jobs do not get. A row
whose presets resolve another value than the plain job shows both; its source says why.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from capt.methods import METHODS
from capt.optim_defaults import FAMILIES, Setting
from pipelines.config.load import validate_job_config
from pipelines.config.sources import PipelineConfigError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN, END = "<!-- baseline settings table: python -m pipelines.baseline_settings --write -->", "<!-- end table -->"
FAMILY_MODELS = {"t5": "tiny-t5", "decoder": "tiny-llama", "encoder": "minilm"}
"""A built-in model of each family: a job's settings depend on its model only through the family."""
PRESETS = {"t5-base": "t5", "t5-large": "t5", "llama-3.2-1b": "decoder", "qwen2.5-1.5b": "decoder"}
"""Each paper preset (`pipelines/configs/paper/<name>.yaml`) with its model's family, whose built-in model it is
resolved on (the presets' own models need their hub configs; no preset sets anything per model)."""

OPTIMISER = Setting("optimiser, lr", ("optim.name", "optim.lr"),
                    "per model family, the method's `optim_defaults` (each entry names its source in "
                    "`capt/baselines/`); T5's are the paper's or its authors', the others' are measured or marked "
                    "untuned there")
GENERIC = (
    Setting("weight decay, schedule, warm-up, clipping",
            ("optim.weight_decay", "optim.schedule", "optim.warmup_ratio", "optim.max_grad_norm"),
            "the pipeline's defaults: no weight decay, linear decay after 6 % warm-up, clipping at 1.0 (SMoP's "
            "code, which the CaPT paper follows for its own runs)"),
    Setting("batch, epochs", ("train.batch_size", "train.max_epochs"),
            "the CaPT paper's protocol: batch 32, up to 50 epochs with early stopping on validation"),
)
"""Rows every method has, for the keys its own rows do not state."""
KEY_NAMES = {"optim.weight_decay": "weight decay", "optim.schedule": "schedule", "optim.warmup_ratio": "warm-up",
             "optim.max_grad_norm": "clipping", "train.batch_size": "batch", "train.max_epochs": "epochs"}
CHECKED_KEYS = ("optim.name", "optim.lr", *KEY_NAMES)
"""The optimiser, schedule, clipping, batch and epoch keys every method's rows state."""


def method_rows(name: str) -> tuple[Setting, ...]:
    """The method's rows: its optimiser row, its own declared rows, then the generic rows for the keys left."""
    own = METHODS[name].provenance
    covered = {key for row in own for key in row.keys}
    optimiser = next((row for row in own if row.keys == OPTIMISER.keys), OPTIMISER)
    rest = []
    for row in GENERIC:
        if keys := tuple(key for key in row.keys if key not in covered):
            rest.append(row if keys == row.keys else Setting(", ".join(KEY_NAMES[k] for k in keys), keys, row.source))
    return (optimiser, *[row for row in own if row.keys != OPTIMISER.keys], *rest)


def _value(job: Any, key: str) -> Any:
    """The value of dotted `key` in a resolved job config."""
    node: Any = job
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(value) if isinstance(value, list | tuple | dict) else str(value)


def _cell(job: Any, keys: Iterable[str]) -> str:
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={_shown(_value(job, key))}" for key in keys)


@cache
def plain_job(method: str, family: str) -> Any | None:
    """The resolved plain job of `method` on the family's built-in model (None: the method has no default there)."""
    try:
        return validate_job_config({"model": {"name": FAMILY_MODELS[family]}, "method": {"name": method},
                                    "task": {"name": "rte", "source": "generated"}})
    except PipelineConfigError:
        return None


@cache
def preset_jobs(preset: str) -> dict[str, list[Any]]:
    """{method: [resolved job]} of the preset's RTE trials of seed 0 (one per `select:` value), on its family's
    model."""
    from pipelines.sweeps.config import load_sweep_config, trials

    overrides = [f"models=[{FAMILY_MODELS[PRESETS[preset]]}]", "data_source=generated", "tasks=[rte]", "seeds=[0]"]
    found: dict[str, list[Any]] = {}
    for trial in trials(load_sweep_config(ROOT / "pipelines/configs/paper" / f"{preset}.yaml", overrides)):
        job = validate_job_config(trial.job)
        found.setdefault(job.method.name, []).append(job)
    return found


def plain_cell(method: str, row: Setting) -> str:
    """The row's values as plain jobs resolve them: one value, or one per family where they differ."""
    cells = {family: _cell(job, row.keys) for family in FAMILIES if (job := plain_job(method, family)) is not None}
    if len(set(cells.values())) == 1:
        return next(iter(cells.values()))
    return "; ".join(f"{family}: {cell}" for family, cell in cells.items())


def preset_cell(method: str, row: Setting) -> str:
    """The row's values under each paper preset where they differ from the plain job of the preset's family ("as
    plain" where none does; selected values listed as the preset's search)."""
    differing = []
    for preset, family in PRESETS.items():
        jobs = preset_jobs(preset).get(method, [])
        if not jobs:
            continue
        plain = plain_job(method, family)
        parts = []
        for key in row.keys:
            values = sorted({_shown(_value(job, key)) for job in jobs}, key=_order)
            shown = values[0] if len(values) == 1 else "select {" + ", ".join(values) + "}"
            if plain is None or shown != _shown(_value(plain, key)):
                parts.append(f"{key.rsplit('.', 1)[-1]}={shown}")
        if parts:
            differing.append((preset, ", ".join(parts)))
    if not differing:
        return "as plain"
    if len({cell for _, cell in differing}) == 1:
        return f"{', '.join(p for p, _ in differing)}: {differing[0][1]}"
    return "; ".join(f"{preset}: {cell}" for preset, cell in differing)


def _order(shown: str) -> tuple[int, float | str]:
    try:
        return 0, float(shown)
    except ValueError:
        return 1, shown


def table() -> str:
    """The whole table, in registry order."""
    lines = ["| method | setting | plain job | paper presets | source |", "|---|---|---|---|---|"]
    for method in METHODS:
        for row in method_rows(method):
            lines.append(f"| {method} | {row.name} | {plain_cell(method, row)} | {preset_cell(method, row)} | "
                         f"{row.source} |")
    return "\n".join(lines)


def readme_with_table(readme: str, generated: str, begin: str = BEGIN, end: str = END) -> str:
    """`readme` with the text between its markers `begin` and `end` replaced by `generated`."""
    if begin not in readme or end not in readme.split(begin, 1)[1]:
        raise ValueError(f"README.md has no {begin!r} ... {end!r} block to write the table into")
    head, rest = readme.split(begin, 1)
    return f"{head}{begin}{generated}{end}{rest.split(end, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    """Print the table, or write it into README.md (--write)."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.baseline_settings", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="write the table into README.md between its markers")
    args = parser.parse_args(argv)
    generated = table()
    if args.write:
        README.write_text(readme_with_table(README.read_text(), f"\n{generated}\n"))
    else:
        sys.stdout.write(generated + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
