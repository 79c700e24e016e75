"""The Landlock backend's last step: apply the session's rules, then exec CMD.

The launcher starts this helper (``main`` with the arguments SPEC_FD and
LIFE_FD, through ``session.python_argv``) at the very beginning of a session,
so that its interpreter start overlaps the servers'.  Its work comes on
SPEC_FD in three parts (:mod:`.parts`: a length, then JSON), each read by the
process that acts on it, so each step is done as soon as what it needs exists:

1. once the session's group exists (``new_session``, ``limits``), read by the
   helper: it makes the PID namespace, its init and the command's process,
   which joins the session's group at once (a cgroup migration waits for an
   RCU grace period, ~10-20 ms: long before go now) and waits;
2. once the host-run guards are up, while the proxy starts (the
   :meth:`~libbroker.sandbox.shape.Shape.early` part of the shape: binds,
   links, holds), read by the init: it makes its mount namespace (after the
   live gate's binds, which its copy of the host's mounts must hold), then
   hands the part on to the command's process, which enters that namespace
   (``setns`` through a pidfd of its parent, the init);
3. at go, read by the command's process itself: the whole shape (which needs
   the proxy's ports) and the command.  Its namespace part must be the one
   prepared (else 125).  It runs the one hardening sequence every sandbox
   gets (:func:`libbroker.sandbox.enter.enter`), then execs.  Applying it is
   irreversible and inherited, so the command and all its children stay
   inside; nothing of any part comes from the sandboxed side.

The helper does not become the command: it forks it and stays, unsandboxed,
as its reaper (:func:`libbroker.sandbox.reaper.supervise`), a child subreaper that
the command cannot signal; the init and the helper stay out of the session's
group.  Signal numbers for the command come on LIFE_FD; its end of file (the
launcher ended, even by SIGKILL) kills the command; and when the command ends,
whatever it left running, setsid() or not, is killed before the helper exits
with the command's status.  End of file where a part was due (the launcher
gave up, or died) ends it all with 125, before anything of the command ran.
Where the kernel refuses a user namespace, the command's process is the
helper's child and reads the second part itself: binds, holds or links are
refused there (125: the paths would name the host's own files).

Exit 125 when it cannot sandbox (fail closed: the command never runs bare).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
from typing import Any, NoReturn

from libbroker.sandbox import enter, landlock, parts, pidns, reaper, seccomp
from libbroker.sandbox.exec import exec_or_exit
from libbroker.sandbox.libc import check, libc
from libbroker.sandbox.shape import Shape, from_json

_REAPER_IGNORES = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM)


def apply(shape: Shape) -> None:
    """Capabilities, no_new_privs, seccomp and Landlock for ``shape`` (irreversible)."""
    version = landlock.require()
    rules = landlock.shape_ruleset(shape)
    enter.enter(rules, version, seccomp.Filter(sockets=True))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        sys.stderr.write("usage: python3 -m libbroker.sandbox.landlock_helper SPEC_FD LIFE_FD\n")
        return 125
    spec, life = int(argv[0]), int(argv[1])
    # Now, while the servers start; the parts arrive later.
    # cgroups too (the command joins the session's group): ~3 ms on its way otherwise.
    with contextlib.suppress(ImportError):
        import ctypes  # noqa: F401

        from libbroker.sandbox import cgroups  # noqa: F401
    try:
        raw = parts.read(spec)
        if raw is None:
            return 125  # the launcher gave up before the session started
        first = json.loads(raw)
        new_session, limits = bool(first["new_session"]), first.get("limits")
        if new_session:
            os.setsid()  # out of the launcher's group; the command gets a session of its own
        # The reaper ends by its pipes, never by a signal: the terminal's keys
        # reach the whole foreground group and are the command's, and the
        # janitor's SIGTERM after a launcher's death would end it before it
        # has killed what the command left (end of file on LIFE_FD does that).
        for sig in _REAPER_IGNORES:
            signal.signal(sig, signal.SIG_IGN)
        reaper.become_subreaper()
        child, watch, group = _spawn(spec, life, new_session, limits)
        os.close(spec)  # the init's and the command's from now on
    except Exception as exc:
        sys.stderr.write(f"agent-sandbox: cannot start the Landlock sandbox: {exc}\n")
        return 125
    try:
        reaper.supervise(child, watch, group=group)
    except BaseException:
        os._exit(125)


def _spawn(spec: int, life: int, new_session: bool, limits: Any) -> tuple[int, int, bool]:
    """The command's process below us (and the init above it where a PID namespace can
    be made, on its own course: :func:`_init`); what this reaper supervises, as
    :func:`.pidns.spawn_below` returns it."""
    def command() -> NoReturn:
        os._exit(_command(spec, new_session, limits, None))

    def init(watch: int) -> NoReturn:
        _init(spec, life, watch, new_session, limits)

    return pidns.spawn_below(command, life, group=new_session, native_reaper=None, init=init)


def _init(spec: int, life: int, watch: int, new_session: bool, limits: Any) -> NoReturn:
    """Pid 1 of the new namespace: the command's process now, the mount namespace once
    its part comes (handed on to the command), then the reaper's job."""
    try:
        ns_r, ns_w = os.pipe()
        command = os.fork()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"agent-sandbox: cannot set up the PID namespace: {exc}\n".encode())
        os._exit(pidns.SETUP_FAILED)
    if command == 0:
        os.close(ns_w)
        os.close(life)
        os.close(watch)
        os._exit(_command(spec, new_session, limits, ns_r))
    os.close(ns_r)
    try:
        raw = parts.read(spec)
        if raw is None:
            raise EOFError  # the launcher gave up before the namespaces' part
        early = from_json(json.loads(raw)["shape"])
        pidns.own_proc(early.binds, early.links, early.protect)
        view = memoryview(raw)
        while view:
            view = view[os.write(ns_w, view) :]
        os.close(ns_w)
    except BaseException as exc:
        # No /proc of our own yet: never the reaper's job (its scan would read the
        # host's).  The command has run nothing: it goes, and so does the namespace.
        if not isinstance(exc, EOFError):
            with contextlib.suppress(OSError):
                os.write(2, f"agent-sandbox: cannot set up the PID namespace: {exc}\n".encode())
        with contextlib.suppress(OSError):
            os.kill(command, signal.SIGKILL)
            os.waitpid(command, 0)
        os._exit(pidns.SETUP_FAILED)
    pidns.become_reaper(command, life, group=new_session, native_reaper=None, keep=(watch,))


def _command(spec_fd: int, new_session: bool, limits: Any, ns: int | None) -> int:
    """In the command's process: into the session's group, into the init's mount
    namespace once it is made (``ns``: its part, handed on; None: no PID namespace,
    the part is read here), then the spec; sandbox ourselves, then exec CMD (returns a
    status only on failure)."""
    try:
        if new_session:
            os.setsid()  # the command leads its own group: signals go to all of it
        if limits is not None:  # into the session's group before CMD runs (the reapers stay out)
            from libbroker.sandbox import cgroups

            cgroups.join_self(limits)
        raw = parts.read(spec_fd) if ns is None else _handed(ns)
        if raw is None:
            return 125  # the launcher (or the init) gave up before go
        early = from_json(json.loads(raw)["shape"])
        if ns is None and (early.binds or early.protect or early.links):
            raise OSError(errno.EPERM, "the kernel refuses the mount namespace the session's "
                          "private git configs need")
        raw = parts.read(spec_fd)
        if raw is None:
            return 125  # the launcher gave up before go
        spec = json.loads(raw)
        shape = from_json(spec["shape"])
        if shape.early() != early:  # the namespaces made are not this shape's: never run
            raise ValueError("the spec's namespaces are not the ones prepared")
        cmd = [str(a) for a in spec["argv"]]
        os.close(spec_fd)
        os.chdir(shape.cwd)
        apply(shape)
    except Exception as exc:
        sys.stderr.write(f"agent-sandbox: cannot apply the Landlock sandbox: {exc}\n")
        return 125
    # Python ignores SIGPIPE and SIGXFSZ, and the reaper those it ignores;
    # an ignored disposition survives exec.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, *_REAPER_IGNORES):
        signal.signal(sig, signal.SIG_DFL)
    exec_or_exit(cmd, shape.env, prog="agent-sandbox: ")


def _handed(ns: int) -> bytes | None:
    """The namespaces' part as the init hands it on once its mount namespace is made;
    then into that namespace, through a pidfd of the init (our parent, pid 1)."""
    with os.fdopen(ns, "rb") as pipe:
        raw = pipe.read()
    if not raw:
        return None
    fd = os.pidfd_open(os.getppid())
    try:
        check(libc().setns(fd, pidns.CLONE_NEWNS), "setns(the init's mount namespace)")
    finally:
        os.close(fd)
    return raw


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
