"""gpg-shim's verification path runs the local gpg, never itself again."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _gpg_installed() -> None:
    if shutil.which("gpg") is None:
        pytest.skip("gpg is not installed")


def shim(*args: str, path: str | None = None, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path or os.environ["PATH"], "GNUPGHOME": str(home), "LANG": "C"}
    env.pop("AGENT_SANDBOX_BROKER_SOCKET", None)
    return subprocess.run(["gpg-shim", *args], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_verify_runs_the_local_gpg_without_a_broker(tmp_path: Path) -> None:
    home = tmp_path / "g"
    home.mkdir(mode=0o700)
    result = shim("--keyid-format=long", "--status-fd=1", "--verify", str(tmp_path / "nope"),
                  "-", home=home)
    # gpg itself answered (its own message and status), not the shim.
    assert result.returncode == 2
    assert "gpg-shim" not in result.stderr
    assert "nope" in result.stderr


def test_a_gpg_on_path_that_is_the_shim_is_skipped(tmp_path: Path) -> None:
    home = tmp_path / "g"
    home.mkdir(mode=0o700)
    fake = tmp_path / "bin"
    fake.mkdir()
    shim_path = shutil.which("gpg-shim")
    assert shim_path is not None
    (fake / "gpg").symlink_to(os.path.realpath(shim_path))
    result = shim("--verify", str(tmp_path / "nope"), path=f"{fake}:{os.environ['PATH']}",
                  home=home)
    assert result.returncode == 2
    assert "gpg-shim" not in result.stderr


def test_a_wrapper_that_loops_back_is_stopped(tmp_path: Path) -> None:
    home = tmp_path / "g"
    home.mkdir(mode=0o700)
    fake = tmp_path / "bin"
    fake.mkdir()
    wrapper = fake / "gpg"
    wrapper.write_text('#!/bin/sh\nexec gpg-shim "$@"\n')
    wrapper.chmod(0o755)
    result = shim("--verify", "x", path=f"{fake}:{os.environ['PATH']}", home=home)
    assert result.returncode == 2
    assert "runs gpg-shim again" in result.stderr
    assert "Traceback" not in result.stderr
