"""The gate service's pure rules, by table: frames, requests, routes, directories."""

from __future__ import annotations

import re

import pytest

from libpolicy import hostrun_gate_service as proto
from libpolicy.hostrun_gate_service import ALLOW, ASK, REFUSE, Dir, FrameError

GOOD = Dir(is_dir=True, owner=1000, here=True, beneath=True, named_git=True, root=False,
           mount_point=False, in_gated=False)


@pytest.mark.parametrize(("fsuid", "tgid", "way"), [
    (0, 50, ALLOW),  # root's open: never the user's to deny
    (1001, 50, ALLOW),  # another user's
    (1000, 42, ALLOW),  # the launcher's own
    (1000, 50, ASK),  # the session's user: the launcher judges
    (None, 50, REFUSE),  # an opener that cannot be identified
    (1000, None, REFUSE),
])
def test_route(fsuid: int | None, tgid: int | None, way: str) -> None:
    assert proto.route(fsuid=fsuid, tgid=tgid, session_uid=1000, launcher=42) == way


@pytest.mark.parametrize(("change", "workdir", "why"), [
    ({}, True, None),
    ({}, False, None),
    ({"is_dir": False}, True, "the workdir is not a directory"),
    ({"owner": 0}, False, "a .git is owned by uid 0, not by the peer's uid 1000"),
    ({"root": True}, True, "the workdir is /"),
    ({"root": True}, False, None),  # (a .git is never /: only the workdir's fact)
    ({"here": False}, True, "passes through a link, or names another directory"),
    ({"beneath": False}, False, "a .git does not lie beneath the workdir"),
    ({"beneath": False}, True, None),
    ({"named_git": False}, False, "is not named .git"),
    ({"mount_point": True}, True, "a mount point already"),
    ({"in_gated": True}, True, "lies inside, or holds, a workdir gated now"),
    # the cheapest facts first: not a directory beats everything
    ({"is_dir": False, "owner": 0, "here": False}, True, "not a directory"),
    ({"owner": 0, "root": True}, True, "owned by uid 0"),
])
def test_dir_refusal(change: dict[str, object], workdir: bool, why: str | None) -> None:
    found = proto.dir_refusal(GOOD._replace(**change), workdir=workdir, peer_uid=1000)
    assert (found is None) if why is None else (found is not None and why in found), found


@pytest.mark.parametrize(("obj", "expected", "error"), [
    ({"op": "gate", "dirs": 3}, ("gate",), None),
    ({"op": "gate", "dirs": 0}, ("gate",), "0 directories"),
    ({"op": "gate", "dirs": proto.MAX_DIRS + 1}, ("gate",), "directories (1 to"),
    ({"op": "gate", "dirs": True}, ("gate",), "'dirs' must be int"),
    ({"op": "gate", "dirs": "3"}, ("gate",), "'dirs' must be int"),
    ({"op": "gate", "dirs": 1, "path": "/"}, ("gate",), "unknown key 'path'"),
    ({"op": "answer", "id": 1, "allow": True}, ("answer", "stop"), None),
    ({"op": "answer", "id": 1, "allow": 1}, ("answer", "stop"), "'allow' must be bool"),
    ({"op": "answer", "id": True, "allow": True}, ("answer", "stop"), "'id' must be int"),
    ({"op": "stop"}, ("answer", "stop"), None),
    ({"op": "gate", "dirs": 1}, ("answer", "stop"), "a request 'gate' here"),
    ({"op": "done", "removed": [".git/index.lock"]}, ("answer", "done"), None),
    ({"op": "done", "removed": "x"}, ("answer", "done"), "'removed' must be list"),
    ({"op": "done", "removed": []}, ("answer", "stop"), "a request 'done' here"),
])
def test_requests(obj: dict[str, object], expected: tuple[str, ...], error: str | None) -> None:
    if error is None:
        assert proto.request(obj, expected) is obj
    else:
        with pytest.raises(FrameError, match=re.escape(error)):
            proto.request(obj, expected)


@pytest.mark.parametrize(("header", "error"), [
    (b"\x00\x00\x00\x01", None),
    ((proto.MAX_FRAME).to_bytes(4, "big"), None),
    ((proto.MAX_FRAME + 1).to_bytes(4, "big"), "a frame length of"),
    (b"\x00\x00\x00\x00", "a frame length of 0"),
    (b"\xff\xff\xff\xff", "4294967295"),
])
def test_lengths(header: bytes, error: str | None) -> None:
    if error is None:
        assert proto.length(header) == int.from_bytes(header, "big")
    else:
        with pytest.raises(FrameError, match=re.escape(error)):
            proto.length(header)


@pytest.mark.parametrize(("body", "error"), [
    (b'{"op":"stop"}', None),
    (b"[1]", "not an object"),
    (b'{"no":"op"}', "not an object"),
    (b"\xff", "not JSON"),
    (b"{", "not JSON"),
])
def test_decode(body: bytes, error: str | None) -> None:
    if error is None:
        assert proto.decode(body) == {"op": "stop"}
    else:
        with pytest.raises(FrameError, match=re.escape(error)):
            proto.decode(body)


def test_frames_round_trip_and_are_bounded() -> None:
    data = proto.encode({"op": "ask", "id": 7, "path": "/w/x"})
    assert proto.decode(data[proto.length(data[:4]) and 4:]) == {"op": "ask", "id": 7,
                                                                  "path": "/w/x"}
    with pytest.raises(FrameError):
        proto.encode({"op": "ask", "path": "x" * proto.MAX_FRAME})
