"""agent_copy: what an agent's private config copy takes and leaves out, by rule.

A home as the agents leave it (Codex's arg0 links to its own binary, caches,
logs, programs, sockets, links out of the config dir, transcripts), copied by
agent_home.prepare: the assertions are on what is in the copy and on the
report's counts.  How fast that is, on a year of a real user's files, is
bench/agents.py's (never a timed test).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from libbroker.launcher import agent_copy, agent_home, agents

ELF = b"\x7fELF\x02\x01\x01" + b"\0" * 100


def prepare(tmp: Path, profile: agents.Profile, workdir: str = "/w") -> agent_home.AgentHome:
    rt = tmp / "rt"
    rt.mkdir(exist_ok=True)
    return agent_home.prepare(
        profile, home=str(tmp / "home"), workdir=workdir, session="s", runtime=str(rt),
        env={"XDG_STATE_HOME": str(tmp / "state")},
        claude_session={} if profile.name == "claude" else None,
    )


def sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


@pytest.fixture()
def codex_home(tmp_path: Path) -> Path:
    """~/.codex as Codex 0.171 leaves it after a year, and a 315 MB binary elsewhere."""
    binary = tmp_path / "lib" / "codex"
    sparse(binary, 315 << 20)
    cx = tmp_path / "home" / ".codex"
    arg0 = cx / "tmp" / "arg0-linux" / "codex-arg0AbCd"
    arg0.mkdir(parents=True)
    for name in ("apply_patch", "applypatch", "codex-linux-sandbox"):
        (arg0 / name).symlink_to(binary)
    (cx / "config.toml").write_text('model = "m"\n')
    (cx / "auth.json").write_text('{"k": 1}')
    (cx / "history.jsonl").write_text("h\n")
    day = cx / "sessions" / "2026" / "01" / "02"
    day.mkdir(parents=True)
    (day / "rollout-1.jsonl").write_text("s" * 100)
    for d in ("log", "cache", ".cache", "Temp", "models-cache", "node_modules"):
        sparse(cx / d / "big", 50 << 20)
    (cx / "bin").mkdir()
    (cx / "bin" / "helper").write_bytes(ELF)  # a program: never config
    (cx / "hook.sh").write_text("#!/bin/sh\necho hi\n")
    (cx / "hook.sh").chmod(0o755)  # a script: small, kept
    sparse(cx / "dump.bin", agent_copy.MAX_FILE + 1)
    (cx / "rules").mkdir()
    (cx / "rules" / "default.rules").write_text("rule")
    (cx / "rules-link").symlink_to("rules")  # inside: made again, as a link
    (cx / "abs-link").symlink_to(cx / "auth.json")  # inside, absolute
    (cx / "ssh").symlink_to(tmp_path / "home" / ".ssh")  # out of ~/.codex: left out
    (cx / "up").symlink_to("../.ssh/id_rsa")
    os.mkfifo(cx / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(cx / "sock"))
    sock.close()
    (tmp_path / "home" / ".ssh").mkdir()
    (tmp_path / "home" / ".ssh" / "id_rsa").write_text("SECRET")
    return cx


def test_codex_copy_takes_config_and_leaves_out_by_rule(
    tmp_path: Path, codex_home: Path
) -> None:
    made = prepare(tmp_path, agents.CODEX)
    cp = Path(made.root) / "codex"
    files = sorted(str(p.relative_to(cp)) for p in cp.rglob("*") if p.is_file()
                   and not p.is_symlink())
    assert files == ["auth.json", "config.toml", "history.jsonl", "hook.sh", "rules/default.rules",
                     "sessions/2026/01/02/rollout-1.jsonl"]
    assert os.stat(cp / "hook.sh").st_mode & 0o100  # still runs
    # Links: inside ones made again (relative, into the copy), outside ones gone.
    assert os.readlink(cp / "rules-link") == "rules"
    assert os.path.realpath(cp / "abs-link") == str(cp / "auth.json")
    for gone in ("ssh", "up", "tmp", "log", "bin/helper", "dump.bin", "fifo", "sock"):
        assert not os.path.lexists(cp / gone), gone
    r = made.report
    assert r.files == 6 and r.bytes == sum((codex_home / f).stat().st_size for f in files)
    # Its config is the user's, with Codex's own sandbox pinned off (agents.codex_config).
    assert (cp / "config.toml").read_text() == 'sandbox_mode = "danger-full-access"\nmodel = "m"\n'
    assert dict(r.dirs) == {"tmp": 1, "log": 1, "cache": 1, ".cache": 1, "Temp": 1,
                            "models-cache": 1, "node_modules": 1}
    assert (r.links_in, r.links_out, r.special, r.programs, r.large) == (2, 2, 2, 1, 1)
    assert r.notable() and not r.over and not r.cut_short
    line = r.line("codex")
    assert "\n" not in line and "6 files" in line and "7 cache/temp/log dirs" in line
    assert "2 links leading out" in line and "1 programs" in line and "over 4.0 MiB" in line
    assert "among them " in line and "ssh" in line and "up" in line
    manifest = json.loads((tmp_path / "rt" / agent_home.MANIFEST).read_text())
    assert manifest["copy"] == line


def test_a_clean_copy_is_not_notable(tmp_path: Path) -> None:
    cx = tmp_path / "home" / ".codex"
    (cx / "tmp" / "x").mkdir(parents=True)
    (cx / "config.toml").write_text("")
    made = prepare(tmp_path, agents.CODEX)
    assert not made.report.notable() and made.report.files == 1


def test_the_total_bound_keeps_the_top_and_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_copy, "MAX_TOTAL", 1000)
    cx = tmp_path / "home" / ".codex"
    day = cx / "sessions" / "d"
    day.mkdir(parents=True)
    (cx / "config.toml").write_bytes(b"c" * 300)  # shallow: first
    for i in range(5):  # 200 bytes each, rollout-4 the newest
        f = day / f"rollout-{i}.jsonl"
        f.write_bytes(b"s" * 200)
        os.utime(f, ns=(i * 10**9, i * 10**9))
    made = prepare(tmp_path, agents.CODEX)
    cp = Path(made.root) / "codex"
    assert (cp / "config.toml").exists()
    assert sorted(p.name for p in (cp / "sessions" / "d").iterdir()) == [
        "rollout-2.jsonl", "rollout-3.jsonl", "rollout-4.jsonl"]
    assert (made.report.over, made.report.over_bytes, made.report.bytes) == (2, 400, 900)
    assert "2 older files past the" in made.report.line("codex")
    assert not made.report.notable()  # routine for a year of use: in the trace only


@pytest.mark.parametrize("size", [0, 1, agent_copy.MAX_FILE - 1, agent_copy.MAX_FILE,
                                  agent_copy.MAX_FILE + 1])
def test_the_per_file_cap(tmp_path: Path, size: int) -> None:
    cx = tmp_path / "home" / ".codex"
    sparse(cx / "f", size)
    made = prepare(tmp_path, agents.CODEX)
    copied = Path(made.root) / "codex" / "f"
    assert copied.exists() is (size <= agent_copy.MAX_FILE)
    if size <= agent_copy.MAX_FILE:
        assert copied.stat().st_size == size


def test_a_named_file_may_exceed_the_per_file_cap(tmp_path: Path) -> None:
    """~/.claude.json grows with every project: Claude Code cannot start as the user without it."""
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    big = {"hasCompletedOnboarding": True, "pad": "x" * (agent_copy.MAX_FILE + 10)}
    (home / ".claude.json").write_text(json.dumps(big))
    made = prepare(tmp_path, agents.CLAUDE)
    assert json.loads((Path(made.root) / "claude" / ".claude.json").read_text())["pad"]


def test_a_linked_config_dir_is_followed_but_nothing_below(tmp_path: Path) -> None:
    """~/.codex itself may be the user's link into a dotfiles checkout."""
    dots = tmp_path / "dotfiles" / "codex"
    dots.mkdir(parents=True)
    (dots / "config.toml").write_text("x = 1\n")
    (dots / "out").symlink_to(tmp_path / "dotfiles")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".codex").symlink_to(dots)
    made = prepare(tmp_path, agents.CODEX)
    cp = Path(made.root) / "codex"
    assert (cp / "config.toml").read_text().endswith("x = 1\n")
    assert not os.path.lexists(cp / "out")


def test_gemini_keeps_its_tmp_chats_of_the_workdir_only(tmp_path: Path) -> None:
    g = tmp_path / "home" / ".gemini"
    g.mkdir(parents=True)
    (g / "projects.json").write_text(json.dumps({"projects": {"/w": "w-1"}}))
    for proj in ("w-1", "other"):
        (g / "tmp" / proj / "chats").mkdir(parents=True)
        (g / "tmp" / proj / "chats" / "session-1.json").write_text("{}")
        (g / "tmp" / proj / "logs.json").write_text("[]")
    (g / "tmp" / "bin").mkdir()
    (g / "tmp" / "bin" / "rg").write_bytes(ELF)
    made = prepare(tmp_path, agents.GEMINI)
    tmp = Path(made.root) / "home" / ".gemini" / "tmp"
    assert sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()) == [
        "w-1/chats/session-1.json", "w-1/logs.json"]


def test_codex_config_pins_its_sandbox_off_at_the_top_level_only() -> None:
    toml = ('model = "m"\nsandbox_mode = "workspace-write"\n  sandbox_mode="read-only"\n'
            '[profiles.p]\nsandbox_mode = "read-only"\n')
    assert agents.codex_config(toml) == (
        'sandbox_mode = "danger-full-access"\nmodel = "m"\n'
        '[profiles.p]\nsandbox_mode = "read-only"\n')
    assert agents.codex_config("") == 'sandbox_mode = "danger-full-access"\n'


def test_the_workdirs_own_project_is_copied_whatever_its_name(tmp_path: Path) -> None:
    """A workdir named like a cache (~/src/web-cache) still has its transcripts copied."""
    proj = tmp_path / "home" / ".claude" / "projects" / "-src-web-cache"
    proj.mkdir(parents=True)
    (proj / "t.jsonl").write_text("{}")
    (proj / "cache").mkdir()  # below it, the rule holds again
    (proj / "cache" / "x").write_text("x")
    made = prepare(tmp_path, agents.CLAUDE, workdir="/src/web-cache")
    copied = Path(made.root) / "claude" / "projects" / "-src-web-cache"
    assert (copied / "t.jsonl").exists() and not (copied / "cache").exists()
