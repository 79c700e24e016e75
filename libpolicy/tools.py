"""Which paths each of the harness's file tools touches, and how.

Pure: from a tool's name and input (Claude Code's PreToolUse ``tool_input``)
to a list of ``(access, path)`` pairs, ``access`` being ``"read"``, ``"write"``
or ``"search"`` (a Grep or Glob root: readable only if no denied region lies
beneath it).  Paths are returned as the agent wrote them; expanding them is
:mod:`libpolicy.paths`' job.
"""

from __future__ import annotations

import os

from libbroker.errors import HookInputError

# The harness's tools that read or write files outside any OS sandbox.
FILE_TOOLS = ("Read", "Grep", "Glob", "Edit", "MultiEdit", "Write", "NotebookEdit")

# Characters that make a glob component a pattern rather than a name.  A
# backslash counts too: stopping the static prefix early only widens the root,
# which is the cautious direction.
_MAGIC = frozenset("*?[]{}\\!")

Touch = tuple[str, str]


class PatternRefused(Exception):
    """A glob whose reach cannot be bounded; the message is the reason."""


def _path_field(tool: str, tool_input: dict[str, object], key: str, *, required: bool) -> str:
    value = tool_input.get(key)
    if value is None and not required:
        return ""
    if value is None:
        raise HookInputError(f"{tool} call without its {key!r} field")
    if not isinstance(value, str):
        raise HookInputError(f"{tool}: {key!r} is not a string")
    if required and not value:
        raise HookInputError(f"{tool}: {key!r} is empty")
    return value


def glob_root(base: str, pattern: str) -> str:
    """The directory a glob ``pattern`` searches beneath, given its search ``base``.

    ``base`` joined with the pattern's static prefix (the components before the
    first wildcard); an absolute pattern replaces the base, and an empty base
    leaves the prefix as written (``~/.ssh`` stays for :mod:`libpolicy.paths`).
    A ``..`` at or after a wildcard would climb out of any root we could name,
    so it is refused.
    """
    parts = pattern.split("/")
    static: list[str] = []
    for index, part in enumerate(parts):
        if _MAGIC & set(part):
            if any(".." in later for later in parts[index:]):
                raise PatternRefused(f"the pattern {pattern!r} climbs with '..' after a wildcard")
            break
        static.append(part)
    else:
        # No wildcard at all: the last component names a file or directory to
        # match, and its directory is what gets listed.
        static = static[:-1] if len(static) > 1 or static[0] != "" else static
    prefix = "/".join(static)
    if pattern.startswith("/") and not prefix:
        prefix = "/"
    if not base:
        return prefix or "."
    return os.path.join(base, prefix) if prefix else base


def touched(tool: str, tool_input: dict[str, object]) -> list[Touch]:
    """The ``(access, path)`` pairs a file tool call touches; [] for any other tool.

    Relative paths stay relative (to the hook input's cwd); an empty Grep/Glob
    ``path`` means the cwd.  Raises :class:`HookInputError` for a file tool call
    without its path field or with one that is not a string, and
    :class:`PatternRefused` for a Glob pattern that cannot be bounded.
    """
    if tool in ("Read",):
        return [("read", _path_field(tool, tool_input, "file_path", required=True))]
    if tool in ("Write", "Edit", "MultiEdit"):
        return [("write", _path_field(tool, tool_input, "file_path", required=True))]
    if tool == "NotebookEdit":
        return [("write", _path_field(tool, tool_input, "notebook_path", required=True))]
    if tool == "Grep":
        root = _path_field(tool, tool_input, "path", required=False) or "."
        out = [("search", root)]
        # ripgrep matches --glob beneath the root and never climbs out of it,
        # but an absolute or ~ glob names a place of its own: count it too.
        for glob in _path_field(tool, tool_input, "glob", required=False).split():
            if glob.startswith(("/", "~")):
                try:
                    out.append(("search", glob_root("", glob)))
                except PatternRefused:
                    out.append(("search", "/"))
        return out
    if tool == "Glob":
        pattern = _path_field(tool, tool_input, "pattern", required=True)
        base = _path_field(tool, tool_input, "path", required=False) or "."
        out = [("search", glob_root(base, pattern))]
        if pattern.startswith("~"):
            # The harness may expand a leading ~ in the pattern; count that reading too.
            out.append(("search", glob_root("", pattern)))
        return out
    return []
