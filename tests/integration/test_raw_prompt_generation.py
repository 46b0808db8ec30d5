"""A raw text prompt on the real default model: it reaches vLLM exactly as vLLM's own text
prompt path (the references' `llm.generate(texts)`) tokenizes it, without the chat template."""

from __future__ import annotations

import math

import pytest

from tests.unit.test_raw_prompts import COUNTDOWN

pytestmark = pytest.mark.heavy


def test_a_raw_prompt_generates_as_vllms_own_text_path(vllm_engine):
    from vllm import SamplingParams

    engine = vllm_engine
    ids = engine.prompt_token_ids(COUNTDOWN)
    assert ids == engine.tokenizer(COUNTDOWN)["input_ids"]
    chat_ids = engine.prompt_token_ids([{"role": "user", "content": COUNTDOWN}])
    assert len(chat_ids) > len(ids)  # the template adds its role markers; raw text does not

    (ours,) = engine.generate([COUNTDOWN], n=1, temperature=0.0, max_tokens=24)[0]
    params = SamplingParams(n=1, temperature=0.0, max_tokens=24)
    (direct,) = engine.llm.generate([COUNTDOWN], params, use_tqdm=False)
    assert list(direct.prompt_token_ids) == ids
    assert ours.text == direct.outputs[0].text
    assert ours.token_ids == tuple(direct.outputs[0].token_ids)

    # The likelihood of LBES sees the same prompt tokens.
    (logprob,) = engine.completion_logprobs([COUNTDOWN], [ours.token_ids])
    assert math.isfinite(logprob) and logprob < 0
