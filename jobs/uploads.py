"""Removing uploaded datasets that no run uses, so a shared dashboard's uploads folder does
not grow forever. The New run page calls it after each upload it keeps and `eslab data
clean-uploads` calls it on demand; engine.data.uploads decides which files are old enough
(ESLAB_UPLOAD_KEEP_HOURS), the runs in the database decide which of them are still used."""

from __future__ import annotations

from pathlib import Path

from engine.config.eval_sets import parse_eval_sets
from engine.data.uploads import stale_uploads
from engine.paths import resolve_path
from jobs.store.store import Store

# Runs created while the list is read still fit in the one query.
LIST_MARGIN = 1000


def referenced_files(store: Store) -> set[Path]:
    """Every file path that a stored run's configuration names (any option, so a dataset
    named as eval_file counts as well as train_file, and each file of eval_sets), resolved as
    a run resolves it, links followed as opening the file follows them."""
    runs = store.list_runs(limit=store.count_runs() + LIST_MARGIN)
    named = {v for run in runs for v in run.config.values() if isinstance(v, str) and v.strip()}
    for run in runs:
        try:
            named.update(parse_eval_sets(run.config.get("eval_sets")).values())
        except ValueError:  # a stored value the rules would refuse names no file
            continue
    found = set()
    for value in named:
        try:
            found.add(resolve_path(value).resolve())
        except (OSError, ValueError):  # not a path at all (a NUL byte, a loop of links)
            continue
    return found


def clean_uploads(store: Store, *, dry_run: bool = False) -> list[Path]:
    """Remove (with `dry_run`, only list) the uploads older than ESLAB_UPLOAD_KEEP_HOURS that
    no run refers to; returns them. The runs are read only when some upload is old enough."""
    stale = stale_uploads()
    if not stale:
        return []
    used = referenced_files(store)
    unused = [p for p in stale if p.resolve() not in used]
    if not dry_run:
        for path in unused:
            path.unlink(missing_ok=True)
    return unused
