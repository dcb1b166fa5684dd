"""The SentencePiece tokenizer stored in a GGUF file (``tokenizer.ggml.model = "llama"``), as
llama.cpp runs it (e.g. Gemma 3).

The file stores the vocabulary (``tokenizer.ggml.tokens``, "▁" for a space), one score per
token (``tokenizer.ggml.scores``) and the token types (1 normal, 3 control, 4 user-defined,
6 byte "<0xNN>"). Encoding, as llama.cpp's ``llm_tokenizer_spm``:

1. control and user-defined tokens are cut out of the text as whole strings (longest first);
2. in each remaining piece spaces become "▁" (and "▁" is prepended when the file's
   ``add_space_prefix`` asks for it); the piece is split into characters, and the adjacent
   pair whose concatenation is a token of the highest score is merged, again and again
   (ties: the leftmost pair);
3. a character that is not a token is written as its UTF-8 bytes, one byte token each.

Decoding writes byte tokens as bytes, every other token as its text with "▁" back to a space.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass

from attnflow._checks import fail

__all__ = ["SentencePiece"]

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6  # llama.cpp's token types
SPACE = "\u2581"  # "▁"


@dataclass(frozen=True)
class Encoding:
    """The token ids of one text (the `.ids` of a `tokenizers` Encoding)."""

    ids: list[int]


class SentencePiece:
    """A SentencePiece (BPE by scores, byte fallback) tokenizer from a GGUF file's fields.

    tokens : the vocabulary, token id = index. scores : one per token (merge priority, higher
    first). token_types : one per token (module docstring). add_space_prefix : prepend "▁" to
    each piece of text. source : the file, for errors.
    """

    def __init__(self, tokens: Sequence[str], scores: Sequence[float],
                 token_types: Sequence[int], add_space_prefix: bool, source: str) -> None:
        if not len(tokens) == len(scores) == len(token_types):
            raise fail("tokenizer", f"one score and one type per token in {source}",
                       f"{len(scores)} scores and {len(token_types)} types for "
                       f"{len(tokens)} tokens")
        self._tokens = list(tokens)
        self._types = list(token_types)
        self._scores = [float(s) for s in scores]
        self._ids = {t: i for i, t in enumerate(self._tokens)
                     if self._types[i] not in (CONTROL, USER_DEFINED, BYTE)}
        self._bytes = {}
        for i, (t, kind) in enumerate(zip(self._tokens, self._types)):
            if kind == BYTE:
                match = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", t)
                if match is None:
                    raise fail("tokenizer", f"byte tokens of the form <0xNN> in {source}",
                               repr(t))
                self._bytes[int(match.group(1), 16)] = i
        if len(self._bytes) != 256:
            raise fail("tokenizer", f"256 byte tokens (byte fallback) in {source}",
                       f"{len(self._bytes)}")
        special = sorted((t for t, kind in zip(self._tokens, self._types)
                          if kind in (CONTROL, USER_DEFINED) and t), key=len, reverse=True)
        self._special = {t: i for i, t in enumerate(self._tokens)
                         if self._types[i] in (CONTROL, USER_DEFINED)}
        self._cut = re.compile("|".join(map(re.escape, special))) if special else None
        self._prefix = bool(add_space_prefix)

    def encode(self, text: str) -> Encoding:
        """The token ids of `text` (module docstring)."""
        ids: list[int] = []
        start = 0
        for match in (self._cut.finditer(text) if self._cut else ()):
            ids += self._piece(text[start:match.start()])
            ids.append(self._special[match.group()])
            start = match.end()
        return Encoding(ids + self._piece(text[start:]))

    def _piece(self, text: str) -> list[int]:
        if not text:
            return []
        text = (SPACE if self._prefix else "") + text.replace(" ", SPACE)
        symbols = list(text)  # merged symbols; "" once merged into the left neighbour
        left = list(range(-1, len(symbols) - 1))
        right = list(range(1, len(symbols) + 1))
        heap: list[tuple[float, int, str]] = []

        def push(a: int, b: int) -> None:
            if a >= 0 and b < len(symbols):
                pair = symbols[a] + symbols[b]
                if pair in self._ids:
                    heapq.heappush(heap, (-self._scores[self._ids[pair]], a, pair))

        for a in range(len(symbols) - 1):
            push(a, a + 1)
        while heap:
            _, a, pair = heapq.heappop(heap)
            b = right[a]
            if b >= len(symbols) or not symbols[a] or symbols[a] + symbols[b] != pair:
                continue  # stale: one side has changed since the pair was pushed
            symbols[a], symbols[b] = pair, ""
            right[a] = right[b]
            if right[b] < len(symbols):
                left[right[b]] = a
            push(left[a], a)
            push(a, right[a])
        ids: list[int] = []
        for s in symbols:
            if s in self._ids:
                ids.append(self._ids[s])
            elif s:
                ids += [self._bytes[byte] for byte in s.encode("utf-8")]
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of token ids; control tokens are kept unless skip_special_tokens."""
        out = bytearray()
        byte_of = {i: b for b, i in self._bytes.items()}
        for i in token_ids:
            if i in byte_of:
                out.append(byte_of[i])
            elif not (skip_special_tokens and self._types[i] == CONTROL):
                out += self._tokens[i].replace(SPACE, " ").encode("utf-8")
        return out.decode("utf-8", errors="replace")
