"""One device-check result folder from several invocations of `benchmarks/device_check.sh --only ...`.

A lent GPU machine may only take the check in pieces (each call carries its own packages, and one call's time is
limited), so each piece writes its own folder. This merges them: for every part, the JSON of the last folder where
it succeeded (else the last one where it failed), the sweep's log beside it, a `run.json` that lists every call
(date, command, versions, duration) and a regenerated `report.md`.

    python -m benchmarks.device_merge --out benchmarks/results/device_check DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult
from benchmarks.device_check import PARTS
from benchmarks.report import write_report

PART_NAMES = tuple(PARTS)
"""The device check's parts, in report order; a part's log, where it writes one, is `<part>.log` beside its JSON."""


def pick_parts(sources: list[Path]) -> dict[str, tuple[Path, BenchResult]]:
    """Part name -> (folder, result): the last folder where the part succeeded, else the last where it failed."""
    picked: dict[str, tuple[Path, BenchResult]] = {}
    for source in sources:
        for name in PART_NAMES:
            path = source / f"{name}.json"
            if not path.is_file():
                continue
            result = BenchResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
            if name not in picked or not result.error or picked[name][1].error:
                picked[name] = (source, result)
    return picked


def merged_info(sources: list[Path]) -> dict[str, Any]:
    """The last call's `run.json` with every call listed, versions filled from the calls that had the package."""
    runs = [json.loads((s / "run.json").read_text(encoding="utf-8")) for s in sources if (s / "run.json").is_file()]
    if not runs:
        raise ValueError(f"no run.json in any of {[str(s) for s in sources]}")
    info = dict(runs[-1])
    versions: dict[str, str] = {}
    for run in runs:
        versions.update({k: v for k, v in run["versions"].items() if v != "not installed" or k not in versions})
    info.update(date=runs[0]["date"], versions=versions, total_s=sum(run["total_s"] for run in runs),
                command=" ; ".join(run["command"] for run in runs),
                calls=[{key: run[key] for key in ("date", "command", "total_s", "versions")} for run in runs])
    return info


def merge(sources: list[Path], out: Path) -> Path:
    """Write the merged folder `out` (its JSONs, logs, run.json and report.md); return the report's path."""
    picked = pick_parts(sources)
    if not picked:
        raise ValueError(f"no device-check part JSON in any of {[str(s) for s in sources]}")
    info = merged_info(sources)
    out.mkdir(parents=True, exist_ok=True)
    for name, (source, _) in picked.items():
        for file in (f"{name}.json", f"{name}.log"):
            if (source / file).is_file() and (source / file).resolve() != (out / file).resolve():
                shutil.copyfile(source / file, out / file)
    (out / "run.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return write_report([picked[name][1] for name in PART_NAMES if name in picked], info, out)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: exit 0 with the report's path, 2 when the folders hold nothing to merge."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.device_merge", description=__doc__.split("\n")[0])
    parser.add_argument("sources", nargs="+", type=Path, help="device-check result folders, earliest first")
    parser.add_argument("--out", type=Path, required=True, help="the merged folder")
    args = parser.parse_args(argv)
    try:
        path = merge(args.sources, args.out)
    except (ValueError, OSError, KeyError, json.JSONDecodeError) as err:
        print(f"error: cannot merge {[str(s) for s in args.sources]}: {err}", file=sys.stderr)
        return 2
    print(f"Merged report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
