"""The reference scorer's conversation format, "BEGINNING OF CONVERSATION: USER: {prompt}
ASSISTANT:{response}" (Safe-RLHF's, used by the jbejjani2022 fork of es-fine-tuning-paper,
`alignment/scorer_service.py` and its clients), in both directions.

A model that reads conversations (`--input-format conversation`) gets the reference's text
plus an end-of-sequence token; a model that reads (prompt, response) pairs (ES Lab's default)
gets the user's words out of a prompt written in that format, so the reference's prompts
score the same as plain ones.
"""

from __future__ import annotations

from engine.prompts import CONVERSATION_ASSISTANT as ASSISTANT
from engine.prompts import CONVERSATION_BEGIN as BEGIN
from engine.prompts import CONVERSATION_USER as USER

REFERENCE_EOS = "</s>"  # the reference's `tokenizer.eos_token or '</s>'`


class ConversationFormatError(ValueError):
    """A text that /score_texts cannot read as a conversation."""


def is_conversation(prompt: str) -> bool:
    """The reference's test (`build_text`): a prompt already in the format is not wrapped."""
    return BEGIN in prompt and ASSISTANT in prompt


def conversation_text(prompt: str, response: str, eos: str) -> str:
    """The reference's `build_text`: wrap a plain prompt, keep a formatted one, end with eos."""
    text = (
        prompt + response
        if is_conversation(prompt)
        else f"{BEGIN} {USER} {prompt} {ASSISTANT}{response}"
    )
    return text if text.endswith(eos) else text + eos


def user_words(prompt: str) -> str:
    """The user's words of a prompt in the format (as the reference's client extracts them:
    between the first USER: and the last ASSISTANT:, stripped); a plain prompt unchanged."""
    if not (is_conversation(prompt) and USER in prompt):
        return prompt
    return prompt.split(USER, 1)[1].rsplit(ASSISTANT, 1)[0].strip()


def split_text(text: str, index: int) -> tuple[str, str]:
    """A full conversation text -> (prompt up to and including the first ASSISTANT:,
    response), so that `conversation_text` rebuilds exactly `text` (+ eos) and `user_words`
    finds the user's words in the prompt."""
    cut = text.find(ASSISTANT) + len(ASSISTANT)
    prompt = text[:cut]
    if cut < len(ASSISTANT) or BEGIN not in prompt or USER not in prompt:
        raise ConversationFormatError(
            f"texts[{index}] is not a conversation "
            f"'{BEGIN} {USER} ... {ASSISTANT}...': {text[:80]!r}"
        )
    return prompt, text[cut:]
