"""agent_home's write-back, without any agent CLI: what comes back from the private copy.

The session owns the copy and may have left anything there: links to the
user's secrets, a directory where a file was, a file too big to hold, its
own hooks in the settings.  Only what the profile's rules name comes back, as
regular files, never through a link, and never our own injected hook.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from libbroker.launcher import agent_home, agents
from libbroker.launcher.agent_home import merge_keys, write_back

OUR_HOOK = {"matcher": "^(Read)$", "hooks": [{"type": "command", "command": "policy-hook"}]}
SESSION = {"hooks": {"PreToolUse": [OUR_HOOK]}, "permissions": {"deny": ["Read(//h/**)"]}}


# --- merge_keys ----------------------------------------------------------------


def test_merge_keys_takes_only_the_kept_keys_from_the_session() -> None:
    host = {"oauthAccount": {"email": "old"}, "theme": "dark", "projects": {"/w": {"a": 1}}}
    session = {
        "oauthAccount": {"email": "new"},
        "theme": "light",
        "mcpServers": {"evil": {"command": "sh"}},
        "projects": {"/w": {"lastSessionId": "s1", "mcpServers": {"x": {}}}, "/v": {"a": 2}},
    }
    merged = merge_keys(host, session, ["oauthAccount", "projects.*.lastSessionId"])
    assert merged == {
        "oauthAccount": {"email": "new"},
        "theme": "dark",
        "projects": {"/w": {"a": 1, "lastSessionId": "s1"}},
    }
    assert host["oauthAccount"] == {"email": "old"}  # the host's object is not changed


def test_merge_keys_never_deletes_what_the_session_lacks() -> None:
    host = {"oauthAccount": {"email": "made-while-the-session-ran"}}
    assert merge_keys(host, {}, ["oauthAccount"]) == host
    assert merge_keys(host, "not an object", ["oauthAccount"]) == host
    assert merge_keys(None, {"oauthAccount": 1}, ["oauthAccount"]) == {"oauthAccount": 1}
    # A kept key under a path the host holds as a non-object: made an object.
    assert merge_keys({"projects": 3}, {"projects": {"/w": {"lastSessionId": "s"}}},
                      ["projects.*.lastSessionId"]) == {"projects": {"/w": {"lastSessionId": "s"}}}


# --- a session's copy, then write_back -------------------------------------------


class Copy:
    """A user's home with Claude Code's config, and a session's private copy of it."""

    def __init__(self, tmp: Path, opted: tuple[str, ...] = ()) -> None:
        self.home = tmp / "home"
        (self.home / ".claude").mkdir(parents=True)
        (self.home / ".claude" / ".credentials.json").write_text('{"login": "host"}')
        (self.home / ".claude" / "history.jsonl").write_text("host-line\n")
        (self.home / ".claude.json").write_text(json.dumps({"numStartups": 1}))
        (self.home / ".ssh").mkdir()
        (self.home / ".ssh" / "id_rsa").write_text("SECRET-KEY")
        self.runtime = tmp / "rt"
        self.runtime.mkdir()
        made = agent_home.prepare(
            agents.CLAUDE,
            home=str(self.home),
            workdir="/w",
            session="s1",
            runtime=str(self.runtime),
            env={"XDG_STATE_HOME": str(tmp / "state")},
            opted=opted,
            claude_session=SESSION,
        )
        self.root = Path(made.root)
        self.claude = self.root / "claude"

    def back(self) -> list[str]:
        return write_back(str(self.runtime))


@pytest.fixture()
def copy(tmp_path: Path) -> Copy:
    return Copy(tmp_path)


def test_what_is_safe_comes_back_and_the_copy_goes(copy: Copy) -> None:
    (copy.claude / ".credentials.json").write_text('{"login": "refreshed"}')
    with open(copy.claude / "history.jsonl", "a") as fh:
        fh.write("session-line\n")
    (copy.claude / "projects" / "-w").mkdir(parents=True)
    (copy.claude / "projects" / "-w" / "t.jsonl").write_text("transcript")
    assert copy.back() == []
    h = copy.home / ".claude"
    assert (h / ".credentials.json").read_text() == '{"login": "refreshed"}'
    assert (h / "history.jsonl").read_text() == "host-line\nsession-line\n"
    assert (h / "projects" / "-w" / "t.jsonl").read_text() == "transcript"
    assert not copy.root.exists()


def test_a_link_planted_in_the_copy_is_never_followed(copy: Copy) -> None:
    key = copy.home / ".ssh" / "id_rsa"
    # A brought-back file replaced by a link to a secret, a transcript that is a
    # link, and a transcripts directory that is a link to the user's ~/.ssh.
    (copy.claude / ".credentials.json").unlink()
    (copy.claude / ".credentials.json").symlink_to(key)
    (copy.claude / "projects").mkdir(exist_ok=True)
    (copy.claude / "projects" / "-w").mkdir()
    (copy.claude / "projects" / "-w" / "t.jsonl").symlink_to(key)
    (copy.claude / "projects" / "-v").symlink_to(copy.home / ".ssh")
    copy.back()
    h = copy.home / ".claude"
    assert (h / ".credentials.json").read_text() == '{"login": "host"}'
    assert not (h / "projects" / "-w" / "t.jsonl").exists()
    assert not (h / "projects" / "-v").exists()
    assert key.read_text() == "SECRET-KEY" and not copy.root.exists()


def test_a_host_file_that_is_a_link_is_written_through_once(tmp_path: Path) -> None:
    """The user's own link (a dotfiles checkout) is followed: the file it names is replaced."""
    c = Copy(tmp_path)
    real = tmp_path / "dotfiles-credentials.json"
    real.write_text('{"login": "host"}')
    host = c.home / ".claude" / ".credentials.json"
    host.unlink()
    host.symlink_to(real)
    (c.claude / ".credentials.json").write_text('{"login": "new"}')
    c.back()
    assert host.is_symlink() and real.read_text() == '{"login": "new"}'


def test_settings_never_come_back_unless_opted_in(copy: Copy) -> None:
    settings = json.loads((copy.claude / "settings.json").read_text())
    assert settings["hooks"]["PreToolUse"] == [OUR_HOOK]  # the session got our hook
    settings["hooks"]["SessionStart"] = [{"hooks": [{"type": "command", "command": "evil"}]}]
    (copy.claude / "settings.json").write_text(json.dumps(settings))
    copy.back()
    assert not (copy.home / ".claude" / "settings.json").exists()


def test_opting_in_hooks_brings_the_users_hook_back_but_never_ours(tmp_path: Path) -> None:
    c = Copy(tmp_path, opted=("hooks",))
    mine = {"hooks": [{"type": "command", "command": "notify-send done"}]}
    settings = json.loads((c.claude / "settings.json").read_text())
    settings["hooks"]["Stop"] = [mine]
    settings["hooks"]["PreToolUse"].append(mine)
    (c.claude / "settings.json").write_text(json.dumps(settings))
    c.back()
    back = json.loads((c.home / ".claude" / "settings.json").read_text())
    assert back == {"hooks": {"Stop": [mine], "PreToolUse": [mine]}}
    assert "policy-hook" not in json.dumps(back)  # neither our hook, deny rules nor sandbox


def test_a_file_replaced_by_a_directory_is_left_alone(copy: Copy) -> None:
    (copy.claude / ".credentials.json").unlink()
    (copy.claude / ".credentials.json").mkdir()
    (copy.claude / ".credentials.json" / "x").write_text("inside")
    (copy.claude / "history.jsonl").unlink()
    os.mkfifo(copy.claude / "history.jsonl")  # not a regular file: never opened
    assert copy.back() == []
    h = copy.home / ".claude"
    assert (h / ".credentials.json").read_text() == '{"login": "host"}'
    assert (h / "history.jsonl").read_text() == "host-line\n"


def test_a_huge_file_is_not_brought_back(copy: Copy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_home, "_MAX_FILE", 1 << 20)
    monkeypatch.setattr(agent_home, "_MAX_JSON", 1 << 20)
    (copy.claude / "projects" / "-w").mkdir(parents=True)
    big = copy.claude / "projects" / "-w" / "big.jsonl"
    with open(big, "wb") as fh:
        fh.truncate((1 << 20) + 1)
    (copy.claude / "projects" / "-w" / "small.jsonl").write_text("fine")
    with open(copy.claude / "history.jsonl", "ab") as fh:
        fh.truncate((1 << 20) + 100)
    state = json.loads((copy.claude / ".claude.json").read_text())
    state["numStartups"] = 2
    state["pad"] = "x" * (1 << 20)
    (copy.claude / ".claude.json").write_text(json.dumps(state))
    problems = copy.back()
    h = copy.home / ".claude"
    assert not (h / "projects" / "-w" / "big.jsonl").exists()
    assert (h / "projects" / "-w" / "small.jsonl").read_text() == "fine"
    assert (h / "history.jsonl").read_text() == "host-line\n"
    assert json.loads((copy.home / ".claude.json").read_text()) == {"numStartups": 1}
    assert len(problems) == 3 and all("larger than" in p for p in problems), problems


def test_a_copy_cut_short_by_the_launchers_death_is_removed_bringing_nothing_back(
    tmp_path: Path,
) -> None:
    """The janitor finds the manifest prepare() writes before copying: only the copy goes."""
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "history.jsonl").write_text("host-line\n")
    rt = tmp_path / "rt"
    rt.mkdir()
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    root = agent_home.make_root(agents.CLAUDE, str(home), env, "s1")
    agent_home._write_manifest(str(rt), {"root": root, "partial": True})
    (Path(root) / "claude").mkdir()
    (Path(root) / "claude" / "history.jsonl").write_text("host-line\n")  # half a copy
    assert write_back(str(rt)) == []
    assert not Path(root).exists() and not (rt / agent_home.MANIFEST).exists()
    assert (home / ".claude" / "history.jsonl").read_text() == "host-line\n"


@pytest.mark.parametrize("name", sorted(agents.PROFILES))
def test_the_manifests_agent_comes_back_as_its_class(name: str) -> None:
    # The janitor's write-back rebuilds the profile from the manifest's JSON:
    # a known agent keeps its class (its hooks), a config table's stays a Profile.
    known = agents.PROFILES[name]
    back = agent_home._profile_from(json.loads(json.dumps(known._asdict())))
    assert type(back) is type(known) and back == known
    table = agents.from_config("mine", {"config": ["~/.mine"]}, "[agents.mine]")
    again = agent_home._profile_from(json.loads(json.dumps(table._asdict())))
    assert type(again) is agents.Profile and again == table
