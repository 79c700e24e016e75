"""Real sessions tell the terminal what was refused; report --propose and watch read them.

A session refused on plain HTTP (GET and HEAD), CONNECT, SOCKS5 and a loopback
address ends with one stderr line naming them; a session refused nothing ends
without one.  --propose's line keeps the configured domains and loads through
the launcher's config loader.  watch follows a live session to its end, and
neither hangs on nor follows a session whose launcher was killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launcher_world import World

from libbroker.launcher import config, config_file
from libbroker.launcher.config import DEFAULT_DOMAINS

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")

SCRIPT = r"""
exec 2>&1
curl -s --max-time 20 -o /dev/null -w 'get=%{http_code}\n' http://refused-one.test/
curl -sI --max-time 20 -o /dev/null -w 'head=%{http_code}\n' http://refused-one.test/x
curl -s --max-time 20 -o /dev/null -w 'connect=%{http_connect}\n' https://refused-one.test/
curl -s --max-time 20 -x "$ALL_PROXY" -o /dev/null http://socks-refused.test/; echo "socks=$?"
curl -s --max-time 20 -o /dev/null -w 'loopback=%{http_code}\n' http://127.0.0.1:9/
"""


def _sessions(world: World) -> Path:
    return world.home / ".local" / "state" / "agent-sandbox" / "sessions"


def _ids(world: World) -> list[str]:
    found = _sessions(world)
    return sorted(p.name.removesuffix(".jsonl") for p in found.glob("*.jsonl")) \
        if found.exists() else []


def _cli(world: World, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["agent-sandbox", *args], env=world.env(), capture_output=True,
                          text=True, check=False, timeout=timeout)


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_a_session_says_what_was_refused(world: World, tmp_path: Path, backend: str) -> None:
    done = world.run("sh", "-c", SCRIPT, sandbox=backend)
    assert done.returncode == 0, done.stderr + done.stdout
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert (seen["get"], seen["head"], seen["connect"], seen["loopback"]) == \
        ("403", "403", "403", "403"), done.stdout
    assert seen["socks"] != "0"
    [sid] = _ids(world)
    said = [line for line in done.stderr.splitlines() if line.startswith("agent-sandbox:")]
    assert said == [f"agent-sandbox: 5 requests refused (refused-one.test, "
                    f"socks-refused.test, 127.0.0.1:9): agent-sandbox report {sid}"], done.stderr
    assert done.stderr.splitlines()[-1] == said[0]  # the session's last word

    shown = _cli(world, "report", sid)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split()[:2] for line in shown.stdout.splitlines()
            if line.startswith("  refused-one.test ")]
    assert sorted(rows) == [["refused-one.test", "443"], ["refused-one.test", "80"]]

    proposed = _cli(world, "report", "--propose", sid)
    assert proposed.returncode == 0, proposed.stderr
    expected = [*DEFAULT_DOMAINS, "refused-one.test", "socks-refused.test"]
    assert proposed.stdout == f"domains = {json.dumps(expected)}\n"
    pasted = tmp_path / "pasted.toml"
    pasted.write_text(proposed.stdout)
    facts = config.HostFacts(home=str(world.home), cwd=str(world.workdir), gh_present=False)
    assert config_file.load(str(pasted), facts).domains == tuple(expected)


def test_a_session_with_nothing_refused_says_nothing(world: World) -> None:
    done = world.run("sh", "-c", "curl -s --max-time 20 -o /dev/null https://github.com/")
    assert done.returncode == 0, done.stderr
    assert "refused" not in done.stderr and "agent-sandbox report" not in done.stderr


def _wait_for_record(world: World, count: int, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 60
    while len(_ids(world)) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no session record appeared"
        time.sleep(0.05)
    return _ids(world)[-1]


def _watch(world: World, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["agent-sandbox", "watch", *args], env=world.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_watch_follows_a_live_session_to_its_end(world: World) -> None:
    gate = world.workdir / "gate"
    proc = world.launch("sh", "-c", "while [ ! -e gate ]; do sleep 0.05; done; "
                        "curl -s -o /dev/null http://watched-refusal.test/")
    sid = _wait_for_record(world, 1, proc)
    watcher = _watch(world)
    time.sleep(0.5)  # the watcher has read the start event and polls
    gate.touch()
    assert proc.wait(60) == 0
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("watching ") and sid in lines[0]
    assert any(" !! egress REFUSED watched-refusal.test:80 " in line for line in lines), out
    assert "exit 0 after" in lines[-1]


def test_watch_never_waits_on_a_killed_launcher(world: World) -> None:
    # A session whose launcher is killed while watched: watch says so and stops.
    killed = world.launch("sleep", "60")
    dead = _wait_for_record(world, 1, killed)
    watcher = _watch(world)
    time.sleep(0.5)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate(timeout=30)
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 1, (out, err)
    assert dead in out.splitlines()[0]
    gone = (f"agent-sandbox watch: session {dead} has no end event and its launcher "
            f"(pid {killed.pid}) is gone (killed?); agent-sandbox report {dead} shows what "
            "it recorded")
    assert err.splitlines() == [gone], err

    # A newer session that ended: no live one is left; watch says which and why, at once.
    done = world.run("true")
    assert done.returncode == 0, done.stderr
    newest = _ids(world)[-1]
    started = time.monotonic()
    out, err = _watch(world).communicate(timeout=30)
    assert time.monotonic() - started < 10
    assert err.splitlines() == [gone, f"agent-sandbox watch: no live session; the newest is "
                                      f"{newest} (agent-sandbox report {newest})"], err
    assert out == ""

    # Named, each is shown: the ended one to its end (0), the killed one to its cut (1).
    ended = _watch(world, newest)
    out, err = ended.communicate(timeout=30)
    assert ended.returncode == 0 and "exit 0 after" in out.splitlines()[-1], (out, err)
    cut = _watch(world, dead)
    out, err = cut.communicate(timeout=30)
    assert cut.returncode == 1 and err.splitlines() == [gone], (out, err)
    assert "session " + dead in out

    # A live session is followed past the killed one.
    live = world.launch("sleep", "60")
    _wait_for_record(world, 3, live)
    follower = _watch(world)
    time.sleep(0.5)
    live.send_signal(signal.SIGTERM)
    live.communicate(timeout=30)
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, (out, err)
    assert _ids(world)[-1] in out.splitlines()[0] and err == ""
    assert world.leftovers() == [] or _settle(world) == []


def _settle(world: World) -> list[str]:
    """The killed launcher's children go with its janitor: give them a moment."""
    deadline = time.monotonic() + 15
    while world.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    return world.leftovers()


def test_without_a_record_there_is_no_line_to_point_at_it(world: World) -> None:
    """record = false: the log has the refusal; no line names a report that does not exist."""
    done = world.run("sh", "-c", "curl -s --max-time 20 -o /dev/null http://refused-one.test/",
                     config=world.config(record=False))
    assert done.returncode == 0, done.stderr
    assert "egress-proxy refused host=refused-one.test port=80" in done.stderr
    assert "agent-sandbox report" not in done.stderr
