"""agent_reuse: the last session's private copy, brought up to date and trusted for nothing.

Each test makes a session's copy of a small Claude Code home (agent_home.prepare),
plays the hostile inside on it (links to secrets, hard links, bytes changed
under the same size and time, files planted, modes changed), ends the session
in order (write_back keeps the copy), and starts the next: its copy must hold
exactly what a fresh copy of the host would, and nothing outside it is read
or written.  The sessions themselves are in tests/agents (test_agents_e2e).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from libbroker.launcher import agent_copy, agent_home, agent_reuse, agents

SESSION = {"hooks": {"PreToolUse": []}, "permissions": {"deny": []}}


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.home = tmp / "home"
        c = self.home / ".claude"
        (c / "projects" / "-w").mkdir(parents=True)
        (c / ".credentials.json").write_text('{"login": "host"}')
        (c / "history.jsonl").write_text("host-line\n")
        (c / "CLAUDE.md").write_text("be brief")
        (c / "projects" / "-w" / "t1.jsonl").write_text("transcript one")
        (self.home / ".claude.json").write_text(json.dumps({"numStartups": 1}))
        (self.home / ".ssh").mkdir()
        (self.home / ".ssh" / "id_rsa").write_text("SECRET-KEY")
        self.env = {"XDG_STATE_HOME": str(tmp / "state")}
        self.n = 0

    def session(self) -> tuple[Path, Path, agent_home.AgentHome]:
        """A session's copy (its runtime dir and root): ended with end()."""
        self.n += 1
        rt = self.tmp / f"rt{self.n}"
        rt.mkdir()
        root = agent_home.make_root(agents.CLAUDE, str(self.home), self.env, f"s{self.n}")
        made = agent_home.prepare(agents.CLAUDE, home=str(self.home), workdir="/w",
                                  session=f"s{self.n}", runtime=str(rt), env=self.env,
                                  claude_session=SESSION, root=root)
        return rt, Path(made.root), made

    def fresh(self) -> dict[str, bytes]:
        """What a fresh copy of the host holds now (in a state dir of its own)."""
        rt = self.tmp / f"fresh{self.n}"
        rt.mkdir()
        made = agent_home.prepare(agents.CLAUDE, home=str(self.home), workdir="/w",
                                  session="fresh", runtime=str(rt),
                                  env={"XDG_STATE_HOME": str(self.tmp / f"fs{self.n}")},
                                  claude_session=SESSION)
        out = tree(Path(made.root))
        agent_home.write_back(str(rt))
        return out


def tree(root: Path) -> dict[str, bytes]:
    """Every entry below ``root`` (links and directories marked, never followed)."""
    out: dict[str, bytes] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = b"link:" + os.readlink(p).encode()
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = b"dir"
            else:
                assert st.st_nlink == 1 and stat.S_IMODE(st.st_mode) & 0o7077 == 0, rel
                out[rel] = p.read_bytes()
    return out


@pytest.fixture()
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_the_next_session_takes_the_last_copy_unchanged(world: World) -> None:
    rt, root, first = world.session()
    assert not first.report.reused
    agent_home.write_back(str(rt), keep=True)
    assert not root.exists()
    idle = list((Path(world.env["XDG_STATE_HOME"]) / "agent-sandbox" / "agents" / "claude")
                .iterdir())
    assert sorted(p.name for p in idle) == ["idle-s1", "idle-s1.ids"]  # and its record
    _, root2, second = world.session()
    # All unchanged but the logins, which a copy at rest does not hold.
    assert second.report.reused and second.report.unchanged == second.report.files - 2
    assert "unchanged" in second.report.line("claude")
    assert not (root.parent / "idle-s1").exists()  # taken, not shared
    assert tree(root2) == world.fresh()


def tick(root: Path, scratch: Path) -> None:
    """Until the filesystem's clock has moved past every ctime below ``root`` (a few ms
    at most): the files made now are recorded by the next session's copy."""
    last = max(p.lstat().st_ctime_ns for p in [root, *root.rglob("*")])
    scratch.mkdir(exist_ok=True)
    while agent_copy.fs_now(str(scratch)) <= last:
        time.sleep(0.001)


def test_unchanged_files_are_kept_unread_and_any_change_is_still_caught(world: World) -> None:
    """The record of what equals the host's (agent_reuse.Record): once the bytes were
    found equal, the next session keeps those files without reading either; bytes
    changed under the same size and time, in the copy (the inside) or on the host,
    move the ctime on and are caught; a record tampered with is ignored."""
    for _ in range(2):  # the first copy's files are new; the second finds them equal
        rt, root, _ = world.session()
        tick(root, world.tmp / "clock")
        agent_home.write_back(str(rt), keep=True)
    rt, root, third = world.session()
    # All but the logins (never at rest) known by their identities, none read.
    assert third.report.known == third.report.unchanged == third.report.files - 2 > 0
    assert f"({third.report.known} unread)" in third.report.line("claude")
    c = root / "claude"
    for path in (c / "CLAUDE.md", world.home / ".claude" / "history.jsonl"):
        st = path.stat()  # other bytes, same size, its times put back
        path.write_bytes(path.read_bytes().swapcase())
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    tick(root, world.tmp / "clock")
    agent_home.write_back(str(rt), keep=True)
    rt, root, fourth = world.session()
    assert fourth.report.known == third.report.known - 2
    assert tree(root) == world.fresh()
    assert (root / "claude" / "CLAUDE.md").read_text() == "be brief"
    # A record that is not the launcher's: the bytes decide, as before.
    for forged in ("not json", json.dumps({"claude/CLAUDE.md": [0] * 10}), "[1, 2]"):
        tick(root, world.tmp / "clock")
        agent_home.write_back(str(rt), keep=True)
        for p in root.parent.glob("*.ids"):
            p.write_text(forged)
        rt, root, nth = world.session()
        assert nth.report.reused and nth.report.known == 0
        assert tree(root) == world.fresh()


def test_what_the_inside_left_is_undone(world: World) -> None:
    """Links to secrets, a hard link, the same size and time with other bytes, plants,
    modes: the next copy is what a fresh one would be, and nothing outside changes."""
    rt, root, _ = world.session()
    c = root / "claude"
    key = world.home / ".ssh" / "id_rsa"
    outside = world.tmp / "workdir-file"
    outside.write_text("the user's own")
    md = c / "CLAUDE.md"  # other bytes, same size, its time put back
    st = md.stat()
    md.write_text("rm -rf /")
    os.utime(md, ns=(st.st_atime_ns, st.st_mtime_ns))
    (c / ".credentials.json").unlink()
    (c / ".credentials.json").symlink_to(key)  # a link to a secret
    (c / "history.jsonl").unlink()
    os.link(outside, c / "history.jsonl")  # a hard link to a file outside
    (c / "projects" / "-w" / "t1.jsonl").chmod(0o4777)
    os.mkfifo(c / "projects" / "-w" / "fifo")
    (c / "commands").mkdir()
    (c / "commands" / "evil.md").write_text("planted")
    (c / "settings.local.json").write_text('{"hooks": "planted"}')
    (c / "projects" / "-v").symlink_to(world.home / ".ssh")  # a directory that is a link
    (c / "projects" / "-w").chmod(0)
    (root / "home").mkdir()
    (root / "home" / "x").symlink_to(world.home)
    agent_home.write_back(str(rt), keep=True)
    _, root2, second = world.session()
    assert second.report.reused
    assert tree(root2) == world.fresh()
    assert key.read_text() == "SECRET-KEY" and outside.read_text() == "the user's own"
    assert (world.home / ".ssh").is_dir() and not (world.home / ".ssh").is_symlink()


def test_a_directory_made_unreadable_is_walked(world: World) -> None:
    rt, root, _ = world.session()
    (root / "claude" / "projects" / "-w").chmod(0)
    agent_home.write_back(str(rt), keep=True)
    _, root2, second = world.session()
    assert second.report.reused and tree(root2) == world.fresh()


def test_the_hosts_changes_since_the_last_session_are_taken(world: World) -> None:
    rt, _, _ = world.session()
    agent_home.write_back(str(rt), keep=True)
    c = world.home / ".claude"
    md = c / "CLAUDE.md"  # same size, same time: only the bytes tell
    st = md.stat()
    md.write_text("be kind!")
    os.utime(md, ns=(st.st_atime_ns, st.st_mtime_ns))
    (c / "projects" / "-w" / "t1.jsonl").unlink()
    (c / "projects" / "-w" / "t2.jsonl").write_text("transcript two")
    (c / "history.jsonl").unlink()
    (c / "history.jsonl").symlink_to(world.home / ".ssh" / "id_rsa")  # a link out: left out
    _, root2, second = world.session()
    assert second.report.reused and second.report.pruned >= 2
    got = tree(root2)
    assert got == world.fresh()
    assert got["claude/CLAUDE.md"] == b"be kind!" and "claude/history.jsonl" not in got
    assert "claude/projects/-w/t1.jsonl" not in got


def test_concurrent_sessions_never_share_a_copy(world: World) -> None:
    rt, _, _ = world.session()
    agent_home.write_back(str(rt), keep=True)
    parent = Path(world.env["XDG_STATE_HOME"]) / "agent-sandbox" / "agents" / "claude"
    a = agent_home.make_root(agents.CLAUDE, str(world.home), world.env, "a")
    b = agent_home.make_root(agents.CLAUDE, str(world.home), world.env, "b")
    assert os.listdir(a) and not os.listdir(b)  # one took the idle copy, the other a new one
    assert sorted(os.listdir(parent)) == ["a", "a.ids", "b"]  # its record went with it


def test_the_pool_is_bounded_and_the_janitor_keeps_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = [world.session() for _ in range(4)]
    for rt, _, _ in sessions[:3]:
        agent_home.write_back(str(rt), keep=True)
    parent = sessions[0][1].parent
    idle = [n for n in os.listdir(parent) if n.startswith("idle-")]
    assert len([n for n in idle if not n.endswith(".ids")]) == agent_reuse.POOL
    agent_home.write_back(str(sessions[3][0]))  # the janitor's: removed, and its record
    assert not sessions[3][1].exists() and not Path(f"{sessions[3][1]}.ids").exists()
    # A copy the session filled past the bound is removed, not kept.
    monkeypatch.setattr(agent_reuse, "POOL", 5)
    monkeypatch.setattr(agent_reuse, "MAX_ENTRIES", 50)
    rt, root, _ = world.session()
    for i in range(60):
        (root / f"junk{i}").write_text("x")
    agent_home.write_back(str(rt), keep=True)
    assert not root.exists() and not (parent / f"idle-{root.name}").exists()
    assert not Path(f"{root}.ids").exists() and not (parent / f"idle-{root.name}.ids").exists()


def test_an_idle_entry_that_is_no_directory_of_ours_is_never_taken(world: World) -> None:
    parent = Path(world.env["XDG_STATE_HOME"]) / "agent-sandbox" / "agents" / "claude"
    parent.mkdir(parents=True)
    (parent / "idle-0").symlink_to(world.home / ".ssh")
    root = agent_home.make_root(agents.CLAUDE, str(world.home), world.env, "s")
    assert not Path(root).is_symlink() and os.listdir(root) == []
    assert (world.home / ".ssh" / "id_rsa").read_text() == "SECRET-KEY"


def test_a_copy_with_too_many_entries_is_made_anew(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, root, _ = world.session()
    agent_home.write_back(str(rt), keep=True)
    idle = root.parent / "idle-s1"
    for i in range(30):
        (idle / f"junk{i}").write_text("x")
    monkeypatch.setattr(agent_reuse, "MAX_ENTRIES", 20)
    _, root2, second = world.session()
    assert not second.report.reused and tree(root2) == world.fresh()
    assert not [n for n in os.listdir(root.parent) if n.startswith("gone-")]


def test_a_kept_copy_holds_no_login_and_its_removal_follows_no_link(world: World) -> None:
    rt, root, _ = world.session()
    assert (root / "claude" / ".credentials.json").exists()
    agent_home.write_back(str(rt), keep=True)
    idle = root.parent / "idle-s1" / "claude"
    assert not (idle / ".credentials.json").exists() and not (idle / ".claude.json").exists()
    assert (idle / "CLAUDE.md").exists()
    # The session replaced its claude/ by a link to the user's own: nothing there goes.
    rt, root, _ = world.session()
    real = world.home / ".claude"
    for p in sorted((root / "claude").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
    (root / "claude").rmdir()
    (root / "claude").symlink_to(real)
    agent_home.write_back(str(rt), keep=True)
    assert (real / ".credentials.json").read_text() == '{"login": "host"}'
    assert (world.home / ".claude.json").exists()
    _, root3, _ = world.session()
    assert tree(root3) == world.fresh()


@pytest.mark.parametrize("size", [0, 1, 5 << 20])
def test_a_kept_copy_holds_only_what_the_copy_made(world: World, size: int) -> None:
    """What the session made or changed is written back, then not kept: the copy at rest
    is bounded as the copy was, whatever the session wrote there."""
    rt, root, _ = world.session()
    c = root / "claude"
    with open(c / "history.jsonl", "ab") as fh:
        fh.write(b"x" * size + b"\n")
    (c / "projects" / "-w" / "t2.jsonl").write_bytes(b"y" * size)
    (c / "big.bin").write_bytes(b"z" * size)
    agent_home.write_back(str(rt), keep=True)
    h = world.home / ".claude"
    assert (h / "history.jsonl").stat().st_size == len("host-line\n") + size + 1
    assert (h / "projects" / "-w" / "t2.jsonl").stat().st_size == size
    idle = root.parent / "idle-s1" / "claude"
    assert not (idle / "history.jsonl").exists() and not (idle / "big.bin").exists()
    assert not (idle / "projects" / "-w" / "t2.jsonl").exists()
    assert (idle / "projects" / "-w" / "t1.jsonl").read_text() == "transcript one"
    _, root2, second = world.session()
    assert second.report.reused and tree(root2) == world.fresh()


def test_sessions_starting_at_once_take_each_idle_copy_once(world: World) -> None:
    import threading

    for rt, _, _ in [world.session() for _ in range(2)]:
        agent_home.write_back(str(rt), keep=True)
    roots: list[str] = []
    go = threading.Barrier(8)

    def start(i: int) -> None:
        go.wait()
        roots.append(agent_home.make_root(agents.CLAUDE, str(world.home), world.env, f"c{i}"))

    threads = [threading.Thread(target=start, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = [r for r in roots if os.listdir(r)]
    assert len(roots) == 8 and len(taken) == agent_reuse.POOL  # each idle copy once
    assert not [n for n in os.listdir(Path(roots[0]).parent) if n.startswith("idle-")]


def test_a_copy_the_session_filled_with_directories_is_not_kept(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_reuse, "SLACK", 10)
    rt, root, made = world.session()
    for i in range(2 * made.report.files + agent_reuse.SLACK):
        (root / "claude" / f"d{i}").mkdir()
    agent_home.write_back(str(rt), keep=True)
    assert not root.exists() and not [n for n in os.listdir(root.parent)]


def test_an_idle_copy_tampered_with_is_sanitized_when_taken(world: World) -> None:
    """What the end's cleanup would have removed, planted in the idle copy itself: the
    walk that takes it (agent_reuse.Old) removes it, never following a link."""
    rt, root, _ = world.session()
    agent_home.write_back(str(rt), keep=True)
    c = root.parent / "idle-s1" / "claude"
    key = world.home / ".ssh" / "id_rsa"
    outside = world.tmp / "outside"
    outside.write_text("the user's own")
    (c / "CLAUDE.md").unlink()
    (c / "CLAUDE.md").symlink_to(key)  # a link to a secret where a file is taken
    (c / "history.jsonl").unlink()
    os.link(outside, c / "history.jsonl")  # a hard link to a file outside
    (c / "settings.json").unlink()
    os.mkfifo(c / "settings.json")  # a fifo where the session settings go
    (c / "projects" / "-w" / "t1.jsonl").chmod(0o4700)
    (c / "projects" / "-v").symlink_to(world.home / ".ssh")  # a directory that is a link
    (c / "commands").mkdir(mode=0o777)
    (c / "commands" / "evil.md").write_text("planted")
    (c / "projects" / "-w").chmod(0)
    _, root2, second = world.session()
    assert second.report.reused
    assert tree(root2) == world.fresh()
    assert key.read_text() == "SECRET-KEY" and outside.read_text() == "the user's own"
    assert outside.stat().st_nlink == 1 and sorted(os.listdir(world.home / ".ssh")) == ["id_rsa"]


def test_a_kept_copy_holds_no_link_and_a_config_tables_agent_is_not_kept(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    rt, root, _ = w.session()
    (root / "home").mkdir()
    (root / "home" / "src").symlink_to(w.home)  # as Landlock's private home links grants
    (root / "claude" / "dirlink").symlink_to(root / "claude" / "projects")
    agent_home.write_back(str(rt), keep=True)
    idle = root.parent / f"idle-{root.name}"
    assert not [p for p in idle.rglob("*") if p.is_symlink()]
    mine = agents.from_config("mine", {"config": ["~/.mine"]}, "[agents.mine]")
    (w.home / ".mine").mkdir()
    (w.home / ".mine" / "auth.json").write_text('{"token": "SECRET"}')
    rt2 = tmp_path / "rt-mine"
    rt2.mkdir()
    made = agent_home.prepare(mine, home=str(w.home), workdir="/w", session="m",
                              runtime=str(rt2), env=w.env)
    agent_home.write_back(str(rt2), keep=True)
    assert not Path(made.root).exists() and os.listdir(Path(made.root).parent) == []
