"""The ops' decisions: where exec may run, what sign may start."""

from __future__ import annotations

import os
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.broker.ops import checked_cwd, gpg_argv, sign_key_problem, spawn_gpg
from libbroker.errors import RequestRefused


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


def test_a_sign_key_may_be_a_user_id_with_spaces() -> None:
    """git's default signing key is the committer, ``Name <email>``."""
    for key in ("ABCD", "0123456789ABCDEF", "Test Signer <signer@example.test>", "Zoë <z@x>"):
        assert sign_key_problem(key) is None
    assert "empty" in (sign_key_problem("") or "")
    for key in ("-x", "--homedir=/x", "- x"):
        assert "starts with '-'" in (sign_key_problem(key) or "")
    for key in ("A\nB", "A\tB", "A\x00B", "A\x1bB", "A\x7fB", "A\x85B"):
        assert "control character" in (sign_key_problem(key) or "")


@given(st.text(max_size=40))
def test_sign_key_rule(key: str) -> None:
    """Refused exactly when empty, option-like, or holding a Unicode control (Cc) character."""
    ok = bool(key) and not key.startswith("-")
    ok = ok and not any(unicodedata.category(c) == "Cc" for c in key)
    assert (sign_key_problem(key) is None) == ok


def test_a_user_id_key_matches_only_exactly() -> None:
    uid = "Test Signer <signer@example.test>"
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for key in (uid + " ", " " + uid, "Test Signer", "signer@example.test", uid.lower(),
                    f"{uid} --export-secret-keys", "Test  Signer <signer@example.test>"):
            with pytest.raises(RequestRefused, match="not enabled"):
                spawn_gpg("/usr/bin/gpg", frozenset({uid}), key, (null, null, null))
    finally:
        os.close(null)
    assert gpg_argv("/usr/bin/gpg", uid) == ["/usr/bin/gpg", "--status-fd=2", "-bsau", uid]
