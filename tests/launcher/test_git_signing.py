"""Signing as git decides it, in real sessions: real git and gpg, verified on the host.

The key a session enables is the one git would use in the workdir: the
repository's own ``user.signingkey`` over the global one, the committer's
``Name <email>`` without either.  A key the session did not enable is refused
with one line that reaches git's stderr inside, where the agent reads it
(git 2.39 drops what gpg.program says; gpg-shim writes to git's stderr too).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from launcher_world import World

pytestmark = pytest.mark.skipif(
    not (shutil.which("gpg") and shutil.which("git") and shutil.which("gpgconf")),
    reason="gpg and git are needed",
)

LOCAL_UID = "Local Key <local@example.test>"
GLOBAL_UID = "Global Key <global@example.test>"
WRONG = "0123456789ABCDEF0123456789ABCDEF01234567"


class Keys(NamedTuple):
    home: Path  # GNUPGHOME: the host's, with both secret keys
    local: str  # fingerprints
    global_: str


def _gpg(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def keys() -> Iterator[Keys]:
    home = Path(tempfile.mkdtemp(prefix="gk-", dir="/tmp"))  # short: gpg-agent's socket
    home.chmod(0o700)
    try:
        fprs = []
        for uid in (LOCAL_UID, GLOBAL_UID):
            made = _gpg(home, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign",
                        "never")
            assert made.returncode == 0, made.stderr
            listing = _gpg(home, "--with-colons", "--list-secret-keys", uid).stdout
            fprs.append(re.findall(r"^fpr:+([0-9A-F]{40}):", listing, re.M)[0])
        yield Keys(home, fprs[0], fprs[1])
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"],
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(home, ignore_errors=True)


def _git(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def _repo(world: World, keys: Keys, *, local: bool, global_: bool) -> dict[str, str]:
    """The workdir as a repository; the keys configured where asked; the host's env."""
    env = world.env(GNUPGHOME=str(keys.home))
    gitconfig = world.home / ".gitconfig"
    lines = ["[user]\n", "\tname = Global Key\n", "\temail = global@example.test\n"]
    if global_:
        lines.append(f"\tsigningkey = {keys.global_}\n")
    gitconfig.write_text("".join(lines))
    assert _git(world.workdir, env, "init", "-q", "-b", "main").returncode == 0
    if local:
        assert _git(world.workdir, env, "config", "user.signingkey", keys.local).returncode == 0
    return env


def _config_without_workdir(world: World, **extra: object) -> Path:
    """The world's config with no workdir key: the session finds it from the cwd."""
    path = world.config(**extra)
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                            if not line.startswith("workdir =")))
    return path


@pytest.mark.parametrize(("local", "global_", "signer", "backend"), [
    (True, False, "local", "bwrap"), (False, True, "global", "bwrap"),
    (True, True, "local", "bwrap"), (False, False, "committer", "bwrap"),
    (True, False, "local", "nono"),
], ids=["local key", "global key", "both: the local one", "none: the committer's uid",
        "local key, Landlock"])
def test_commit_s_signs_with_the_key_git_would_use(
    world: World, keys: Keys, local: bool, global_: bool, signer: str, backend: str
) -> None:
    env = _repo(world, keys, local=local, global_=global_)
    # The committer (Global Key) has a secret key: "none" signs as that uid.
    want = keys.local if signer == "local" else keys.global_
    config = _config_without_workdir(world)
    doctor = subprocess.run(["agent-sandbox", "doctor", f"--config={config}"], env=env,
                            cwd=world.workdir, capture_output=True, text=True, timeout=60)
    line = next(x for x in doctor.stdout.splitlines() if " signing: " in x)
    origin = {"local": f"(local, {world.workdir}/.git/config)",
              "global": f"(global, {world.home}/.gitconfig)",
              "committer": "the committer's name and email"}[signer]
    assert line.startswith("ok") and origin in line, doctor.stdout
    try:
        done = world.run("git", "commit", "-S", "--allow-empty", "-qm", "signed inside",
                         config=config, env=env, sandbox=backend)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(keys.home), "--kill", "gpg-agent"],
                       capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    verify = _git(world.workdir, env, "verify-commit", "HEAD")
    assert verify.returncode == 0, verify.stderr
    shown = _git(world.workdir, env, "log", "-1", "--format=%G? %GF")
    assert shown.stdout.split() == ["G", want], (signer, shown.stdout)


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_a_refused_key_says_why_inside_on_gits_stderr(
    world: World, keys: Keys, backend: str
) -> None:
    """git 2.39 prints only "gpg failed to sign the data": the reason is gpg-shim's line.

    Both shims: the C fast path (the session's gpg.program when built) and
    the Python one (gpg-shim from PATH).
    """
    from libbroker.native import built

    env = _repo(world, keys, local=True, global_=False)
    script = (
        'echo "program=$(readlink "$(git config gpg.program)" || echo script)"; '
        f"git -c user.signingkey={WRONG} commit -S --allow-empty -qm native 2>&1; "
        "echo status=$?; "
        f"git -c user.signingkey={WRONG} -c gpg.program=gpg-shim "
        "commit -S --allow-empty -qm python 2>&1; echo status=$?"
    )
    done = world.run("sh", "-c", script, config=_config_without_workdir(world), env=env,
                     sandbox=backend)
    assert done.returncode == 0, done.stderr
    assert f"program={built('gpg-shim') or 'script'}\n" in done.stdout  # the fast path if built
    halves = done.stdout.split("status=")
    assert len(halves) == 3, done.stdout
    for half in halves[:2]:
        reason = [x for x in half.splitlines() if x.startswith("gpg-shim: ")]
        assert len(reason) >= 1, done.stdout  # twice with git 2.40+, which prints it too
        assert f"signing key '{WRONG}' is not enabled" in reason[0], reason
        assert f"(enabled: '{keys.local}')" in reason[0], reason
        assert "start a new session" in reason[0], reason
        assert "gpg failed to sign the data" in half
    assert done.stdout.count("status=128") == 2, done.stdout
    assert _git(world.workdir, env, "rev-parse", "-q", "--verify", "HEAD").returncode != 0


def test_an_ssh_signing_format_gets_one_clear_line(world: World, keys: Keys) -> None:
    env = _repo(world, keys, local=True, global_=False)
    assert _git(world.workdir, env, "config", "gpg.format", "ssh").returncode == 0
    config = _config_without_workdir(world)
    doctor = subprocess.run(["agent-sandbox", "doctor", f"--config={config}"], env=env,
                            cwd=world.workdir, capture_output=True, text=True, timeout=60)
    line = next(x for x in doctor.stdout.splitlines() if " signing: " in x)
    assert line.startswith("warn") and "gpg.format is ssh" in line, doctor.stdout
    done = world.run("true", config=config, env=env)
    assert done.returncode == 0, done.stderr
    said = [x for x in done.stderr.splitlines() if "gpg.format" in x]
    assert len(said) == 1 and "OpenPGP keys only" in said[0], done.stderr
