"""Every form a path a file tool names can take, so none of them talks around the policy.

A path from the agent is hostile: ``~``, relative to the session's cwd, ``..``,
repeated or trailing slashes, symlinks at any depth (dangling ones included),
and ``/proc/<pid>/root`` or ``/proc/self/cwd`` detours.  :func:`forms` turns one
into the set of absolute, clean paths it may mean: the literal (lexical) form
and the resolved form (symlinks followed the way the kernel will, ``..`` after
a symlink taken physically, the existing prefix of a not-yet-existing file
resolved).  A decision allows a path only if it allows every form.

A form that cannot be pinned down (a per-process file under /proc, a NUL byte)
raises :class:`Unresolvable`, which the caller turns into a denial: when we
cannot say where a path leads, the answer is no.

Case-insensitive filesystems are out of scope.
"""

from __future__ import annotations

import os

from libbroker.paths import under

# /proc/<pid>/<entry> entries that are links into another process's view of
# the filesystem; only "root" and "cwd" are ever followed, and only where the
# process shares our mount namespace.
_FOLLOWABLE = ("root", "cwd")


class Unresolvable(Exception):
    """A path whose meaning cannot be pinned down; the message is the reason."""


def clean(path: str) -> str:
    """Lexically normalise an absolute path: no '.', '..', repeated or trailing '/'.

    POSIX lets ``//x`` differ from ``/x`` and ``normpath`` keeps it; Linux does
    not, so the leading pair is folded too (else ``//root/.ssh`` would not be
    "under" ``/root``).
    """
    out = os.path.normpath(path)
    if out.startswith("//"):
        out = "/" + out.lstrip("/")
    return out


def candidates(raw: str, cwd: str, home: str) -> list[str]:
    """The absolute (not yet cleaned) paths ``raw`` may mean to the harness.

    A reading the harness might or might not apply counts either way: ``~``
    and ``~user`` expanded or taken as names, ``$VAR`` expanded (from the
    environment the harness handed the hook) or taken literally.
    """
    if "\x00" in raw:
        raise Unresolvable("the path contains a NUL byte")
    readings = [raw]
    if "$" in raw:
        expanded = os.path.expandvars(raw)
        if expanded != raw:
            readings.append(expanded)
    out: list[str] = []
    for reading in readings:
        for candidate in _candidates(reading, cwd, home):
            if candidate not in out:
                out.append(candidate)
    return out


def _candidates(raw: str, cwd: str, home: str) -> list[str]:
    if raw.startswith("/"):
        return [raw]
    relative = os.path.join(cwd, raw)
    if raw == "~" or raw.startswith("~/"):
        return [home + raw[1:], relative]
    if raw.startswith("~"):
        expanded = os.path.expanduser(raw)
        return [expanded, relative] if expanded.startswith("/") else [relative]
    return [relative]


def _same_mount_namespace(pid: str) -> bool:
    try:
        theirs = os.stat(f"/proc/{pid}/ns/mnt")
        ours = os.stat("/proc/self/ns/mnt")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def _is_process_dir(name: str) -> bool:
    return name in ("self", "thread-self") or name.isdigit()


def through_proc(path: str, cwd: str, _depth: int = 0) -> str:
    """``path`` with a /proc/<pid>/root or /proc/<pid>/cwd detour replaced by its target.

    ``self`` is the harness (the hook's parent shares its root; its cwd is the
    hook input's ``cwd``).  Any other per-process file (environ, mem, fd/N,
    exe, another namespace's root) is refused: it is no place for a file tool,
    and what lies behind it cannot be checked.
    """
    if not under(path, "/proc"):
        return path
    if _depth > 8:
        raise Unresolvable(f"{path}: too many /proc detours")
    parts = path.split("/")  # ['', 'proc', pid, entry, ...]
    if len(parts) < 3 or not _is_process_dir(parts[2]):
        return path
    pid, entry, rest = parts[2], (parts[3] if len(parts) > 3 else ""), parts[4:]
    if entry not in _FOLLOWABLE:
        raise Unresolvable(f"{path} is a per-process file under /proc, not readable by file tools")
    if pid in ("self", "thread-self"):
        target = "/" if entry == "root" else cwd
    else:
        if not _same_mount_namespace(pid):
            raise Unresolvable(f"{path} leads into another process's view of the filesystem")
        try:
            target = os.readlink(f"/proc/{pid}/{entry}")
        except OSError:
            raise Unresolvable(f"{path}: cannot read where /proc/{pid}/{entry} leads") from None
        if not target.startswith("/"):
            raise Unresolvable(f"{path}: /proc/{pid}/{entry} does not lead to a path")
    # The remainder may hold another detour (/proc/self/root/proc/1/cwd/...).
    followed = clean(os.path.join(target, *rest)) if rest else clean(target)
    return through_proc(followed, cwd, _depth + 1)


_MAX_LINKS = 40  # the kernel's own limit on symlinks in one lookup


def _proc_link(path: str, cwd: str) -> str | None:
    """Where /proc/<pid>/root or /proc/<pid>/cwd leads, seen from the harness; else None.

    ``self`` is the harness: the hook's parent shares its root, and its cwd is
    the hook input's.  Another pid is followed only within our mount namespace.
    """
    parts = path.split("/")
    if len(parts) != 4 or parts[3] not in _FOLLOWABLE:
        return None
    if parts[2] in ("self", "thread-self"):
        return "/" if parts[3] == "root" else cwd
    if not parts[2].isdigit() or not _same_mount_namespace(parts[2]):
        return None
    try:
        target = os.readlink(path)
    except OSError:
        return None
    return target if target.startswith("/") else None


def resolve(path: str, cwd: str) -> str:
    """The absolute ``path`` with every symlink followed, as the harness's lookup would.

    Like ``os.path.realpath``: ``..`` after a symlink climbs from its target,
    the missing tail of a not-yet-existing path stays as written, a dangling
    symlink leads to its target.  Unlike it, /proc/self is the harness, not
    this process, and no per-process link but root and cwd is followed (what
    is left under /proc/<pid> is refused by :func:`through_proc`).
    """
    pending = list(reversed(path.split("/")))
    resolved = "/"
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            resolved = os.path.dirname(resolved)
            continue
        nxt = os.path.join(resolved, name)
        if resolved == "/proc":
            # /proc/self names this process, not the harness: never follow it.
            target = None
        elif under(resolved, "/proc") and _is_process_dir(resolved.split("/")[2]):
            # Inside /proc/<pid>: only root and cwd lead anywhere we can judge.
            target = _proc_link(nxt, cwd)
        else:
            try:
                target = os.readlink(nxt)
            except OSError:  # not a symlink, missing, or not a directory on the way
                target = None
        if target is None:
            resolved = nxt
            continue
        links += 1
        if links > _MAX_LINKS:
            raise Unresolvable(f"{path}: too many levels of symbolic links")
        if target.startswith("/"):
            resolved = "/"
        pending.extend(reversed(target.split("/")))
    return resolved


def forms(raw: str, cwd: str, home: str) -> list[str]:
    """Every clean absolute path ``raw`` may name: literal and resolved, for each reading.

    Raises :class:`Unresolvable` when one of them cannot be pinned down.
    """
    out: list[str] = []
    for candidate in candidates(raw, cwd, home):
        literal = through_proc(clean(candidate), cwd)
        # Resolve the raw candidate, not the cleaned one: '..' after a symlink
        # climbs from the link's target, as the kernel does.
        resolved = through_proc(resolve(candidate, cwd), cwd)
        for form in (literal, resolved):
            if form not in out:
                out.append(form)
    return out
