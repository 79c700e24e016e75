"""The Landlock backend's last step: apply the session's rules, then exec CMD.

The launcher starts this helper (``main`` with the arguments PREP_FD,
SPEC_FD and LIFE_FD, through ``session.python_argv``) at the very beginning
of a session, so that its interpreter start overlaps the servers'.  Its
work then comes in two parts, each a pipe read to its end of file:

- PREP_FD, once the session's group and host-run guards exist, while the
  proxy still starts: what the command's namespaces and group need (the
  part of the :class:`~libbroker.sandbox.shape.Shape` that
  :meth:`~libbroker.sandbox.shape.Shape.early` keeps, and the limits).  The
  helper makes them at once: the PID namespace, its init and the command's
  process, which joins the session's group (a cgroup migration waits for an
  RCU grace period, ~10 ms: off the command's path now) and then waits;
- SPEC_FD, at go, read by that waiting process itself: the whole shape
  (which needs the proxy's ports) and the command.  Its namespace part must
  be the one prepared (else 125).  It runs the one hardening sequence every
  sandbox gets (:func:`libbroker.sandbox.enter.enter`), then execs.  Applying
  it is irreversible and inherited, so the command and all its children stay
  inside; nothing of either part comes from the sandboxed side.

The helper does not become the command: it forks it and stays, unsandboxed,
as its reaper (:func:`libbroker.sandbox.reaper.supervise`), a child subreaper that
the command cannot signal.  Signal numbers for the command come on LIFE_FD;
its end of file (the launcher ended, even by SIGKILL) kills the command; and
when the command ends, whatever it left running, setsid() or not, is killed
before the helper exits with the command's status.  End of file on either
part before it was written (the launcher gave up, or died) ends it all with
125, before anything of the command ran.

Exit 125 when it cannot sandbox (fail closed: the command never runs bare).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from typing import Any, NoReturn

from libbroker.sandbox import enter, landlock, pidns, reaper, seccomp
from libbroker.sandbox.exec import exec_or_exit
from libbroker.sandbox.shape import Shape, from_json

_REAPER_IGNORES = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM)


def apply(shape: Shape) -> None:
    """Capabilities, no_new_privs, seccomp and Landlock for ``shape`` (irreversible)."""
    version = landlock.require()
    rules = landlock.shape_ruleset(shape)
    enter.enter(rules, version, seccomp.Filter(sockets=True))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or not all(a.isdigit() for a in argv):
        sys.stderr.write(
            "usage: python3 -m libbroker.sandbox.landlock_helper PREP_FD SPEC_FD LIFE_FD\n")
        return 125
    spec, life = int(argv[1]), int(argv[2])
    # Now, while the servers start; the parts arrive later.
    # cgroups too (the command joins the session's group): ~3 ms on its path otherwise.
    with contextlib.suppress(ImportError):
        import ctypes  # noqa: F401

        from libbroker.sandbox import cgroups  # noqa: F401
    with os.fdopen(int(argv[0]), "rb") as control:
        raw = control.read()
    if not raw:
        return 125  # the launcher gave up before the session started
    try:
        prep = json.loads(raw)
        early = from_json(prep["shape"])
        tty = not early.new_session
        if not tty:
            os.setsid()  # out of the launcher's group; the command gets a session of its own
        # The reaper ends by its pipes, never by a signal: the terminal's keys
        # reach the whole foreground group and are the command's, and the
        # janitor's SIGTERM after a launcher's death would end it before it
        # has killed what the command left (end of file on LIFE_FD does that).
        for sig in _REAPER_IGNORES:
            signal.signal(sig, signal.SIG_IGN)
        reaper.become_subreaper()

        def run() -> NoReturn:
            os._exit(_command(spec, early, prep.get("limits")))

        # private git configs and holds, in its mount namespace
        child, watch, group = pidns.spawn_below(run, life, group=not tty, native_reaper=None,
                                                binds=early.binds, links=early.links,
                                                holds=early.protect)
        os.close(spec)  # the command's alone: it reads it
    except Exception as exc:
        sys.stderr.write(f"agent-sandbox: cannot start the Landlock sandbox: {exc}\n")
        return 125
    try:
        reaper.supervise(child, watch, group=group)
    except BaseException:
        os._exit(125)


def _command(spec_fd: int, early: Shape, limits: dict[str, Any] | None) -> int:
    """In the forked child: into the session's group, wait for the spec, sandbox
    ourselves, then exec CMD (returns a status only on failure)."""
    try:
        if early.new_session:
            os.setsid()  # the command leads its own group: signals go to all of it
        if limits is not None:  # into the session's group before CMD runs (the reaper stays out)
            from libbroker.sandbox import cgroups

            cgroups.join_self(limits)
    except Exception as exc:
        sys.stderr.write(f"agent-sandbox: cannot apply the Landlock sandbox: {exc}\n")
        return 125
    with os.fdopen(spec_fd, "rb") as control:
        raw = control.read()
    if not raw:
        return 125  # the launcher gave up before go
    try:
        spec = json.loads(raw)
        shape = from_json(spec["shape"])
        if shape.early() != early:  # the namespaces made are not this shape's: never run
            raise ValueError("the spec's namespaces are not the ones prepared")
        cmd = [str(a) for a in spec["argv"]]
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
