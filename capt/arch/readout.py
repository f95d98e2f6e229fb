"""What the linear head of an encoder-only classifier (BERT family) reads: the readout.

A BERT `*ForSequenceClassification` model classifies `pooler_output`, i.e. [CLS] through the frozen, pretrained
pooler (dense + tanh). Models trained for sentence embeddings with mean pooling (all-MiniLM-L6-v2) never trained
that pooler, so the head can read instead:

- "pooler": [CLS] through the pooler (the model's own behaviour; installs nothing);
- "cls": the final state of [CLS], without the pooler;
- "mean": the masked mean of the final states of the input tokens ([CLS], the text and [SEP]; padding excluded).
  Positions a method inserts (capsule slots, soft-prompt tokens) are excluded too, so "mean" reads the same
  tokens under every method; the capsule has its own readout;
- "capsule": the final state of the capsule slot (the mean over the slots when a capsule has several).

`install_readout` replaces `pooler_output` by the chosen vector with a forward hook on the base model (the bare
`BertModel`), which sees the sequence with every inserted position; `remove_readout` takes it off again (a cached
base model must leave a job exactly as it came).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capt.errors import CaptError

if TYPE_CHECKING:  # configuration validation reads READOUTS and must not import torch
    import torch
    from torch import nn

READOUTS = ("pooler", "cls", "mean", "capsule")
"""What an encoder classifier's head can read; "pooler" is the model's own behaviour."""
_INSTALLED = "_capt_readout"


class ReadoutError(CaptError, ValueError):
    """A readout that this model or method cannot provide."""


@dataclass
class _Readout:
    name: str
    inserted: tuple[int, int]
    handle: Any


def install_readout(model: nn.Module, readout: str, inserted: tuple[int, int] = (0, 0)) -> None:
    """Make `model`'s classifier head read `readout`; `inserted` = [start, stop) positions a method inserts.

    "pooler" installs nothing. "capsule" needs inserted capsule slots (start < stop).
    """
    if readout not in READOUTS:
        raise ReadoutError(f"readout={readout!r} is not a readout (allowed: {', '.join(READOUTS)}).")
    if getattr(model, _INSTALLED, None) is not None:
        raise ReadoutError("This model already has a readout installed; remove_readout(model) first.")
    if readout == "pooler":
        return
    start, stop = inserted
    if readout == "capsule" and not 0 <= start < stop:
        raise ReadoutError(f"readout='capsule' needs the capsule slot's positions; got inserted={inserted} "
                           "(only CaPT has a capsule slot: use pooler, cls or mean for other methods).")
    bare = bare_encoder(model)
    handle = bare.register_forward_hook(_hook(readout, start, stop), with_kwargs=True)
    setattr(model, _INSTALLED, _Readout(readout, (start, stop), handle))


def remove_readout(model: nn.Module) -> None:
    """Undo `install_readout` (nothing to do when none is installed)."""
    installed = getattr(model, _INSTALLED, None)
    if installed is not None:
        installed.handle.remove()
        delattr(model, _INSTALLED)


def installed_readout(model: nn.Module) -> str:
    """The readout `model`'s head reads now ("pooler" when none was installed)."""
    installed = getattr(model, _INSTALLED, None)
    return installed.name if installed is not None else "pooler"


def bare_encoder(model: nn.Module) -> nn.Module:
    """The bare encoder whose `pooler_output` the head classifies; an error when the head reads anything else."""
    bare = getattr(model, "base_model", None)
    if bare is None or bare is model or getattr(bare, "pooler", None) is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        raise ReadoutError(
            f"{type(model).__name__} (model_type={model_type!r}) has no pooler output for its head to read: readouts "
            f"other than 'pooler' need a BERT-style *ForSequenceClassification model (allowed here: pooler).")
    return bare


def _hook(readout: str, start: int, stop: int):
    def replace_pooler_output(module: nn.Module, args: tuple, kwargs: dict, output):
        states = output.last_hidden_state  # (B, S, D), inserted positions included
        output["pooler_output"] = readout_vector(readout, states, kwargs.get("attention_mask"), start, stop)
        return output

    return replace_pooler_output


def readout_vector(readout: str, states: torch.Tensor, attention_mask: torch.Tensor | None, start: int,
                   stop: int) -> torch.Tensor:
    """(B, S, D) final states -> (B, D) vector the head reads; positions [start, stop) are the inserted ones."""
    import torch

    from capt.capsule import masked_mean

    if readout == "cls":
        return states[:, 0]
    if readout == "capsule":
        return states[:, start:stop].mean(dim=1).to(states.dtype)
    mask = torch.ones(states.shape[:2], dtype=torch.long, device=states.device)
    if attention_mask is not None and attention_mask.dim() == 2:
        mask = attention_mask.to(torch.long)
    mask = mask.clone()
    mask[:, start:stop] = 0  # capsule slots and soft-prompt tokens are not input tokens
    return masked_mean(states, mask).to(states.dtype)


def row_readout_vectors(readouts: Sequence[str], rows: torch.Tensor, states: torch.Tensor,
                        pooled: torch.Tensor | None, attention_mask: torch.Tensor | None, start: int,
                        stop: int) -> torch.Tensor:
    """(B, D): each row's readout of the final `states` (B, S, D), when rows read differently (a batch mixing
    tasks). `readouts[i]` is what capsule i's head reads, `rows` (B,) each row's capsule index, `pooled` (B, D)
    the bare encoder's own `pooler_output` (what "pooler" reads)."""
    import torch

    out = torch.empty(states.shape[0], states.shape[2], dtype=states.dtype, device=states.device)  # (B, D)
    wanted = [readouts[i] for i in rows.tolist()]
    for name in dict.fromkeys(wanted):  # each readout once, over the rows that read it
        chosen = torch.tensor([i for i, w in enumerate(wanted) if w == name], dtype=torch.long, device=states.device)
        if name == "pooler":
            if pooled is None:
                raise ReadoutError("readout='pooler' needs the encoder's pooler output; this encoder has no pooler.")
            out[chosen] = pooled.index_select(0, chosen).to(states.dtype)
            continue
        mask = None if attention_mask is None else attention_mask.index_select(0, chosen)
        out[chosen] = readout_vector(name, states.index_select(0, chosen), mask, start, stop)
    return out
