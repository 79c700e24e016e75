"""End to end with real gpg and git: commits and tags signed through the broker.

The "sandboxed side" here is a repository whose GNUPGHOME holds only the
public key and whose gpg.program is gpg-shim; the secret key lives in another
GNUPGHOME that only broker-server (the host side) is given.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

UID = "Test Signer <signer@example.test>"
WRONG_KEY = "0123456789ABCDEF0123456789ABCDEF01234567"


def _need(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


class Keys(NamedTuple):
    secret_home: Path  # only broker-server sees this one
    public_home: Path  # the sandboxed side's GNUPGHOME: the public key alone
    fingerprint: str


def _gpg(home: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", *args], input=data, capture_output=True,
        timeout=60, check=False,
    )


@pytest.fixture(scope="module")
def keys() -> Iterator[Keys]:
    _need("gpg", "git", "gpgconf")
    # Short paths: gpg-agent's socket lives in the home and sun_path is small.
    root = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    secret, public = root / "s", root / "p"
    secret.mkdir(mode=0o700)
    public.mkdir(mode=0o700)
    try:
        made = _gpg(secret, "--passphrase", "", "--quick-gen-key", UID, "ed25519", "sign", "never")
        assert made.returncode == 0, made.stderr
        listing = _gpg(secret, "--with-colons", "--list-secret-keys").stdout.decode()
        fingerprint = re.findall(r"^fpr:+([0-9A-F]{40}):", listing, re.M)[0]
        exported = _gpg(secret, "--export", fingerprint).stdout
        assert _gpg(public, "--import", data=exported).returncode == 0
        trust = _gpg(public, "--import-ownertrust", data=f"{fingerprint}:6:\n".encode())
        assert trust.returncode == 0
        assert "sec" not in _gpg(public, "--with-colons", "--list-secret-keys").stdout.decode()
        yield Keys(secret, public, fingerprint)
    finally:
        for home in (secret, public):  # the agents gpg started are daemons: end them
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"],
                           capture_output=True, timeout=30, check=False)
        shutil.rmtree(root, ignore_errors=True)


class Broker(NamedTuple):
    socket: Path
    workdir: Path
    process: subprocess.Popen[bytes]


@pytest.fixture
def broker(keys: Keys, tmp_path: Path) -> Iterator[Broker]:
    with running_broker(keys, tmp_path, keys.fingerprint) as started:
        yield started


@contextlib.contextmanager
def running_broker(keys: Keys, tmp_path: Path, sign_key: str) -> Iterator[Broker]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    sock = Path(tempfile.mkdtemp(prefix="gsb-", dir="/tmp")) / "broker.sock"
    env = dict(os.environ, GNUPGHOME=str(keys.secret_home))
    env.pop("AGENT_SANDBOX_BROKER_SOCKET", None)
    proc = subprocess.Popen(
        ["broker-server", f"--socket={sock}", f"--workdir={workdir}",
         f"--sign-key={sign_key}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("listening unix:"):
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"broker-server did not start: {line!r} {err.decode()}")
        yield Broker(sock, workdir, proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        shutil.rmtree(sock.parent, ignore_errors=True)


def sandbox_env(keys: Keys, broker: Broker | None, home: Path) -> dict[str, str]:
    """The environment of the sandboxed side: public keys only, the broker's socket."""
    env = {
        "PATH": os.environ["PATH"], "HOME": str(home), "GNUPGHOME": str(keys.public_home),
        "GIT_CONFIG_NOSYSTEM": "1", "LANG": "C", "LC_ALL": "C",
    }
    if broker is not None:
        env["AGENT_SANDBOX_BROKER_SOCKET"] = str(broker.socket)
    return env


def git(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture(params=["console script", "native fast path"])
def repo(request: pytest.FixtureRequest, keys: Keys, broker: Broker) -> Path:
    """A repository whose gpg.program is gpg-shim: as installed, or the launcher's C fast path."""
    path = broker.workdir / "repo"
    env = sandbox_env(keys, broker, broker.workdir)
    program = "gpg-shim"
    if request.param == "native fast path":
        import sys

        from libbroker.native import install_gpg_program

        native = request.getfixturevalue("native_gpg_shim")
        (broker.workdir / "gpg-fast").mkdir()
        program = str(broker.workdir / "gpg-fast" / "gpg-shim")
        import libbroker

        root = os.path.dirname(os.path.dirname(os.path.abspath(libbroker.__file__)))
        install_gpg_program(program, sys.executable, root, native)
    subprocess.run(["git", "init", "-q", str(path)], env=env, check=True, timeout=30)
    for key, value in [
        ("user.name", "Test Signer"), ("user.email", "signer@example.test"),
        ("user.signingkey", keys.fingerprint), ("gpg.program", program),
        ("commit.gpgsign", "true"), ("tag.gpgsign", "true"),
    ]:
        assert git(path, env, "config", key, value).returncode == 0
    (path / "file.txt").write_text("signed content\n")
    assert git(path, env, "add", "file.txt").returncode == 0
    return path


def test_commit_is_signed_through_the_broker_and_verifies_locally(
    keys: Keys, broker: Broker, repo: Path
) -> None:
    env = sandbox_env(keys, broker, broker.workdir)
    commit = git(repo, env, "commit", "-S", "-m", "signed through the broker")
    assert commit.returncode == 0, commit.stderr
    assert "-----BEGIN PGP SIGNATURE-----" in git(repo, env, "cat-file", "commit", "HEAD").stdout
    # Verification needs no broker at all: the local gpg with the public key.
    offline = sandbox_env(keys, None, broker.workdir)
    verify = git(repo, offline, "verify-commit", "-v", "HEAD")
    assert verify.returncode == 0, verify.stderr
    assert f'Good signature from "{UID}"' in verify.stderr
    shown = git(repo, offline, "log", "--show-signature", "-1")
    assert "Good signature" in shown.stdout + shown.stderr
    pretty = git(repo, offline, "log", "-1", "--format=%G? %GF")
    assert pretty.stdout.strip() == f"G {keys.fingerprint}"


def test_tag_is_signed_too(keys: Keys, broker: Broker, repo: Path) -> None:
    env = sandbox_env(keys, broker, broker.workdir)
    assert git(repo, env, "commit", "-m", "base").returncode == 0
    tag = git(repo, env, "tag", "-s", "v1.0", "-m", "release")
    assert tag.returncode == 0, tag.stderr
    verify = git(repo, sandbox_env(keys, None, broker.workdir), "verify-tag", "v1.0")
    assert verify.returncode == 0, verify.stderr
    assert "Good signature" in verify.stderr


def test_a_key_the_broker_does_not_hold_fails_like_gpg(
    keys: Keys, broker: Broker, repo: Path
) -> None:
    env = sandbox_env(keys, broker, broker.workdir)
    commit = git(repo, env, "-c", f"user.signingkey={WRONG_KEY}", "commit", "-m", "nope")
    assert commit.returncode != 0
    assert "gpg failed to sign the data" in commit.stderr
    assert git(repo, env, "rev-parse", "--verify", "-q", "HEAD").returncode != 0  # no commit
    # The shim itself: one line naming the refusal, a non-zero status, no signature.
    fpr = keys.fingerprint
    for key in (WRONG_KEY, fpr.lower(), fpr + " ", fpr[-16:]):  # the list matches exactly
        shim = subprocess.run(["gpg-shim", "--status-fd=2", "-bsau", key], input=b"payload",
                              env=env, capture_output=True, timeout=60)
        assert shim.returncode != 0
        assert shim.stdout == b""
        assert len(shim.stderr.decode().strip().splitlines()) == 1, shim.stderr
        assert shim.stderr.startswith(b"gpg-shim: ")


def test_unreachable_broker(keys: Keys, broker: Broker, repo: Path, tmp_path: Path) -> None:
    env = sandbox_env(keys, broker, broker.workdir)
    env["AGENT_SANDBOX_BROKER_SOCKET"] = str(tmp_path / "no-such.sock")
    shim = subprocess.run(["gpg-shim", "--status-fd=2", "-bsau", keys.fingerprint],
                          input=b"payload", env=env, capture_output=True, timeout=60)
    assert shim.returncode == 125
    assert shim.stdout == b""
    assert shim.stderr.decode().count("\n") == 1
    assert "broker" in shim.stderr.decode()
    commit = git(repo, env, "commit", "-m", "no broker")
    assert commit.returncode != 0
    assert "gpg failed to sign the data" in commit.stderr
    # Reported before stdin is read: a payload that never ends does not hold it up.
    with subprocess.Popen(["gpg-shim", "--status-fd=2", "-bsau", keys.fingerprint],
                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as waiting:
        assert waiting.wait(timeout=30) == 125  # stdin still open, never written to
        assert waiting.stderr is not None
        assert b"broker" in waiting.stderr.read()


def test_status_lines_go_to_the_fd_named(keys: Keys, broker: Broker, tmp_path: Path) -> None:
    env = sandbox_env(keys, broker, broker.workdir)
    read_end, write_end = os.pipe()
    payload = b"tree 0000\n\nsome payload\n"
    try:
        shim = subprocess.run(
            ["gpg-shim", "--status-fd", str(write_end), "-b", "-s", "-a", "-u", keys.fingerprint],
            input=payload, env=env, capture_output=True, timeout=60, pass_fds=(write_end,),
            cwd=broker.workdir,
        )
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as f:
            status = f.read()
    finally:
        if write_end >= 0:
            os.close(write_end)
    assert shim.returncode == 0, shim.stderr
    assert re.search(rb"^\[GNUPG:\] SIG_CREATED D ", status, re.M), status
    assert b"[GNUPG:]" not in shim.stderr
    assert shim.stdout.startswith(b"-----BEGIN PGP SIGNATURE-----")
    (tmp_path / "payload").write_bytes(payload)
    (tmp_path / "payload.asc").write_bytes(shim.stdout)
    check = _gpg(keys.public_home, "--verify", str(tmp_path / "payload.asc"),
                 str(tmp_path / "payload"))
    assert check.returncode == 0, check.stderr


def _raw_sign(sock: Path, request: dict[str, object], payload: bytes) -> list[tuple[int, bytes]]:
    """Speak the wire format by hand: what a hostile sandboxed process could send."""
    body = json.dumps(request).encode()
    frames = [struct.pack(">BI", 5, len(body)) + body,
              struct.pack(">BI", 0, len(payload)) + payload, struct.pack(">BI", 0, 0)]
    out: list[tuple[int, bytes]] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)
        conn.connect(str(sock))
        conn.sendall(b"".join(frames))
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    while len(data) >= 5:
        channel, length = struct.unpack(">BI", data[:5])
        out.append((channel, data[5 : 5 + length]))
        data = data[5 + length :]
    return out


def test_sign_requests_cannot_steer_gpg(keys: Keys, broker: Broker) -> None:
    """Only the key reaches gpg's command line; argv is never gpg's arguments."""
    frames = _raw_sign(broker.socket, {
        "op": "sign", "key": keys.fingerprint, "cwd": str(broker.workdir), "with_stdin": True,
        "argv": ["--export-secret-keys", "--armor", keys.fingerprint]}, b"payload")
    everything = b"".join(payload for _, payload in frames)
    assert b"PRIVATE KEY" not in everything
    if frames[-1][0] == 3:  # signed anyway: then it is a plain detached signature
        assert b"-----BEGIN PGP SIGNATURE-----" in everything
    else:
        assert frames[-1][0] == 4
    fpr = keys.fingerprint
    for key in (f"{fpr} --export-secret-keys", f"--export-secret-keys={fpr}"):
        refused = _raw_sign(broker.socket, {"op": "sign", "key": key, "argv": [],
                                            "cwd": str(broker.workdir), "with_stdin": True}, b"x")
        assert refused[-1][0] == 4, refused
        assert b"PRIVATE KEY" not in b"".join(p for _, p in refused)


def test_the_secret_key_is_not_readable_from_the_sandbox(keys: Keys, broker: Broker) -> None:
    """A command the broker runs in its sandbox cannot see the secret GNUPGHOME."""
    env = sandbox_env(keys, broker, broker.workdir)
    secret_files = [str(p) for p in keys.secret_home.rglob("*") if p.is_file()]
    assert any("private-keys-v1.d" in p for p in secret_files)
    cat = subprocess.run(
        ["broker-client", "-n", "-C", str(broker.workdir), "--", "cat", *secret_files],
        env=env, capture_output=True, timeout=60)
    assert cat.returncode != 0
    assert b"PRIVATE KEY" not in cat.stdout and b"Key:" not in cat.stdout
    listing = subprocess.run(
        ["broker-client", "-n", "-C", str(broker.workdir), "--", "gpg", "--batch", "--homedir",
         str(keys.secret_home), "--with-colons", "--list-secret-keys"],
        env=env, capture_output=True, timeout=60)
    assert b"\nsec:" not in b"\n" + listing.stdout
    exported = subprocess.run(
        ["broker-client", "-n", "-C", str(broker.workdir), "--", "gpg", "--batch", "--homedir",
         str(keys.secret_home), "--pinentry-mode", "loopback", "--passphrase", "",
         "--export-secret-keys", "--armor"],
        env=env, capture_output=True, timeout=60)
    assert b"PRIVATE KEY" not in exported.stdout


def test_the_fast_program_script_signs_too(keys: Keys, broker: Broker, repo: Path) -> None:
    """program_script (python -I -S, no site-packages) is a working gpg.program."""
    import sys

    import libbroker
    from libbroker.native import program_script

    root = os.path.dirname(os.path.dirname(os.path.abspath(libbroker.__file__)))
    script = broker.workdir / "gpg-program"
    script.write_text(program_script(sys.executable, root))
    script.chmod(0o755)
    env = sandbox_env(keys, broker, broker.workdir)
    assert git(repo, env, "config", "gpg.program", str(script)).returncode == 0
    commit = git(repo, env, "commit", "-m", "through the fast script")
    assert commit.returncode == 0, commit.stderr
    verify = git(repo, sandbox_env(keys, None, broker.workdir), "verify-commit", "HEAD")
    assert verify.returncode == 0, verify.stderr
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                             timeout=30, env=env)
    assert version.stdout.startswith("gpg-shim ")


def test_git_default_key_the_committer_user_id_signs(keys: Keys, tmp_path: Path) -> None:
    """Without user.signingkey git asks for ``-bsau 'Name <email>'``: a key with spaces."""
    with running_broker(keys, tmp_path, UID) as started:
        env = sandbox_env(keys, started, started.workdir)
        path = started.workdir / "repo"
        subprocess.run(["git", "init", "-q", str(path)], env=env, check=True, timeout=30)
        for key, value in [("user.name", "Test Signer"), ("user.email", "signer@example.test"),
                           ("gpg.program", "gpg-shim"), ("commit.gpgsign", "true")]:
            assert git(path, env, "config", key, value).returncode == 0
        commit = git(path, env, "commit", "--allow-empty", "-m", "default key")
        assert commit.returncode == 0, commit.stderr
        verify = git(path, sandbox_env(keys, None, started.workdir), "verify-commit", "HEAD")
        assert verify.returncode == 0, verify.stderr
        # Still an exact match: a near miss of the user id is refused.
        for key in (UID + " ", "Test Signer", "signer@example.test", UID.upper()):
            shim = subprocess.run(["gpg-shim", "--status-fd=2", "-bsau", key], input=b"payload",
                                  env=env, capture_output=True, timeout=60)
            assert shim.returncode == 1, (key, shim.stderr)
            assert b"not enabled" in shim.stderr and shim.stdout == b""
        other = git(path, env, "-c", "user.email=other@example.test", "commit",
                    "--allow-empty", "-m", "another committer")
        assert other.returncode != 0
        assert "gpg failed to sign the data" in other.stderr
