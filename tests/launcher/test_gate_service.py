"""``agent-sandbox gate-service`` against hostile clients: a real root service, real users.

Each refusal is one ``refused`` frame to the client and one line in the
service's log, and nothing of root's runs for it: no mount is made.  A client
that gates and then goes takes its binds with it; a service killed with a
session's binds unbinds them at its next start.  The protocol's pure rules
are tested by table in tests/policy/test_hostrun_gate_service.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gate_service_world import Service, ask, frame, mounts, running, start

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the service runs as root")

O_PATH_DIR = os.O_PATH | os.O_DIRECTORY
GATE1 = frame(b'{"op":"gate","dirs":1}')
GATE2 = frame(b'{"op":"gate","dirs":2}')


@pytest.fixture(scope="module")
def user():  # type: ignore[no-untyped-def]
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
    from as_user import ordinary_user

    found = ordinary_user()
    if found.unavailable:
        pytest.skip(found.unavailable)
    return found


@pytest.fixture()
def tree(user) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    top = Path(tempfile.mkdtemp(prefix="gate-hostile-", dir="/tmp"))
    top.chmod(0o755)
    for d in ("w/.git", "w/sub/.git", "elsewhere/.git", "roots"):
        (top / d).mkdir(parents=True)
    (top / "w/link").symlink_to("sub")
    user.own(top / "w", top / "elsewhere")  # "roots" stays root's
    yield top
    import shutil

    shutil.rmtree(top, ignore_errors=True)


def _reply(raw: bytes) -> dict[str, object]:
    assert raw, "no reply"
    found = json.loads(raw)
    assert isinstance(found, dict)
    return found


def test_hostile_clients_are_refused_with_one_line(user, tree: Path) -> None:  # type: ignore[no-untyped-def]
    with running() as service:
        cases: list[tuple[bytes, list[str], str]] = [
            (GATE1, ["roots"], "owned by uid 0, not by the peer's uid"),
            (GATE1, ["w/link"], "the workdir is not a directory"),  # an O_PATH on the link
            (GATE2, ["w", "elsewhere/.git"], "a .git does not lie beneath the workdir"),
            (GATE2, ["w", "w/sub"], "is not named .git"),
            (GATE2, ["w", "roots"], "a .git is owned by uid 0"),
            (GATE2, ["w"], "says 2 directories and came with 1 descriptors"),
            (frame(b'{"op":"gate","dirs":500}'), ["w"], "500 directories (1 to 200)"),
            (frame(b"\xff\xfenot json"), ["w"], "a frame that is not JSON"),
            (frame(b'{"op":"answer","id":1,"allow":true}'), ["w"], "a request 'answer' here"),
            (frame(b'{"op":"gate","dirs":1,"x":1}'), ["w"], "an unknown key 'x'"),
            (frame(b'{"op":"gate","dirs":true}'), ["w"], "'dirs' must be int"),
            (b"\xff\xff\xff\xff" + b"x" * 64, ["w"], "a frame length of 4294967295"),
            (b"\x00\x00", ["w"], "a frame cut short (end of file)"),
            (b"\x00\x00\x00\x40{", ["w"], "a frame cut short (timed out)"),  # it drips
            (GATE1, ["w"] * 201, f"more than {200} descriptors"),
        ]
        for data, names, line in cases:
            shut = "timed out" not in line
            def fds(names: list[str] = names) -> list[int]:
                return [os.open(tree / n, O_PATH_DIR if not n.endswith("link")
                                else os.O_PATH | os.O_NOFOLLOW) for n in names]

            reply = _reply(ask(user, service.socket, data, fds, shut=shut))
            assert reply["op"] == "refused" and line in str(reply["why"]), (line, reply)
            service.wait_log(line)
            assert mounts(tree) == [], line  # nothing of root's ran for it
        # root is served for its own directory (its launcher prefers the service: bounded)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(service.socket)
            sock.settimeout(10)
            socket.send_fds(sock, [GATE1], [os.open(tree / "roots", O_PATH_DIR)])
            assert b'"op":"ready"' in sock.recv(4096)
            assert len(mounts(tree / "roots")) == 1
        deadline = time.monotonic() + 10
        while mounts(tree) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert mounts(tree) == []
        _a_client_that_goes_takes_its_binds(user, tree, service)


def _a_client_that_goes_takes_its_binds(user, tree: Path, service: Service) -> None:  # type: ignore[no-untyped-def]
    """Gated (the workdir and its .git bound), then a second client on the same workdir is
    refused, then the first disconnects: its binds go, the service serves on."""
    def fds() -> list[int]:
        return [os.open(tree / "w", O_PATH_DIR), os.open(tree / "w/.git", O_PATH_DIR)]

    def while_gated() -> None:
        assert len(mounts(tree / "w")) == 2
        again = _reply(ask(user, service.socket, GATE2, fds))
        assert "a mount point already" in str(again["why"]), again
        inner = _reply(ask(user, service.socket, GATE1,
                           lambda: [os.open(tree / "w/sub", O_PATH_DIR)]))
        assert "lies inside, or holds, a workdir gated now" in str(inner["why"]), inner
        # then the first one closes, mid-session: the service unbinds

    reply = _reply(ask(user, service.socket, GATE2, fds, while_gated))
    assert reply == {"op": "ready", "workdir": str(tree / "w"), "gits": 1}, reply
    deadline = time.monotonic() + 10  # the connection's end or the process's, first seen
    while "ended (the" not in service.log() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "ended (the connection was lost)" in service.log() or \
        "ended (the launcher exited)" in service.log(), service.log()
    deadline = time.monotonic() + 10
    while mounts(tree) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mounts(tree) == []
    reply = _reply(ask(user, service.socket, GATE2, fds))  # still serving
    assert reply["op"] == "ready", reply


def test_a_killed_service_leaves_binds_its_next_start_removes(user, tree: Path) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the service: the kernel closes its groups (what waits is allowed) and its
    binds stay; the next start finds their record and unbinds them, with a line."""
    with running() as service:
        def fds() -> list[int]:
            return [os.open(tree / "w", O_PATH_DIR), os.open(tree / "w/.git", O_PATH_DIR)]

        def kill() -> None:
            os.kill(service.proc.pid, signal.SIGKILL)

        reply = _reply(ask(user, service.socket, GATE2, fds, kill))
        assert reply["op"] == "ready"
        service.proc.wait(timeout=10)
        assert len(mounts(tree / "w")) == 2
        assert (tree / "w/.git").is_dir()  # not held: the group went with the service
        again = start(service.base)
        service.proc = again.proc
        again.wait_log("left its live guard's mounts on")
        assert mounts(tree) == []


def test_the_launchers_side_refused_and_served(world) -> None:  # type: ignore[no-untyped-def]
    """ServiceGate (the launcher's side, in-process as root here): refused when its workdir
    is gated already (GateRefused with the service's line: the session then runs with the
    watcher alone or its own gate), else ready; its end unbinds and says nothing."""
    from launcher_world import World
    from test_hostrun_live import _repo

    from libbroker.launcher import hostrun_live, hostrun_scan
    from libbroker.launcher.hostrun_gate_client import GateRefused, ServiceGate
    from libpolicy.hostrun import Table

    assert isinstance(world, World)
    work = _repo(world)
    snap = hostrun_scan.scan(str(work), Table())
    watcher = hostrun_live.begin(snap, str(world.home / ".local/state/agent-sandbox"), "",
                                 swap=True)
    watcher.start()
    watcher.wait_ready()
    try:
        with running() as service:
            first = ServiceGate(snap, watcher, service.socket)
            first.start()
            try:
                assert len(mounts(work)) == 2
                second = ServiceGate(snap, watcher, service.socket)
                with pytest.raises(GateRefused, match="a mount point already"):
                    second.start()
                assert second.sock is None and second.under == {}  # nothing left
                assert (work / "a.txt").read_text() == "a\n"  # our own: allowed at once
            finally:
                assert first.stop() == []
            assert mounts(work) == []
            service.wait_log("ended (stop)")
    finally:
        hostrun_live.end(watcher, snap)
