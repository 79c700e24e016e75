"""agent-sandbox run, end to end: real proxy, broker, sandbox, curl, git, gpg.

One probe session per backend runs every in-sandbox check in one go (a
session costs the proxy's start, so the checks share it) and prints
``name=value`` lines; each test then asserts one line of it, named after the
contract it checks.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_world import TOKEN, StandIn, World, kill_leftovers, make_world, who_accepts

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")

BACKENDS = ["bwrap", "nono"]

PROBE = r"""
exec 2>&1
echo "tty=$(test -t 0 && echo yes || echo no)"
echo "fds=$(ls /proc/self/fd | tr '\n' ' ')"
echo "github=$(curl -sS --max-time 20 https://github.com/probe)"
echo "api=$(curl -sS --max-time 20 https://api.github.com/user)"
echo "denied_http=$(curl -s -o /dev/null --max-time 20 -w '%{http_code}' http://denied.invalid/)"
echo "denied_connect=$(curl -s -o /dev/null --max-time 20 -w '%{http_connect}' https://denied.invalid/)"
curl -sS -k --noproxy '*' --max-time 5 https://127.0.0.1:$STANDIN_PORT/ >/dev/null 2>&1
echo "noproxy=$?"
python3 -c '
import socket, sys
for addr in (("127.0.0.1", int(sys.argv[1])), ("127.0.0.1", 22), ("::1", int(sys.argv[1]))):
    try:
        socket.create_connection(addr, timeout=3).close()
        print("raw=connected", addr)
    except OSError as exc:
        print("raw=refused", addr, type(exc).__name__)
' "$STANDIN_PORT"
cat "$HOME/.ssh/id_rsa" >/dev/null 2>&1; echo "ssh_key=$?"
ls "$HOME/.ssh" >/dev/null 2>&1; echo "ssh_dir=$?"
touch "$HOME/planted" 2>/dev/null; echo "write_home=$?"
touch /etc/planted 2>/dev/null; echo "write_etc=$?"
touch "$WORKDIR/../outside" 2>/dev/null; echo "write_outside=$?"
touch "$WORKDIR/inside" 2>/dev/null; echo "write_workdir=$?"
touch "$AGENT_SANDBOX_BROKER_SOCKET.x" 2>/dev/null; echo "write_runtime=$?"
echo "broker=$(broker-client -- sh -c 'echo $AGENT_SANDBOX' 2>&1)"
echo "env_token=$(env | grep -c "$TOKEN_PROBE")"
echo "proc_token=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null \
    | tr '\0' '\n' | grep -c "$TOKEN_PROBE")"
RUNTIME="$(dirname "$AGENT_SANDBOX_POLICY")"
echo "file_token=$(grep -rls "$TOKEN_PROBE" /tmp "$HOME" "$WORKDIR" "$RUNTIME" 2>/dev/null | wc -l)"
echo "github_token_env=${GITHUB_TOKEN:-unset}"
echo "policy=$(test -r "$AGENT_SANDBOX_POLICY" && echo readable)"
echo "bundle=$(test -r "$SSL_CERT_FILE" && echo readable)"
echo x >> "$WORKDIR/.git/config" 2>/dev/null; echo "write_git_config=$?"
touch "$WORKDIR/.git/hooks/pre-commit" 2>/dev/null; echo "write_git_hook=$?"
touch "$WORKDIR/.git/planted" 2>/dev/null; echo "write_git_other=$?"
echo "hook=$(policy-hook check read "$HOME/.ssh/id_rsa" "$WORKDIR/inside" \
    | cut -d' ' -f1 | tr '\n' ,)"
"""


# The probe's results that went through the proxy's upstream TLS to the stand-in.
TLS_KEYS = ("github", "api")


def _probe(world: World, backend: str) -> dict[str, list[str]]:
    # The probe greps for the token through a bracket pattern, which does not
    # match itself: the grep's own argv must not count as a leak.
    mid = len(TOKEN) // 2
    pattern = TOKEN[:mid] + "[" + TOKEN[mid] + "]" + TOKEN[mid + 1 :]
    head = f"STANDIN_PORT={world.standin.port}; WORKDIR={world.workdir}; TOKEN_PROBE='{pattern}'\n"
    done = world.run("sh", "-c", head + PROBE, sandbox=backend)
    assert done.returncode == 0, done.stderr + done.stdout
    lines: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            lines.setdefault(key, []).append(value)
    lines["_stderr"] = [done.stderr]
    return lines


@pytest.fixture(scope="module", params=BACKENDS)
def probe(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, standin: StandIn
) -> Iterator[tuple[World, dict[str, list[str]]]]:
    w = make_world(tmp_path_factory.mktemp(f"probe-{request.param}"), standin)
    subprocess.run(["git", "init", "-q", str(w.workdir)], check=True)
    shutil.rmtree(w.workdir / ".git" / "hooks")  # the launcher must make it to protect it
    before, shook, accepted = (len(standin.seen), len(standin.handshakes),
                               len(standin.accepts))
    started = time.time()
    result = _probe(w, request.param)
    result["_seen"] = [json.dumps(s) for s in standin.seen[before:]]
    result["_handshakes"] = [f"{t - started:.3f}s after the start: SNI {name}"
                             for t, name in standin.handshakes[shook:]]
    result["_backend"] = [request.param]
    # Which threads of this process could have accepted on the stand-in's port (a
    # one-off "unable to get local issuer certificate" seen here: the first request
    # of a probe in a full run, the next one answered by the stand-in).
    result["_threads"] = [f"{t.name}: {getattr(t, '_target', None)!r}"
                          for t in threading.enumerate()]
    # What the stand-in accepted (no accept of the failed request: another acceptor
    # took it; an accept that failed its handshake: the proxy sent it no ClientHello),
    # and, on that failure, who else holds its listening socket.
    result["_accepts"] = [f"{t - started:.3f}s after the start: {what}"
                          for t, what in standin.accepts[accepted:]]
    if not all(result.get(key, [""])[0].startswith("{") for key in TLS_KEYS):
        result["_threads"] += who_accepts(standin)
    assert w.leftovers() == []
    yield w, result
    kill_leftovers(w)


Probe = tuple[World, dict[str, list[str]]]

def _tls_failure(r: dict[str, list[str]], key: str) -> str:
    """A TLS result's failure message: what the stand-in saw and who else could accept."""
    return "\n".join(
        [*r.get(key, ["(no result)"]), *r["_threads"], "stand-in handshakes:",
         *r["_handshakes"], "stand-in accepts:", *r["_accepts"], "session stderr:",
         *r["_stderr"]])


def _one(result: dict[str, list[str]], key: str) -> str:
    assert key in result, result
    return result[key][0]


def test_the_command_inherits_no_descriptor_but_its_stdio(probe: Probe) -> None:
    """Nothing of bwrap's forwarder (its control pipe: the command could read the signals
    meant for it) nor of the Landlock helper: 0-2, and ls's own directory."""
    _, r = probe
    assert _one(r, "fds") == "0 1 2 3 "


def test_github_is_reached_with_the_token_injected(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "github").startswith("{"), _tls_failure(r, "github")
    seen = json.loads(_one(r, "github"))
    want = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert seen["authorization"] == [want]
    assert seen["host"] == "github.com"


def test_the_api_gets_a_bearer_token(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "api").startswith("{"), _tls_failure(r, "api")
    assert json.loads(_one(r, "api"))["authorization"] == [f"Bearer {TOKEN}"]


def test_the_sandbox_never_sees_the_token(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "env_token") == "0"
    assert _one(r, "proc_token") == "0"
    assert _one(r, "file_token") == "0"
    assert _one(r, "github_token_env") == "unset"
    assert TOKEN not in "".join(r["_stderr"])


def test_a_denied_domain_gets_403(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "denied_http") == "403"
    assert _one(r, "denied_connect") == "403"


def test_no_way_around_the_proxy(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "noproxy") != "0"
    assert r["raw"] and all(v.startswith("refused") for v in r["raw"]), r["raw"]


def test_home_is_hidden(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "ssh_key") != "0"
    assert _one(r, "ssh_dir") != "0"


def test_only_the_workdir_is_writable(probe: Probe) -> None:
    w, r = probe
    assert _one(r, "write_workdir") == "0"
    assert (w.workdir / "inside").exists()
    for key in ("write_etc", "write_runtime"):
        assert _one(r, key) != "0", key
    # bwrap gives home and /tmp private tmpfs copies a write may land in;
    # what counts is that nothing reached the host's files.
    assert not (w.home / "planted").exists()
    assert not (w.root / "outside").exists()
    assert not Path("/etc/planted").exists()


def test_broker_client_works_inside(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "broker") == "1"


def test_the_session_files_are_readable(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "policy") == "readable"
    assert _one(r, "bundle") == "readable"
    assert _one(r, "tty") == "no"


def test_git_hooks_and_config_cannot_be_planted(probe: Probe) -> None:
    w, r = probe
    if r["_backend"][0] == "nono":
        pytest.skip("Landlock cannot make a path inside the writable workdir read-only")
    # .git/config is writable inside (git remote add, push -u work: the session
    # writes a private copy, docs/hostrun.md); what it wrote never reaches the
    # host's file, which ends without the line (below).
    assert _one(r, "write_git_config") == "0"
    assert _one(r, "write_git_hook") != "0"
    assert _one(r, "write_git_other") == "0"  # the rest of .git stays writable
    assert not (w.workdir / ".git" / "hooks" / "pre-commit").exists()
    assert "x" not in (w.workdir / ".git" / "config").read_text().splitlines()


def test_the_policy_hook_reads_the_session_policy(probe: Probe) -> None:
    _, r = probe
    assert _one(r, "hook") == "deny,allow,"


# --- exit status and cleanup ---------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_exit_status_comes_back_and_nothing_remains(world: World, backend: str) -> None:
    done = world.run("sh", "-c", "echo out; echo err >&2; exit 7", sandbox=backend)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "out\n"
    assert "err" in done.stderr
    assert "is shared with every user" not in done.stderr  # a workdir of its own
    assert world.leftovers() == []
    # Nothing was moved aside: no quarantine of its own (one a session piled up, empty).
    quarantine = world.home / ".local/state/agent-sandbox/quarantine"
    assert (list(quarantine.iterdir()) if quarantine.exists() else []) == []


def test_a_shared_workdir_is_named_before_the_command_runs(world: World) -> None:
    """A workdir like /tmp (world-writable, sticky): what others make there during the
    session is swept as the agent's, so the person is told, once, before it starts."""
    shared = world.root / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    done = world.run("true", config=world.config(workdir=str(shared)))
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "is shared with every user" in line]
    assert said == [f"agent-sandbox: the workdir {shared} is shared with every user "
                    "(world-writable, sticky): host-run files (git hooks and config, .envrc, "
                    "...) that any program makes there during the session are swept as the "
                    "agent's; run from a project directory of your own, or name one with "
                    "--workdir"], done.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_workdir_holding_the_temporary_dirs_keeps_the_sessions_own_files_out(
    world: World, backend: str
) -> None:
    """Run from a directory that holds $TMPDIR and $XDG_RUNTIME_DIR (as from /tmp):
    the session's runtime dir (under Landlock a plain command's home, with its link
    to ~/.gitconfig) is made outside the workdir.  Inside it, the guard's sweep took
    those files for the agent's: every session moved one to the quarantine, with a
    line."""
    (world.home / ".gitconfig").write_text("[user]\n\tname = Someone\n")
    tmp, run = world.workdir / "tmp", world.workdir / "run"
    tmp.mkdir()
    run.mkdir()
    env = world.env(TMPDIR=str(tmp), XDG_RUNTIME_DIR=str(run))
    done = world.run("sh", "-c", 'echo "$AGENT_SANDBOX_BROKER_SOCKET"; ls -a "$HOME"',
                     sandbox=backend, env=env)
    assert done.returncode == 0, done.stderr
    rt = os.path.dirname(done.stdout.splitlines()[0])
    assert rt.startswith(("/var/tmp/agent-sandbox-", "/dev/shm/agent-sandbox-")), rt
    if backend == "nono":  # the plain command's home, with the link, was there
        assert ".gitconfig" in done.stdout.splitlines()
    assert "quarantine" not in done.stderr and "appeared" not in done.stderr, done.stderr
    quarantine = world.home / ".local/state/agent-sandbox/quarantine"
    assert (list(quarantine.iterdir()) if quarantine.exists() else []) == []
    assert not os.path.lexists(rt)  # removed at the end, as in the temporary dir
    assert list(tmp.iterdir()) == [] and list(run.iterdir()) == []
    assert world.leftovers() == []


def test_a_session_past_bwraps_argument_limit_is_refused_before_it_starts(world: World) -> None:
    """bwrap dies past 9000 arguments with a line that names no cause; the session is
    refused before it spawns bwrap, and says whose arguments they are."""
    done = world.run("true", *(["x"] * 9000), sandbox="bwrap")
    assert done.returncode == 1, done.stderr
    assert "bwrap cannot take this session: its command line would be " in done.stderr
    assert "and bwrap takes at most 9000; 9001 of them are the command's: pass them in a " \
           "file, or use --sandbox=nono" in done.stderr
    assert "Exceeded maximum number of arguments" not in done.stderr
    assert world.leftovers() == []
    assert world.run("true", *(["x"] * 9000), sandbox="nono").returncode == 0


def test_a_workdir_of_too_many_repositories_for_bwrap_is_refused_before_their_setup(
    world: World,
) -> None:
    """Hundreds of repositories (a ~/src of checkouts): their pins and holds alone pass
    bwrap's limit, so the session is refused once the guard's walk has counted them,
    before each one's live config and bind is made (and undone); nothing of them
    changes."""
    count = 1100
    for i in range(count):
        git = world.workdir / f"r{i}" / ".git"
        for sub in ("objects", "refs/heads", "hooks", "info"):
            (git / sub).mkdir(parents=True)
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        (git / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    done = world.run("true", sandbox="bwrap")
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("agent-sandbox: bwrap cannot take this session: its command line "
                           "would be at least "), line
    assert f"hooks and configs of the workdir's {count} git directories: start it in one " \
           "repository (or name one with --workdir), or use --sandbox=nono" in line, line
    assert "Exceeded maximum number of arguments" not in done.stderr
    assert world.leftovers() == []
    for i in (0, count - 1):
        config = world.workdir / f"r{i}" / ".git" / "config"
        assert not config.is_symlink()
        assert config.read_text() == "[core]\n\trepositoryformatversion = 0\n"


def _escape_script(world: World, then: str) -> list[str]:
    """A command that leaves two processes outside its process group (setsid, and
    setsid after a double fork), then runs ``then``."""
    escapee = f"import time; time.sleep(300)  # {world.mark} escapee"
    # A file, not sh -c: only the escapees' own command lines carry the marker.
    (world.workdir / "escape.sh").write_text(
        f"escape() {{ setsid python3 -c '{escapee}' </dev/null >/dev/null 2>&1; }}\n"
        "escape &\n(escape &)\n"
        f"until [ $(pgrep -fc '{world.mark} escapee') -ge 2 ]; do sleep 0.01; done\n"
        f"{then}\n"
    )
    return ["sh", "escape.sh"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_escapes_the_process_group_ends_with_the_session(world: World, backend: str) -> None:
    """bwrap's PID namespace ends such processes; under Landlock the sandbox
    helper, the command's reaper, kills them."""
    done = world.run(*_escape_script(world, "exit 5"), sandbox=backend)
    assert done.returncode == 5, done.stderr
    assert _gone(world) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_9_of_the_launcher_takes_the_escaped_processes_too(
    world: World, backend: str
) -> None:
    proc = world.launch(*_escape_script(world, "touch started; sleep 300"), sandbox=backend)
    _wait_for(world.workdir / "started", proc)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(world) == []


def test_the_command_cannot_kill_its_reaper_under_landlock(world: World) -> None:
    done = world.run("sh", "-c", "kill -9 $PPID && echo killed; echo still here", sandbox="nono")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "still here\n"


def test_a_signal_death_is_128_plus_n(world: World) -> None:
    done = world.run("sh", "-c", "kill -KILL $$")
    assert done.returncode == 137, done.stderr


def test_command_not_found_is_127(world: World) -> None:
    done = world.run("no-such-command-here")
    assert done.returncode == 127
    assert "not found" in done.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hidden_directory_on_path_does_not_turn_127_into_126(world: World, backend: str) -> None:
    hidden = world.home / "bin"  # the home is not visible inside
    hidden.mkdir()
    env = {**world.env(), "PATH": f"{hidden}:{world.env()['PATH']}"}
    done = world.run("no-such-command-here", sandbox=backend, env=env)
    assert done.returncode == 127, done.stderr
    assert "not found" in done.stderr


def test_a_command_that_cannot_run_is_126(world: World) -> None:
    script = world.workdir / "not-executable.sh"
    script.write_text("echo ran\n")
    script.chmod(0o644)
    done = world.run(str(script))
    assert done.returncode == 126
    assert "Permission denied" in done.stderr and "ran" not in done.stdout


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"session ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)


def _sleeper(world: World) -> list[str]:
    """A command with a background child, both marked, that says when it runs.

    The foreground child says it, from its own code: a SIGINT that reached the
    group before it existed would be held by ``sh -c`` (dash catches SIGINT then
    and acts on it only once its foreground job ends: never, so the grace's
    SIGKILL would end the test's command, 137 instead of 130)."""
    py = f"import time; time.sleep(300)  # {world.mark}"
    say = f"import pathlib, time; pathlib.Path('started').touch(); time.sleep(300)  # {world.mark}"
    return ["sh", "-c", f"python3 -c '{py}' & python3 -c \"{say}\""]


def _gone(world: World, timeout: float = 15) -> list[str]:
    deadline = time.monotonic() + timeout
    while world.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    return world.leftovers()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_everything(world: World, backend: str, sig: int) -> None:
    proc = world.launch(*_sleeper(world), sandbox=backend)
    _wait_for(world.workdir / "started", proc)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    assert _gone(world) == []


def test_sigint_without_a_tty_ends_everything(world: World) -> None:
    proc = world.launch(*_sleeper(world))
    _wait_for(world.workdir / "started", proc)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert _gone(world) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_9_of_the_launcher_leaves_nothing(world: World, backend: str) -> None:
    proc = world.launch(*_sleeper(world), sandbox=backend)
    _wait_for(world.workdir / "started", proc)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(world) == []


# --- failures to start -----------------------------------------------------------


# A server that cannot start: tests/launcher/test_fast_start.py (it may die after go).


def test_an_unknown_config_key_is_named(world: World) -> None:
    config = world.config(domains_typo=["x"])
    done = world.run("true", config=config)
    assert done.returncode == 2
    assert "domains_typo" in done.stderr
    assert world.leftovers() == []


# --- a tty passes through; TIOCSTI does not ------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tty_passes_through_and_tiocsti_is_refused(world: World, backend: str) -> None:
    import pty

    inject = (
        "import fcntl, termios, sys\n"
        "print('tty', sys.stdin.isatty())\n"
        "try:\n"
        "    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n"
        "    print('tiocsti=allowed')\n"
        "except OSError as exc:\n"
        "    print('tiocsti=refused', exc.errno)\n"
    )
    controller, terminal = pty.openpty()
    proc = world.launch(
        "python3",
        "-c",
        inject,
        sandbox=backend,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        text=False,
    )
    os.close(terminal)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 1)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: every holder of the terminal is gone
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=30)
    os.close(controller)
    text = out.decode(errors="replace")
    assert "tty True" in text, text
    assert "tiocsti=refused 1" in text, text
    assert proc.returncode == 0


# --- signing through the broker ------------------------------------------------


def _gpg(home: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GNUPGHOME": str(home)}
    return subprocess.run(
        ["gpg", "--batch", "--yes", "--pinentry-mode", "loopback", *args],
        input=data, capture_output=True, env=env, check=False, timeout=60,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_git_commit_s_signs_through_gpg_shim(world: World, backend: str) -> None:
    """git's gpg.program is the native fast path when built (just setup), else the script."""
    from libbroker.native import built

    if not shutil.which("gpg") or not shutil.which("git"):
        pytest.skip("gpg and git are needed")
    gnupg = world.home / ".gnupg"
    gnupg.mkdir(mode=0o700)
    made = _gpg(gnupg, "--passphrase", "", "--quick-gen-key", "Launcher Test <t@example.com>",
                "ed25519", "sign", "never")
    assert made.returncode == 0, made.stderr
    listing = _gpg(gnupg, "--with-colons", "--list-secret-keys").stdout.decode()
    fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    git_env = {**world.env(), "GNUPGHOME": str(gnupg)}
    subprocess.run(["git", "init", "-q", "-b", "main", str(world.workdir)], check=True, env=git_env)
    config = world.config(sign_key=fpr)
    try:
        commit = (
            "git -c user.name='Launcher Test' -c user.email=t@example.com"
            " commit -S --allow-empty -qm 'signed in the sandbox'"
            ' && { readlink "$(git config gpg.program)" || echo script; }'
        )
        done = world.run("sh", "-c", commit, config=config, env=git_env, sandbox=backend)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == (built("gpg-shim") or "script")
        verify = subprocess.run(["git", "-C", str(world.workdir), "verify-commit", "HEAD"],
                                capture_output=True, text=True, env=git_env, check=False)
        assert verify.returncode == 0, verify.stderr
        assert "Good signature" in verify.stderr
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=git_env, check=False)


# The token command's second run (a renewal, token_every = 1) hangs: a shell
# waiting on a child of its own, and a child that left the group (setsid).
# All of it must end with the session when egress-proxy is killed mid-read.
_HANGING_TOKEN = """#!/bin/sh
if [ -e "$0.ran" ]; then
    setsid sleep 300 &
    touch "$0.again"
    sleep 300
    exit 0
fi
touch "$0.ran"
echo tok-first
"""


@pytest.mark.parametrize(("server", "backend"), [("egress-proxy", "bwrap"),
                                                 ("broker-server", "nono")])
def test_a_crashed_server_ends_the_session(world: World, server: str, backend: str) -> None:
    # broker-server starts on the first brokered call (lazy_broker): one first.
    sh, dash_c, script = _sleeper(world)
    token = world.root / "token.sh"
    token.write_text(_HANGING_TOKEN)
    token.chmod(0o755)
    config = world.config(token_command=str(token), token_every=1)
    proc = world.launch(sh, dash_c, "broker-client -- true; " + script, config=config,
                        sandbox=backend)
    _wait_for(world.workdir / "started", proc)
    if server == "egress-proxy":  # killed while its token command runs
        _wait_for(world.root / "token.sh.again", proc)
    victims = [
        int(line.split()[1].rstrip(":"))
        for line in world.leftovers()
        if line.startswith("pid ") and f"sys.argv[0] = '{server}'" in line
    ]
    assert len(victims) == 1, world.leftovers()
    os.kill(victims[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert f"{server} exited unexpectedly" in err
    assert _gone(world) == []


def test_a_signal_while_starting_ends_everything(world: World) -> None:
    proc = world.launch("true", sandbox="nono")
    sessions = world.runtime_parent / "agent-sandbox"
    deadline = time.monotonic() + 30
    while not (sessions.exists() and any(sessions.iterdir())):  # the start is under way
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode in (143, 0), err  # 0 only if the whole session beat the signal
    assert "Traceback" not in err
    assert _gone(world) == []


@pytest.mark.parametrize("first", ["", "sleep 0.2"])
def test_a_sandbox_that_cannot_start_is_reported(world: World, tmp_path: Path,
                                                 first: str) -> None:
    """Also in a repository, whose config links the session holds in the sandbox's
    mount namespace: a fake bwrap's child (no namespace of its own) is never taken for
    the sandbox, and nothing is said of a hold that had nothing to hold."""
    if not (world.workdir / ".git").exists():
        subprocess.run(["git", "init", "-q"], cwd=world.workdir, check=True)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "bwrap").write_text(f"#!/bin/sh\n{first}\necho 'bwrap: no user namespaces' >&2\n"
                                "exit 1\n")  # fmt: skip
    (fake / "bwrap").chmod(0o755)
    env = world.env(PATH=f"{fake}:{os.environ['PATH']}")
    done = world.run("true", env=env)
    assert done.returncode == 1
    assert "sandbox exited with status 1 while starting" in done.stderr
    assert "doctor" in done.stderr
    assert "config links" not in done.stderr, done.stderr
    assert "could not be" not in done.stderr, done.stderr  # merged back, checked: EBUSY
    with open("/proc/self/mountinfo") as fh:
        assert not any(str(world.workdir) in line for line in fh)
    assert _gone(world) == []


def test_server_logs_go_to_the_log_file_when_asked(world: World) -> None:
    log = world.root / "session.log"
    config = world.config(log_file=str(log))
    done = world.run(
        "sh", "-c", "curl -s -o /dev/null --max-time 20 http://denied.invalid/", config=config
    )
    assert done.returncode == 0, done.stderr
    assert "denied.invalid" in log.read_text()
    # The servers' lines go to the file; stderr has only the launcher's closing
    # count of refusals, which names the host.
    lines = [ln for ln in done.stderr.splitlines() if "denied.invalid" in ln]
    assert lines == [ln for ln in lines if ln.startswith("agent-sandbox: 1 request refused")]
    assert len(lines) == 1, done.stderr
    assert oct(log.stat().st_mode & 0o777) == "0o600"
