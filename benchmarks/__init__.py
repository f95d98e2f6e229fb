"""Benchmark harness: CaPT against the frozen floor and the baselines, measured side by side in one run.

    python -m benchmarks.run [--quick] [--only NAME ...]

Each benchmark module exposes ``NAME``, ``TITLE``, ``settings(quick) -> dict`` and
``run(settings, out_dir) -> BenchResult``; ``benchmarks.run`` writes one JSON file per benchmark and the
Markdown report ``benchmarks/results/report.md``. See ``benchmarks/README.md``.
"""
