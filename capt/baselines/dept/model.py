"""DePT, decomposed prompt tuning: Shi and Lipani, "DePT: Decomposed Prompt Tuning for Parameter-Efficient
Fine-tuning", ICLR 2024 (arXiv 2309.05173).

Equations: the input token embeddings E (n x d) of an input become E' = E + (alpha / sqrt(r)) (A B)[:n], with
A (s x r) and B (r x d), s the maximum input length; then a soft prompt P (m x d) is inserted exactly as in
prompt tuning (`PromptTuningModel`: prepended for T5 and decoder-only models, after [CLS] for BERT). P trains at the
job's learning rate, A and B at a second one (`embedding_lr`), through `parameter_groups`. Trainable parameters:
m d + s r + r d.

T5-Base sizes (the paper keeps prompt tuning's 100-token budget, 76,800 parameters, at s = 256): m = 60, r = 30
(60 x 768 + 30 x (256 + 768) = 76,800). A Kaiming-uniform, B zero (training starts at plain prompt tuning), alpha 8.
``init: text`` is the authors' prompt init: the token ids of ``init_text`` (special tokens included, as the
tokenizer returns them) repeated until there are m and cut to m, P = the embedding rows of those ids. Settings and
their sources (m, r, s, alpha, the inits, both lrs, optimiser, schedule, warm-up): README.md, "Baseline settings
and their sources", rows "dept".

Choices where the paper is silent:
- Inputs longer than s: positions from s on get no offset (the paper truncates inputs to s).
- The offset is per input position, counted over the input tokens (the soft prompt does not shift it); BERT's
  [CLS] is position 0. Decoder-only models: every token of the sequence is an input token, the answer tokens of
  teacher forcing and the tokens `generate` appends included, so decoding with the KV cache gives each new token
  the offset of its position (a hook on the input embedding while generating) and equals uncached greedy decoding.
- With `instance_token` the instance mean reads the offset embeddings.

Families: those of prompt tuning (T5 encoder inputs, decoder-only LMs, BERT encoders).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from capt.baselines.dept.config import DeptConfig
from capt.baselines.prompt import PromptTuningModel
from capt.errors import MethodError

logger = logging.getLogger(__name__)


def _tokenise(base: nn.Module, text: str) -> list[int]:
    """Token ids of `text` under the tokenizer of `base`'s checkpoint; MethodError when it has none to load."""
    from transformers import AutoTokenizer

    name = getattr(base.config, "name_or_path", "")
    try:
        ids = AutoTokenizer.from_pretrained(name)(text)["input_ids"]
    except (OSError, ValueError) as error:
        raise MethodError(f"DeptConfig init='text' needs the tokenizer of the base model, and {name!r} has none to "
                          f"load ({type(error).__name__}); give init_text_ids (the ids of {text!r}) or "
                          "init='normal'.") from error
    if not ids:
        raise MethodError(f"DeptConfig init_text={text!r} has no tokens under the tokenizer of {name!r}.")
    return list(ids)


class DeptModel(PromptTuningModel):
    """A soft prompt of ``num_tokens`` plus the low-rank offset A B of the first ``max_length`` input embeddings."""

    def __init__(self, base: nn.Module, config: DeptConfig) -> None:
        super().__init__(base, config)
        device = self.embed.weight.device
        self.embedding_a = nn.Parameter(torch.empty(config.max_length, config.rank, device=device))
        nn.init.kaiming_uniform_(self.embedding_a, a=math.sqrt(5))
        self.embedding_b = nn.Parameter(torch.zeros(config.rank, self.info.hidden_size, device=device))
        self.scaling = config.alpha / math.sqrt(config.rank)
        self._next_position: int | None = None
        """Position of the next token the input embedding embeds while `generate` runs (None otherwise)."""
        logger.info("DePT on %s: %d prompt tokens, rank %d offsets of %d positions", self.info.model_type,
                    config.num_tokens, config.rank, config.max_length)

    def _initial_prompt(self, config: DeptConfig) -> torch.Tensor:
        if config.init != "text":
            return super()._initial_prompt(config)
        ids = list(config.init_text_ids or _tokenise(self.base, config.init_text))
        repeated = (ids * math.ceil(config.num_tokens / len(ids)))[: config.num_tokens]
        weight = self.embed.weight
        return weight.detach()[torch.tensor(repeated, device=weight.device)].clone().float()

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """The soft prompt (m, d) and the offset factors A (s, r) and B (r, d)."""
        return {"prompt": self.prompt, "embedding_a": self.embedding_a, "embedding_b": self.embedding_b}

    def parameter_groups(self) -> list[tuple[list[nn.Parameter], float | None]]:
        """The soft prompt at the job's learning rate, A and B at ``embedding_lr``."""
        return [([self.prompt], None), ([self.embedding_a, self.embedding_b], self.adapter_config.embedding_lr)]

    def offsets(self, start: int, count: int) -> torch.Tensor:
        """(count, d) offsets of input positions [start, start + count); zero from ``max_length`` on."""
        rows = self.embedding_a[start:start + count] @ self.embedding_b * self.scaling
        missing = count - rows.shape[0]
        return torch.cat([rows, rows.new_zeros(missing, rows.shape[1])]) if missing else rows

    def extend_inputs(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                      inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                      prompt_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Offset input embeddings, then prompt tuning's insertion of the soft prompt."""
        hook_offsets = inputs_embeds is None and self._next_position is not None  # generating: the hook adds them
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        if not hook_offsets:
            embeds = embeds + self.offsets(0, embeds.shape[1]).to(embeds.dtype)
        return super().extend_inputs(None, attention_mask, embeds, labels, prompt_mask)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 **kwargs: Any) -> Any:
        """Prompt tuning's ``generate``; decoder-only models offset each new token by its position."""
        if not self.spec.generation_echoes_prompt:  # T5: the offsets live in the encoder inputs only
            return super().generate(input_ids, attention_mask, **kwargs)
        self._next_position = 0
        handle = self.embed.register_forward_hook(self._offset_embedded_tokens)
        try:
            return super().generate(input_ids, attention_mask, **kwargs)
        finally:
            handle.remove()
            self._next_position = None

    def _offset_embedded_tokens(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        count = output.shape[1]
        shifted = output + self.offsets(self._next_position, count).to(output.dtype)
        self._next_position += count
        return shifted
