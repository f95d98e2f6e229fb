"""A pack member's checkpoint: its state at its last validation, in its own folder, so a pack run again after an
interruption continues each member from where it was (`PackOptions.checkpoints`).

One file per member, `<output_dir>/checkpoints/pack_member.pt`, replaced atomically at each of its validations: its
trainable tensors (capsule, head) and best state, its optimiser and schedule state, its loop (steps, epoch, batches of
the epoch consumed, history, patience) and its per-step losses. It is read with `torch.load(weights_only=True)`
(tensors and plain values only, nothing unpickled). A resumed member sees the batches it had not seen yet in the order
it would have (`pack_setup.EpochSampler`), with its optimiser and schedule where they were; what is not restored is
the pack's dropout stream (one stream over the whole batch, drawn afresh by the pack that resumes).
"""

from __future__ import annotations

from pathlib import Path

import torch

from capt.atomic import write_atomically
from pipelines.training.checkpoint import LoopState
from pipelines.training.pack_setup import Member, Pack, PackError

CHECKPOINT = Path("checkpoints") / "pack_member.pt"
"""A member's checkpoint, under its output_dir."""


def checkpoint_path(member: Member) -> Path:
    """Where `member`'s checkpoint lives."""
    return Path(member.config.resolved_output_dir()) / CHECKPOINT


def save_member(pack: Pack, member: Member) -> None:
    """Write `member`'s state now (after one of its validations), replacing its previous checkpoint atomically."""
    path = checkpoint_path(member)
    path.parent.mkdir(parents=True, exist_ok=True)
    params = {n: p.detach().to("cpu", copy=True) for n, p in pack.model.member_parameters(member.index).items()}
    state = {"params": params, "best": member.best, "optimizer": member.optimizer.state_dict(),
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
