"""The ops' decisions: where exec may run, what sign may start."""

from __future__ import annotations

import os

import pytest

from libbroker.errors import RequestRefused
from libbroker.ops import checked_cwd, gpg_argv, spawn_gpg


def test_cwd_inside_the_workdir_only(tmp_path) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "out").symlink_to(tmp_path)
    (tmp_path / "work-evil").mkdir()
    w = str(work)
    assert checked_cwd(w, w) == w
    assert checked_cwd(f"{w}/sub/../sub", w) == f"{w}/sub"
    for bad in (str(tmp_path), f"{w}/out", f"{w}/..", f"{w}-evil", "/"):
        with pytest.raises(RequestRefused, match="outside the workdir"):
            checked_cwd(bad, w)
    with pytest.raises(RequestRefused, match="not a directory"):
        checked_cwd(f"{w}/missing", w)


def test_sign_takes_only_an_enabled_key() -> None:
    assert gpg_argv("/usr/bin/gpg", "ABCD") == ["/usr/bin/gpg", "--status-fd=2", "-bsau", "ABCD"]
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for key in ("abcd", "ABCD ", "--homedir=/x", None):
            with pytest.raises(RequestRefused, match="not enabled"):
                spawn_gpg("/usr/bin/gpg", frozenset({"ABCD"}), key, (null, null, null))
    finally:
        os.close(null)
