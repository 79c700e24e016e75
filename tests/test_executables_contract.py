"""docs/DESIGN.md 2.3, for every executable: -h/--help and --version exit 0, a usage
error exits 2 with the usage on stderr, and no traceback reaches the user."""

from __future__ import annotations

import subprocess

import pytest

EXECUTABLES = [
    "broker-server",
    "broker-client",
    "egress-proxy",
    "policy-hook",
    "gpg-shim",
    "kubeconfig-proxify",
    "agent-sandbox",
]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("exe", EXECUTABLES)
@pytest.mark.parametrize("flag", ["-h", "--help", "--version"])
def test_help_and_version_exit_0(exe: str, flag: str) -> None:
    done = _run(exe, flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("exe", EXECUTABLES)
def test_an_unknown_option_is_a_usage_error(exe: str) -> None:
    done = _run(exe, "--no-such-option-here")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Usage:" in done.stderr or "usage:" in done.stderr
    assert "--no-such-option-here" in done.stderr
    # docopt's internal repr never reaches a user.
    assert "Option(" not in done.stderr and "Traceback" not in done.stderr
