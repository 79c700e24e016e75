"""The Landlock backend's last step: apply the session's rules, then exec CMD.

The launcher starts this helper (``main`` with the arguments SPEC_FD and
LIFE_FD, through ``session.python_argv``) at the very beginning of a session,
so that importing nono-py (a 32 MB extension, ~0.2 s) overlaps the servers'
start.  It then blocks on SPEC_FD until the launcher writes the spec
(:func:`agent_sandbox.landlock_spec`, JSON, which needs the proxy's ports) and
closes it.  Applying Landlock is irreversible and inherited, so the command
and all its children stay inside; nothing of the spec comes from the
sandboxed side.

The helper does not become the command: it forks it and stays, unsandboxed,
as its reaper (:func:`libbroker.reaper.supervise`), a child subreaper that
the command cannot signal.  Signal numbers for the command come on LIFE_FD;
its end of file (the launcher ended, even by SIGKILL) kills the command; and
when the command ends, whatever it left running, setsid() or not, is killed
before the helper exits with the command's status.

Exit 125 when it cannot sandbox (fail closed: the command never runs bare).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from typing import Any

from libbroker import bpf, reaper
from libbroker.exec_command import exec_or_exit
from libbroker.launcher import seccomp
from libbroker.paths import under

_PR_SET_NO_NEW_PRIVS = 38
_REAPER_IGNORES = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM)


def _install_seccomp() -> None:
    prog = seccomp.program()
    if prog is None:
        return  # no filter for this machine: new_session is forced instead
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    bpf.install(prog)


def apply(spec: dict[str, Any]) -> None:
    """Apply the spec's Landlock rules to this process (irreversible)."""
    import nono_py

    granted = [*spec["read"], *spec["write"]]
    for deny in spec["deny"]:
        # Landlock only adds rights: a denied path inside a granted one
        # cannot be carved out, so such a config is refused, not weakened.
        if any(under(deny, g) for g in granted):
            raise ValueError(f"deny path {deny} lies inside a granted path; use the bwrap backend")
    caps = nono_py.CapabilitySet()
    for mode, paths in (
        (nono_py.AccessMode.READ, spec["read"]),
        (nono_py.AccessMode.READ_WRITE, spec["write"]),
    ):
        for p in paths:
            if os.path.isdir(p):
                caps.allow_path(p, mode)
            elif os.path.exists(p):
                caps.allow_file(p, mode)
    caps.block_network()
    for port in spec["ports"]:
        caps.allow_tcp_connect_port(int(port))
    nono_py.apply_landlock(caps)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        sys.stderr.write("usage: python3 -m libbroker.launcher.landlock_exec SPEC_FD LIFE_FD\n")
        return 125
    life = int(argv[1])
    # Now, while the servers start: the import is most of this helper's
    # cost, and the spec arrives only once they listen.  If it fails, apply() says so.
    with contextlib.suppress(ImportError):
        import nono_py  # noqa: F401
    with os.fdopen(int(argv[0]), "rb") as control:
        raw = control.read()
    if not raw:
        return 125  # the launcher gave up before the session started
    try:
        spec = json.loads(raw)
        tty = not spec.get("new_session")
        if not tty:
            os.setsid()  # out of the launcher's group; the command gets a session of its own
        # The reaper ends by its pipes, never by a signal: the terminal's keys
        # reach the whole foreground group and are the command's, and the
        # janitor's SIGTERM after a launcher's death would end it before it
        # has killed what the command left (end of file on LIFE_FD does that).
        for sig in _REAPER_IGNORES:
            signal.signal(sig, signal.SIG_IGN)
        reaper.become_subreaper()
        command = os.fork()
    except Exception as exc:
        sys.stderr.write(f"agent-sandbox: cannot start the Landlock sandbox: {exc}\n")
        return 125
    if command == 0:
        os.close(life)
        os._exit(_sandboxed(spec, tty))
    try:
        reaper.supervise(command, life, group=not tty)
    except BaseException:
        os._exit(125)


def _sandboxed(spec: dict[str, Any], tty: bool) -> int:
    """In the forked child: sandbox ourselves, then exec CMD (returns a status only on failure)."""
    try:
        if not tty:
            os.setsid()  # the command leads its own group: signals go to all of it
        os.chdir(spec["cwd"])
        apply(spec)
        _install_seccomp()
    except Exception as exc:
        sys.stderr.write(f"agent-sandbox: cannot apply the Landlock sandbox: {exc}\n")
        return 125
    cmd = [str(a) for a in spec["argv"]]
    env = {str(k): str(v) for k, v in spec["env"].items()}
    # Python ignores SIGPIPE and SIGXFSZ, and the reaper those it ignores;
    # an ignored disposition survives exec.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, *_REAPER_IGNORES):
        signal.signal(sig, signal.SIG_DFL)
    exec_or_exit(cmd, env, prog="agent-sandbox: ")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
