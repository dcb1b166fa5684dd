"""The tokenizer stored in a GGUF file, rebuilt with the `tokenizers` library.

GGUF files of the GPT-2 tokenizer family (``tokenizer.ggml.model = "gpt2"``) store a
byte-level BPE tokenizer: the vocabulary (``tokenizer.ggml.tokens``, strings in GPT-2's
byte-to-unicode alphabet, e.g. "Ġ" for a space), the merges in priority order
(``tokenizer.ggml.merges``, "left right"), the type of each token (``token_type``: 3 =
control, e.g. "<|im_start|>") and the name of the pre-tokenizer (``tokenizer.ggml.pre``).
The pre-tokenizers llama.cpp gives these names are rebuilt here:

* "smollm", "starcoder", "refact": every digit a word of its own, then GPT-2's regex split;
* "gpt2", "default": GPT-2's regex split.

Control tokens are special: they match only as whole strings and are kept by `decode`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnflow._checks import fail

__all__ = ["CONTROL", "PRE_TOKENIZERS", "bpe_tokenizer"]

CONTROL = 3  # llama.cpp's token type of control tokens
PRE_TOKENIZERS: dict[str, bool] = {  # name -> digits split one by one before GPT-2's regex
    "smollm": True, "starcoder": True, "refact": True, "gpt2": False, "default": False,
}


def bpe_tokenizer(tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int],
                  model: str, pre: str, source: str) -> Any:
    """A `tokenizers.Tokenizer` from a GGUF file's tokenizer fields (module docstring).

    tokens : the vocabulary, token id = index. merges : "left right" strings, first = most
    frequent. token_types : one per token (3 = control). model, pre : the values of
    ``tokenizer.ggml.model`` and ``tokenizer.ggml.pre``. source : the file, for errors.
    """
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError as err:
        raise fail("tokenizer", "the `tokenizers` package installed (pip install "
                   "'attnflow[pretrained]')", "none") from err
    if model != "gpt2":
        raise fail("tokenizer", f"a byte-level BPE tokenizer (tokenizer.ggml.model 'gpt2') in "
                   f"{source}", f"not supported: {model!r}")
    if pre not in PRE_TOKENIZERS:
        raise fail("tokenizer", f"a pre-tokenizer among {sorted(PRE_TOKENIZERS)} in {source}",
                   f"not supported: {pre!r}")
    if len(token_types) != len(tokens):
        raise fail("tokenizer", f"one token type per token in {source}",
                   f"{len(token_types)} types for {len(tokens)} tokens")
    pairs = [tuple(m.split(" ")) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise fail("tokenizer", f"merges of the form 'left right' in {source}",
                   repr(next(m for m, p in zip(merges, pairs) if len(p) != 2)))
    vocab = {token: i for i, token in enumerate(tokens)}
    try:
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    except Exception as err:  # noqa: BLE001 - the library's own refusal (e.g. unknown merge)
        raise fail("tokenizer", f"a consistent vocabulary and merges in {source}",
                   f"{type(err).__name__}: {err}") from err
    split = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if PRE_TOKENIZERS[pre]:
        split.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(split)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(token_types) if kind == CONTROL])
    return tokenizer
