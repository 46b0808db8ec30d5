"""What `ensemble_members` says: one parser for the configuration's rules and the scoring.

A member is `scorer` (the scorer_url reward model), another scorer's http(s) URL, or else the
dotted path of a reward function, which is code and so checked like reward_func_path.
"""

from __future__ import annotations

SCORER_MEMBER = "scorer"
_URL_SCHEMES = ("http://", "https://")


def parse_members(text: str | None) -> list[str]:
    """The comma-separated members of `text`, blanks dropped."""
    return [m.strip() for m in (text or "").split(",") if m.strip()]


def is_url(member: str) -> bool:
    return member.startswith(_URL_SCHEMES)


def is_function(member: str) -> bool:
    """Whether `member` names a reward function (neither `scorer` nor a URL)."""
    return member != SCORER_MEMBER and not is_url(member)


def member_name(member: str) -> str:
    """A short, metric-key-safe name: `conciseness` for a function path of module
    engine.rewards.conciseness, `scorer`, or host_port for another scorer."""
    if member == SCORER_MEMBER:
        return member
    if is_url(member):
        return member.split("://", 1)[1].rstrip("/").replace(":", "_").replace("/", "_")
    module, _, function = member.rpartition(".")
    return module.rpartition(".")[2] if function == "compute_score" else function
