"""File names built from what a person typed (an uploaded file's name, a run's name in a
download's name). Only ASCII letters, digits, dot, dash and underscore survive: such a name
cannot leave its folder (no `/`, and no leading dot, so no `..`), hide, or carry quotes,
newlines or control characters into a Content-Disposition header, a shell or a log line."""

from __future__ import annotations

import re

MAX_STEM_CHARS = 80
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_file_name(stem: str, suffix: str = "", fallback: str = "file") -> str:
    """`stem` with every run of other characters turned into one dash, no leading or
    trailing dot or dash, at most MAX_STEM_CHARS long (`fallback` when nothing is left),
    then `suffix` (the caller's own, e.g. ".json", kept as given)."""
    cleaned = _UNSAFE.sub("-", stem)[:MAX_STEM_CHARS].strip(".-")
    return f"{cleaned or fallback}{suffix}"
