"""The policy's decisions: may a file tool read, write or search a path?

Each decision is a pair ``(allowed, reason)``; the reason names the rule that
decided, for the agent (in the hook's denial) and for people debugging a policy
(``policy-hook check``).

The ``*_rule`` functions are pure: they judge one clean absolute path against
the policy.  :func:`readable`, :func:`writable` and :func:`search_root_readable`
take the path as the agent wrote it, expand it into every form it may name
(:func:`libpolicy.paths.forms`, which looks at the filesystem for symlinks) and
allow it only if every form is allowed.  Deny wins everywhere.
"""

from __future__ import annotations

from libbroker.paths import under
from libpolicy.hostrun import match_path
from libpolicy.model import Policy
from libpolicy.paths import Unresolvable, forms

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections costs ms at a -S start-up; annotations only
    from collections.abc import Callable

Decision = tuple[bool, str]


def _first_under(path: str, bases: tuple[str, ...]) -> str | None:
    for base in bases:
        if under(path, base):
            return base
    return None


def read_rule(policy: Policy, path: str) -> Decision:
    """May the file tools read the clean absolute ``path``?

    Outside home and runtime, or under read/write/tool_write (what the tools
    may write they may read); never under deny.
    """
    denied = _first_under(path, policy.deny)
    if denied is not None:
        return False, f"{path} is under deny {denied}"
    for key, bases in (("write", policy.write), ("tool_write", policy.tool_write),
                       ("read", policy.read)):
        base = _first_under(path, bases)
        if base is not None:
            return True, f"{path} is under {key} {base}"
    for key, region in (("home", policy.home), ("runtime", policy.runtime)):
        if region and under(path, region):
            return False, (f"{path} is under {key} {region}, which is denied for reading "
                           "apart from the read and write paths")
    return True, f"{path} is outside home and runtime"


def write_rule(policy: Policy, path: str) -> Decision:
    """May the file tools write the clean absolute ``path``?

    Under write or tool_write, never under deny, never a host-run file (at any
    depth, whatever grant covers it), and inside harness only under tool_write.
    """
    denied = _first_under(path, policy.deny)
    if denied is not None:
        return False, f"{path} is under deny {denied}"
    entry = match_path(path, policy.home, policy.hostrun)
    if entry is not None:
        return False, (f"{path} is a host-run file (rule {entry.rule}: {entry.reason}); "
                       "the file tools never write these, whatever the write paths say")
    base = _first_under(path, policy.tool_write)
    if base is not None:
        return True, f"{path} is under tool_write {base}"
    if policy.harness and under(path, policy.harness):
        return False, (f"{path} is inside harness {policy.harness}, which the file tools "
                       "write only under tool_write")
    base = _first_under(path, policy.write)
    if base is not None:
        return True, f"{path} is under write {base}"
    return False, f"{path} is not under any write or tool_write path"


def _fully_readable(policy: Policy, region: str) -> bool:
    return any(under(region, base) for base in (*policy.write, *policy.tool_write, *policy.read))


def search_rule(policy: Policy, root: str) -> Decision:
    """May Grep or Glob search beneath the clean absolute ``root``?

    Only if ``root`` is readable and no denied region lies beneath it: a search
    over an ancestor of home would sweep it.
    """
    ok, why = read_rule(policy, root)
    if not ok:
        return ok, why
    for base in policy.deny:
        if under(base, root):
            return False, f"deny {base} lies under the search root {root}"
    for key, region in (("home", policy.home), ("runtime", policy.runtime)):
        if region and under(region, root) and not _fully_readable(policy, region):
            return False, f"{key} {region}, denied for reading, lies under the search root {root}"
    if under("/proc", root):
        return False, f"the per-process files under /proc lie under the search root {root}"
    return True, why


def _all_forms(
    policy: Policy, raw: str, cwd: str, rule: Callable[[Policy, str], Decision]
) -> Decision:
    try:
        paths = forms(raw, cwd, policy.home)
    except Unresolvable as exc:
        return False, str(exc)
    last: Decision = (False, f"{raw}: no path to check")
    for form in paths:
        ok, why = rule(policy, form)
        if not ok:
            if form != paths[0]:
                why = f"{raw} leads to {form}: {why}"
            return False, why
        last = (True, why)
    return last


def readable(policy: Policy, path: str, cwd: str = "/") -> Decision:
    """May a file tool read ``path`` (as the agent wrote it, relative to ``cwd``)?"""
    return _all_forms(policy, path, cwd, read_rule)


def writable(policy: Policy, path: str, cwd: str = "/") -> Decision:
    """May a file tool write ``path`` (as the agent wrote it, relative to ``cwd``)?"""
    return _all_forms(policy, path, cwd, write_rule)


def search_root_readable(policy: Policy, root: str, cwd: str = "/") -> Decision:
    """May Grep or Glob search beneath ``root`` (as the agent wrote it)?"""
    return _all_forms(policy, root, cwd, search_rule)
