"""Serving every promoted capsule of one base model: `python -m pipelines.serve` and `infra/serve.yaml`.

Modules: `engine` (`CapsuleEngine`: the base model once, every capsule in one `capt.CapsuleBank`, one padded mixed batch
per call, capsules swapped in place; no Ray, no MLflow), `source` (`RegistrySource`: the versions the registry aliases
name, read through `pipelines.tracking.registry`, each checked before it is served), `settings` (`ServeSettings`),
`routes` (the HTTP surface: a FastAPI app), `limits` (a body's checks before and while it is parsed), `auth` (the bearer
token), `app` (the Ray Serve deployment: `routes` through Serve's ingress, `serve.batch`, the alias poller).
"""
