"""Start without waiting (docs/fast-start.md): the launcher binds the servers' sockets.

The command starts while the servers finish starting.  A connection made
before a server serves waits in the socket's backlog and is answered; a
server that dies at start ends the session with one clear line, status 1, and
nothing left running.  Real sessions, real servers; the slowness is a real
one of egress-proxy's: it accepts nothing before its first token has been
read (tokens.FIRST_WAIT), and here the token command answers only once the
command inside has asked.
"""

from __future__ import annotations

import base64
import json
import shutil
import time

import pytest
from launcher_world import TOKEN, World

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")

BACKENDS = ["bwrap", "nono"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_made_before_the_proxy_serves_waits_and_is_answered(
    world: World, backend: str
) -> None:
    asked = world.workdir / "asked"
    served = world.workdir / "served"
    # The proxy's first token (read before it accepts anything) comes only
    # after the command inside has started and is about to connect.
    token = (
        f"sh -c 'while [ ! -e {asked} ]; do sleep 0.02; done; "
        f"touch {served}; cat {world.home}/.config/token'"
    )
    inside = (
        "test -e served && echo served-before-start; touch asked; "
        "curl -sS --max-time 60 https://github.com/early"
    )
    done = world.run("sh", "-c", inside, config=world.config(token_command=token),
                     sandbox=backend)
    assert done.returncode == 0, done.stderr
    assert "served-before-start" not in done.stdout  # the command ran before the proxy served
    seen = json.loads(done.stdout)
    assert seen["path"] == "/early"
    want = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert seen["authorization"] == [want]  # answered, token and all: never refused
    assert served.exists()
    assert world.leftovers() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_proxy_that_dies_at_start_ends_the_session(world: World, backend: str) -> None:
    # The token command kills its parent, egress-proxy, during its first-token
    # wait: after it handed its `listening` lines, before it served.
    token = "sh -c 'kill -KILL $PPID'"
    py = f"import time; time.sleep(300)  # {world.mark}"
    done = world.run("python3", "-c", py, config=world.config(token_command=token),
                     sandbox=backend)
    assert done.returncode == 1, done.stderr
    # Before go ("exited with status -9 while starting") or after it ("exited
    # unexpectedly (status -9); ... the session was ended"): one line either way.
    assert "egress-proxy exited" in done.stderr
    assert "status -9" in done.stderr
    assert "Traceback" not in done.stderr
    assert world.leftovers() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_broker_that_cannot_start_ends_the_session(world: World, backend: str) -> None:
    # A sign key that reads as an option passes the launcher and is refused by
    # broker-server as it starts: on the command's first brokered call
    # (lazy_broker), which gets no answer (125, unless the session's end comes first).
    py = f"import time; time.sleep(300)  # {world.mark}"
    inside = f"broker-client -- true; echo client=$?; python3 -c '{py}'"
    done = world.run("sh", "-c", inside, config=world.config(sign_key="-bad-key"),
                     sandbox=backend)
    assert done.stdout in ("", "client=125\n")
    assert done.returncode == 1, done.stderr
    assert "broker-server exited" in done.stderr
    assert "-bad-key" in done.stderr
    assert "Traceback" not in done.stderr
    assert world.leftovers() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_broker_starts_on_the_first_brokered_call_only(world: World, backend: str) -> None:
    """No broker-server in a session that has brokered nothing yet; the first call starts
    it and is answered (it waited in the backlog), the next one reaches the same server."""
    ran, go_on = world.workdir / "ran", world.workdir / "go-on"
    inside = (
        f"touch {ran}; while [ ! -e {go_on} ]; do sleep 0.05; done; "
        "broker-client -- sh -c 'echo first $AGENT_SANDBOX'; broker-client -- echo second"
    )
    proc = world.launch("sh", "-c", inside, sandbox=backend)
    deadline = time.monotonic() + 60
    while not ran.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    # The session's processes carry the world's mark; the broker's boot names itself.
    brokers = [line for line in world.leftovers() if "'broker-server'" in line]
    go_on.touch()
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert brokers == []  # the command ran, and no broker had been started
    assert out.splitlines() == ["first 1", "second"]
    assert world.leftovers() == []
