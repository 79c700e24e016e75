"""The session's janitor: cleans up after a launcher killed by SIGKILL.

Started by :class:`.supervise.Janitor` as its own process group (so no
terminal signal reaches it) with two arguments: the read end of a pipe and
the runtime directory.  The launcher writes ``PID GROUP`` lines to the pipe
for every child, and ``done`` once it has cleaned up itself.  End of file
without ``done`` means the launcher died: the janitor ends the children
(SIGTERM, a grace, SIGKILL; the sandbox, started last, first), sweeps the
workdir's host-run files (:mod:`.hostrun_guard`) and removes the runtime
directory.  Standard library only, little of it: this starts beside
the servers.
"""

from __future__ import annotations

import os
import select
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import signal
else:
    # The C module: signal.py's enum import and conversions would double this
    # process's start-up, which competes with the servers' for the cores.
    import _signal as signal


def _read_watch_list(r: int) -> list[tuple[int, int, bool]] | None:
    """(pid, pidfd, own group) per child until end of file; None after ``done``."""
    watched: list[tuple[int, int, bool]] = []
    buf = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            return watched
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line == b"done":
                return None
            pid_s, group_s = line.split()
            try:
                watched.append((int(pid_s), os.pidfd_open(int(pid_s)), group_s == b"1"))
            except OSError:
                continue  # already gone


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        return  # the group is gone already


def _end(pid: int, fd: int, group: bool) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if group:
            _killpg(pid, sig)
        try:
            signal.pidfd_send_signal(fd, sig)
        except OSError:
            return
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if poller.poll(3000):
            return


def _release_mounts_and_cgroups(runtime_dir: str) -> None:
    """The kernel's part of the session: its cgroups, the live gate's mounts."""
    # The session's cgroup (named in the runtime dir), and any group left by a
    # process now gone: the launcher's, the broker's commands'.
    try:
        from libbroker.sandbox import cgroups

        cgroups.remove_recorded(runtime_dir)
        cgroups.reclaim()
    except Exception as exc:  # the runtime dir is removed whatever happened
        sys.stderr.write(f"agent-sandbox-janitor: removing the session's cgroup failed: {exc}\n")
    # The live gate's mounts first (libbroker.launcher.hostrun_binds): the launcher's
    # death closed its fanotify group, so nothing holds the host's opens any more.
    try:
        from libbroker.launcher.hostrun_binds import release

        for line in release(runtime_dir):
            sys.stderr.write(line + "\n")
    except Exception as exc:  # the rest runs whatever happened
        sys.stderr.write(f"agent-sandbox-janitor: unbinding the live gate failed: {exc}\n")


def _put_the_host_back(runtime_dir: str) -> None:
    """As the launcher would have: the git configs merged, the host-run files swept,
    the agent's config written back; each step runs whatever the one before did."""
    # The repositories' configs next: links back to files, the session's
    # allowed keys merged (libbroker.launcher.hostrun_gitconfig), so the sweep keeps them.
    try:
        from libbroker.launcher.hostrun_gitconfig import janitor_finish

        for line in janitor_finish(runtime_dir):
            sys.stderr.write(line + "\n")
    except Exception as exc:  # the sweep runs whatever happened; a later start repairs
        sys.stderr.write(f"agent-sandbox-janitor: the git config merge failed: {exc}\n")
    # Then the host-run files, from the snapshot the launcher's scan left in
    # the runtime dir (lines go to the quarantine's sweep.log: no terminal here).
    try:
        from libbroker.launcher import gitdir_guard
        from libbroker.launcher.hostrun_guard import janitor_sweep

        janitor_sweep(runtime_dir)
        gitdir_guard.janitor_sweep(runtime_dir)  # git dirs outside the workdir
    except Exception as exc:  # the runtime dir is removed whatever happened
        sys.stderr.write(f"agent-sandbox-janitor: the host-run sweep failed: {exc}\n")
    # The agent's private config: what is safe goes back to the user's real
    # one (libbroker.launcher.agent_home), as the launcher would have done.
    try:
        from libbroker.launcher.agent_home import write_back

        for problem in write_back(runtime_dir):
            sys.stderr.write(f"agent-sandbox-janitor: not written back: {problem}\n")
    except Exception as exc:  # the runtime dir is removed whatever happened
        sys.stderr.write(f"agent-sandbox-janitor: the agent config write-back failed: {exc}\n")


def _remove_runtime_dir(runtime_dir: str) -> None:
    import shutil

    deadline = time.monotonic() + 5
    shutil.rmtree(runtime_dir + ".host", ignore_errors=True)  # runtime.Runtime.host_only
    while time.monotonic() < deadline and os.path.exists(runtime_dir):
        shutil.rmtree(runtime_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[0].isdigit():
        sys.stderr.write("usage: python3 -m libbroker.launcher.janitor FD RUNTIME_DIR\n")
        return 2
    r, runtime_dir = int(argv[0]), argv[1]
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_IGN)
    watched = _read_watch_list(r)
    if watched is None:
        # The launcher cleaned up itself and waits to reap us: nothing to
        # flush or finalize, so skip the interpreter's teardown (ms of its tail).
        os._exit(0)
    # The launcher is gone without cleaning up: the session ends here.
    for pid, fd, group in reversed(watched):
        _end(pid, fd, group)
    _release_mounts_and_cgroups(runtime_dir)
    _put_the_host_back(runtime_dir)
    _remove_runtime_dir(runtime_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
