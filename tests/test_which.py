"""libbroker.which: shutil.which's answer, without shutil (the launcher's start)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from libbroker.which import which


def test_it_answers_as_shutil_which(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for d in (first, second):
        d.mkdir()
    (first / "tool").mkdir()  # a directory of that name is skipped
    (first / "plain").write_text("")  # not executable: skipped
    (second / "plain").write_text("")
    (second / "plain").chmod(0o755)
    (second / "tool").write_text("#!/bin/sh\n")
    (second / "tool").chmod(0o755)
    env = {"PATH": f"{first}:{second}"}
    for name in ("tool", "plain", "absent", str(second / "tool"), str(first / "plain"),
                 str(first / "tool")):  # fmt: skip
        assert which(name, env) == shutil.which(name, path=env["PATH"]), name
    assert which("tool", env) == str(second / "tool")
    assert which("absent", env) is None


def test_an_empty_path_finds_nothing_even_in_the_cwd(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert which("tool", {"PATH": ""}) is None is shutil.which("tool", path="")
    monkeypatch.setenv("PATH", "")
    assert which("tool") is None is shutil.which("tool")


def test_without_an_env_it_reads_this_process_path() -> None:
    assert which("sh") == shutil.which("sh") is not None
    assert os.path.isabs(which("sh") or "")
