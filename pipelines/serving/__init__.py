"""Serving every promoted capsule of one base model: `python -m pipelines.serve` and `infra/serve.yaml`."""
