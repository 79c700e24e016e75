"""The live gate's decision: may the host's process open this file of the workdir now?

Pure: the gate (``libbroker/launcher/hostrun_gate.py``) brings the facts it
looked up (which git directory the file lies in, whether that one was there
at the start, whether the file is what the start recorded); this says allow
or why not.  One principle: a host-run entry that is not provably what it
was at the start is not opened by the host while the session runs.
"""

from __future__ import annotations

from libpolicy.hostrun import Table

# Names git opens in a directory it takes for a git directory (discovery, a
# commondir, a gitlink): a directory holding one is tested (HEAD, objects, refs).
GIT_NAMES = frozenset({"HEAD", "config", "config.worktree", "commondir", "packed-refs", "gitdir"})


def probes(rel: str) -> list[str]:
    """The directories to test for being git directories, for an open of ``rel``: the
    parent of a name git opens in one, the grandparent of a hook."""
    parts = rel.split("/")
    out = []
    if parts[-1] in GIT_NAMES:
        out.append("/".join(parts[:-1]))
    if len(parts) >= 2 and parts[-2] == "hooks":
        out.append("/".join(parts[:-2]))
    return out


def git_dir_of(rel: str, recorded: frozenset[str] | set[str] | dict[str, int]) -> str | None:
    """The git directory ``rel`` lies in, by name: the longest recorded one on its way, else
    the innermost ``.git`` on its way (a directory the session made); None outside one."""
    parts = rel.split("/")
    for i in range(len(parts) - 1, 0, -1):
        head = "/".join(parts[:i])
        if head in recorded:
            return head
    for i in range(len(parts) - 1, 0, -1):
        if parts[i - 1] == ".git":
            return "/".join(parts[:i])
    return None


def verdict(rel: str, table: Table, *, git_dir: str | None, recorded: bool,
            unchanged: bool) -> str | None:
    """None: allow the open of ``rel``; else why it is refused.

    ``git_dir``: the git directory ``rel`` lies in (``""``: the workdir is
    one); ``recorded``: that one was there at the start; ``unchanged``: the
    file opened is the one the start recorded at ``rel``, byte for byte.
    """
    if git_dir is not None and not recorded:
        return "a file of a git directory made during the session"
    probe = rel
    if git_dir is not None:  # judged as if the directory were named .git
        probe = ".git/" + (rel[len(git_dir) + 1:] if git_dir else rel)
    entry = table.match(probe)
    if entry is None or unchanged:
        return None
    return f"{entry.rule}: new or changed during the session"
