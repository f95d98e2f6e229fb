"""Resumable state with Accelerate's `save_state`/`load_state`, keeping only the trainable weights.

Accelerate would write the whole frozen backbone at every checkpoint (gigabytes for a few KB of
capsule); its save/load pre-hooks let us store the trainable tensors ourselves as safetensors and skip
the rest, while Accelerate keeps the optimiser, scheduler, sampler and RNG states.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from capt.errors import CaptError

TRAINABLE_FILE = "trainable_{index}.safetensors"
LOOP_FILE = "loop_state.json"
BEST_FILE = "best_trainable.safetensors"
PHASE_FILE = "phase_state_{index}.safetensors"
LATEST_CHECKPOINT = Path("checkpoints") / "latest"
"""Where a job keeps its resumable checkpoint, under its output_dir: the loop writes and resumes it, a full disk's
message names it."""
T = TypeVar("T")
_END = object()


class DamagedCheckpointError(CaptError, RuntimeError):
    """A checkpoint to resume from is incomplete; the message names the missing file and how to restart."""


@dataclass
class LoopState:
    """Where the loop is: steps, epochs, the best validation so far and the curve."""

    step: int = 0
    """Optimiser steps taken."""
    epoch: int = 0
    """Current epoch (0-based)."""
    batches_in_epoch: int = 0
    """Batches of the current epoch already consumed."""
    best_score: float = -math.inf
    """Best validation score so far."""
    best_step: int = 0
    """Step of the best validation."""
    bad_evals: int = 0
    """Validations since the last improvement (for early stopping)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """One record per validation."""
    loss_sum: float = 0.0
    """Sum of the training losses since the last validation."""
    loss_count: int = 0
    """Number of losses in `loss_sum`."""
    untrained_score: float | None = None
    """Test score before the first training step (with `train.score_untrained`), kept for a resumed job."""
    log_sum: float = 0.0
    """Sum of the training losses since the last point of the loss curve (`loop.curve_point_if_due`)."""
    log_count: int = 0
    """Number of losses in `log_sum`."""
    curve: list[dict[str, Any]] = field(default_factory=list)
    """One point per `train.log_every_steps` steps: the mean training loss over them and the learning rate."""

    def add_loss(self, loss: float) -> None:
        """Count one batch's training loss towards the next validation record and the next curve point."""
        self.loss_sum, self.loss_count = self.loss_sum + loss, self.loss_count + 1
        self.log_sum, self.log_count = self.log_sum + loss, self.log_count + 1

    def record_validation(self, metrics: dict[str, float]) -> tuple[dict[str, Any], bool]:
        """Add the validation record of `metrics` at this step: (the record, whether its score is a new best). Its
        ``train_loss`` covers the steps since the last record; patience counts the validations without a new best."""
        record = {"step": self.step, "epoch": self.epoch, "train_loss": self.loss_sum / max(1, self.loss_count),
                  **{f"validation_{k}": v for k, v in metrics.items()}}
        self.loss_sum, self.loss_count = 0.0, 0
        self.history.append(record)
        improved = metrics["score"] > self.best_score
        if improved:
            self.best_score, self.best_step, self.bad_evals = metrics["score"], self.step, 0
        else:
            self.bad_evals += 1
        record["best_validation_score"] = self.best_score
        return record, improved

    def out_of_patience(self, patience: int | None) -> bool:
        """Whether `patience` validations in a row brought no new best (early stopping)."""
        return patience is not None and self.bad_evals >= patience

    def wants_untrained_score(self, train) -> bool:
        """Whether to score the untrained model now (`train.score_untrained`, not yet started, not yet scored)."""
        return train.score_untrained and self.step == 0 and self.untrained_score is None

    def to_json(self) -> str:
        data = asdict(self)
        data["best_score"] = None if math.isinf(self.best_score) else self.best_score
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> LoopState:
        data = json.loads(text)
        data["best_score"] = -math.inf if data["best_score"] is None else data["best_score"]
        return cls(**data)


def cpu_copies(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", copy=True).contiguous() for n, p in params.items()}


def copy_into(params: Mapping[str, nn.Parameter], state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state[name]` into each parameter of `params` (on its device, in its dtype)."""
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name].to(param.device, param.dtype))


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return cpu_copies({n: p for n, p in model.named_parameters() if p.requires_grad})


def restore_trainable(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` back into the model's trainable parameters (names must match exactly)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(params) != set(state):
        raise RuntimeError(f"Checkpoint holds {sorted(state)[:5]}..., the model trains {sorted(params)[:5]}...")
    copy_into(params, state)


def install_hooks(accelerator) -> None:
    """Make `save_state`/`load_state` store only the trainable weights of each prepared model, and what a
    multi-phase method's phases have set (`capt.phases`)."""

    def save_hook(models: list, weights: list, output_dir: str) -> None:
        if accelerator.is_main_process:  # the ranks hold the same weights; one writer per file
            for index, model in enumerate(map(accelerator.unwrap_model, models)):
                save_file(trainable_state(model), str(Path(output_dir) / TRAINABLE_FILE.format(index=index)))
                if phase_state := model.phase_state():  # none for a one-phase method
                    save_file(phase_state, str(Path(output_dir) / PHASE_FILE.format(index=index)))
        weights.clear()  # Accelerate then skips writing the full model weights

    def load_hook(models: list, input_dir: str) -> None:
        for index, model in enumerate(map(accelerator.unwrap_model, models)):
            restore_trainable(model, load_file(str(Path(input_dir) / TRAINABLE_FILE.format(index=index))))
            path = Path(input_dir) / PHASE_FILE.format(index=index)
            if not model.phase_state():
                continue
            if not path.is_file():  # a multi-phase method's missing file is a damaged checkpoint
                raise DamagedCheckpointError(
                    f"Cannot resume from {path.parent}: {path.name} is missing, so the method's training phase state "
                    f"(e.g. XPrompt's pruning masks) is lost. {_restart_hint(path.parent)}")
            model.load_phase_state(load_file(str(path)))
        models.clear()  # Accelerate then skips loading full model weights

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def save_checkpoint(accelerator, directory: Path, loop: LoopState, best: dict[str, torch.Tensor] | None) -> None:
    """Write the resumable state to `directory` atomically (a crash never leaves a half checkpoint)."""
    staging = directory.with_name(directory.name + ".partial")
    if accelerator.is_main_process and staging.exists():
        shutil.rmtree(staging)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(staging))
        accelerator.wait_for_everyone()  # every rank writes its RNG state into staging: all done before the move
        if accelerator.is_main_process:
            (staging / LOOP_FILE).write_text(loop.to_json())
            if best is not None:
                save_file(best, str(staging / BEST_FILE))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a half-written checkpoint is never left to resume from
        raise
    if accelerator.is_main_process:
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    accelerator.wait_for_everyone()


def load_checkpoint(accelerator, directory: Path) -> tuple[LoopState, dict[str, torch.Tensor]]:
    """Restore optimiser, scheduler, RNG and trainable weights; return the loop state and best weights.

    Every file the job wrote must be there: a missing one raises `DamagedCheckpointError` rather than
    resuming with fresh optimiser state or taking the current weights for the best ones.
    """
    numbered = {"optimizer": len(accelerator._optimizers), "scheduler": len(accelerator._schedulers)}
    required = [LOOP_FILE, BEST_FILE, *(TRAINABLE_FILE.format(index=i) for i in range(len(accelerator._models))),
                *(f"{kind}{'' if i == 0 else f'_{i}'}.bin" for kind, count in numbered.items() for i in range(count)),
                f"random_states_{accelerator.process_index}.pkl"]
    for name in required:
        if not (directory / name).is_file():
            raise DamagedCheckpointError(
                f"Cannot resume from {directory}: {name} is missing, so the checkpoint is incomplete (a damaged or "
                f"hand-edited folder). {_restart_hint(directory)}")
    accelerator.load_state(str(directory))
    try:
        loop = LoopState.from_json((directory / LOOP_FILE).read_text())
    except (ValueError, KeyError, TypeError) as err:
        raise DamagedCheckpointError(
            f"Cannot resume from {directory}: {LOOP_FILE} is unreadable ({err}). {_restart_hint(directory)}") from err
    return loop, load_file(str(directory / BEST_FILE))


def _restart_hint(directory: Path) -> str:
    return (f"Restart this job from step 0: delete {directory} and run it again, or run it with "
            f"train.resume=false (which replaces this job's old outputs).")


def rng_restored_once_started(batches: Iterable[T], cpu_rng_state: torch.Tensor) -> Iterator[T]:
    """`batches`, with torch's CPU random state set back to `cpu_rng_state` once their iterator has started.

    Starting a DataLoader's iterator draws its base seed from torch's global generator. An uninterrupted job made
    that draw for the epoch in progress before it saved its checkpoint (whose random state comes after it); a job
    resumed from the checkpoint starts that epoch's iterator again, which without this would leave every later
    dropout mask one draw behind the uninterrupted job's. (On a GPU, dropout draws from the device's generator,
    which the draw does not touch; the reset is then a no-op for the masks.)"""
    iterator = iter(batches)
    first = next(iterator, _END)
    torch.set_rng_state(cpu_rng_state)
    if first is not _END:
        yield first
        yield from iterator
