"""What a prompt is: chat messages, or raw text that reaches the model exactly as written.

Chat messages go through the model's chat template (engine.backends.vllm.engine). Raw text is
for the references' own prompt formats, which were written for models used without a template:
ES at Scale's countdown prompt (VsonicV/es-at-scale, the `context` field of its countdown data,
fed through unchanged by `countdown_template` in `es_at_scale/template_function/apply_template.py`)
ends in "<think>", and the Safe-RLHF alignment fork (jbejjani2022/es-fine-tuning-paper,
`alignment/es-fine-tuning_alignment_accl_api.py`) prompts "BEGINNING OF CONVERSATION: USER: ...
ASSISTANT:", and ES at Scale's math task (`qwen_math_template` there) writes each problem
into Qwen's ChatML turns under a system instruction (chatml_prompt). A run says which kind its
datasets hold (`prompt_format`), and a dataset of the other kind is refused when the run is
planned.

Light on purpose (no pyarrow, no vLLM): the configuration schema imports it.
"""

from __future__ import annotations

CHAT = "chat"
RAW = "raw"
PROMPT_FORMATS = (CHAT, RAW)

Messages = list[dict[str, str]]
"""One chat prompt: [{"role": "system" | "user" | "assistant", "content": ...}, ...]."""

Prompt = Messages | str
"""Chat messages (the chat template applies) or raw text (sent as it is)."""

# The conversation form of Safe-RLHF that the alignment fork's prompts and its scorer use.
CONVERSATION_BEGIN = "BEGINNING OF CONVERSATION:"
CONVERSATION_USER = "USER:"
CONVERSATION_ASSISTANT = "ASSISTANT:"

# Qwen's ChatML turn markers, the layout its models' chat templates write.
CHATML_START = "<|im_start|>"
CHATML_END = "<|im_end|>"
# ES Lab's own instruction for math problems answered in \boxed{} (engine.rewards.math_boxed
# grades the last box); the reference's own words come from the user's copy of its template
# file (engine.data.math_es_at_scale).
MATH_SYSTEM = "Solve the problem step by step, then write only the final answer inside \\boxed{}."


def chatml_prompt(user: str, system: str = MATH_SYSTEM) -> str:
    """`user`'s problem as a raw ChatML prompt: a system turn, the user turn and an open
    assistant turn. ES at Scale writes its math prompts so whatever the model (Qwen's markers
    are hard-coded in its template, not taken from the tokenizer), so they are raw text here
    too; for a Qwen model it is what the chat template gives the same two messages."""
    return (
        f"{CHATML_START}system\n{system}{CHATML_END}\n"
        f"{CHATML_START}user\n{user}{CHATML_END}\n"
        f"{CHATML_START}assistant\n"
    )


def conversation_prompt(user: str) -> str:
    """`user`'s words as a one-turn Safe-RLHF conversation awaiting the assistant's answer:
    "BEGINNING OF CONVERSATION: USER: {user} ASSISTANT:", the raw prompt the alignment fork
    gives its policy."""
    return f"{CONVERSATION_BEGIN} {CONVERSATION_USER} {user} {CONVERSATION_ASSISTANT}"


def prompt_format(prompt: Prompt) -> str:
    """`raw` for text, `chat` for messages."""
    return RAW if isinstance(prompt, str) else CHAT


def render_prompt(prompt: Prompt) -> str:
    """The prompt as people read it (samples, reports): raw text as it is, messages with
    their roles."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(f"[{m['role']}] {m['content']}" for m in prompt)


def user_text(prompt: Prompt) -> str:
    """What a scorer reads as the prompt: the last user message of a chat; of raw text in the
    Safe-RLHF conversation form, the text between "USER:" and the last "ASSISTANT:" (what the
    alignment fork's scorer client extracts, so the scorer does not wrap it twice); other raw
    text whole."""
    if isinstance(prompt, str):
        if CONVERSATION_USER in prompt and CONVERSATION_ASSISTANT in prompt:
            after_user = prompt.split(CONVERSATION_USER, 1)[1]
            return after_user.rsplit(CONVERSATION_ASSISTANT, 1)[0].strip()
        return prompt
    users = [m["content"] for m in prompt if m["role"] == "user"]
    return users[-1] if users else "\n\n".join(m["content"] for m in prompt)
