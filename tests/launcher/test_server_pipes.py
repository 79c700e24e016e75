"""The session's poller over its servers' pipes (libbroker/launcher/servers.py).

A pipe can be named twice in one poll batch: the service's link ends, the
drain that follows reads every pipe to its end of file, and the same batch
still holds that pipe's own hang-up.  That second end of file once ended a
session with "internal error: KeyError" instead of its closed end
(test_serve's service killed mid-session, 2 runs in 3).  A real child and
its real pipes here.
"""

from __future__ import annotations

from libbroker.launcher import supervise
from libbroker.launcher.servers import ServerPipes


def test_a_pipe_drained_to_its_end_then_polled_again_is_no_error() -> None:
    child = supervise.spawn("a-server", ["sh", "-c", "echo said; printf 'no newline' >&2"])
    try:
        pipes = ServerPipes()
        pipes.watch(child)
        assert child.proc.wait() == 0
        events = pipes.poller.poll(5000)  # both pipes at their end (and readable)
        assert {fd for fd, _ in events} == set(pipes.owners)
        pipes.drain_all(None)  # as the link's end does: what each pipe holds,
        pipes.drain_all(None)  # then (as a later drain) its end of file
        for fd, _ in events:  # then the same batch's own events
            assert pipes.read_lines(fd, None) == []
        assert list(child.tail) == ["said", "no newline"]  # each line once, the last too
        assert pipes.early == ["no newline"]
        assert pipes.poller.poll(0) == []  # nothing left registered that is at its end
    finally:
        child.close()

