"""Word-level tokenizer for the tiny preset, trained on the environments' own text.

Words keep their leading space as a `▁` marker (Metaspace), punctuation and every digit are
separate tokens and newlines are tokens of their own, so `decode(encode(text))` gives the text back
(up to unknown words) and answers such as `\\boxed{12}` tokenize as `\\ boxed { 1 2 }`.
Every encoding starts with <bos>; generation ends at <eos>; <pad> pads batches.

`encode_prompt` is the one place a prompt string becomes token ids, shared by both backends and
bootstrap training: tokenizers with a chat template (instruct models such as SmolLM2) get the
prompt as one user turn, others get the raw text.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
# Always in the vocabulary, whatever the corpus: answer pieces and digits.
ALWAYS_TOKENS = [*"0123456789", "\\", "boxed", "{", "}", "-", "+", "▁", "\n", "▁-", "▁+"]


def train_word_tokenizer(texts: Iterable[str], *, min_frequency: int = 2, vocab_size: int = 4096) -> Any:
    """A `PreTrainedTokenizerFast` whose vocabulary is the frequent words of `texts`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
            pre_tokenizers.Punctuation(behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    trainer = trainers.WordLevelTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS
    )
    # ALWAYS_TOKENS ride along as ordinary words (special ones would vanish from decoded text).
    always = " ".join(ALWAYS_TOKENS) + " " + "".join(ALWAYS_TOKENS)
    tok.train_from_iterator(itertools.chain(texts, [always] * min_frequency), trainer=trainer)
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id), (EOS, eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(folder: str | Path) -> Any:
    """The tokenizer saved in a model folder, with a pad token and left padding guaranteed."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids the model is conditioned on for `prompt` (chat template when the tokenizer has one)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(prompt)["input_ids"])


def encode_response(tokenizer: Any, response: str) -> list[int]:
    """Token ids of a response as the model should produce them, ending with <eos>."""
    return list(tokenizer(response, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
