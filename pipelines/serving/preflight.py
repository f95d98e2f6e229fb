"""Every capsule to serve, fetched and checked by the driver before anything is deployed.

A replica loads its capsules only once Ray and Serve are up, a minute into the start; a capsule that fails there
surfaces as Serve's "Failed to update the deployments". The driver therefore downloads each version first and
runs the same verification the replicas run (`RegistrySource.fetch`: digests against the version's and its run's
tags, provenance against the registered name), then checks that every tensor file holds only finite values. The
capsule's fit to the base model's weights stays the replica's check: it needs the loaded model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from capt.errors import CaptError
from pipelines.serving.records import ServedCapsule
from pipelines.serving.source import RegistrySource


class UnservableCapsuleError(CaptError, RuntimeError):
    """A version to serve failed the driver's check; the message names the version, the file and why."""


def check_capsules(source: RegistrySource, versions: dict[str, int]) -> None:
    """Fetch and verify every (task, version) in a scratch folder; raise on the first that cannot be served."""
    with tempfile.TemporaryDirectory(prefix="capt-serve-check-") as scratch:
        checking = RegistrySource(source.uri, source.model, source.alias, root=scratch)
        for task, version in sorted(versions.items()):
            check_finite(checking, checking.fetch(task, version))


def check_finite(source: RegistrySource, fetched: ServedCapsule) -> None:
    """UnservableCapsuleError when a tensor file of a fetched capsule holds NaN or infinite values (the driver
    checks this before start, a replica's poll before it serves a new version or task)."""
    for weights in sorted(Path(fetched.capsule_dir).glob("*.safetensors")):
        bad = [name for name, tensor in load_file(str(weights)).items()
               if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
        if bad:
            raise UnservableCapsuleError(
                f"Version {fetched.version} of {fetched.model_name}: {weights.name} holds NaN or infinite values in "
                f"{', '.join(bad)}; it cannot be served. Promote another version (python -m "
                f"pipelines.promote --model {source.model} --task {fetched.task}) or retrain it.")
