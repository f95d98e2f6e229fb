"""Page faults of a CPU training step at a packed batch: glibc's defaults against settings that keep pages mapped.

    python -m benchmarks.page_faults --batches 144 16 --steps 3 --where thread main

Each (batch, glibc settings, where) runs in a fresh process (glibc reads `MALLOC_*` at start-up): MiniLM's shapes,
random weights, one torch thread, forward and backward; `where=thread` steps in a thread of its own, as a Tune trial
does. Prints user and system CPU seconds and minor faults per step after a warm-up: CPU times, not wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pipelines.sweeps.config import TUNED_HEAP_ENV

KEEP_MAPPED = {k: v for k, v in TUNED_HEAP_ENV.items() if k != "MALLOC_ARENA_MAX"}
"""glibc settings under which freed activations stay in the heap instead of being unmapped and faulted in again."""

SETTINGS = {"default": {}, "keep mapped": KEEP_MAPPED, "keep mapped, one arena": dict(TUNED_HEAP_ENV)}
"""The glibc environments compared. A thread's own arena serves requests above its 64 MB heaps with fresh maps
whatever `MALLOC_MMAP_MAX_` says; one arena sends every thread to the main heap."""

SHAPES = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
"""MiniLM-L6's encoder (all-MiniLM-L6-v2)."""


def measure(batch: int, tokens: int, steps: int, where: str, shapes: dict[str, int]) -> dict[str, float]:
    """Per-step user and system CPU seconds and minor faults of `steps` steps after a warm-up (this process)."""
    import resource
    import threading

    import torch
    from transformers import BertConfig, BertModel

    torch.set_num_threads(1)
    model = BertModel(BertConfig(vocab_size=30522, **shapes))
    ids = torch.randint(0, 30000, (batch, tokens), generator=torch.Generator().manual_seed(0))
    found: dict[str, float] = {}

    def run() -> None:
        def step() -> None:
            model(input_ids=ids).last_hidden_state.mean().backward()

        step()
        who = resource.RUSAGE_THREAD if where == "thread" else resource.RUSAGE_SELF
        before = resource.getrusage(who)
        for _ in range(steps):
            step()
        after = resource.getrusage(who)
        found.update(user_s=(after.ru_utime - before.ru_utime) / steps,
                     system_s=(after.ru_stime - before.ru_stime) / steps,
                     minor_faults=(after.ru_minflt - before.ru_minflt) / steps)

    if where == "thread":
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    else:
        run()
    return found


def row(batch: int, tokens: int, steps: int, where: str, setting: str, shapes: dict[str, int]) -> dict:
    """One measurement in a fresh process with the glibc environment `SETTINGS[setting]`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | SETTINGS[setting]
    code = (f"import json; from benchmarks.page_faults import measure; "
            f"print(json.dumps(measure({batch}, {tokens}, {steps}, {where!r}, {shapes!r})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    return {"batch": batch, "tokens": tokens, "where": where, "glibc": setting,
            **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[144, 16], help="rows per step")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per row")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--where", nargs="+", default=["thread"], choices=["thread", "main"],
                        help="the thread the steps run in")
    parser.add_argument("--layers", type=int, default=SHAPES["num_hidden_layers"], help="encoder layers")
    parser.add_argument("--glibc", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                        help="the glibc environments to compare")
    args = parser.parse_args(argv)
    shapes = {**SHAPES, "num_hidden_layers": args.layers}
    rows = [row(batch, args.tokens, args.steps, where, setting, shapes)
            for batch in args.batches for where in args.where for setting in args.glibc]
    lines = ["| batch | where | glibc | user s | system s | minor faults |", "|---:|---|---|---:|---:|---:|"]
    lines += [f"| {r['batch']} x {r['tokens']} | {r['where']} | {r['glibc']} | {r['user_s']:.2f} | "
              f"{r['system_s']:.2f} | {r['minor_faults']:,.0f} |" for r in rows]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
