"""Shared pieces: the result record, interleaved timing, statistics, machine facts, JSON and subprocesses."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PACKAGES = ("torch", "transformers", "accelerate", "peft", "ray", "mlflow", "capt")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1"}


@dataclass
class Target:
    """A stated goal and how the measurement compares with it."""

    name: str  # what is compared, e.g. "CaPT step / floor (T5-Base)"
    goal: str  # e.g. "<= 1.05x"
    measured: float
    met: bool
    detail: str = ""  # by how much it is missed (or "met")


@dataclass
class Table:
    """One table of a benchmark: a title, its column keys in order and one dict per row."""

    title: str
    columns: list[str]
    rows: list[dict[str, Any]]


@dataclass
class BenchResult:
    """Everything one benchmark produced; serialised to `<name>.json`."""

    name: str
    title: str
    settings: dict[str, Any]
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)  # PNG file names relative to the results folder
    profiles: dict[str, str] = field(default_factory=dict)  # title -> torch.profiler top-ops text table
    sections: dict[str, str] = field(default_factory=dict)  # title -> another tool's Markdown, shown as is
    skipped: str | None = None  # why the benchmark did not run (e.g. no CAPT_DATA_DIR)
    error: str | None = None
    started: str = ""
    duration_s: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        """The result `save_result` wrote as JSON."""
        data = dict(data)
        data["tables"] = [Table(**t) for t in data.get("tables", [])]
        data["targets"] = [Target(**t) for t in data.get("targets", [])]
        return cls(**data)


def at_most(name: str, measured: float, limit: float, unit: str = "x") -> Target:
    """A `measured <= limit` target; a miss says by how much, absolute and relative."""
    met = measured <= limit
    detail = "met" if met else (f"missed by {measured - limit:.3f}{unit} "
                                f"({(measured / limit - 1) * 100:.1f} % over the limit)")
    return Target(name, f"<= {limit:g}{unit}", measured, met, detail)


def at_least(name: str, measured: float, goal: float, unit: str = "") -> Target:
    """A `measured >= goal` target; a miss says by how much, absolute and relative."""
    met = measured >= goal
    detail = "met" if met else (f"missed by {goal - measured:.3f}{unit} "
                                f"({(1 - measured / goal) * 100:.1f} % under the goal)")
    return Target(name, f">= {goal:g}{unit}", measured, met, detail)


def now_iso() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def interleaved(fns: Mapping[str, Callable[[], object]], rounds: int,
                warmup: int = 1) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall seconds, process CPU seconds: far less sensitive to other processes) of each callable, `rounds` times
    round-robin with a rotating start, after `warmup` untimed runs each."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
        logger.info("round %d/%d: %s", index + 1, rounds,
                    ", ".join(f"{n} {wall[n][-1]:.3f}s" for n in names))
    return wall, cpu


def paired_ratios(times: Mapping[str, Sequence[float]], reference: str) -> dict[str, list[float]]:
    """Per-round ratios time[name][i] / time[reference][i] (same round, same load)."""
    ref = times[reference]
    return {name: [v / r for v, r in zip(values, ref, strict=True)] for name, values in times.items()}


def median(values: Sequence[float]) -> float:
    """The median (NaN for no values)."""
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    """"min-max" of the values, 3 significant digits."""
    return f"{min(values):.3g}-{max(values):.3g}" if values else "-"


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM, load and platform of this machine."""
    import torch

    info: dict[str, Any] = {"cpu_model": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count(),
                            "usable_cpus": len(os.sched_getaffinity(0)), "platform": platform.platform(),
                            "python": platform.python_version()}
    with contextlib.suppress(OSError, StopIteration):  # not Linux, or no such line: the platform's answer stays
        cpu = Path("/proc/cpuinfo").read_text().splitlines()
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in cpu if line.startswith("model name"))
    with contextlib.suppress(OSError):
        total = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
        info["ram_gib"] = round(int(total.split()[1]) / 2**20, 1)
    info["load_average_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    info["torch_threads"] = torch.get_num_threads()
    return info


def commit_info() -> dict[str, Any]:
    """The commit the code ran at, and whether its code folders (capt, pipelines, benchmarks) matched it."""
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"),
            "tree_clean": not git("status", "--porcelain", "--", "capt", "pipelines", "benchmarks")}


def versions() -> dict[str, str]:
    """Installed versions of the packages the numbers depend on."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def save_result(result: BenchResult, out_dir: Path) -> Path:
    """Write `<out_dir>/<name>.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.name}.json"
    path.write_text(json.dumps(asdict(result), indent=2, default=str) + "\n")
    return path


def load_results(out_dir: Path, names: Sequence[str]) -> list[BenchResult]:
    """The saved results of `names` that exist in `out_dir`, in that order."""
    paths = [out_dir / f"{name}.json" for name in names]
    return [BenchResult.from_dict(json.loads(path.read_text())) for path in paths if path.is_file()]


def fmt(value: Any) -> str:
    """A table cell: 4 significant digits for floats, thousands separators for big numbers."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 10000 else f"{value:.4g}"
    return str(value)


def markdown_table(table: Table) -> str:
    """The table as GitHub Markdown (title as a bold line above it)."""
    lines = [f"**{table.title}**", "", "| " + " | ".join(table.columns) + " |",
             "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in table.columns) + " |" for row in table.rows]
    return "\n".join(lines)


def run_logged(cmd: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
               timeout: float | None = None) -> tuple[int, float]:
    """Run `cmd` in its own session from the repository root, output to `log_path`; (exit code, wall s). On a
    timeout its process group gets SIGINT (so a sweep stops its own Ray and MLflow), then SIGTERM."""
    from pipelines.services.probe import stop_process_group

    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("%s ran past %s s; interrupting it", cmd[:3], timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                code = proc.wait(timeout=60.0)
            except subprocess.TimeoutExpired:
                stop_process_group(proc.pid, 20.0, proc)
                code = proc.returncode
    return code, time.perf_counter() - start
