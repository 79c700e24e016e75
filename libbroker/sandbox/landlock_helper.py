"""The Landlock backend's last step: apply the session's rules, then exec CMD.

The launcher starts this helper (``main`` with the arguments SPEC_FD and
LIFE_FD, through ``session.python_argv``) at the very beginning of a session,
so that its interpreter start overlaps the servers'.  It then blocks on
SPEC_FD until the launcher writes the spec (the session's
:class:`~libbroker.sandbox.shape.Shape`, which needs the proxy's ports, and
the command) and closes it.  The forked command runs the one hardening
sequence every sandbox gets (:func:`libbroker.sandbox.enter.enter`), then
execs.  Applying it is irreversible and inherited, so the command and all its
children stay inside; nothing of the spec comes from the sandboxed side.

The helper does not become the command: it forks it and stays, unsandboxed,
as its reaper (:func:`libbroker.sandbox.reaper.supervise`), a child subreaper that
the command cannot signal.  Signal numbers for the command come on LIFE_FD;
its end of file (the launcher ended, even by SIGKILL) kills the command; and
when the command ends, whatever it left running, setsid() or not, is killed
before the helper exits with the command's status.

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
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        sys.stderr.write("usage: python3 -m libbroker.sandbox.landlock_helper SPEC_FD LIFE_FD\n")
        return 125
    life = int(argv[1])
    # Now, while the servers start; the spec arrives only once they listen.
    # cgroups too (the command joins the session's group): ~3 ms after go otherwise.
    with contextlib.suppress(ImportError):
        import ctypes  # noqa: F401

        from libbroker.sandbox import cgroups  # noqa: F401
    with os.fdopen(int(argv[0]), "rb") as control:
        raw = control.read()
    if not raw:
        return 125  # the launcher gave up before the session started
    try:
        spec = json.loads(raw)
        tty = not from_json(spec["shape"]).new_session
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
            os._exit(_sandboxed(spec, tty))

        shape = from_json(spec["shape"])  # private git configs, in its mount namespace
        child, watch, group = pidns.spawn_below(run, life, group=not tty, native_reaper=None,
                                                binds=shape.binds, links=shape.links,
                                                holds=shape.protect)
    except Exception as exc:
        sys.stderr.write(f"agent-sandbox: cannot start the Landlock sandbox: {exc}\n")
        return 125
    try:
        reaper.supervise(child, watch, group=group)
    except BaseException:
        os._exit(125)


def _sandboxed(spec: dict[str, Any], tty: bool) -> int:
    """In the forked child: sandbox ourselves, then exec CMD (returns a status only on failure)."""
    try:
        shape = from_json(spec["shape"])
        if not tty:
            os.setsid()  # the command leads its own group: signals go to all of it
        os.chdir(shape.cwd)
        if "limits" in spec:  # into the session's group before CMD runs (the reaper stays out)
            from libbroker.sandbox import cgroups

            cgroups.join_self(spec["limits"])
        apply(shape)
    except Exception as exc:
        sys.stderr.write(f"agent-sandbox: cannot apply the Landlock sandbox: {exc}\n")
        return 125
    cmd = [str(a) for a in spec["argv"]]
    # Python ignores SIGPIPE and SIGXFSZ, and the reaper those it ignores;
    # an ignored disposition survives exec.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, *_REAPER_IGNORES):
        signal.signal(sig, signal.SIG_DFL)
    exec_or_exit(cmd, shape.env, prog="agent-sandbox: ")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
