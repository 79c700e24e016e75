"""What each per-call path may import: a budget, enforced.

The hot paths, and why they are hot:

- **broker-client** runs once per brokered command (``broker-client -- make``,
  every ``git push`` an agent asks the host for);
- **policy-hook in hook mode** runs before every file-tool call Claude Code
  makes (Read, Edit, Grep, ...);
- **gpg-shim's signing path** runs once per signature git asks for (each
  ``commit -S``, each commit of a rebase);
- **the launcher's prestart** runs before a session's two servers are spawned:
  everything it imports delays both of them (libbroker/launcher/prestart.py);
- **egress-proxy between its arguments and its ``listening`` line**: the
  session waits for that line, so everything on the way is imported before the
  arguments arrive (prestart's PROXY_WARM), and this stretch imports nothing;
  and all it loads from its start to that line, which competes with the
  launcher's own start for the cores.

Their start-up is most of what they cost, so none of them may load
cryptography, psutil, nono_py, h11, asyncio, yaml or docopt (each costs from
a few to 190 ms: docs/DESIGN.md section 4), and each has a ceiling on the number
of standard-library modules it loads, a little above what it loads today: a
new import on one of these paths has to be a decision, taken by raising a
number here.  Everywhere else (the servers, the launcher after prestart,
doctor, render) write ordinary Python: ``import os``, ``import signal``,
imports at the top.

Each path is run for real in a fresh ``python -I -S`` (the form the start
scripts of libbroker/start_script.py use inside a session; a console script
adds only site and its own ``import re``), entered as the console script
enters it (``from bin.X import main; main()``), against a scripted broker
where it needs one; what it has loaded is read when it exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import libbroker
from libbroker import wire

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(libbroker.__file__)))

FORBIDDEN = ("cryptography", "psutil", "nono_py", "h11", "asyncio", "yaml", "docopt")

BUDGET = {
    "broker-client": 58,  # 55 (68 before wire.py lost enum, typing, struct and mmap)
    "egress-proxy": 85,  # 82 at `listening` (106 with dataclasses, inspect, hashlib, random)
    "gpg-shim": 28,  # 26
    "policy-hook": 56,  # 53
    "prestart": 68,  # 65
    "launcher-go": 95,  # 92 at go with a config file (tomllib; 93 with signal, 100 with
    # hashlib and base64 too, 115 with shutil and tempfile, 120 with dataclasses); 83 without
    "warm-client": 48,  # 45 (json would add re and enum: _json does without)
}
"""Standard-library modules each path may load: today's count (measured on
CPython 3.11, in the comments) plus a little."""

# A child interpreter: run ``main`` of the entry module; on exit (sys.exit or
# the posix._exit of skip_teardown) write the status and sys.modules.
DRIVER = """\
import sys, posix
sys.path.insert(0, {root!r})
_real_exit = posix._exit
def _report(code=0):
    names = sorted(sys.modules)
    fd = posix.open({out!r}, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o600)
    posix.write(fd, ("\\n".join([str(code), *names])).encode())
    _real_exit(0)
posix._exit = _report
sys.argv = {argv!r}
from {module} import main
{patch}
try:
    main()
except SystemExit as done:
    _report(done.code)
_report(0)
"""


def loaded(tmp_path: Path, module: str, argv: list[str], *, patch: str = "",
           stdin: bytes = b"", env: dict[str, str] | None = None) -> tuple[str, set[str]]:
    """The exit status and the modules loaded when ``module``'s main ends."""
    out = tmp_path / "modules.txt"
    code = DRIVER.format(root=ROOT, out=str(out), argv=argv, module=module, patch=patch)
    subprocess.run([sys.executable, "-I", "-S", "-c", code], input=stdin, env=env,
                   capture_output=True, timeout=60, check=True, cwd=tmp_path)  # fmt: skip
    status, *names = out.read_text().split("\n")
    return status, set(names)


def stdlib(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in sys.stdlib_module_names}


def check_budget(names: set[str], ceiling: int, extra_forbidden: tuple[str, ...] = ()) -> None:
    heavy = sorted(n for n in names for f in (*FORBIDDEN, *extra_forbidden)
                   if n == f or n.startswith(f + "."))  # fmt: skip
    assert heavy == [], f"a per-call path loads {heavy}"
    count = len(stdlib(names))
    assert count <= ceiling, (
        f"{count} standard-library modules, the budget is {ceiling}: "
        f"{sorted(stdlib(names))}"
    )


@contextlib.contextmanager
def scripted_broker(tmp_path: Path, answer: bytes) -> Iterator[str]:
    """A broker socket that answers one connection's first read with ``answer``."""
    path = str(tmp_path / "broker.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            conn.recv(1 << 20)
            conn.sendall(answer)
            while conn.recv(1 << 20):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        listener.close()


def test_broker_client(tmp_path: Path) -> None:
    answer = wire.encode_frame(wire.Channel.STDOUT, b"hi\n") + wire.encode_exit(0)
    with scripted_broker(tmp_path, answer) as path:
        status, names = loaded(tmp_path, "bin.broker_client",
                               ["broker-client", "-n", f"--socket={path}", "--", "true"])
    assert status == "0"
    assert "libbroker.broker.client" in names
    check_budget(names, ceiling=BUDGET["broker-client"])


def test_gpg_shim_signing(tmp_path: Path) -> None:
    answer = (wire.encode_frame(wire.Channel.STDOUT, b"-----BEGIN PGP SIGNATURE-----\n")
              + wire.encode_frame(wire.Channel.STDERR, b"[GNUPG:] SIG_CREATED D 22\n")
              + wire.encode_exit(0))  # fmt: skip
    with scripted_broker(tmp_path, answer) as path:
        env = {"AGENT_SANDBOX_BROKER_SOCKET": path, "PATH": os.environ["PATH"]}
        status, names = loaded(tmp_path, "bin.gpg_shim", ["gpg-shim", "--status-fd=2", "-bsau",
                               "KEY"], stdin=b"tree 0000\n", env=env)  # fmt: skip
    assert status == "0"
    assert "libbroker.signing.shim" in names
    # Its own, stricter rule (libbroker/gpg_shim.py): not even socket, json or typing.
    check_budget(names, ceiling=BUDGET["gpg-shim"],
                 extra_forbidden=("socket", "json", "enum", "typing", "re", "os"))


def test_policy_hook_in_hook_mode(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "home": str(home), "runtime": str(tmp_path / "run"), "read": [],
        "write": [str(home / "proj")], "deny": [], "harness": str(home / ".claude"),
        "tool_write": [], "domains": [], "proxy_port": 3128,
    }))  # fmt: skip
    call = {"hook_event_name": "PreToolUse", "tool_name": "Read", "cwd": str(home / "proj"),
            "tool_input": {"file_path": str(home / ".ssh" / "id")}}  # fmt: skip
    status, names = loaded(tmp_path, "bin.policy_hook", ["policy-hook", f"--policy={policy}"],
                           stdin=json.dumps(call).encode())
    assert status == "0"
    assert "libpolicy.hook" in names
    check_budget(names, ceiling=BUDGET["policy-hook"])


def test_launcher_prestart(tmp_path: Path) -> None:
    """What is loaded when prestart spawns the servers (its start is stopped there)."""
    stop = ("import libbroker.launcher.prestart as _prestart\n"
            "_prestart.start = lambda: _report('spawning')\n")  # fmt: skip
    status, names = loaded(tmp_path, "bin.agent_sandbox", ["agent-sandbox", "run", "--", "true"],
                           patch=stop)
    assert status == "spawning"
    # Not shutil (and re, fnmatch, bz2, lzma with it): ~10 ms before the spawn once.
    check_budget(names, ceiling=BUDGET["prestart"], extra_forbidden=("shutil", "re"))


# Each module loaded by the cold launcher (no resident service) before go is paid
# on every session's critical path; these were, and are not needed there.
LAUNCHER_CUT = (
    "dataclasses", "inspect",  # ~7 ms of CPU (Shape, Limits... are NamedTuples)
    "shutil", "tempfile", "random",  # ~6 ms (libbroker.which; runtime_dir makes its own)
    "hashlib", "_hashlib", "_blake2", "base64",  # ~3 ms in the scan's thread (hostrun_fs.sha256)
    "signal",  # ~0.7 ms: its enum wrappers (reaper uses _signal, as supervise does)
    "ipaddress",  # ~1.5 ms: the config's hosts are names (libegress.hosts); the door's check
    "encodings.idna", "stringprep",  # ~1 ms: an ASCII host name is its own idna spelling
)  # fmt: skip


@pytest.mark.parametrize(("backend", "config_file"), [("bwrap", True), ("nono", True),
                                                      ("bwrap", False)])  # fmt: skip
def test_cold_launcher_to_go(tmp_path: Path, backend: str, config_file: bool) -> None:
    """What a whole cold session (``agent-sandbox run -- true`` in a repository, no
    resident service) has loaded at go, the end of its start: the session's own
    threads' imports included; then it runs to its end.  Without a config file, not
    even tomllib (~4.5 ms of CPU)."""
    names, at_end = _at_go(tmp_path, backend, config_file, ["--", "true"])
    cut = LAUNCHER_CUT if config_file else (*LAUNCHER_CUT, "tomllib")
    check_budget(names, ceiling=BUDGET["launcher-go"], extra_forbidden=cut)
    # Nor at the end: the record's digest and the runtime dir's removal (~5 ms of CPU).
    assert not {"shutil", "hashlib"} & at_end, "the session's end loads shutil or hashlib"
    # The cyclic collector is off until go (~6 ms of CPU), then on, the start's objects frozen.
    marks = [line.split() for line in (tmp_path / "gc.txt").read_text().splitlines()]
    states = {name: (enabled, int(frozen)) for name, enabled, frozen in marks}
    assert states["go"][0] == "False" and states["ended"][0] == "True", states
    assert states["ended"][1] > 10000, states


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_cold_agent_session_to_go(tmp_path: Path, agent: str) -> None:
    """The same with an agent's profile (its private copy made in a thread, its
    settings, its login's placeholders): the copy's modules load no dataclasses and
    inspect (~7 ms of CPU: agent_copy.Report is a plain class), shutil (~2 ms), nor
    base64 (its login's parser, only where a login file is), and stays in ``true``'s
    budget (92 modules when measured, as ``true``'s)."""
    names, _ = _at_go(tmp_path, "bwrap", True, [f"--agent={agent}", "--", "true"])
    assert "libbroker.launcher.agent_copy" in names
    check_budget(names, ceiling=BUDGET["launcher-go"], extra_forbidden=LAUNCHER_CUT)


def test_an_upstream_ca_is_checked_without_the_ssl_module(tmp_path: Path) -> None:
    """A config's ``upstream_ca`` is loaded before anything starts, as egress-proxy will
    load it (config_file._check_ca), on _ssl's own context: the ssl module (~8 ms of CPU
    on the critical path, its enums) is not loaded for that one check."""
    import trustme

    pem = tmp_path / "upstream-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(pem))
    names, _ = _at_go(tmp_path, "bwrap", True, ["--", "true"], f'upstream_ca = "{pem}"\n')
    assert "_ssl" in names  # the file was loaded by OpenSSL, as egress-proxy loads it
    check_budget(names, ceiling=BUDGET["launcher-go"], extra_forbidden=(*LAUNCHER_CUT, "ssl"))


def _at_go(tmp_path: Path, backend: str, config_file: bool,
           cmd: list[str], more_config: str = "") -> tuple[set[str], set[str]]:
    """The modules a cold ``agent-sandbox run CMD`` has loaded at go, and at its end
    (``more_config``: lines added to the config file)."""
    from libbroker.sandbox import backends

    if (why := backends.of("nono" if backend == "nono" else "bwrap").unavailable()) is not None:
        pytest.skip(why)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    config = tmp_path / "config.toml"
    config.write_text(f'workdir = "{work}"\ntoken_command = ""\nstart_timeout = 60\n'
                      + more_config)
    options = [f"--config={config}"] if config_file else []  # else the default: absent
    at_go = tmp_path / "at-go.txt"
    collector = tmp_path / "gc.txt"  # the cyclic collector's state at each mark: go, ended
    patch = ("import gc, libbroker.launcher.trace as _trace\n"
             "_mark = _trace.mark\n"
             "def _at_go(name):\n"
             "    if name == 'go':\n"
             f"        with open({str(at_go)!r}, 'w') as fh:\n"
             "            fh.write('\\n'.join(sorted(sys.modules)))\n"
             f"    with open({str(collector)!r}, 'a') as fh:\n"
             "        fh.write(f'{name} {gc.isenabled()} {gc.get_freeze_count()}\\n')\n"
             "    _mark(name)\n"
             "_trace.mark = _at_go\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "AGENT_SANDBOX"))}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(tmp_path), AGENT_SANDBOX_SERVE="off",
               AGENT_SANDBOX_GATE_SOCKET="off")  # fmt: skip
    out = tmp_path / "modules.txt"
    code = DRIVER.format(root=ROOT, out=str(out), module="bin.agent_sandbox", patch=patch,
                         argv=["agent-sandbox", "run", *options, f"--sandbox={backend}", *cmd])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], env=env, cwd=work,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    status, *at_end = out.read_text().split("\n")
    assert done.returncode == 0 and status == "0", done.stderr
    names = set(at_go.read_text().split("\n"))
    assert "libbroker.launcher.session" in names
    return names, set(at_end)


def test_warm_run_client(tmp_path: Path) -> None:
    """What a warm run's client loads up to its handover (libbroker/launcher/warm_client.py):
    a scripted run pays it on every call, before the service's fork takes over."""
    listening = socket.socket(socket.AF_UNIX)
    path = str(tmp_path / "serve.sock")
    listening.bind(path)
    listening.listen(1)  # connect() succeeds on the backlog: no answer needed
    stop = ("import libbroker.launcher.warm_client as _warm\n"
            "_warm._start = lambda sock, line: _report('handing over')\n")  # fmt: skip
    try:
        status, names = loaded(tmp_path, "bin.agent_sandbox",
                               ["agent-sandbox", "run", "--", "true"], patch=stop,
                               env={**os.environ, "AGENT_SANDBOX_SERVE": path})
    finally:
        listening.close()
    assert status == "handing over"
    assert "libbroker.launcher.session" not in names and "signal" not in names
    check_budget(names, ceiling=BUDGET["warm-client"])


@pytest.mark.parametrize("forbidden", FORBIDDEN)
def test_the_budget_check_catches_a_forbidden_module(forbidden: str) -> None:
    with pytest.raises(AssertionError, match=forbidden):
        check_budget({"sys", forbidden + ".sub"}, ceiling=100)


# egress-proxy's deferred boot (libbroker/launcher/boot.py) up to its arguments,
# then the session's command line to its ``listening`` lines, which stop it.
PROXY_DRIVER = """\
import sys, posix, json
sys.path[:0] = {paths!r}
for warm in {warm!r}:
    __import__(warm)
from bin.egress_proxy import main
import libegress.app as app
warmed = set(sys.modules)
def announce_lines(listeners):
    def announce():
        out = {{"late": sorted(set(sys.modules) - warmed), "all": sorted(sys.modules),
               "collecting": __import__("gc").isenabled()}}
        fd = posix.open({out!r}, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o600)
        posix.write(fd, json.dumps(out).encode())
        posix._exit(0)
    return announce
app.announce_lines = announce_lines
sys.argv = {argv!r}
main()
"""


def proxy_to_listening(tmp_path: Path) -> dict[str, Any]:
    """What egress-proxy has loaded at its ``listening`` line, started as a session
    starts it: ``late``, since its arguments; ``all``, since its start."""
    from libbroker.launcher import boot, prestart

    out = tmp_path / "loaded.json"
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    token = tmp_path / "token"
    token.write_text("#!/bin/sh\necho t0ken\n")
    token.chmod(0o700)
    argv = ["egress-proxy", f"--listen-fd={listeners[0].fileno()}",
            f"--socks-fd={listeners[1].fileno()}",
            "--allow=pypi.org,*.pythonhosted.org,registry.npmjs.org:443,xn--bcher-kva.example",
            "--inject=github.com,api.github.com", f"--egress-dir={tmp_path / 'egress'}",
            "--token-every=300", f"--token-command={token}", f"--record={tmp_path / 'record'}",
            "--resolve=pypi.org:151.101.0.223", "--allow-cidr=10.0.0.0/8"]  # fmt: skip
    code = PROXY_DRIVER.format(paths=boot.import_paths(), warm=prestart.PROXY_WARM,
                               out=str(out), argv=argv)
    try:
        subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                       timeout=60, check=True, cwd=tmp_path,
                       pass_fds=[s.fileno() for s in listeners])  # fmt: skip
    finally:
        for s in listeners:
            s.close()
    assert (tmp_path / "egress" / "ca.pem").is_file()  # it got that far for real
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def test_egress_proxy_loads_nothing_between_its_arguments_and_listening(tmp_path: Path) -> None:
    """A session waits for egress-proxy's ``listening`` from the moment its arguments
    are written (libbroker/launcher/prestart.py): all that path imports is warmed
    before them (PROXY_WARM), where it overlaps the launcher's own start."""
    late = proxy_to_listening(tmp_path)["late"]
    assert late == [], f"imported after the arguments, on the session's wait: {late} (PROXY_WARM)"


def test_egress_proxy_to_listening_within_its_budget(tmp_path: Path) -> None:
    """All egress-proxy loads from its start to ``listening``, warmed or not: the
    session's servers start while the launcher does, on the same cores.

    It needs cryptography (the CA), and nothing else of :data:`FORBIDDEN`: the
    server's asyncio and h11 load after ``listening`` (libegress.serving).  Its
    values up to there (options, policy, limits, listeners, outcome) are
    NamedTuples: the dataclasses module loads inspect (ast, dis, tokenize...),
    ~10 ms of CPU, and each dataclass execs its generated methods (~0.5-1 ms).
    """
    loaded = set(proxy_to_listening(tmp_path)["all"])
    assert "cryptography" in loaded
    check_budget({n for n in loaded if n.split(".")[0] != "cryptography"},
                 ceiling=BUDGET["egress-proxy"],
                 extra_forbidden=("dataclasses", "inspect", "hashlib"))
    # The CA is signed without cryptography's OpenSSL backend (RSA, ciphers, random:
    # ~5 ms), and its key identifier digested without hashlib (~2.7 ms): libegress.ca.
    assert sorted(n for n in loaded if n.startswith("cryptography.hazmat.backends")) == []


def test_egress_proxy_serves_without_the_graphql_reader() -> None:
    """The GraphQL reader loads at the first GraphQL write --repos judges
    (libegress/scope.py), not at every proxy's start."""
    from libbroker.launcher import boot

    code = (f"import sys; sys.path[:0] = {boot.import_paths()!r}\n"
            "import libegress.serving, libegress.scope, libegress.gateway\n"
            "print('libegress.graphql' in sys.modules)\n"
            "libegress.scope.graphql_ties(b'{\"query\": \"{ viewer { login } }\"}')\n"
            "print('libegress.graphql' in sys.modules)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout.split() == ["False", "True"]


# What only --repos, --secrets (and the logins among them) or an inject host need.
_ON_DEMAND = ("libegress.scope", "libegress.scope_guard", "libegress.secrets",
              "libegress.oauth_login", "libegress.token_endpoint", "libegress.placeholders",
              "libegress.login_host", "libegress.graphql", "urllib.parse")


def test_egress_proxy_serving_loads_only_what_every_session_needs() -> None:
    """After ``listening`` (libegress.serving: asyncio, the server, the token keeper)
    the proxy competes with the session's command for the cores: what only
    --repos or --secrets need loads with them (libegress.serving, libegress.app),
    and the values made there are plain classes, not dataclasses."""
    from libbroker.launcher import boot, prestart

    code = (f"import sys; sys.path[:0] = {boot.import_paths()!r}\n"
            f"for warm in {prestart.PROXY_WARM!r}: __import__(warm)\n"
            "import libegress.serving\n"
            "print(' '.join(sorted(sys.modules)))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    loaded = set(done.stdout.split())
    assert "asyncio" in loaded
    assert sorted(loaded & {*_ON_DEMAND, "dataclasses"}) == []


# egress-proxy started as a session starts it, until SIGTERM ends it: then what it loaded.
SERVING_DRIVER = """\
import sys, posix, json
sys.path[:0] = {paths!r}
for warm in {warm!r}:
    __import__(warm)
from bin.egress_proxy import main
import libegress.peers as peers
scans = []
def socket_owners(proc, scan=peers.socket_owners):
    scans.append(proc)
    return scan(proc)
peers.socket_owners = socket_owners
_real_exit = posix._exit
def _report(code, ended="_exit"):
    import gc
    fd = posix.open({out!r}, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o600)
    posix.write(fd, json.dumps({{"modules": sorted(sys.modules), "scans": len(scans),
                                 "collecting": gc.isenabled(), "ended": ended,
                                 "frozen": gc.get_freeze_count()}}).encode())
    _real_exit(code)
posix._exit = _report
sys.argv = {argv!r}
try:
    main()
finally:
    _report(0, "teardown")
"""


def test_egress_proxy_tunnels_without_the_inject_path(tmp_path: Path) -> None:
    """A CONNECT and a SOCKS5 tunnel to an allowed host (what most sessions' requests
    are: the inject hosts are GitHub's) load neither the inject path
    (libegress.intercept: TLS, the credential) nor what only --repos, --secrets,
    a login or the gateway need, nor ``http``'s status enum (for the proxy's own
    answers only).  They load with their first use (libegress/http_proxy.py).
    Nor do they scan /proc for their client's pid: without --log-allowed no line
    names it (libegress.eventlog.EventLog.allowed)."""
    from libbroker.launcher import boot, prestart

    upstream = socket.create_server(("127.0.0.1", 0))
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    http_port, socks_port = (s.getsockname()[1] for s in listeners)
    argv = ["egress-proxy", f"--listen-fd={listeners[0].fileno()}",
            f"--socks-fd={listeners[1].fileno()}", "--allow=up.example",
            "--inject=github.com,api.github.com", f"--egress-dir={tmp_path / 'egress'}",
            f"--resolve=up.example:127.0.0.1:{upstream.getsockname()[1]}"]  # fmt: skip
    out = tmp_path / "loaded.json"
    code = SERVING_DRIVER.format(paths=boot.import_paths(), warm=prestart.PROXY_WARM,
                                 out=str(out), argv=argv)
    proxy = subprocess.Popen([sys.executable, "-I", "-S", "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, cwd=tmp_path,
                             pass_fds=[s.fileno() for s in listeners])  # fmt: skip
    try:
        for s in listeners:
            s.close()
        assert proxy.stdout is not None
        assert proxy.stdout.readline().startswith(b"listening http://")
        with socket.create_connection(("127.0.0.1", http_port), timeout=30) as client:
            client.sendall(b"CONNECT up.example:443 HTTP/1.1\r\nHost: up.example:443\r\n\r\n")
            assert client.recv(1024).startswith(b"HTTP/1.1 200 ")
        with socket.create_connection(("127.0.0.1", socks_port), timeout=30) as client:
            client.sendall(b"\x05\x01\x00")
            assert client.recv(2) == b"\x05\x00"
            client.sendall(b"\x05\x01\x00\x03\x0aup.example\x01\xbb")
            assert client.recv(1024)[:2] == b"\x05\x00"  # succeeded
        proxy.terminate()
        assert proxy.wait(30) == 0
    finally:
        proxy.kill()
        proxy.wait()
        upstream.close()
    report = json.loads(out.read_text())
    assert report["scans"] == 0
    # Serving, the collector is on, and the start's objects out of its way.
    assert report["collecting"] and report["frozen"] > 10_000
    # And it ends without the interpreter's teardown (bin/egress_proxy.py).
    assert report["ended"] == "_exit"
    loaded = set(report["modules"])
    assert {"h11", "libegress.http_proxy", "libegress.socks5"} <= loaded
    late = loaded & {*_ON_DEMAND, "libegress.intercept", "libegress.proxyauth", "http"}
    assert sorted(late) == []


def test_egress_proxy_starts_without_the_cyclic_collector(tmp_path: Path) -> None:
    """Its warm-up turns the collector off (libegress.startup_gc, first in PROXY_WARM):
    the start's ~40 young-generation collections cost ~5-9 ms of CPU for nearly
    no garbage.  The collector is on again once serving (the tunnel test above)."""
    assert not proxy_to_listening(tmp_path)["collecting"]
