"""The optimiser and learning rate each method declares per model family, and the source texts methods share.

A method's config class declares its entries as ``optim_defaults = {"t5": OptimDefault(...), ...}``; a job that
names no optimiser or lr gets the entry of its method and its model's family, filled in before anything trains.
Each entry says where its values come from. Encoder-only values marked "measured" are the learning benchmark's
(pipelines/configs/bench/learning.yaml, benchmarks/README.md): the lr chosen on CB's validation split, CB being
the one task MiniLM learns in its 150 steps (COPA's and RTE's choices, at chance, are given for the record).
Values marked "not tuned" are placeholders; a sweep that cares should give `select: {job.optim.lr: [...]}` anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = ("t5", "decoder", "encoder")
"""Model families, as `capt.arch` names them: T5 (encoder-decoder), decoder-only, encoder-only (BERT)."""


@dataclass(frozen=True)
class OptimDefault:
    """The default optimiser and learning rate of one (method, family), with where they come from."""

    optimizer: str
    """adafactor (fixed lr: relative_step=False, scale_parameter=False) or adamw."""
    lr: float
    """Learning rate of the method's parameters (a classifier head has its own, optim.head_lr)."""
    source: str
    """The paper, the baseline's paper, or the measurement these values come from."""


@dataclass(frozen=True)
class Setting:
    """One row of the baseline-settings table: a setting of a method, the resolved job-config keys that hold its value
    (``method.options.num_tokens``, ``optim.weight_decay``, ``train.batch_size``), and where the value comes from: the
    paper (section or table), the official code (repository and file), or "ours" with the reason. The table's values
    are read from resolved jobs (`pipelines.baseline_settings`), never written here, so it cannot say what jobs do
    not get."""

    name: str
    """The setting as the table names it ("prompt length, init")."""
    keys: tuple[str, ...]
    """Dotted keys of the resolved job config that hold its value."""
    source: str
    """Where the value comes from; a value a paper preset sets otherwise says why there."""


PROMPT_T5 = ("Lester et al. 2021 (prompt tuning on T5): Adafactor at lr 0.3; the CaPT paper trains prompt methods "
             "with Adafactor and takes lr 0.3 from earlier work (SMoP's code)")
OUTLIER = ("Adafactor's fixed-lr first step moves every element by +-lr, so the T5 value 0.3 makes the capsule an "
           "outlier token on models whose states are ~0.6 per element (MiniLM)")
UNMEASURED = ("not tuned: the learning benchmark runs one encoder-only model (MiniLM), so this family's value is a "
              "placeholder")
SMALL_STATES = (UNMEASURED + ". " + OUTLIER + "; AdamW at 1e-2 is "
                "the top of P-Tuning v2's AdamW range on BERT-family encoders (Liu et al. 2022: 5e-3..1e-2)")
REPARAM_OTHER = (UNMEASURED + "; the prompt-tuning value of this "
                 "family (a reparameterised prompt is still one input-level prompt)")


def measured(chosen: float, candidates: str, others: str) -> str:
    """The source of an encoder default the learning benchmark chose (see the module docstring)."""
    return (f"measured: the learning benchmark (MiniLM, 150 AdamW steps, 3 seeds) chose lr {chosen:g} from "
            f"{{{candidates}}} on CB's validation split; {others}")
