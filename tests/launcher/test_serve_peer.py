"""The service's peer check by pidfd (libbroker/launcher/serve_peer.py), each way it reads.

This kernel has ``SO_PEERPIDFD`` and ``PIDFD_GET_NET_NAMESPACE``; the path
through ``/proc/PID/ns/net`` (kernels 6.5 to 6.10) is run here directly, with
a real pid handed to another process.  The whole check, with a real service and
a peer in a namespace of its own, is in test_serve.py.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
from pathlib import Path

import pytest

from libbroker.launcher import serve_peer


def spawn_as_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes] | None:
    """``argv`` started with exactly ``pid`` (just freed): the kernel's next pid set first."""
    last = Path("/proc/sys/kernel/ns_last_pid")
    for _ in range(200):
        try:
            last.write_text(str(pid - 1))
        except OSError as exc:
            pytest.skip(f"cannot set ns_last_pid ({exc.strerror}): needs CAP_SYS_ADMIN")
        proc = subprocess.Popen(argv)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def test_both_ways_name_a_live_peers_namespace() -> None:
    a, b = socket.socketpair()
    with a, b:
        pidfd, exact = serve_peer.peer_pidfd(a, os.getpid())
        try:
            assert exact  # SO_PEERPIDFD on this kernel
            assert serve_peer.netns_of(pidfd, os.getpid()) == serve_peer.own_netns()
            assert serve_peer._netns_by_proc(pidfd, os.getpid()) == serve_peer.own_netns()
        finally:
            os.close(pidfd)
        assert serve_peer.refusal(a, serve_peer.own_netns()) == ""
        assert "another network namespace" in serve_peer.refusal(a, (0, 0))


def test_a_pid_gone_to_another_process_is_no_answer_by_either_way() -> None:
    first = subprocess.Popen(["sleep", "60"])
    pidfd = os.pidfd_open(first.pid)
    try:
        first.kill()
        first.wait()  # reaped: its pid is free
        other = spawn_as_pid(first.pid, ["sleep", "60"])
        if other is None:
            pytest.skip("the freed pid went elsewhere 200 times")
        try:
            assert os.path.exists(f"/proc/{first.pid}/ns/net")  # the pid names `other` now
            for way in (serve_peer.netns_of, serve_peer._netns_by_proc):
                with pytest.raises(OSError) as caught:
                    way(pidfd, first.pid)
                assert caught.value.errno == errno.ESRCH, way
        finally:
            other.kill()
            other.wait()
    finally:
        os.close(pidfd)
