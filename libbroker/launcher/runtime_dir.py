"""Making, filling and removing a session's runtime directory (:mod:`.runtime` names its parts).
"""

from __future__ import annotations

import contextlib
import os

from libbroker.errors import LaunchError
from libbroker.launcher.runtime import Runtime
from libbroker.paths import under

_SUN_PATH_MAX = 107
# "/agent-sandbox/session-XXXXXXXX/broker.sock" plus slack for the sockets' names.
_LONGEST_NAME = 48
# tempfile's, without its import (random and shutil: ~6 ms of CPU before go).
_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_TMP_DIRS = ("/tmp", "/var/tmp", "/usr/tmp")  # tempfile.gettempdir's after the environment's
# Where a session's runtime dir goes when the temporary directory lies in its workdir.
_ASIDE_DIRS = ("/var/tmp", "/dev/shm", "/tmp")
_tmp: str | None = None


def temp_dir() -> str:
    """The temporary directory, as ``tempfile.gettempdir`` finds it: $TMPDIR, $TEMP,
    $TMP, then /tmp, /var/tmp, /usr/tmp, then the cwd; the first that is a directory
    this process may write (asked of the kernel, not tried with a file); once."""
    global _tmp
    if _tmp is None:
        named = [os.environ.get(name, "") for name in ("TMPDIR", "TEMP", "TMP")]
        for candidate in (*(n for n in named if n), *_TMP_DIRS, os.getcwd()):
            if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
                _tmp = os.path.abspath(candidate)
                break
        else:
            raise LaunchError("no writable temporary directory ($TMPDIR, /tmp, /var/tmp)")
    return _tmp


def _make_dir(prefix: str, parent: str) -> str:
    """A new directory (0700) named ``prefix`` and 8 random characters in ``parent``, as
    ``tempfile.mkdtemp`` makes it: mkdir refuses a name that exists, so another is tried."""
    for _ in range(100):
        name = prefix + "".join(_NAME_CHARS[b % len(_NAME_CHARS)] for b in os.urandom(8))
        path = os.path.join(parent, name)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return os.path.abspath(path)
    raise FileExistsError(17, "no free name", os.path.join(parent, prefix + "*"))


def _in_workdir(path: str, workdir: str) -> bool:
    """Whether ``path``, links resolved, lies in ``workdir`` (a real path; "": none)."""
    return bool(workdir) and under(os.path.realpath(path), workdir)


def _outside(parent: str, workdir: str) -> str:
    """A parent for the runtime dir outside ``workdir``: ``parent`` if it is, else the
    first of :data:`_ASIDE_DIRS` that is and that this process may write.

    The runtime dir holds the session's own files (under Landlock a plain
    command's home, with its links to the granted configs).  In the workdir
    (run from /tmp, or from a directory that holds $TMPDIR) the host-run
    guard's walk and sweep would take them for the agent's, and every session
    would move them to the quarantine with a line.  None outside (a workdir of
    /): the temporary directory, as before."""
    if not _in_workdir(parent, workdir):
        return parent
    for candidate in _ASIDE_DIRS:
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK) \
                and not _in_workdir(candidate, workdir):
            return candidate
    return parent


def create(workdir: str = "") -> Runtime:
    """Make a fresh private runtime directory (0700) for one session, outside
    ``workdir`` (its real path) when it can be."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if base and _in_workdir(base, workdir):
        base = ""
    parent: str | None = None
    # A unix socket path is at most 107 bytes: a deep runtime dir falls back to /tmp.
    if base and len(base) + _LONGEST_NAME > _SUN_PATH_MAX:
        base = ""
    if base and os.path.isabs(base) and os.path.isdir(base):
        parent = os.path.join(base, "agent-sandbox")
        try:
            os.makedirs(parent, mode=0o700, exist_ok=True)
            st = os.lstat(parent)
            # Refuse a parent someone else owns or a symlink planted in its place.
            if st.st_uid != os.getuid() or not os.path.isdir(parent) or os.path.islink(parent):
                parent = None
        except OSError:
            parent = None
    try:
        root = _make_dir(*(("session-", parent) if parent else
                           ("agent-sandbox-", _outside(temp_dir(), workdir))))
        os.chmod(root, 0o700)
        # Fails if something is there already: nobody else's directory is used.
        os.mkdir(Runtime(root).host_only, 0o700)
    except OSError as exc:
        raise LaunchError(
            f"cannot create the session's runtime directory: {exc.strerror}"
        ) from None
    return Runtime(root)


def session_dirs() -> list[str]:
    """Every session runtime dir of this user that :func:`create` may have made (a dead
    session's stays): ``$XDG_RUNTIME_DIR/agent-sandbox/*`` and the fallback's
    ``agent-sandbox-*`` in the temporary directory.  Their owner is for the reader to
    check (:mod:`.hostrun_bindrecord` does)."""
    out = []
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if base and os.path.isabs(base):
        parent = os.path.join(base, "agent-sandbox")
        with contextlib.suppress(OSError):
            out += [os.path.join(parent, n) for n in os.listdir(parent) if not n.endswith(".host")]
    parents = list(_ASIDE_DIRS)  # and where a workdir that holds the temporary dir sent them
    with contextlib.suppress(LaunchError):
        parents.insert(0, temp_dir())
    seen: set[str] = set()
    for tmp in parents:
        real = os.path.realpath(tmp)
        if real in seen:
            continue
        seen.add(real)
        with contextlib.suppress(OSError):
            out += [os.path.join(tmp, n) for n in os.listdir(tmp)
                    if n.startswith("agent-sandbox-") and not n.endswith(".host")]
    return out


def remove(rt: Runtime) -> None:
    """Remove the runtime directory, its host-only sibling and all in them; a no-op if gone.

    hostrun_fs's removal (never through a link, as rmtree's fd walk; what the command
    made unwritable is made writable first), not shutil's: its import (bz2, lzma,
    zlib, fnmatch: ~3 ms of CPU) would come at every session's end."""
    from libbroker.launcher.hostrun_fs import remove_path

    for path in (rt.host_only, rt.root):
        with contextlib.suppress(OSError):
            remove_path(path)


def write_private(path: str, data: str) -> None:
    """Write a new file of the session's (0600; refused if something is at ``path``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(data)
