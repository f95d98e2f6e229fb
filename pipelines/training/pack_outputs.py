"""A pack member's outputs in its own folder: the artifact of its best state, written as a single job writes it
(`pipelines.methods.save_artifact`: the capsule, an encoder classifier's head and readout, the digest manifest), so
`pipelines.methods.load_artifact` and everything downstream read it like any job's artifact."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from capt.heads import head_installed
from capt.packing import PackedCapsules
from pipelines.config.load import validate_job_config
from pipelines.methods import save_artifact
from pipelines.training.outputs import RESULT_FILE, claim_job_folder
from pipelines.training.pack_setup import Member, Pack, PackError

REPLACED_OUTPUTS = ("artifact", RESULT_FILE, RESULT_FILE + ".tmp")
"""What a member's folder may hold from an interrupted end of a pack, removed before a pack that keeps checkpoints
trains it again."""


class _MemberSaver:
    """The `MethodModel.save` of one member: what `save_artifact` calls to write the capsule files."""

    def __init__(self, model: PackedCapsules, index: int) -> None:
        self.model, self.index = model, index

    def save(self, directory: str | os.PathLike, task: str | None = None,
             metrics: Mapping[str, float] | None = None, overwrite: bool = False) -> Path:
        return self.model.save_member(self.index, directory, task, metrics, overwrite)


def save_member_artifact(pack: Pack, member: Member, metrics: dict[str, float]) -> Path:
    """Write the member's current capsule (and head) to `<its output_dir>/artifact`; returns that folder.

    The base model holds the member's head meanwhile (the artifact's fingerprint and head file are those of the model
    the member was trained as), and its own head again afterwards.
    """
    directory = member.config.resolved_output_dir() / "artifact"
    directory.parent.mkdir(parents=True, exist_ok=True)
    config, base = member.config, pack.loaded.model
    with head_installed(base, pack.model.member_head(member.index)):
        save_artifact(_MemberSaver(pack.model, member.index), base, config.method.name, directory, config.task.name,
                      metrics, config.model.readout)
    return directory


@contextlib.contextmanager
def claimed_member_folders(configs: list, keep_checkpoints: bool = False) -> Iterator[None]:
    """Hold every member's output_dir as a single job holds its own (`pipelines.training.outputs.claim_job_folder`):
    locked for the pack's duration, another config's outputs refused, the member's config recorded.

    `keep_checkpoints`: the folder's outputs of the same config are kept as a resumed job keeps them (its checkpoints,
    its run record) but for the artifact and result.json, which this pack writes again (`REPLACED_OUTPUTS`); else
    they are removed, as a job that does not resume removes them."""
    folders = [str(config.resolved_output_dir().resolve()) for config in configs]
    shared = [(i, folder) for i, folder in enumerate(folders) if folders.index(folder) != i]
    if shared:
        i, folder = shared[0]
        raise PackError(f"member {i} writes to output_dir={folder}, as member {folders.index(folder)} does: each "
                        "member writes its artifact to a folder of its own (give it another output_dir)")
    with contextlib.ExitStack() as stack:
        for config in configs:
            stack.enter_context(claim_job_folder(with_resume(config, True) if keep_checkpoints else config))
            if keep_checkpoints:
                _remove_replaced(Path(config.resolved_output_dir()))
        yield


def with_resume(config, resume: bool):
    """The resolved `config` with `train.resume` set to `resume`: outside the config hash, so the same folder and hash
    (on: a claim keeps the folder's outputs of this config; off: what a pack member trains with)."""
    data = config.to_dict()
    return validate_job_config({**data, "train": {**data["train"], "resume": resume}})


def _remove_replaced(folder: Path) -> None:
    for name in REPLACED_OUTPUTS:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
