"""A pack member's outputs in its own folder: the artifact of its best state, written as a single job writes it
(`pipelines.adapted.save_artifact`: the capsule, an encoder classifier's head and readout, the digest manifest), so
`pipelines.adapted.load_artifact` and everything downstream read it like any job's artifact; and its checkpoint.

The checkpoint (`PackOptions.checkpoints`): a member's state at its last validation, in its own folder, so a pack run
again after an interruption continues each member from where it was. One file per member,
`<output_dir>/checkpoints/pack_member.pt`, replaced atomically at each of its validations: its trainable tensors
(capsule, head) and best state, its optimiser and schedule state, its loop (steps, epoch, batches of the epoch consumed,
history, patience) and its per-step losses. It is read with `torch.load(weights_only=True)` (tensors and plain values
only, nothing unpickled). A resumed member sees the batches it had not seen yet in the order it would have
(`pack_setup.EpochSampler`), with its optimiser and schedule where they were; what is not restored is the pack's dropout
stream (one stream over the whole batch, drawn afresh by the pack that resumes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from capt.atomic import write_atomically
from capt.heads import head_installed
from capt.packing import PackedCapsules
from pipelines.adapted import save_artifact
from pipelines.config.load import validate_job_config
from pipelines.training.checkpoint import LoopState
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


CHECKPOINT = Path("checkpoints") / "pack_member.pt"
"""A member's checkpoint, under its output_dir."""


def checkpoint_path(member: Member) -> Path:
    """Where `member`'s checkpoint lives."""
    return Path(member.config.resolved_output_dir()) / CHECKPOINT


def member_state(pack: Pack, member: Member) -> dict[str, torch.Tensor]:
    """A CPU copy of `member`'s trainable tensors now (capsule, head)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in pack.model.member_parameters(member.index).items()}


def save_member(pack: Pack, member: Member) -> None:
    """Write `member`'s state now (after one of its validations), replacing its previous checkpoint atomically."""
    path = checkpoint_path(member)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"params": member_state(pack, member), "best": member.best, "optimizer": member.optimizer.state_dict(),
             "scheduler": member.scheduler.state_dict(), "loop": member.loop.to_json(), "losses": member.losses,
             "stopped_early": member.stopped_early}
    write_atomically(path, lambda staging: torch.save(state, staging))


def restore_member(pack: Pack, member: Member) -> bool:
    """Load `member`'s checkpoint into it, if it has one; True when it did."""
    path = checkpoint_path(member)
    if not path.is_file():
        return False
    state = torch.load(path, map_location="cpu", weights_only=True)
    params = pack.model.member_parameters(member.index)
    if set(params) != set(state["params"]):
        raise PackError(f"The pack checkpoint {path} holds {sorted(state['params'])}, but member {member.index} "
                        f"trains {sorted(params)}: delete {path} to train this member afresh.")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state["params"][name].to(param.device, param.dtype))
    member.optimizer.load_state_dict(state["optimizer"])
    member.scheduler.load_state_dict(state["scheduler"])
    member.loop = LoopState.from_json(state["loop"])
    member.best, member.losses = state["best"], list(state["losses"])
    member.stopped_early = bool(state["stopped_early"])
    return True
