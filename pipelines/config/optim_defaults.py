"""The optimiser and learning rate a job gets when its config names none: one table, keyed by method and family.

A job's config is resolved before anything trains (`resolve_optim`): `optim.name` and `optim.lr` left empty
are filled in from `OPTIM_DEFAULTS`, so result.json, the MLflow params and the config hash all hold the
values actually used, never `None`. Each entry says where its values come from. Encoder-only values marked
"measured" are the learning benchmark's (pipelines/configs/bench/learning.yaml, benchmarks/README.md): the lr
chosen on CB's validation split, CB being the one task MiniLM learns in its 150 steps (COPA's and RTE's choices,
at chance, are given for the record). Values marked "not tuned" are placeholders; a sweep that cares should give
`select: {job.optim.lr: [...]}` anyway.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipelines.config.schema import JobConfig

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


_PROMPT_T5 = ("Lester et al. 2021 (prompt tuning on T5): Adafactor at lr 0.3; the CaPT paper trains prompt methods "
              "with Adafactor and takes lr 0.3 from earlier work (SMoP's code)")
_OUTLIER = ("Adafactor's fixed-lr first step moves every element by +-lr, so the T5 value 0.3 makes the capsule an "
            "outlier token on models whose states are ~0.6 per element (MiniLM)")
_UNMEASURED = ("not tuned: the learning benchmark runs one encoder-only model (MiniLM), so this family's value is a "
               "placeholder")
_SMALL_STATES = (_UNMEASURED + ". " + _OUTLIER + "; AdamW at 1e-2 is "
                 "the top of P-Tuning v2's AdamW range on BERT-family encoders (Liu et al. 2022: 5e-3..1e-2)")


def _measured(chosen: float, candidates: str, others: str) -> str:
    """The source of an encoder default the learning benchmark chose (see the module docstring)."""
    return (f"measured: the learning benchmark (MiniLM, 150 AdamW steps, 3 seeds) chose lr {chosen:g} from "
            f"{{{candidates}}} on CB's validation split; {others}")


_PTUNING = ("P-Tuning v2 (Liu et al. 2022) tunes lr in 5e-3..1e-2; the paper presets use 1e-2 with the "
            "CaPT paper's optimiser for prompt methods (Adafactor)")
_LORA = "LoRA (Hu et al. 2021): AdamW, lr 4e-4..5e-4 on RoBERTa GLUE"
_LORA_OTHER = _LORA + "; " + _UNMEASURED
_ADAPTER = "Houlsby et al. 2019 (adapters on BERT GLUE): Adam, lr swept over {3e-5, 3e-4, 3e-3}; 3e-4, the middle"
_ADAPTER_OTHER = _ADAPTER + "; " + _UNMEASURED
_DEPT_T5 = ("DePT (Shi & Lipani 2024), the authors' T5-Base scripts: AdamW (the HF Trainer's), batch 32, soft-prompt lr "
            "searched in {3e-1, 4e-1, 5e-1}; the low-rank matrices train at method.options.embedding_lr (searched in "
            "{1e-4, 5e-4, 1e-3, 5e-3})")
_RESPROMPT_T5 = ("Residual Prompt Tuning (Razdaibiedina et al. 2023), the authors' code: AdamW at lr 0.3 (weight "
                 "decay 1e-5) for the prompt and the MLP on T5")
_REPARAM_OTHER = (_UNMEASURED + "; the prompt-tuning value of this "
                  "family (a reparameterised prompt is still one input-level prompt)")
_SUPERPOS_T5 = ("not tuned: SuperPos-Prompt (Sadraei Javaheri et al. 2024) gives no lr we could confirm; the "
                "prompt-tuning T5 value (Lester et al. 2021: Adafactor at lr 0.3)")
_VFPT_T5 = ("not tuned: VFPT (Zeng et al. 2024) has no text-model runs; the prompt-tuning T5 value (Lester et al. "
            "2021: Adafactor at lr 0.3)")
_SMOP_T5 = ("SMoP (Choi et al. 2023; its code's README command for T5-base SuperGLUE): Adafactor at lr 0.5, "
            "weight decay 1e-5, batch 32, 50 epochs, 6 % linear warm-up")
_EPT_T5 = ("not tuned: EPT's (Lan et al. 2025) learning rates could not be read; DePT's T5-Base values, whose "
           "decomposition EPT builds on: " + _DEPT_T5)
_XPROMPT_T5 = ("XPrompt (Ma et al. 2022) trains its prompt as prompt tuning does (Lester et al. 2021: Adafactor, "
               "lr 0.3) in every stage")

OPTIM_DEFAULTS: dict[tuple[str, str], OptimDefault] = {
    ("capt", "t5"): OptimDefault("adafactor", 0.3, _PROMPT_T5),
    ("capt", "decoder"): OptimDefault("adamw", 1e-2, _SMALL_STATES),
    ("capt", "encoder"): OptimDefault("adamw", 3e-2, _measured(0.03, "0.03, 0.1, 0.3", "COPA and RTE chose 0.3 and "
                                                            "0.1. AdamW rather than T5's Adafactor: " + _OUTLIER)),
    ("prompt_tuning", "t5"): OptimDefault("adafactor", 0.3, _PROMPT_T5),
    ("prompt_tuning", "decoder"): OptimDefault("adamw", 1e-2, _SMALL_STATES),
    ("prompt_tuning", "encoder"): OptimDefault("adamw", 3e-3, _measured(3e-3, "0.003, 0.01, 0.03",
                                                                        "COPA and RTE chose it too")),
    ("ptuning_v2", "t5"): OptimDefault("adafactor", 1e-2, _PTUNING),
    ("ptuning_v2", "decoder"): OptimDefault("adamw", 1e-2, "P-Tuning v2 (Liu et al. 2022): AdamW, lr 5e-3..1e-2; "
                                            "not tuned for decoder-only models"),
    ("ptuning_v2", "encoder"): OptimDefault("adamw", 3e-2, _measured(0.03, "0.003, 0.01, 0.03", "COPA and RTE "
                                            "chose it too; above P-Tuning v2's own 5e-3..1e-2 (Liu et al. 2022) at "
                                            "this short budget")),
    ("lora", "t5"): OptimDefault("adamw", 5e-4, _LORA_OTHER),
    ("lora", "decoder"): OptimDefault("adamw", 5e-4, _LORA_OTHER),
    ("lora", "encoder"): OptimDefault("adamw", 1e-4, _measured(1e-4, "1e-4, 5e-4, 2e-3", "COPA chose it too, RTE "
                                                               "2e-3; " + _LORA)),
    ("full_finetune", "t5"): OptimDefault("adafactor", 1e-3, "T5 (Raffel et al. 2020) fine-tunes with Adafactor "
                                          "at a constant lr 1e-3"),
    ("full_finetune", "decoder"): OptimDefault("adamw", 5e-5, _UNMEASURED + " (the BERT paper's top value, as for "
                                               "encoders)"),
    ("full_finetune", "encoder"): OptimDefault("adamw", 5e-5, _measured(5e-5, "2e-5, 5e-5, 1e-4", "COPA chose 1e-4. "
                                               "BERT (Devlin et al. 2019) fine-tunes with Adam at lr in {5e-5, 3e-5, "
                                               "2e-5}")),
    ("adapter", "t5"): OptimDefault("adamw", 3e-4, _ADAPTER_OTHER),
    ("adapter", "decoder"): OptimDefault("adamw", 3e-4, _ADAPTER_OTHER),
    ("adapter", "encoder"): OptimDefault("adamw", 3e-3, _measured(3e-3, "3e-5, 3e-4, 3e-3", "COPA chose it too "
                                                                  "(tied with 3e-5). " + _ADAPTER)),
    ("dept", "t5"): OptimDefault("adamw", 0.3, _DEPT_T5),
    ("dept", "decoder"): OptimDefault("adamw", 1e-2, _SMALL_STATES + "; the soft prompt's lr, as for prompt tuning"),
    ("dept", "encoder"): OptimDefault("adamw", 3e-3, _measured(3e-3, "0.003, 0.01, 0.03", "COPA chose it too. The "
                                                               "soft prompt's lr (the offset's is "
                                                               "method.options.embedding_lr)")),
    ("residual_prompt", "t5"): OptimDefault("adamw", 0.3, _RESPROMPT_T5),
    ("residual_prompt", "decoder"): OptimDefault("adamw", 1e-2, _REPARAM_OTHER),
    ("residual_prompt", "encoder"): OptimDefault("adamw", 3e-2, _measured(0.03, "0.003, 0.01, 0.03",
                                                                          "COPA chose it too")),
    ("superpos_prompt", "t5"): OptimDefault("adafactor", 0.3, _SUPERPOS_T5),
    ("superpos_prompt", "decoder"): OptimDefault("adamw", 1e-2, _REPARAM_OTHER),
    ("superpos_prompt", "encoder"): OptimDefault("adamw", 1e-2, _measured(0.01, "0.003, 0.01, 0.03",
                                                                          "COPA chose 0.003")),
    ("vfpt", "t5"): OptimDefault("adafactor", 0.3, _VFPT_T5),
    ("vfpt", "decoder"): OptimDefault("adamw", 1e-2, _REPARAM_OTHER),
    ("vfpt", "encoder"): OptimDefault("adamw", 3e-3, _measured(3e-3, "0.003, 0.01, 0.03", "COPA chose it too")),
    ("smop", "t5"): OptimDefault("adafactor", 0.5, _SMOP_T5),
    ("smop", "decoder"): OptimDefault("adamw", 1e-2, _SMALL_STATES),
    ("smop", "encoder"): OptimDefault("adamw", 3e-2, _measured(0.03, "0.003, 0.01, 0.03", "COPA chose 0.003")),
    ("ept", "t5"): OptimDefault("adamw", 0.3, _EPT_T5),
    ("ept", "decoder"): OptimDefault("adamw", 1e-2, _SMALL_STATES + "; the soft prompt's lr, as for DePT"),
    ("ept", "encoder"): OptimDefault("adamw", 3e-2, _measured(0.03, "0.003, 0.01, 0.03", "COPA chose it too. The "
                                                              "soft prompt's lr, as for DePT")),
    ("xprompt", "t5"): OptimDefault("adafactor", 0.3, _XPROMPT_T5),
    ("xprompt", "decoder"): OptimDefault("adamw", 1e-2, "XPrompt reports T5 only; " + _SMALL_STATES),
    ("xprompt", "encoder"): OptimDefault("adamw", 3e-2, _measured(0.03, "0.003, 0.01, 0.03", "COPA chose it too. "
                                                                  "XPrompt reports T5 only")),
}


def optim_default(method: str, family: str) -> OptimDefault:
    """The table entry of (`method`, `family`); ValueError naming both when there is none."""
    try:
        return OPTIM_DEFAULTS[(method, family)]
    except KeyError:
        known = ", ".join(sorted({m for m, _ in OPTIM_DEFAULTS}))
        raise ValueError(f"No default optimiser for method {method!r} on model family {family!r} (methods: {known}; "
                         f"families: {', '.join(FAMILIES)}); set optim.name and optim.lr.") from None


def model_family(model_name: str) -> str:
    """The family of base model `model_name`, read from its config alone (no weights loaded)."""
    from pipelines.models.shape import model_shape

    return model_shape(model_name).family


def resolve_optim(config: JobConfig) -> JobConfig:
    """`config` with `optim.name` and `optim.lr` filled in from the table when empty (unchanged otherwise).

    ValueError when only `optim.name` is given and it is not the table's optimiser (its lr would not fit).
    """
    optim = config.optim
    if optim.name is not None and optim.lr is not None:
        return config
    family = model_family(config.model.name)
    default = optim_default(config.method.name, family)
    if optim.lr is None and optim.name not in (None, default.optimizer):
        raise ValueError(f"optim.name={optim.name!r} with optim.lr unset: the default lr of method "
                         f"{config.method.name!r} on model.name={config.model.name!r} (family {family!r}) is "
                         f"{default.lr:g} for {default.optimizer}, not for {optim.name}; set optim.lr too")
    resolved = dataclasses.replace(optim, name=optim.name or default.optimizer, lr=optim.lr or default.lr)
    return dataclasses.replace(config, optim=resolved)
