"""Tiny models of every supported family, built from `*Config` objects (never downloaded)."""

from __future__ import annotations

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

VOCAB = 64
PAD, EOS, BOS = 0, 1, 2


def tiny_t5(seed: int = 0, layers: int = 2) -> T5ForConditionalGeneration:
    torch.manual_seed(seed)
    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=layers, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.0, initializer_factor=10.0, decoder_start_token_id=PAD, pad_token_id=PAD, eos_token_id=EOS)
    return T5ForConditionalGeneration(config).eval()


def tiny_llama(seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
    return LlamaForCausalLM(config).eval()


def tiny_qwen2(seed: int = 0, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
    return Qwen2ForCausalLM(config).eval()


def tiny_bert(seed: int = 0, layers: int = 2) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128, num_labels=3, pad_token_id=PAD,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config).eval()


BUILDERS = {"t5": tiny_t5, "llama": tiny_llama, "qwen2": tiny_qwen2, "bert": tiny_bert}


def random_batch(kind: str, batch: int = 3, length: int = 7, seed: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded inputs with labels suited to `kind` (row i has length - i real tokens)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        cut = length - row
        mask[row, cut:] = 0
        ids[row, cut:] = PAD
    inputs = {"input_ids": ids, "attention_mask": mask}
    if kind == "t5":
        inputs["labels"] = torch.randint(3, VOCAB, (batch, 3), generator=generator)
    elif kind == "bert":
        inputs["labels"] = torch.randint(0, 3, (batch,), generator=generator)
    else:
        labels = ids.clone()
        labels[:, : length // 2] = -100  # prompt
        labels[mask == 0] = -100
        inputs["labels"] = labels
    return inputs

