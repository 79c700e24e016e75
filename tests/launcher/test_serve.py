"""The resident service (agent-sandbox serve) with real sessions (docs/serve.md).

Everything is real: the service and its egress-proxy gateway, launchers,
bwrap and Landlock sandboxes, curl through the gateway to the TLS stand-in.
Two sessions run at once, each with its own canary token (its launcher's
environment: the gateway runs ``printenv`` with it) and its own record; each
tries the other's credential, broker socket, door and record.  Then: no
service (fallback), a stale socket, the service killed mid-session, the
launcher killed, and socket activation by a real parent.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from launcher_world import World
from test_serve_peer import spawn_as_pid

from libbroker.launcher import record

BACKENDS = ["bwrap", "nono"]


class Service:
    def __init__(self, proc: subprocess.Popen[str], path: Path, log: Path) -> None:
        self.proc = proc
        self.path = path
        self.log = log

    def text(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def _wait_for(pred: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start_service(world: World, argv: list[str] | None = None, **env: str) -> Service:
    path = world.runtime_parent / "agent-sandbox" / "serve.sock"
    log = world.root / f"serve-{secrets.token_hex(3)}.log"
    # The gateway trusts the stand-in's CA the way any process does (a session's
    # own upstream_ca is the whole gateway's option: such a session runs its own).
    # Its own mark: the sessions' leftovers are told from the service's own processes.
    full = world.env(SSL_CERT_FILE=str(world.standin.ca_file), AS_TEST_MARK="the-service",
                     **env)
    with log.open("w") as fh:
        proc = subprocess.Popen(argv or ["agent-sandbox", "serve"], env=full, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    service = Service(proc, path, log)
    _wait_for(lambda: "serving:" in service.text() or proc.poll() is not None, "serving")
    assert proc.poll() is None, service.text()
    return service


@pytest.fixture()
def service(world: World) -> Iterator[Service]:
    svc = start_service(world)
    yield svc
    svc.stop()


def _config(world: World, name: str, **extra: object) -> Path:
    """A config without upstream_ca (the gateway's own trust is used), token from env."""
    path = world.config(name, token_command="printenv CANARY_TOKEN", **extra)
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                            if not line.startswith("upstream_ca")))
    return path


def _token(auth: list[str]) -> str:
    """The token in the stand-in's echo of Authorization (github.com: Basic; api.: Bearer)."""
    assert len(auth) == 1, auth
    kind, value = auth[0].split(" ", 1)
    if kind == "Basic":
        return base64.b64decode(value).decode().removeprefix("x-access-token:")
    return value


def _kv(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _records(world: World) -> dict[str, list[dict[str, object]]]:
    sessions = world.home / ".local" / "state" / "agent-sandbox" / "sessions"
    out = {}
    for path in sorted(sessions.glob("*.jsonl")):
        assert record.verify(str(path)) == [], path
        out[path.name] = record.events(str(path))
    return out


def _descendants(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(p) for p in fh.read().split()]
    except OSError:
        return []
    return out + [d for p in out for d in _descendants(p)]


def _brokers(service: Service) -> list[int]:
    """The sessions' brokers: what the service's zygote has forked and is still there."""
    zygote = re.search(r"broker zygote pid (\d+)", service.text())
    assert zygote, service.text()
    return _descendants(int(zygote.group(1)))


def _own_leftovers(world: World, service: Service | None = None) -> list[str]:
    """Leftovers but the service's own entries (its socket and its private dir)."""
    found = [line for line in world.leftovers() if "/agent-sandbox/serve" not in line]
    if service is not None and service.proc.poll() is None:
        found += [f"broker pid {pid}" for pid in _brokers(service)]
    return found


# B: says where its broker socket, door and credential are, then waits.
HOLDER = r"""
echo "cred=$(printf %s "$HTTPS_PROXY" | sed 's,^http://,,; s,@.*,,')" > "$PWD/b.info.tmp"
echo "broker=$AGENT_SANDBOX_BROKER_SOCKET" >> "$PWD/b.info.tmp"
echo "door=$AGENT_SANDBOX_BROKER_DOOR" >> "$PWD/b.info.tmp"
echo "rt=$(dirname "$AGENT_SANDBOX_POLICY")" >> "$PWD/b.info.tmp"
mv "$PWD/b.info.tmp" "$PWD/b.info"
echo "fetch=$(curl -sS --max-time 20 https://api.github.com/b-path)"
i=0; while [ ! -e "$PWD/b.done" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
"""

# A: with B's facts in its workdir, tries each of B's things, and its own fetch.
PROBER = r"""
. "$PWD/other.env"
pass=${cred#*:}
echo "fetch=$(curl -sS --max-time 20 https://github.com/a-path)"
case "$HTTPS_PROXY" in *"$pass"*) echo own_cred_is_b=yes;; *) echo own_cred_is_b=no;; esac
found=0
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  grep -qs -- "$pass" "$f" && found=$((found+1))
done
echo "b_cred_in_proc=$found"
# (other.env, which the test wrote here, excepted)
echo "b_cred_in_files=$(grep -rls -- "$pass" /tmp "$HOME" "$(dirname "$rt")" 2>/dev/null \
    | grep -vc "/other.env$")"
python3 - "$broker" "$door" "$rt" <<'EOF'
import os, socket, sys
broker, door, rt = sys.argv[1:]
def attempt(fam, addr):
    try:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(addr)
        s.close()
        return "connected"
    except OSError as e:
        return "refused:" + (e.strerror or type(e).__name__)
print("b_broker=" + attempt(socket.AF_UNIX, broker))
print("b_door=" + (attempt(socket.AF_INET, ("127.0.0.1", int(door))) if door else "none"))
try:
    print("b_runtime=" + ",".join(os.listdir(rt)))
except OSError as e:
    print("b_runtime=refused:" + (e.strerror or "?"))
serve = os.path.join(os.path.dirname(rt), "serve.sock")
print("serve_socket=" + attempt(socket.AF_UNIX, serve))
EOF
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_concurrent_sessions_share_the_gateway_and_nothing_else(
    world: World, service: Service, backend: str
) -> None:
    tok_a = "tok-" + secrets.token_hex(8) + "-A-CANARY"
    tok_b = "tok-" + secrets.token_hex(8) + "-B-CANARY"
    work_a, work_b = world.root / "work-a", world.root / "work-b"
    work_a.mkdir()
    work_b.mkdir()
    cfg_a = _config(world, "a.toml", workdir=str(work_a))
    cfg_b = _config(world, "b.toml", workdir=str(work_b))
    b = world.launch("sh", "-c", HOLDER, config=cfg_b, sandbox=backend, cwd=str(work_b),
                     env=world.env(CANARY_TOKEN=tok_b))
    try:
        _wait_for(lambda: (work_b / "b.info").exists() or b.poll() is not None, "B's facts", 90)
        assert b.poll() is None, b.communicate()
        info = _kv((work_b / "b.info").read_text())
        (work_a / "other.env").write_text("".join(f"{k}='{v}'\n" for k, v in info.items()))
        a = world.run("sh", "-c", PROBER, config=cfg_a, sandbox=backend, cwd=str(work_a),
                      env=world.env(CANARY_TOKEN=tok_a))
    finally:
        (work_b / "b.done").touch()
        out_b, err_b = b.communicate(timeout=90)
    assert b.returncode == 0, err_b
    assert a.returncode == 0, a.stderr
    got_a, got_b = _kv(a.stdout), _kv(out_b)
    # Each session's request carried its own token (its launcher's environment), only.
    assert _token(json.loads(got_a["fetch"])["authorization"]) == tok_a
    assert _token(json.loads(got_b["fetch"])["authorization"]) == tok_b
    # Both were the service's tenants (no egress-proxy of their own).
    assert service.text().count("tenant added") == 2, service.text()
    assert info["cred"].startswith("s") and len(info["cred"].split(":", 1)[1]) == 64
    # B's credential is nowhere A can read; B's broker, door and runtime dir are shut.
    assert got_a["own_cred_is_b"] == "no"
    assert got_a["b_cred_in_proc"] == "0", got_a
    assert got_a["b_cred_in_files"] == "0", got_a
    assert got_a["b_broker"].startswith("refused:"), got_a
    assert got_a["b_door"] == "none" if backend == "bwrap" else got_a["b_door"].startswith(
        "refused:"), got_a
    assert got_a["b_runtime"].startswith("refused:"), got_a
    assert got_a["serve_socket"].startswith("refused:"), got_a
    # Each record holds its own session's decisions only.
    recs = _records(world)
    assert len(recs) == 2, recs.keys()
    by_cmd = {}
    for events in recs.values():
        start = events[0]
        assert isinstance(start["cmd"], list)
        who = "b" if "b.done" in start["cmd"][2] else "a"
        by_cmd[who] = [(e.get("host"), e.get("verdict")) for e in events if e["ev"] == "egress"]
        text = json.dumps(events)
        assert tok_a not in text and tok_b not in text
        assert info["cred"].split(":", 1)[1] not in text
    assert by_cmd["a"] == [("github.com", "allowed")], by_cmd
    assert by_cmd["b"] == [("api.github.com", "allowed")], by_cmd
    # B's credential died with B: the gateway answers it 407 now.
    port = int(service.text().split("gateway http 127.0.0.1:")[1].split(",")[0])
    stale = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--proxy",
         f"http://127.0.0.1:{port}", "--proxy-user", info["cred"], "http://github.com/"],
        capture_output=True, text=True, check=False)
    assert stale.stdout == "407", stale
    assert "session " in service.text() and service.text().count("ended (") == 2
    assert _own_leftovers(world, service) == []


def test_without_a_service_the_session_starts_its_own_proxy(world: World) -> None:
    cfg = world.config("own.toml", token_command="printenv CANARY_TOKEN")
    tok = "tok-" + secrets.token_hex(8)
    done = world.run("sh", "-c", 'echo "proxy=$HTTPS_PROXY"; echo "fetch=$(curl -sS '
                     'https://api.github.com/x)"', config=cfg, env=world.env(CANARY_TOKEN=tok))
    assert done.returncode == 0, done.stderr
    got = _kv(done.stdout)
    assert "@" not in got["proxy"]  # no tenant credential: its own proxy
    assert _token(json.loads(got["fetch"])["authorization"]) == tok
    assert world.leftovers() == []


def test_an_environment_too_large_for_the_gateway_runs_its_own_proxy(
    world: World, service: Service
) -> None:
    cfg = _config(world, "big.toml")  # no upstream_ca: the size alone decides
    big = world.env(CANARY_TOKEN="tok-big", BIG_VARIABLE="x" * (60 * 1024))
    done = world.run("sh", "-c", 'echo "proxy=$HTTPS_PROXY"; broker-client -- true && echo ok=1',
                     config=cfg, env=big)
    assert done.returncode == 0, done.stderr
    got = _kv(done.stdout)
    assert "@" not in got["proxy"] and got["ok"] == "1"
    assert "tenant added" not in service.text()
    assert _own_leftovers(world, service) == []


def test_a_stale_socket_means_no_service_and_serve_replaces_it(world: World) -> None:
    path = world.runtime_parent / "agent-sandbox" / "serve.sock"
    path.parent.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # a socket file nobody listens on: a service killed by SIGKILL
    cfg = _config(world, "stale.toml")
    done = world.run("sh", "-c", 'echo "proxy=$HTTPS_PROXY"', config=cfg,
                     env=world.env(CANARY_TOKEN="tok-x"))
    assert done.returncode == 0, done.stderr
    assert "@" not in _kv(done.stdout)["proxy"]
    svc = start_service(world)
    try:
        assert "replaced a stale socket" in svc.text()
        assert (path.stat().st_mode & 0o777) == 0o600
        done = world.run("sh", "-c", 'echo "proxy=$HTTPS_PROXY"', config=cfg,
                         env=world.env(CANARY_TOKEN="tok-x"))
        assert done.returncode == 0, done.stderr
        assert "@127.0.0.1:" in _kv(done.stdout)["proxy"]
    finally:
        assert svc.stop() == 0
    assert not path.exists()
    # A live service is never replaced: a second one refuses, and the first serves on.
    first = start_service(world)
    try:
        second = subprocess.run(["agent-sandbox", "serve"], env=world.env(), text=True,
                                capture_output=True, timeout=60, check=False)
        assert second.returncode == 2 and "already listens" in second.stderr, second
        assert first.proc.poll() is None
    finally:
        first.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_service_killed_mid_session_ends_the_session_closed(
    world: World, service: Service, backend: str
) -> None:
    cfg = _config(world, "kill.toml")
    script = (
        'curl -sS https://github.com/before >/dev/null && echo before=ok\n'
        'broker-client -- true && echo brokered=ok\n'
        'touch "$PWD/up"\n'
        'i=0; while [ $i -lt 300 ]; do\n'
        '  curl -sS --max-time 2 https://github.com/during >/dev/null 2>&1 && echo during=ok\n'
        '  sleep 0.1; i=$((i+1)); done\n'
    )
    proc = world.launch("sh", "-c", script, config=cfg, sandbox=backend,
                        env=world.env(CANARY_TOKEN="tok-" + secrets.token_hex(8)))
    _wait_for(lambda: (world.workdir / "up").exists() or proc.poll() is not None, "up", 90)
    ours = _descendants(service.proc.pid)  # its gateway, its zygote, the session's broker
    assert len(ours) >= 3, ours
    service.proc.send_signal(signal.SIGKILL)
    service.proc.wait(timeout=10)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    assert "resident service (agent-sandbox serve) went away" in err, err
    assert _kv(out).get("before") == "ok" and _kv(out).get("brokered") == "ok"
    # The gateway went with the service (PR_SET_PDEATHSIG): nothing serves its port.
    _wait_for(lambda: _own_leftovers(world) == [], "the session's processes to go", 30)
    _wait_for(lambda: not any(os.path.exists(f"/proc/{pid}/exe") for pid in ours),
              "the gateway, the zygote and the broker to go", 30)


def test_a_session_that_brokers_nothing_gets_no_broker(world: World, service: Service) -> None:
    cfg = _config(world, "none.toml")
    proc = world.launch("sh", "-c", 'touch "$PWD/up"; sleep 60', config=cfg,
                        env=world.env(CANARY_TOKEN="tok-n"))
    try:
        _wait_for(lambda: (world.workdir / "up").exists() or proc.poll() is not None, "up", 90)
        assert "tenant added" in service.text()
        assert _brokers(service) == []  # the zygote forks on the first brokered connection
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert _own_leftovers(world, service) == []


def test_a_killed_launcher_removes_its_tenant(world: World, service: Service) -> None:
    cfg = _config(world, "k.toml")
    proc = world.launch("sh", "-c", 'broker-client -- true && touch "$PWD/up"; sleep 60',
                        config=cfg, env=world.env(CANARY_TOKEN="tok-x"))
    _wait_for(lambda: (world.workdir / "up").exists() or proc.poll() is not None, "up", 90)
    assert "tenant added" in service.text()
    assert len(_brokers(service)) == 1  # the session's broker, forked by the zygote
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    _wait_for(lambda: "tenant removed" in service.text(), "the tenant's removal", 30)
    _wait_for(lambda: _own_leftovers(world, service) == [], "the janitor's cleanup", 60)
    assert service.proc.poll() is None  # one session's end is not the service's


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_brokered_command_runs_as_the_launcher_would_run_it(
    world: World, service: Service, backend: str
) -> None:
    cfg = _config(world, "b.toml")
    # The launcher's umask and working directory, not the service's (022, /).
    inner = ("broker-client -- sh -c 'echo \"umask=$(umask)\"; echo \"cwd=$PWD\"; "
             "echo \"sandboxed=$AGENT_SANDBOX\"'")
    argv = ["sh", "-c", 'umask 027; exec "$@"', "sh", "agent-sandbox", "run",
            f"--config={cfg}", f"--sandbox={backend}", "--", "sh", "-c", inner]
    done = subprocess.run(argv, env=world.env(CANARY_TOKEN="tok-b"), cwd=str(world.workdir),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = _kv(done.stdout)
    assert got == {"umask": "0027", "cwd": str(world.workdir), "sandboxed": "1"}, done.stdout
    assert "tenant added" in service.text()  # it was the service's session
    assert _own_leftovers(world, service) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gateways_lines_for_a_session_reach_its_stderr(
    world: World, service: Service, backend: str
) -> None:
    cfg = _config(world, "log.toml")
    done = world.run("sh", "-c", "curl -sS https://denied.invalid/ 2>/dev/null; echo done=1",
                     config=cfg, sandbox=backend, env=world.env(CANARY_TOKEN="tok-l"))
    assert done.returncode == 0, done.stderr
    assert "tenant added" in service.text()
    # As its own proxy's refusal line would (stderr is no terminal here), tagged.
    lines = [line for line in done.stderr.splitlines() if "egress-proxy refused" in line]
    assert len(lines) == 1 and "host=denied.invalid" in lines[0], done.stderr
    assert "tenant=s" in lines[0]
    assert "1 request refused (denied.invalid)" in done.stderr  # from the record, as before


def test_a_request_that_is_no_session_is_refused_with_a_line(
    world: World, service: Service
) -> None:
    for line in (b"{nope\n", b'{"op":"add","tenant":"x"}\n',
                 b'{"op":"session","tenant":"s1","password":"p","extra":1}\n',
                 b'{"op":"broker","env":{},"cwd":"/","umask":18}\n',  # no descriptors
                 b'{"op":"broker","env":{"A":1},"cwd":"/","umask":18}\n'):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(service.path))
            s.sendall(line)
            answer = json.loads(s.makefile().readline())
        assert answer["ok"] is False and answer["error"]
    # A password the gateway refuses is refused, and never shown.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(service.path))
        s.sendall(b'{"op":"session","tenant":"s1","password":"short-secret-x"}\n')
        answer = json.loads(s.makefile().readline())
    assert answer["ok"] is False and "short-secret-x" not in answer["error"] + service.text()
    assert service.text().count("refused a session") == 5
    assert service.proc.poll() is None


# A peer in a network namespace of its own (a sandbox's) connects, hands the
# connection to its child and exits; its pid then goes to a process in the
# service's namespace.  A check by pid would read that process's namespace.
# The request waits in the socket while the service is stopped.
RECYCLED_PEER = r"""
import json, os, secrets, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
os.write(1, b"%d\n" % os.getpid())
if os.fork():
    os._exit(0)
s.sendall(json.dumps({"op": "session", "tenant": "s" + secrets.token_hex(8),
                      "password": secrets.token_hex(32), "policy": {}}).encode() + b"\n")
os.write(1, b"%d\n" % os.getpid())  # (after the request: it is there before the accept)
print(s.makefile().readline(), end="", flush=True)
"""


def test_a_peer_whose_pid_went_to_another_process_is_refused(
    world: World, service: Service
) -> None:
    if not os.access("/usr/bin/unshare", os.X_OK):
        pytest.skip("unshare is not installed")
    service.proc.send_signal(signal.SIGSTOP)  # it accepts (and checks) once all is in place
    stat = Path(f"/proc/{service.proc.pid}/stat")
    _wait_for(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", "the stop")
    holder = sleeper = None
    try:
        peer = subprocess.Popen(["/usr/bin/unshare", "-rn", sys.executable, "-c", RECYCLED_PEER,
                                 str(service.path)],
                                stdout=subprocess.PIPE, text=True)
        assert peer.stdout is not None
        connected = int(peer.stdout.readline())
        holder = int(peer.stdout.readline())
        assert peer.wait(timeout=30) == 0  # reaped: its pid is free
        sleeper = spawn_as_pid(connected, ["sleep", "60"])  # in the service's namespace
        if sleeper is None:
            pytest.skip("the freed pid went elsewhere 200 times")
        service.proc.send_signal(signal.SIGCONT)
        line = peer.stdout.readline()
        assert line, service.text()
        answer = json.loads(line)
    finally:
        service.proc.send_signal(signal.SIGCONT)
        for pid in (holder,):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
    assert answer["ok"] is False, answer
    assert f"peer pid {connected} has exited since it connected" in answer["error"], answer
    assert "tenant added" not in service.text() and "refused a session" in service.text()
    assert service.proc.poll() is None


def test_the_socket_is_private(world: World, service: Service) -> None:
    assert (service.path.stat().st_mode & 0o777) == 0o600
    assert (service.path.parent.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("parent", ["systemd-socket-activate", "python"])
def test_serve_accepts_an_activated_socket(world: World, parent: str) -> None:
    tool = "/usr/bin/systemd-socket-activate"
    path = world.runtime_parent / "agent-sandbox" / "serve.sock"
    path.parent.mkdir(mode=0o700)
    if parent == "systemd-socket-activate" and not os.access(tool, os.X_OK):
        pytest.skip("systemd-socket-activate is not installed")
    if parent == "systemd-socket-activate":
        # It passes on only the variables named (systemd gives its own environment).
        keep = [f"-E{name}" for name in ("PATH", "HOME", "XDG_RUNTIME_DIR", "SSL_CERT_FILE")]
        argv = [tool, "-l", str(path), *keep, "agent-sandbox", "serve"]
    else:  # a small real parent: bind on fd 3, then exec the service in the same pid
        code = ("import os, socket, sys\n"
                "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
                "os.dup2(s.fileno(), 3) if s.fileno() != 3 else os.set_inheritable(3, True)\n"
                "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()))\n"
                "os.execvp('agent-sandbox', ['agent-sandbox', 'serve'])\n")
        argv = [sys.executable, "-c", code, str(path)]
    log = world.root / "activated.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, env=world.env(SSL_CERT_FILE=str(world.standin.ca_file)),
                                stdout=fh, stderr=subprocess.STDOUT, text=True)
    svc = Service(proc, path, log)
    try:
        _wait_for(lambda: path.exists(), "the activated socket")
        # The first connection starts the service (systemd-socket-activate execs on accept).
        cfg = _config(world, "act.toml")
        done = world.run("sh", "-c", 'echo "proxy=$HTTPS_PROXY"; echo "fetch=$(curl -sS '
                         'https://api.github.com/x)"', config=cfg,
                         env=world.env(CANARY_TOKEN="tok-activated"))
        assert done.returncode == 0, done.stderr + svc.text()
        got = _kv(done.stdout)
        assert "@127.0.0.1:" in got["proxy"], svc.text()
        assert _token(json.loads(got["fetch"])["authorization"]) == "tok-activated"
        assert "serving:" in svc.text() and "tenant added" in svc.text()
    finally:
        svc.stop()


def test_the_systemd_units_verify() -> None:
    tool = "/usr/bin/systemd-analyze"
    if not os.access(tool, os.X_OK):
        pytest.skip("systemd-analyze is not installed")
    units = Path(__file__).parents[2] / "contrib" / "systemd"
    env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR") or "/tmp"}
    done = subprocess.run([tool, "verify", str(units / "agent-sandbox.socket"),
                           str(units / "agent-sandbox.service")],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    text = (units / "agent-sandbox.socket").read_text()
    assert "SocketMode=0600" in text and "%t/agent-sandbox/serve.sock" in text
