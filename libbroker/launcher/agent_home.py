"""The agent's private config home for one session, and what comes back from it.

The sandbox never writes the user's real ``~/.claude``, ``~/.claude.json``,
``~/.codex`` or ``~/.gemini``: a hook, an MCP server or a ``notify`` planted
there would run on the host the next time the user starts the agent.
Instead each session gets a private copy, made (or brought up to date from
the last session's, :mod:`.agent_reuse`) while the servers start:

    $XDG_STATE_HOME/agent-sandbox/agents/<agent>/<session>/   (0700, on disk)

which the sandbox may write (it is added to the session's ``write`` paths,
so both backends and the file-tool policy grant it) and which the agent is
pointed at by its own variable (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``,
``GEMINI_CLI_HOME``).  A manifest (what was copied, its sizes and times, the
rules) goes to the session's runtime directory, which the sandbox can read
but not change.

When the session ends (the launcher's teardown, or the janitor's after a
``kill -9`` of the launcher) :func:`write_back` takes from the copy only what
the profile's rules name: logins, transcripts, history, sessions; keys in
JSON files only where listed (:mod:`.agents`).  It walks the copy with
directory fds and never follows a symlink the session made (``os.fwalk``,
``O_NOFOLLOW``), reads regular files only, and replaces host files
atomically (temp file + rename, 0600).  Then the copy is removed, or, at the
launcher's own end, its logins are and it is kept for the next session of the
agent, which trusts nothing of it but the bytes equal to the host's
(:mod:`.agent_reuse`).

Standard library only (the janitor imports it after the launcher died).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from libbroker.launcher import agent_copy, agent_reuse, agent_settings, agents
from libbroker.launcher.agents import APPEND, JSON, WHOLE, Profile
from libbroker.launcher.trace import trace
from libbroker.named_tuple import NamedTuple

MANIFEST = "agent-home.json"
_MAX_JSON = 64 << 20  # a settings or state file larger than this is not merged
# A transcript, session or login larger than this is not brought back (the
# session wrote it: it must not fill the user's disk or the launcher's memory).
_MAX_FILE = 256 << 20
# A login the session held as placeholders (launcher.logins) never replaces
# the person's own: the real one stayed on the host, refreshed there.
_PLACEHOLDER = b"agent-sandbox-placeholder"
_LOGIN_FILES = frozenset({"claude/.credentials.json", "codex/auth.json",
                          "home/.gemini/oauth_creds.json"})
# Not left in a copy kept for the next session (agent_reuse): the logins, and Claude
# Code's state (which may hold an API key, primaryApiKey).
_AT_REST = (*sorted(_LOGIN_FILES), "claude/.claude.json")


class TooLarge(Exception):
    """A file of the session's copy is larger than what is brought back."""


class AgentHome(NamedTuple):
    """The private copy of one session: where it is and the agent's variables."""

    root: str
    env: dict[str, str]
    report: agent_copy.Report  # what the copy took and left out (its one line)
    record: agent_reuse.Record  # what of it equals the host's (written, or the caller's to)


def state_dir(home: str, env: Mapping[str, str]) -> str:
    base = env.get("XDG_STATE_HOME") or os.path.join(home, ".local", "state")
    return os.path.join(base, "agent-sandbox", "agents")


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read(_MAX_JSON))
    except (OSError, ValueError):
        return None


def _write_json(path: str, data: Mapping[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2))  # dumps: the C encoder (dump is Python's)


def _workdir_only(profile: Profile, home: str, workdir: str) -> dict[str, str]:
    """The per-project dirs' one entry each that is copied: the workdir's ("\\0": none)."""
    only: dict[str, str] = {}
    for entry in profile.entries:
        if entry.copy in profile.per_workdir or any(
            d.startswith(entry.copy + "/") for d in profile.per_workdir
        ):
            host = agents.host_path(profile, home, entry.copy)
            assert host is not None
            projects = _read_json(os.path.join(host, "projects.json")) or {}
            inner = projects.get("projects") if isinstance(projects, dict) else None
            key = profile.workdir_key(workdir, inner if isinstance(inner, dict) else {})
            for d in profile.per_workdir:
                only[d] = key or "\0"  # no entry yet: copy none
    return only


def prepare(
    profile: Profile,
    *,
    home: str,
    workdir: str,
    session: str,
    runtime: str,
    env: Mapping[str, str],
    opted: Sequence[str] = (),
    claude_session: Mapping[str, Any] | None = None,
    root: str = "",
    record_later: bool = False,
) -> AgentHome:
    """Make the session's private copy of the agent's config; write the manifest.

    ``root``: made already (:func:`make_root`), else made here.  ``record_later``:
    its :class:`.agent_reuse.Record` is the caller's to write (after the start:
    :mod:`.agent_session`), not written here.
    """
    root = root or make_root(profile, home, env, session)
    # Until the copy is whole, a launcher killed now leaves only this: the
    # janitor's write_back removes the copy and brings nothing back.
    _write_manifest(runtime, {"root": root, "partial": True})
    copier = agent_copy.Copier(_skipper(profile, _workdir_only(profile, home, workdir)),
                               frozenset(profile.per_workdir))
    # The last session's copy, if make_root took one, and its record of what equals the host's.
    copier.reuse(root, agent_reuse.take_record(root))
    edit = profile.session_settings(claude_session)
    if edit is not None:  # rewritten below in any case: not removed to be made again
        copier.spare(os.path.join(root, edit.rel))
    for entry in profile.entries:
        host = agents.host_path(profile, home, entry.copy)
        assert host is not None
        dst = os.path.join(root, entry.copy)
        if entry.is_dir:
            os.makedirs(dst, mode=0o700, exist_ok=True)
            copier.tree(host, dst, entry.copy)
        else:
            os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
            copier.file(host, dst, entry.copy)
    report = copier.finish()
    copier.seal(root)  # before the settings below are written
    if not record_later:
        agent_reuse.write_record(root, copier.verified)
    trace(report.line(profile.name))
    seen = copier.copied
    _session_settings(profile, root, claude_session, seen)
    trace(f"{profile.name}'s session settings written")
    manifest = {
        "agent": profile._asdict(),
        "root": root,
        "home": home,
        "opted": list(opted),
        "copied": seen,
        "copy": report.line(profile.name),
        "claude_session": claude_session or {},
    }
    _write_manifest(runtime, manifest)
    return AgentHome(root, home_env(profile, root), report, copier.verified)


def _skipper(profile: Profile, only: Mapping[str, str]) -> Callable[[str, str], bool]:
    """What the copy leaves out: the profile's skip patterns, and in a per-project dir
    every entry but the workdir's (``only``)."""
    # A pattern without ** matches paths of its own depth only: tried on those.
    deep = [p for p in profile.skip if "**" in p]
    by_depth: dict[int, list[str]] = {}
    for p in profile.skip:
        if "**" not in p:
            by_depth.setdefault(p.count("/"), []).append(p)

    def skip(rel: str, parent: str) -> bool:
        if parent in only and rel != f"{parent}/{only[parent]}":
            return True  # a per-project dir: only the workdir's entry
        pats = by_depth.get(rel.count("/"))
        if pats is None and not deep:  # most of a deep tree: no pattern to try
            return False
        return any(agents.match(p, rel) for p in (*(pats or ()), *deep))

    return skip


def _write_manifest(runtime: str, manifest: Mapping[str, Any]) -> None:
    """The manifest, replaced whole: the janitor reads either the old or the new one."""
    path = os.path.join(runtime, MANIFEST)
    with open(path + ".new", "w") as fh:
        fh.write(json.dumps(manifest))  # dumps: the C encoder (dump is Python's)
    os.replace(path + ".new", path)


def make_root(profile: Profile, home: str, env: Mapping[str, str], session: str) -> str:
    """The session's copy's directory (0700): its path is known before the copy.

    An idle copy a past session left is taken (:func:`.agent_reuse.claim`), to be
    brought up to date by :func:`prepare`; else a new one is made.
    """
    parent = os.path.join(state_dir(home, env), profile.name)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    root = os.path.join(parent, session)
    if not agent_reuse.claim(parent, root):
        os.mkdir(root, 0o700)
    return root


def home_env(profile: Profile, root: str) -> dict[str, str]:
    """The agent's variables, pointing it at the copy in ``root``."""
    env_out = {var: os.path.join(root, rel) for var, rel in profile.home_env}
    env_out.update(profile.env)
    return env_out


def _session_settings(
    profile: Profile,
    root: str,
    claude_session: Mapping[str, Any] | None,
    seen: dict[str, list[int]],
) -> None:
    """The copy's settings made to work inside our sandbox (never written back)."""
    edit = profile.session_settings(claude_session)
    if edit is None:
        return
    path = os.path.join(root, edit.rel)
    if edit.json is not None:
        user = _read_json(path)
        _write_json(path, edit.json(user if isinstance(user, dict) else {}))
    elif edit.text is not None:
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                text = fh.read()
        except FileNotFoundError:
            text = ""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(edit.text(text))
    # What we wrote is the baseline: only the agent's own later changes count.
    st = os.stat(path)
    seen[os.path.relpath(path, root)] = [st.st_size, st.st_mtime_ns]


# --- write-back --------------------------------------------------------------


def _profile_from(data: Mapping[str, Any]) -> Profile:
    raw = dict(data)
    raw["entries"] = tuple(agents.Entry(*e) for e in raw["entries"])
    raw["rules"] = tuple(agents.Rule(r[0], r[1], tuple(r[2])) for r in raw["rules"])
    for key in ("commands", "command_keys", "domains", "key_env", "skip", "per_workdir"):
        raw[key] = tuple(raw[key])
    for key in ("home_env", "env"):
        raw[key] = tuple(tuple(p) for p in raw[key])
    known = agents.PROFILES.get(raw["name"])  # its class and hooks (a table's has none)
    return (type(known) if known is not None else Profile)(**raw)


def _read_session_file(dirfd: int, name: str, limit: int, start: int = 0) -> bytes | None:
    """A regular file's bytes from ``start``, never through a symlink; None if not one.

    Raises :class:`TooLarge` when more than ``limit`` bytes follow ``start``.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            fh.seek(start)
            data = fh.read(limit + 1)  # never more than the bound in memory
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooLarge(f"larger than {limit >> 20} MiB: not brought back")
    return data


def _atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` (the user's own file, a link of theirs followed) atomically, 0600."""
    path = os.path.realpath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.agent-sandbox-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _get(data: Any, parts: list[str]) -> list[tuple[list[str], Any]]:
    """Every (concrete path, value) under ``parts`` (``*`` matches any key)."""
    if not parts:
        return [([], data)]
    if not isinstance(data, dict):
        return []
    head, rest = parts[0], parts[1:]
    keys = list(data) if head == "*" else [head] if head in data else []
    return [([k, *p], v) for k in keys for p, v in _get(data[k], rest)]


def _set(data: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        nxt = data.get(key)
        if not isinstance(nxt, dict):
            nxt = data[key] = {}
        data = nxt
    data[path[-1]] = value


def merge_keys(host: Any, session: Any, keep: Sequence[str]) -> dict[str, Any]:
    """``host`` with the ``keep`` keys (dotted, ``*``) set as the session has them.

    Keys the session lacks are left as the host has them (never deleted): a
    host login made while the session ran must not be undone by it.
    """
    out: dict[str, Any] = json.loads(json.dumps(host)) if isinstance(host, dict) else {}
    if not isinstance(session, dict):
        return out
    for key in keep:
        for path, value in _get(session, key.split(".")):
            _set(out, path, value)
    return out


def write_back(runtime: str, *, remove: bool = True, keep: bool = False) -> list[str]:
    """Bring back what is safe from the session's copy (see the module doc); problems.

    ``keep`` (the launcher's own end, its sandbox gone): the copy is kept for the
    next session of the agent (:func:`.agent_reuse.release`) rather than removed,
    less every file the session made or changed (size or time): what is kept is
    bounded as the copy was, and the next session trusts none of it but its bytes.
    """
    manifest = _read_json(os.path.join(runtime, MANIFEST))
    if not isinstance(manifest, dict):
        return []
    if manifest.get("partial"):  # the copy was never whole: nothing in it is the session's
        if remove and isinstance(manifest.get("root"), str):
            agent_reuse.remove(manifest["root"])
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(runtime, MANIFEST))
        return []
    problems: list[str] = []
    try:
        profile = _profile_from(manifest["agent"])
        profile = agents.rules_with(profile, manifest.get("opted") or [])
        root, home = str(manifest["root"]), str(manifest["home"])
        copied: dict[str, list[int]] = manifest.get("copied") or {}
        claude_session = manifest.get("claude_session") or {}
    except (KeyError, TypeError, ValueError) as exc:
        return [f"unreadable manifest: {exc}"]
    entries = 0
    # Only a built-in agent's copy is kept: which of a config table's files hold a
    # login is not known, and a copy at rest holds none.
    keep = keep and remove and profile.name in agents.PROFILES
    # fwalk's dir fds are open only while it yields them: iterate as it goes.
    for dirpath, dirs, files, dirfd in os.fwalk(root, follow_symlinks=False):
        entries += len(dirs) + len(files)
        below = dirpath[len(root) + 1:]  # fwalk's paths are root's joined with names
        if keep:  # fwalk lists a link to a directory with them (never entered)
            agent_reuse.unlink_links(dirs, dirfd)
        for name in files:
            rel = f"{below}/{name}" if below else name
            if _untouched(copied.get(rel), dirfd, name):
                continue  # most of a copy: no rule to look up
            problem = _back(profile, home, rel, dirfd, name, copied.get(rel), claude_session)
            if problem:
                problems.append(problem)
            if keep:  # a copy kept holds no more than the copy made: its bound
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dirfd)
    if remove:
        if keep:
            agent_reuse.release(root, entries, len(copied), _AT_REST)
        else:
            agent_reuse.remove(root)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(runtime, MANIFEST))
    return problems


def _back(profile: Profile, home: str, rel: str, dirfd: int, name: str,
          before: list[int] | None, claude_session: Mapping[str, Any]) -> str:
    """Bring back one file the session made or changed, by its rule; a problem, or ""."""
    rule = agents.rule_for(profile, rel)
    target = agents.host_path(profile, home, rel)
    if rule is None or target is None:
        return ""
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            _bring(rule, dirfd, name, rel, target, before, claude_session)
    except TooLarge as exc:
        return f"{target}: {exc}"
    except OSError as exc:
        return f"{target}: {exc.strerror or exc}"
    return ""


def _untouched(before: list[int] | None, dirfd: int, name: str) -> bool:
    """A regular file as the copy made it (its size and time: what the session may
    change without consequence, as it is the session's own copy)."""
    if before is None:
        return False
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and before == [st.st_size, st.st_mtime_ns]


def _bring(
    rule: agents.Rule,
    dirfd: int,
    name: str,
    rel: str,
    target: str,
    before: list[int] | None,
    claude_session: Mapping[str, Any],
) -> None:
    if rule.mode == WHOLE:
        data = _read_session_file(dirfd, name, _MAX_FILE)
        if data is not None and not (rel in _LOGIN_FILES and _PLACEHOLDER in data):
            _atomic_write(target, data)
    elif rule.mode == APPEND:
        start = before[0] if before is not None else 0
        size = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_size
        if size < start:  # rewritten shorter by the agent
            data = _read_session_file(dirfd, name, _MAX_FILE)
            if data is not None:
                _atomic_write(target, data)
        elif size > start:  # only what was added after the copy
            data = _read_session_file(dirfd, name, _MAX_FILE, start)
            if data:
                fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
    elif rule.mode == JSON and rule.keep:
        raw = _read_session_file(dirfd, name, _MAX_JSON)
        try:
            session = json.loads(raw) if raw else None
        except ValueError:
            return
        if rel.endswith("claude/settings.json") and isinstance(session, dict):
            session = agent_settings.claude_unsettle(session, claude_session)
        host = _read_json(target)
        merged = merge_keys(host, session, rule.keep)
        if merged != host:
            _atomic_write(target, (json.dumps(merged, indent=2) + "\n").encode())
