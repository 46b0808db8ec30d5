"""The batch decode (engine/backends/vllm/detokenize.py) against vLLM's own incremental
detokenizer, on the default model's tokenizer: the same text for every token sequence,
byte-heavy and malformed UTF-8 included, and vLLM's detokenizer wherever the decoder is not
byte-level."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from engine.backends.vllm.detokenize import (
    REPLACEMENT,
    batch_decoder,
    stream_decode,
    text_tokens,
)


@pytest.fixture(scope="module", params=["byte-level", "transformers-5-sequence"])
def tokenizer(request, default_model_dir):
    """The default model's tokenizer as vLLM loads it, with its decoder as this machine's
    transformers builds it (byte-level) or as transformers 5 does (a sequence around it)."""
    import copy

    from tokenizers import decoders
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(str(default_model_dir))
    if request.param == "transformers-5-sequence":
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer._tokenizer.decoder = decoders.Sequence(
            [
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Replace("▁", " "),
                decoders.ByteLevel(),
            ]
        )
    return tokenizer


def vllm_text(tokenizer, prompt: list[int], ids: list[int], stopped: bool) -> str:
    """The text vLLM's engine gives a completion of `ids`, fed one token a step as it
    generates them (`stopped`: the last one is the stop token)."""
    from vllm import SamplingParams
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    request = SimpleNamespace(
        request_id="r",
        prompt_token_ids=prompt,
        prompt_embeds=None,
        sampling_params=SamplingParams(),
    )
    detokenizer = IncrementalDetokenizer.from_new_request(tokenizer, request)
    for i, token in enumerate(ids):
        detokenizer.update([token], stopped and i == len(ids) - 1)
    return detokenizer.get_next_output_text(finished=True, delta=False)


def sequences(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    """Random sequences, most of their tokens single bytes or pieces of multi-byte characters
    (where text can end inside a character), some special tokens among them."""
    rng = random.Random(seed)
    vocab = tokenizer.get_vocab()
    pieces = [i for p, i in vocab.items() if len(p) == 1 or any(ord(c) > 255 for c in p)]
    special = list(tokenizer.all_special_ids)
    size = len(vocab)

    def token() -> int:
        r = rng.random()
        if r < 0.6:
            return rng.choice(pieces)
        return rng.choice(special) if r < 0.65 else rng.randrange(size)

    return [[token() for _ in range(rng.randint(1, 40))] for _ in range(count)]


def chat_prompt(tokenizer) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say something."}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_batch_decode_gives_vllms_text_for_every_sequence(tokenizer) -> None:
    decode = batch_decoder(tokenizer)
    assert decode is not None  # SmolLM2's decoder is byte-level
    prompt = chat_prompt(tokenizer)
    seqs = sequences(tokenizer, 1500)
    texts = decode(seqs)
    expected = [vllm_text(tokenizer, prompt, ids, stopped=False) for ids in seqs]
    assert texts == expected
    # the token-by-token path was taken, and needed: the batch text differs there
    plain = tokenizer._tokenizer.decode_batch(seqs)
    malformed = [i for i, text in enumerate(plain) if REPLACEMENT in text]
    assert len(malformed) > 50
    assert any(expected[i] != tokenizer._tokenizer.decode(seqs[i]) for i in malformed)


def test_a_text_cut_inside_a_character_ends_before_it(tokenizer) -> None:
    """'é' is two bytes: ids that end after the first one give the text before it, as vLLM
    (which never shows half a character), where a plain decode ends in U+FFFD."""
    backend = tokenizer._tokenizer
    whole = backend.encode("café", add_special_tokens=False).ids
    byte_ids = [backend.token_to_id(piece) for piece in ("Ã", "©")]  # é in byte-level pieces
    assert all(i is not None for i in byte_ids)
    cut = backend.encode("caf", add_special_tokens=False).ids + byte_ids[:1]
    assert backend.decode(cut).endswith(REPLACEMENT)
    assert batch_decoder(tokenizer)([cut]) == ["caf"] == [vllm_text(tokenizer, [1], cut, False)]
    assert stream_decode(backend, whole) == "café"


def test_the_stop_token_is_not_in_the_text(tokenizer) -> None:
    ids = tokenizer("Hello there", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    shown = text_tokens(ids, "stop")
    assert list(shown) == ids[:-1]
    assert text_tokens(ids, "length") == ids
    assert batch_decoder(tokenizer)([shown]) == [vllm_text(tokenizer, [1], ids, stopped=True)]


def test_a_decoder_that_is_not_byte_level_keeps_vllms_detokenizer() -> None:
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE

    backend = Tokenizer(BPE())
    backend.decoder = decoders.Metaspace()  # its first piece's space depends on the prompt
    assert batch_decoder(SimpleNamespace(_tokenizer=backend)) is None
    backend.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    assert batch_decoder(SimpleNamespace(_tokenizer=backend)) is None
    backend.decoder = decoders.Sequence([decoders.Replace("ab", "c"), decoders.ByteLevel()])
    assert batch_decoder(SimpleNamespace(_tokenizer=backend)) is None
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteLevel()])
    assert batch_decoder(SimpleNamespace(_tokenizer=backend)) is not None
    assert batch_decoder(SimpleNamespace()) is None  # a slow tokenizer has no backend
