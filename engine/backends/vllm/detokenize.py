"""Completion text decoded once per generate call, in one batch, instead of token by token.

vLLM detokenizes every sequence as it steps: a `DecodeStream` step per token, in the engine
loop's Python. At 1.07B on an H200, where the whole call is bound by the host, that was
0.13-0.15 s of a 1.5 s low-rank ES step (32,768 tokens); one `decode_batch` of the same
token ids takes about 0.02 s. So the engine asks vLLM for tokens only (`detokenize=False`)
and decodes them here, to the same text:

- For a byte-level BPE decoder (GPT-2's scheme: SmolLM2, Llama 3, Qwen; transformers 5
  wraps it in a sequence with byte fallback, fusing and a one-character replace, all of them
  per character) the text of a token sequence does not depend on the tokens before it, and
  the batch text equals vLLM's incremental text, except where a sequence's bytes are not
  valid UTF-8: vLLM holds back a tail that ends in U+FFFD and may reset its stream on a
  malformed prefix, where the batch decode writes U+FFFD. Texts with a U+FFFD are therefore
  decoded again token by token, as vLLM's fast detokenizer does (tests/unit/test_detokenize.py
  compares both with vLLM's own detokenizer).
- Other decoders (SentencePiece's metaspace strips the first token's leading space, which
  depends on the prompt's last tokens) keep vLLM's detokenizer: `batch_decoder` gives None.
- A sequence that stopped on a stop token is decoded without it, as vLLM does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REPLACEMENT = "\ufffd"
INVALID_PREFIX = "Invalid prefix encountered"
"""The start of tokenizers' error when a stream's prefix decodes to non-monotonic text;
vLLM then starts a new stream at that token, and so does `stream_decode`."""

BatchDecoder = Callable[[Sequence[Sequence[int]]], list[str]]

PER_CHARACTER = {"ByteLevel", "ByteFallback", "Fuse"}
"""Decoders that map each token's characters (or bytes) alone: the text of a sequence is the
text of its pieces, up to the joining of a multi-byte character."""


def batch_decoder(tokenizer: Any) -> BatchDecoder | None:
    """The batch decode of `tokenizer` (vLLM's engine tokenizer), or None where only vLLM's
    incremental detokenizer gives its text (a slow tokenizer, a decoder not per character)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None or not per_character(json.loads(decoder.__getstate__())):
        return None

    def decode(sequences: Sequence[Sequence[int]]) -> list[str]:
        texts = backend.decode_batch([list(s) for s in sequences], skip_special_tokens=True)
        return [
            stream_decode(backend, ids) if REPLACEMENT in text else text
            for text, ids in zip(texts, sequences, strict=True)
        ]

    return decode


def per_character(decoder: Mapping[str, Any]) -> bool:
    """Whether a decoder (its serialized form) decodes every token without the ones before
    it: the per-character kinds, a replace of one character, or a sequence of those."""
    kind = decoder["type"]
    if kind == "Sequence":
        return all(per_character(d) for d in decoder["decoders"])
    if kind == "Replace":
        return len(decoder["pattern"].get("String", "")) == 1
    return kind in PER_CHARACTER


def stream_decode(backend: Any, token_ids: Sequence[int]) -> str:
    """The text vLLM's fast incremental detokenizer builds for `token_ids` (special tokens
    skipped): tokenizers' DecodeStream, restarted on a malformed prefix."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=True)
    pieces = []
    for token in token_ids:
        try:
            piece = stream.step(backend, token)
        except Exception as e:
            if not str(e).startswith(INVALID_PREFIX):
                raise
            stream = DecodeStream(skip_special_tokens=True)
            piece = stream.step(backend, token)
        if piece:
            pieces.append(piece)
    return "".join(pieces)


def text_tokens(token_ids: Sequence[int], finish_reason: str | None) -> Sequence[int]:
    """The tokens whose text a completion shows: without the stop token that ended it (vLLM
    leaves it out of the text, special or not). No stop strings are set, so "stop" always
    means a stop token."""
    return token_ids[:-1] if finish_reason == "stop" and token_ids else token_ids
