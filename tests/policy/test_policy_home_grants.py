"""libpolicy.home_grants: which read/write grants of home are refused (pure, table-driven)."""

from __future__ import annotations

import pytest

from libpolicy.home_grants import READ_SHUT, WRITE_SHUT, refusal

HOME = "/home/u"


def judge(kind: str, grant: str, *, real: str = "", shut: dict[str, tuple[str, ...]] | None = None,
          ) -> str | None:
    spellings = (grant, real) if real else (grant,)
    shown = "~" + grant[len(HOME):] if grant.startswith(HOME) else grant
    return refusal(kind, shown, spellings, HOME, shut or {})


@pytest.mark.parametrize("shut", WRITE_SHUT, ids=lambda s: s.rel)
def test_every_write_shut_path_is_refused_as_itself_above_and_inside(shut: object) -> None:
    rel = shut.rel  # type: ignore[attr-defined]
    assert judge("write", f"{HOME}/{rel}") is not None
    assert judge("write", f"{HOME}/{rel}/deeper/file") is not None
    parent = f"{HOME}/{rel}".rsplit("/", 1)[0]
    assert judge("write", parent) is not None  # the home itself or a directory above


@pytest.mark.parametrize("shut", READ_SHUT, ids=lambda s: s.rel)
def test_every_credential_is_refused_for_read(shut: object) -> None:
    assert judge("read", f"{HOME}/{shut.rel}") is not None  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind, grant, expected", [
    ("write", f"{HOME}/.codex",
     "~/.codex covers Codex's config directory: a hook or MCP server planted there runs at "
     "its next start on the host"),
    ("write", f"{HOME}/.codex/config.toml",
     "~/.codex/config.toml covers Codex's config directory (~/.codex): a hook or MCP server "
     "planted there runs at its next start on the host"),
    ("write", HOME, "~ holds your whole home directory, every credential and start file in it"),
    ("write", "/", "/ holds your whole home directory, every credential and start file in it"),
    ("write", "/home", "/home holds your whole home directory, every credential and start "
     "file in it"),
    ("read", f"{HOME}/.ssh", "~/.ssh covers ssh's keys: it holds a credential the sandbox must "
     "never see"),
    ("read", f"{HOME}/.gemini/oauth_creds.json",
     "~/.gemini/oauth_creds.json covers Gemini CLI's config directory (its login, "
     "oauth_creds.json) (~/.gemini): it holds a credential the sandbox must never see"),
    ("write", f"{HOME}/.bashrc", "~/.bashrc covers a shell start file: a line planted there "
     "runs in your next shell"),
    # allowed: the defaults, projects, caches, a look at git's config
    ("read", f"{HOME}/.gitconfig", None),
    ("read", f"{HOME}/.config/git", None),
    ("write", f"{HOME}/src/project", None),
    ("write", f"{HOME}/.cache/pip", None),
    ("read", f"{HOME}/.bashrc", None),
    ("write", f"{HOME}/.codexes", None),  # a sibling whose name only starts alike
    ("write", f"{HOME}/.sshx", None),
    ("write", "/srv/data", None),
])
def test_the_lines(kind: str, grant: str, expected: str | None) -> None:
    assert judge(kind, grant) == expected


def test_links_are_judged_by_both_spellings() -> None:
    # ~/dots is where ~/.bashrc really lives: a grant of ~/dots reaches it.
    shut = {".bashrc": (f"{HOME}/.bashrc", f"{HOME}/dots/bashrc")}
    assert judge("write", f"{HOME}/dots", shut=shut) is not None
    # ~/work is a link to home: the resolved spelling covers everything.
    assert judge("write", f"{HOME}/work", real=HOME) is not None
    assert judge("write", f"{HOME}/work", real=f"{HOME}/src") is None
