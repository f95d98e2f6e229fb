"""Prompt tuning: a trainable soft prompt at the input embeddings (optionally plus one instance token).

Written here rather than with PEFT's prompt tuning, decided by testing PEFT 0.21.2 with transformers 5.24:
on a tiny Llama, PEFT's cached greedy ``generate`` diverged from step-by-step greedy decoding through its
own forward from the first new token; its decoder-only logits include the virtual positions (they do not
align with ``input_ids``); it ignores ``position_ids``; and it has no training-free instance token. The
implementation below is small, and its generation is tested equal to uncached greedy decoding.

Layout of the virtual tokens V = [instance token (optional), soft prompt (num_tokens)]:
- T5: prepended to the encoder input; the decoder and its outputs are unchanged.
- decoder-only: prepended to the sequence; logits (and hidden states) are returned without the virtual
  positions so they align with ``input_ids``; labels are padded with -100 and the first real label is not
  predicted from the prompt, so the loss is the base model's loss definition on the aligned logits.
- BERT family: inserted after the first token ([CLS]) so the pooler still reads [CLS].

The instance token is the masked mean of the input token embeddings (no parameters). Its mask is, in order
of precedence: an explicit ``prompt_mask`` keyword, else for decoder-only models the positions whose label
is -100 (never the answer tokens, which would leak the label under teacher forcing), else the attention mask.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from capt.baselines.adapted import AdaptedModel
from capt.baselines.config import PromptTuningConfig
from capt.capsule import masked_mean
from capt.errors import MethodError

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


class PromptTuningModel(AdaptedModel):
    """Soft prompt of ``num_tokens`` vectors at the input embeddings; base model frozen."""

    def __init__(self, base: nn.Module, config: PromptTuningConfig) -> None:
        super().__init__(base, config)
        self.freeze_base()
        self.embed = base.get_input_embeddings()
        self._build_prompt(config)
        self.num_virtual = config.sequence_overhead()
        self.insert_at = self.spec.slot_offset  # BERT: after [CLS], so the pooler still reads [CLS]
        logger.info("prompt tuning on %s: %d virtual tokens (instance token: %s)",
                    self.info.model_type, self.num_virtual, config.instance_token)

    def train(self, mode: bool = True) -> PromptTuningModel:
        """Set training mode; a method whose config has ``base_dropout: false`` (SuperPos-Prompt, VFPT) keeps the
        frozen base model in eval mode, without dropout, as its authors train it."""
        super().train(mode)
        if not getattr(self.adapter_config, "base_dropout", True):
            self.base.eval()
        return self

    def _build_prompt(self, config: PromptTuningConfig) -> None:
        """Create the parameters that produce the soft prompt (here the prompt itself; subclasses reparameterise)."""
        self.prompt = nn.Parameter(self._initial_prompt(config))

    def current_prompt(self) -> torch.Tensor:
        """The (num_tokens, d) soft prompt the virtual tokens carry (subclasses compute it from their parameters)."""
        return self.prompt

    def _initial_prompt(self, config: PromptTuningConfig) -> torch.Tensor:
        weight = self.embed.weight
        if config.init == "vocab":
            ids = torch.randint(0, weight.shape[0], (config.num_tokens,))
            return weight.detach()[ids.to(weight.device)].clone().float()
        return torch.randn(config.num_tokens, weight.shape[1], device=weight.device) * config.init_std

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """The soft prompt, (num_tokens, d)."""
        return {"prompt": self.prompt}

    def row_prompts(self, embeds: torch.Tensor, instance_mask: torch.Tensor) -> torch.Tensor:
        """(B, num_tokens, d): each row's soft prompt; `current_prompt` for every row unless a method picks one
        per input (SMoP) from the row's input embeddings and the mask the instance token averages over."""
        return self.current_prompt().to(embeds.dtype).unsqueeze(0).expand(embeds.shape[0], -1, -1)

    def _virtual_tokens(self, embeds: torch.Tensor, instance_mask: torch.Tensor) -> torch.Tensor:
        """(B, V, d) virtual-token embeddings for a batch of input embeddings."""
        prompt = self.row_prompts(embeds, instance_mask)
        if not self.adapter_config.instance_token:
            return prompt
        return torch.cat([masked_mean(embeds, instance_mask).to(embeds.dtype).unsqueeze(1), prompt], dim=1)

    def _instance_mask(self, mask: torch.Tensor, labels: torch.Tensor | None,
                       prompt_mask: torch.Tensor | None) -> torch.Tensor:
        if prompt_mask is not None:
            return mask * prompt_mask.to(mask.dtype)
        if self.spec.mean_over_prompt and labels is not None:  # answers would leak under teacher forcing
            return mask * (labels == IGNORE_INDEX).to(mask.dtype)
        return mask

    def _insert(self, tensor: torch.Tensor, virtual: torch.Tensor) -> torch.Tensor:
        """Insert ``virtual`` along dim 1 of ``tensor`` at ``self.insert_at``."""
        at = self.insert_at
        return torch.cat([tensor[:, :at], virtual, tensor[:, at:]], dim=1)

    def extend_inputs(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                      inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                      prompt_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Input embeddings and attention mask with the virtual tokens inserted."""
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = embeds.shape[:2]
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.long, device=embeds.device)
        virtual = self._virtual_tokens(embeds, self._instance_mask(attention_mask, labels, prompt_mask))
        ones = attention_mask.new_ones(batch, self.num_virtual)
        return self._insert(embeds, virtual), self._insert(attention_mask, ones)

    def _extend_side_inputs(self, kwargs: dict[str, Any], batch: int, device: torch.device) -> None:
        """Pad per-token inputs (token_type_ids, position_ids, labels of decoder-only) for the virtual tokens."""
        count = self.num_virtual
        if kwargs.get("token_type_ids") is not None:
            tt = kwargs["token_type_ids"]
            kwargs["token_type_ids"] = self._insert(tt, tt.new_zeros(batch, count))
        if kwargs.get("position_ids") is not None:
            pos = kwargs["position_ids"]
            virtual = torch.arange(count, device=device).expand(pos.shape[0], -1).to(pos.dtype)
            kwargs["position_ids"] = self._insert(pos + count, virtual)
        if self.spec.shifts_labels and kwargs.get("labels") is not None:  # labels aligned with the sequence
            labels = kwargs["labels"].clone()
            labels[:, 0] = IGNORE_INDEX
            kwargs["labels"] = torch.cat([labels.new_full((batch, count), IGNORE_INDEX), labels], dim=1)

    def forward(self, **kwargs: Any) -> Any:
        """Base-model forward with the virtual tokens; decoder-only outputs are realigned to ``input_ids``."""
        if self.spec.shifts_labels and kwargs.get("cache", kwargs.get("past_key_values")) is not None:
            raise MethodError("prompt tuning forward does not continue a cache; use generate() for decoding")
        prompt_mask = kwargs.pop("prompt_mask", None)
        if kwargs.get("encoder_outputs") is not None:  # T5 with precomputed (already prompted) encoder states
            kwargs["attention_mask"] = self._encoder_mask(kwargs["encoder_outputs"], kwargs.get("attention_mask"))
            return self.base(**kwargs)
        embeds, mask = self.extend_inputs(kwargs.pop("input_ids", None), kwargs.pop("attention_mask", None),
                                          kwargs.pop("inputs_embeds", None), kwargs.get("labels"), prompt_mask)
        self._extend_side_inputs(kwargs, embeds.shape[0], embeds.device)
        output = self.base(inputs_embeds=embeds, attention_mask=mask, **kwargs)
        if self.spec.shifts_labels:  # the logits cover the input sequence: realign them with input_ids
            self._strip_virtual(output)
        return output

    def _encoder_mask(self, encoder_outputs: Any, mask: torch.Tensor | None) -> torch.Tensor | None:
        """Encoder mask for ``encoder_outputs`` computed on prompted inputs (they hold the V virtual positions).

        A mask of the real tokens (length n) gains the virtual positions; one already of length n + V is kept.
        """
        if mask is None:
            return None
        states = encoder_outputs[0]
        if mask.shape[1] == states.shape[1]:
            return mask
        if mask.shape[1] + self.num_virtual != states.shape[1]:
            raise MethodError(
                f"attention_mask has {mask.shape[1]} positions but encoder_outputs has {states.shape[1]}: pass "
                f"the mask of the input tokens ({states.shape[1] - self.num_virtual} positions) or one that already "
                f"covers the {self.num_virtual} virtual tokens ({states.shape[1]} positions).")
        return self._insert(mask, mask.new_ones(mask.shape[0], self.num_virtual))

    def _strip_virtual(self, output: Any) -> None:
        """Drop the virtual positions from decoder-only logits and hidden states, in place."""
        count = self.num_virtual
        if getattr(output, "logits", None) is not None:
            output.logits = output.logits[:, count:]
        if getattr(output, "hidden_states", None) is not None:
            output.hidden_states = tuple(h[:, count:] for h in output.hidden_states)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 **kwargs: Any) -> Any:
        """``base.generate`` on the prompted embeddings; decoder-only returns prompt + new tokens.

        T5 also accepts ``encoder_outputs`` computed on the prompted inputs (e.g. ``base.get_encoder()`` on
        ``extend_inputs(...)``) instead of ``input_ids``, with the attention mask of the input tokens.
        """
        self._require_generate()
        prompt_mask = kwargs.pop("prompt_mask", None)
        if kwargs.get("encoder_outputs") is not None:
            return self._generate_from_encoder_outputs(attention_mask, kwargs)
        if input_ids is None:
            raise MethodError("prompt tuning generate needs input_ids (or, for T5, encoder_outputs).")
        embeds, mask = self.extend_inputs(input_ids, attention_mask, prompt_mask=prompt_mask)
        if self.spec.generation_echoes_prompt and kwargs.get("max_length") is not None:
            kwargs["max_new_tokens"] = kwargs.pop("max_length") - input_ids.shape[1]
        output = self.base.generate(inputs_embeds=embeds, attention_mask=mask, **kwargs)
        if not self.spec.generation_echoes_prompt:
            return output
        return _prepend_prompt(output, input_ids)

    def _generate_from_encoder_outputs(self, attention_mask: torch.Tensor | None, kwargs: dict[str, Any]) -> Any:
        if not self.spec.encoder_decoder:
            raise MethodError(f"encoder_outputs is for encoder-decoder models; this {self.info.model_type} model "
                             "is decoder-only: pass input_ids.")
        encoder_outputs = kwargs.pop("encoder_outputs")
        if not isinstance(encoder_outputs, BaseModelOutput):  # generate reads .last_hidden_state and expands it
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
        mask = self._encoder_mask(encoder_outputs, attention_mask)
        return self.base.generate(encoder_outputs=encoder_outputs, attention_mask=mask, **kwargs)


def _prepend_prompt(output: Any, input_ids: torch.Tensor) -> Any:
    """Decoder-only ``generate`` on embeddings returns only new tokens: put the prompt ids in front."""
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    prompt = input_ids.repeat_interleave(sequences.shape[0] // input_ids.shape[0], dim=0)
    full = torch.cat([prompt.to(sequences.device), sequences], dim=1)
    if isinstance(output, torch.Tensor):
        return full
    output.sequences = full
    return output
