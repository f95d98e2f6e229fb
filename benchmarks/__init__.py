"""Benchmark harness (`python -m benchmarks.run`, README): every benchmark module exposes ``NAME``, ``TITLE``,
``settings(quick) -> dict`` and ``run(settings, out_dir) -> BenchResult``."""
