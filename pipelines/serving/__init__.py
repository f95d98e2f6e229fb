"""Serving every promoted capsule of one base model: `python -m pipelines.serve` and `infra/serve.yaml`.

Modules: `engine` (`CapsuleEngine`: the base model once, every capsule in one `capt.CapsuleBank`, one mixed
batch per call, capsules swapped in place; no Ray, no MLflow), `batch` (one padded batch from many requests),
`source` (`RegistrySource`: the versions the registry aliases name, read through `pipelines.tracking.serving`),
`settings` (`ServeSettings`), `app` (the Ray Serve deployment: HTTP, `serve.batch`, the alias poller).
"""
