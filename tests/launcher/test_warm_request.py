"""The warm run's request (libbroker/launcher/warm_request.py) and the client's JSON.

Pure: the check the service and the launcher zygote both apply, the wait
status as an exit code, and the client's ``_json``-only encoding, which must
say exactly what ``json`` says.  The real runs are in test_serve_warm.py.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from libbroker.launcher import warm_client, warm_request

SECRET = "s3cret-VALUE-in-argv"


def _good() -> dict[str, object]:
    frame = json.loads(warm_client.request(["run", "--", "echo", SECRET]))
    assert isinstance(frame, dict)
    return frame


def test_the_clients_own_request_passes_the_check() -> None:
    frame = warm_request.check(_good())
    assert frame["argv"] == ["run", "--", "echo", SECRET]
    assert frame["env"] == dict(os.environ)


@pytest.mark.parametrize(("key", "value", "why"), [
    ("op", "session", "not a launch request"),
    ("argv", [], "'argv'"),
    ("argv", ["run", SECRET + "\0"], "'argv'"),
    ("argv", SECRET, "'argv'"),
    ("env", {"A": 1}, "'env'"),
    ("env", {"A=B": SECRET}, "'env'"),
    ("env", {"": SECRET}, "'env'"),
    ("umask", 0o1000, "'umask'"),
    ("umask", True, "'umask'"),
    ("rlimits", [[7, 1]], "'rlimits'"),
    ("rlimits", [[64, 1, 1]], "'rlimits'"),
    ("rlimits", [[7, -2, 1]], "'rlimits'"),
    ("nice", 20, "'nice'"),
    ("ids", [0, 0, 0, 0], "'ids'"),
    ("ids", [0, 0, 0, 0, ["x"]], "'ids'"),
    ("signals", {"ignored": [65], "blocked": []}, "'signals'"),
    ("signals", {"ignored": []}, "'signals'"),
    ("install", [SECRET], "'install'"),
    ("privs", ["0"], "'privs'"),
    ("privs", [SECRET * 3] * 7, "'privs'"),
    ("extra", 1, "unknown key 'extra'"),
])
def test_a_malformed_request_is_refused_without_quoting_it(
    key: str, value: object, why: str
) -> None:
    frame = {**_good(), key: value}
    with pytest.raises(ValueError, match=why) as refused:
        warm_request.check(frame)
    assert SECRET not in str(refused.value)


def test_a_missing_key_is_named() -> None:
    frame = _good()
    del frame["nice"]
    with pytest.raises(ValueError, match="no 'nice'"):
        warm_request.check(frame)
    with pytest.raises(ValueError, match="not a launch request"):
        warm_request.check([SECRET])


def test_a_wait_status_is_the_launchers_exit_code() -> None:
    assert warm_request.exit_code(0) == 0
    assert warm_request.exit_code(3 << 8) == 3
    assert warm_request.exit_code(255 << 8) == 255
    assert warm_request.exit_code(signal.SIGTERM) == 128 + 15
    assert warm_request.exit_code(signal.SIGKILL | 0x80) == 128 + 9  # core dumped


@pytest.mark.parametrize("value", [
    {"op": "launch", "argv": ["a\"b\\c", "é", "\udcff", "\x01\n"], "n": [-1, 0, 2**64 - 1]},
    {"ok": True, "pid": 12}, {"ok": False, "error": "x"}, {"status": 256}, [], {}, "s", 0,
])
def test_the_clients_json_is_jsons(value: object) -> None:
    assert warm_client.dumps(value) == json.dumps(value, separators=(",", ":")).encode()
    assert warm_client.loads(warm_client.dumps(value)) == value
    assert warm_client.loads(json.dumps(value, indent=1).encode()) == value


@pytest.mark.parametrize("data", [b"", b"{nope", b'{"a":1} x', b"\xff", b"NaN", b'{"a":'])
def test_the_client_refuses_what_is_not_one_json_value(data: bytes) -> None:
    with pytest.raises(ValueError):
        warm_client.loads(data)
