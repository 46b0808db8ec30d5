"""The scorer speaks the reference's protocol (jbejjani2022/es-fine-tuning-paper,
`alignment/scorer_service.py` and the client `call_scorer_api` of
`alignment/es-fine-tuning_alignment_accl_api.py`): the request bodies that client sends, to
the real service on 127.0.0.1, get the answers it reads, scored on the reference's
conversation text at 512 tokens (requests and texts stated below as literals); and any
Hugging Face sequence-classification folder, a decoder without a padding token included,
serves as reward or cost model."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from scorer.conversation import conversation_text
from scorer.models import ScoringModel, ScoringModelError
from tests.integration.scorers import running_scorer, tiny_checkpoint

PROMPTS = ["how do i make a cake", "how do i make a bomb", "can you help", "the water"]
RESPONSES = [" the cake is safe", " sorry", " i can help", " water is water " * 300]


# The texts the reference's service scores for these pairs (and for their conversations sent
# whole): the conversation framing, the response as written, then the end-of-sequence token,
# "</s>" for a tokenizer without one (as these BERT tokenizers). The reference's `build_text`
# (alignment/scorer_service.py, commit 84c16db0) returns these strings for these pairs.
EXPECTED_TEXTS = [
    "BEGINNING OF CONVERSATION: USER: how do i make a cake ASSISTANT: the cake is safe</s>",
    "BEGINNING OF CONVERSATION: USER: how do i make a bomb ASSISTANT: sorry</s>",
    "BEGINNING OF CONVERSATION: USER: can you help ASSISTANT: i can help</s>",
    "BEGINNING OF CONVERSATION: USER: the water ASSISTANT:" + " water is water " * 300 + "</s>",
]
# What the reference's client (`call_scorer_api`, alignment/es-fine-tuning_alignment_accl_api.py)
# posts to /score_batch for `conversations(PROMPTS, RESPONSES)` at batch size 3: per text, the
# user's words (between USER: and ASSISTANT:, without the spaces around them) and the response
# (everything after ASSISTANT:, its leading space kept), in chunks of 3; it reads the answer's
# "rewards" and "costs" lists, one float per pair, in order.
CLIENT_REQUESTS = [
    {
        "prompts": ["how do i make a cake", "how do i make a bomb", "can you help"],
        "responses": [" the cake is safe", " sorry", " i can help"],
    },
    {"prompts": ["the water"], "responses": [" water is water " * 300]},
]


def scores_of_texts(folder, texts, max_length: int = 512) -> list[float]:
    """Each text scored alone, truncated at `max_length` tokens, by a sequence-classification
    head (one label: the logit; two: the log-odds of label 1), standing in for the
    reference's `end_scores`."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            inputs = tokenizer(text, return_tensors="pt", max_length=max_length, truncation=True)
            logits = model(**inputs).logits[0].float()
            out.append(float(logits[0] if logits.numel() == 1 else logits[1] - logits[0]))
    return out


def conversations(prompts, responses) -> list[str]:
    return [
        f"BEGINNING OF CONVERSATION: USER: {p} ASSISTANT:{r}"
        for p, r in zip(prompts, responses, strict=True)
    ]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    return (
        tiny_checkpoint(root / "reward", num_labels=1, seed=0, initializer_range=1.0),
        tiny_checkpoint(root / "cost", num_labels=2, seed=1, initializer_range=1.0),
    )


def post(url: str, path: str, body: dict) -> dict:
    response = httpx.post(url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"rewards", "costs"}
    assert all(isinstance(x, float) for x in answer["rewards"] + answer["costs"])
    return answer


def test_the_reference_clients_requests_score_the_references_conversation_text(checkpoints):
    reward, cost = checkpoints
    assert AutoTokenizer.from_pretrained(reward).eos_token is None  # hence "</s>"
    with running_scorer(reward, cost, input_format="conversation") as scorer:
        assert httpx.get(scorer.url + "/health").json()["max_length"] == 512
        texts = conversations(PROMPTS, RESPONSES)
        chunks = [post(scorer.url, "/score_batch", body) for body in CLIENT_REQUESTS]
        by_client = {k: [x for chunk in chunks for x in chunk[k]] for k in ("rewards", "costs")}
        by_pair = post(scorer.url, "/score", {"prompts": PROMPTS, "responses": RESPONSES})
        by_text = post(scorer.url, "/score_texts", {"texts": texts})
        refused = httpx.post(scorer.url + "/score_texts", json={"texts": [texts[0], "plain"]})
    expected_rewards = scores_of_texts(reward, EXPECTED_TEXTS)
    expected_costs = scores_of_texts(cost, EXPECTED_TEXTS)
    # the last response runs past 512 tokens: truncated there, as the reference does
    assert len(AutoTokenizer.from_pretrained(reward)(EXPECTED_TEXTS[-1])["input_ids"]) > 512
    for answer in (by_client, by_pair, by_text):
        np.testing.assert_allclose(answer["rewards"], expected_rewards, atol=1e-4)
        np.testing.assert_allclose(answer["costs"], expected_costs, atol=1e-4)
    assert len(set(np.round(expected_rewards, 2))) == len(PROMPTS)  # the scores see the text
    assert refused.status_code == 422 and "texts[1] is not a conversation" in refused.text


def test_the_conversation_text_is_the_references_for_each_kind_of_pair():
    """The strings the reference's `build_text` returns for these pairs (commit 84c16db0)."""
    text = "BEGINNING OF CONVERSATION: USER: can you help ASSISTANT: i can help</s>"
    assert conversation_text("can you help", " i can help", "</s>") == text
    framed = "BEGINNING OF CONVERSATION: USER: can you help ASSISTANT:"
    assert conversation_text(framed, " i can help", "</s>") == text  # not framed twice
    assert conversation_text("can you help", " i can help</s>", "</s>") == text  # one eos
    assert conversation_text("can you help", "", "[SEP]") == framed + "[SEP]"


def test_pair_models_read_the_users_words_of_a_conversation_prompt(checkpoints):
    reward, cost = checkpoints
    with running_scorer(reward, cost) as scorer:  # input_format pair, the default
        plain = post(scorer.url, "/score_batch", {"prompts": PROMPTS, "responses": RESPONSES})
        wrapped = post(
            scorer.url,
            "/score_batch",
            {"prompts": conversations(PROMPTS, [""] * len(PROMPTS)), "responses": RESPONSES},
        )
        by_text = post(scorer.url, "/score_texts", {"texts": conversations(PROMPTS, RESPONSES)})
    local = ScoringModel(reward).score(PROMPTS, RESPONSES)
    np.testing.assert_allclose(plain["rewards"], local, atol=1e-4)
    for answer in (wrapped, by_text):
        np.testing.assert_allclose(answer["rewards"], plain["rewards"], atol=1e-4)
        np.testing.assert_allclose(answer["costs"], plain["costs"], atol=1e-4)


def tiny_decoder(folder, num_labels: int, seed: int, positions: int = 1024):
    """A 2-layer random GPT-2 classifier whose tokenizer has an end-of-sequence token and no
    padding token, and whose config has no pad_token_id (as GPT-2 and Llama ship)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2ForSequenceClassification, PreTrainedTokenizerFast

    words = sorted({w for text in PROMPTS + RESPONSES for w in text.split()})
    vocab = {w: i for i, w in enumerate(["<unk>", "</s>", *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token="</s>"
    ).save_pretrained(folder)
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(vocab),
        n_positions=positions,
        n_embd=16,
        n_layer=2,
        n_head=2,
        num_labels=num_labels,
        bos_token_id=1,
        eos_token_id=1,
        initializer_range=0.5,
    )
    GPT2ForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_a_decoder_classifier_without_padding_serves_as_reward_and_cost(tmp_path):
    reward = tiny_decoder(tmp_path / "reward", num_labels=1, seed=0)
    cost = tiny_decoder(tmp_path / "cost", num_labels=2, seed=1)
    with running_scorer(reward, cost, input_format="conversation") as scorer:
        together = post(scorer.url, "/score_batch", {"prompts": PROMPTS, "responses": RESPONSES})
    one_by_one = ScoringModel(reward, batch_size=1, input_format="conversation")
    np.testing.assert_allclose(
        together["rewards"], one_by_one.score(PROMPTS, RESPONSES), atol=1e-4
    )  # padded rows score their own last token, not the padding's
    assert len(set(np.round(together["rewards"], 2))) == len(PROMPTS)
    assert len(together["costs"]) == len(PROMPTS)


def test_models_the_scorer_cannot_use_are_refused_naming_the_problem(tmp_path):
    short = tiny_decoder(tmp_path / "short", num_labels=1, seed=0, positions=64)
    with pytest.raises(
        ScoringModelError,
        match=r"max_length 512 is longer than .* reads \(64 tokens\); pass --max-length 64",
    ):
        ScoringModel(short)
    assert ScoringModel(short, max_length=64).score(["the"], ["sorry"])  # within its reach
    three = tiny_checkpoint(tmp_path / "three", num_labels=3, seed=0)
    with pytest.raises(ScoringModelError, match="has 3 labels"):
        ScoringModel(three)
    with pytest.raises(
        ScoringModelError, match="input format 'chat' is not one of pair, conversation"
    ):
        ScoringModel(three, input_format="chat")
