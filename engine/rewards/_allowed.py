"""Where a reward function may come from, decided from its dotted path alone.

A run configuration names code (`reward_func_path`, function members of `ensemble_members`),
and whoever may launch a run may write one. Importing whatever it names would let them run
anything as the service user (`os.system`, `subprocess.run`, `builtins.exec`), and importing a
module runs its top level, so the path is checked here, as text, before anything is imported:
the configuration's validation (the form, the CLI and the worker alike) and the loader both
ask `path_refusal`.

Allowed are the modules under ES Lab's `engine.rewards` package (not the package itself,
whose functions load and call reward functions) and what the operator lists in one setting,
ESLAB_REWARD_MODULES: entries separated by commas or os.pathsep (":" on Linux and macOS),
blanks around them ignored, each either
- a dotted module name (`mylab.rewards`): that module and every module under it, imported
  the usual way (sys.path, PYTHONPATH), or
- an absolute folder (`/srv/eslab/rewards`, `~` expanded): the Python files and packages in
  it, named as top-level modules (`mine.compute_score` for /srv/eslab/rewards/mine.py),
  imported from that folder only and under a private package (engine.rewards'
  FOLDER_NAMESPACE), so a file named like another module (`hmac.py`) never replaces it.
No path part may start with `_`: private modules and functions, dunders included, are never
reward functions.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

REWARD_MODULES_SETTING = "ESLAB_REWARD_MODULES"
BUILTIN_PACKAGE = "engine.rewards"
_BUILTIN_FOLDER = Path(__file__).resolve().parent

_DOTTED_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$", re.ASCII)
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", re.ASCII)
_SEPARATORS = re.compile(f"[,{re.escape(os.pathsep)}]")


class SettingError(ValueError):
    """ESLAB_REWARD_MODULES holds an entry that is neither a module name nor a folder."""


@dataclass(frozen=True)
class AllowList:
    """The operator's entries of ESLAB_REWARD_MODULES (the built-in package is implied)."""

    modules: tuple[str, ...] = ()
    folders: tuple[Path, ...] = ()

    @classmethod
    def parse(cls, value: str) -> AllowList:
        """The entries of a setting's value; SettingError names a bad entry."""
        modules: list[str] = []
        folders: list[Path] = []
        for entry in (e.strip() for e in _SEPARATORS.split(value)):
            if not entry:
                continue
            if _MODULE_NAME.match(entry):
                modules.append(entry)
                continue
            folder = Path(entry).expanduser()
            if not folder.is_absolute():
                raise SettingError(
                    f"{REWARD_MODULES_SETTING} entry {entry!r} is neither a dotted module name "
                    "(like mylab.rewards) nor an absolute folder (like /srv/eslab/rewards)"
                )
            if not folder.is_dir():
                raise SettingError(
                    f"{REWARD_MODULES_SETTING} entry {entry!r} is not an existing folder"
                )
            folders.append(folder.resolve())
        return cls(tuple(modules), tuple(folders))

    @classmethod
    def from_environment(cls) -> AllowList:
        """Read at every check, so a process always checks against its own setting."""
        return cls.parse(os.environ.get(REWARD_MODULES_SETTING, ""))

    def lists_module(self, module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in self.modules)

    def folder_of(self, module: str) -> Path | None:
        """The listed folder whose files hold `module`."""
        return next((folder for folder in self.folders if _holds(folder, module)), None)


def _holds(folder: Path, module: str) -> bool:
    """Whether `folder` has the source of `module` (relative to it), seen on disk without
    importing anything."""
    relative = Path(*module.split("."))
    return (folder / relative.with_suffix(".py")).is_file() or (
        folder / relative / "__init__.py"
    ).is_file()


def is_builtin(module: str) -> bool:
    return module.startswith(BUILTIN_PACKAGE + ".")


def path_refusal(path: str) -> str | None:
    """Why dotted `path` may not name a reward function (a phrase that follows the path in
    a message), or None when it names one in an allowed place."""
    if not _DOTTED_PATH.match(path):
        return "must be a dotted path module.function, e.g. engine.rewards.countdown.compute_score"
    if any(part.startswith("_") for part in path.split(".")):
        return "names a private module or function (a part starts with '_'): not a reward function"
    module = path.rpartition(".")[0]
    if module == BUILTIN_PACKAGE:
        return (
            f"names ES Lab's reward loader, not a reward function: built-in reward functions "
            f"are in the modules under {BUILTIN_PACKAGE}"
        )
    if is_builtin(module):
        if _holds(_BUILTIN_FOLDER, module.removeprefix(BUILTIN_PACKAGE + ".")):
            return None
        return f"is not a built-in reward function: {BUILTIN_PACKAGE} has no module {module!r}"
    try:
        allowed = AllowList.from_environment()
    except SettingError as exc:
        return f"is not a built-in reward function, and {exc}"
    if allowed.lists_module(module) or allowed.folder_of(module) is not None:
        return None
    return (
        f"is not in an allowed place: reward functions must be defined in a module under "
        f"{BUILTIN_PACKAGE} or in a module or folder that the operator lists in the "
        f"{REWARD_MODULES_SETTING} setting; to allow this one, add {module!r} (or the "
        f"folder that holds its file) to {REWARD_MODULES_SETTING}"
    )


def folder_to_import_from(module: str) -> Path | None:
    """The listed folder to import an allowed `module` from; None: the usual way (sys.path)."""
    if is_builtin(module):
        return None
    allowed = AllowList.from_environment()
    return None if allowed.lists_module(module) else allowed.folder_of(module)
