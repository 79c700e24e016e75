"""Git config rules: the allow list, the parser against the real git, the merge, the targets.

The parser is checked against ``git config --list --null`` on the same bytes;
the merge against configs that the real ``git`` wrote (``git config``,
``git remote add``, ``git push -u``, ``git branch -D``, ``git checkout
--track``), read back by the real ``git config --list``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libpolicy import gitconfig as gc
from libpolicy.gitconfig import UNPARSEABLE, config_targets, key_runs, merge_config
from libpolicy.gitconfig_parse import parse

GIT_ENV = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}


def git_list(data: bytes) -> list[tuple[str, bytes | None]] | None:
    """What the real git makes of ``data``: (key, value) pairs, None when it refuses."""
    done = subprocess.run(["git", "config", "--file", "-", "--list", "--null", "--no-includes"],
                          input=data, capture_output=True, env=GIT_ENV, check=False)
    if done.returncode != 0:
        return None
    out: list[tuple[str, bytes | None]] = []
    for item in done.stdout.split(b"\0")[:-1]:
        key, newline, value = item.partition(b"\n")
        out.append((key.decode("utf-8", "surrogateescape"), value if newline else None))
    return out


def ours(data: bytes) -> list[tuple[str, bytes | None]] | None:
    parsed = parse(data)
    return None if parsed is None else [(i.key, i.value) for i in parsed.items]


# --- the allow list: key -> runs? ---------------------------------------------------

KEYS = [
    # kept: data only
    ("user.name", False), ("user.email", False), ("User.Email", False),
    ("user.signingkey", False), ("color.ui", False), ("color.diff.meta", False),
    ("advice.detachedHead", False), ("core.repositoryformatversion", False),
    ("core.filemode", False), ("core.bare", False), ("core.logallrefupdates", False),
    ("core.ignorecase", False), ("core.precomposeunicode", False), ("core.symlinks", False),
    ("core.autocrlf", False), ("core.eol", False), ("CORE.Bare", False),
    ("extensions.objectformat", False), ("extensions.worktreeConfig", False),
    ("init.defaultBranch", False), ("remote.origin.url", False), ("remote.origin.pushurl", False),
    ("remote.origin.fetch", False), ("remote.origin.push", False), ("remote.x.mirror", False),
    ("remote.x.tagopt", False), ("remote.x.prune", False), ("remote.a.b.c.url", False),
    ("remote.pushDefault", False), ("remote.origin.gh-resolved", False),
    ("branch.main.remote", False), ("branch.main.merge", False), ("branch.feat/x.rebase", False),
    ("branch.main.pushremote", False), ("branch.main.description", False),
    ("push.default", False), ("push.autoSetupRemote", False), ("pull.rebase", False),
    ("pull.ff", False), ("fetch.prune", False), ("commit.gpgsign", False), ("tag.gpgSign", False),
    ("submodule.m.url", False), ("submodule.m.active", False),
    # runs, or may: on no list
    ("core.fsmonitor", True), ("Core.FSMonitor", True), ("core.hooksPath", True),
    ("core.sshCommand", True), ("core.pager", True), ("core.editor", True), ("core.askPass", True),
    ("core.gitProxy", True), ("core.worktree", True), ("core.alternateRefsCommand", True),
    ("core.excludesFile", True), ("core.attributesFile", True), ("core.sharedRepository", True),
    ("core.protectNTFS", True), ("core.fsmonitorHookVersion", True),
    ("sequence.editor", True), ("diff.external", True), ("diff.x.textconv", True),
    ("diff.x.command", True), ("merge.x.driver", True), ("filter.lfs.smudge", True),
    ("filter.x.process", True), ("credential.helper", True), ("credential.https://h.helper", True),
    ("gpg.program", True), ("gpg.ssh.program", True), ("gpg.format", True),
    ("include.path", True), ("Include.Path", True), ("includeIf.gitdir:/x/.path", True),
    ("includeif.onbranch:main.path", True), ("pager.log", True), ("imap.tunnel", True),
    ("lfs.extension.x.clean", True), ("lfs.url", True), ("url.ext::sh.insteadOf", True),
    ("protocol.ext.allow", True), ("protocol.allow", True), ("remote.origin.uploadpack", True),
    ("remote.origin.receivepack", True), ("remote.origin.vcs", True), ("remote.x.proxy", True),
    ("submodule.m.update", True), ("uploadpack.packObjectsHook", True), ("web.browser", True),
    ("interactive.diffFilter", True), ("ssh.variant", True), ("sendemail.smtpserver", True),
    ("difftool.x.cmd", True), ("mergetool.x.cmd", True), ("merge.tool", True),
    ("init.templateDir", True), ("branch.main.mergeOptions", True), ("http.sslVerify", True),
    ("http.proxy", True), ("trailer.x.command", True), ("man.viewer", True),
    ("blame.ignoreRevsFile", True), ("maintenance.auto", True), ("status.showUntrackedFiles", True),
    ("some.unknown", True), ("x.y.z", True), ("core", True), ("user", False),
]


@pytest.mark.parametrize(("key", "runs"), KEYS)
def test_key_verdict(key: str, runs: bool) -> None:
    assert key_runs(key) is runs


ALIASES = [
    ("status", False), ("log --oneline --graph", False), ("checkout", False), ("commit -v", False),
    ("  branch -vv", False), ("'log' --stat", False), ("diff --cached", False),
    ("!sh -c evil", True), ("  !evil", True), ("-c core.fsmonitor=evil status", True),
    ('"-c" core.fsmonitor=evil status', True), ("'-c' x=y status", True), ("\\-c x=y log", True),
    ("--exec-path=/tmp/x status", True), ("-p status", True), ("rebase -x evil", True),
    ("fetch --upload-pack=evil", True), ("submodule foreach evil", True),
    ("difftool -x evil", True), ("grep -Oevil x", True), ("config core.fsmonitor evil", True),
    ("log --output=/home/u/.bashrc", True), ("diff --outp=x", True), ("lg", True),
    ("'unclosed", True), ("", True), (None, True), ("status\n-c x", False),
]


@pytest.mark.parametrize(("value", "runs"), ALIASES)
def test_alias_verdict(value: str | None, runs: bool) -> None:
    assert key_runs("alias.st", value) is runs
    assert gc.alias_harmless(value) is not runs


@pytest.mark.parametrize(("line", "words"), [
    ("a b  c", ["a", "b", "c"]), ("'a b' c", ["a b", "c"]), ('"a \\" b"', ['a " b']),
    ("a\\ b", ["a b"]), ("''", [""]), ("'a", None), ("a'b'c", ["abc"]), ("", []),
])  # fmt: skip
def test_split_cmdline(line: str, words: list[str] | None) -> None:
    assert gc.split_cmdline(line) == words


def test_the_old_names_keep_working() -> None:
    assert gc.runs_commands(["user.name", "core.fsmonitor", "alias.co", "x.y"]) == [
        "core.fsmonitor", "x.y"]
    assert gc.sanitized_pairs([("user.name", "a"), ("alias.co", "checkout")]) is None
    clean, bad = gc.sanitized_pairs([("user.name", "a\n\"b"), ("core.pager", "evil")]) or (b"", [])
    assert bad == ["core.pager"] and git_list(clean) == [("user.name", b'a\n"b')]
    assert gc.sanitized_pairs(None) == (b"", [UNPARSEABLE])


# --- files: the parser as git reads them ---------------------------------------------

FILES = [
    # (bytes, keys that must be found dropped)
    (b"[core]\n\tfsmonitor = evil\n", ["core.fsmonitor"]),
    (b"[Core]\n\tFSMonitor = evil\n", ["core.fsmonitor"]),
    (b"[CORE] FsMonitor=evil", ["core.fsmonitor"]),
    (b"[core.x]\n\tfsmonitor = evil\n", ["core.x.fsmonitor"]),
    (b'[remote "o\\"r\\\\g"]\n\turl = u\n\tuploadpack = evil\n', ['remote.o"r\\g.uploadpack']),
    (b"[remote.Origin]\n\turl = u\n\tvcs = evil\n", ["remote.origin.vcs"]),
    (b"[include]\n\tpath = ../x\n", ["include.path"]),
    (b'[includeIf "gitdir:../.."]\n\tpath = x.cfg\n', ["includeif.gitdir:../...path"]),
    (b'[alias]\n\tst = "-c" core.fsmonitor=evil status\n', ["alias.st"]),
    (b"[alias]\n\tst = !\\\n evil\n", ["alias.st"]),
    (b"[user]\n\tname = a\\\n b\n[core]\n\tpager = le\\\nss\n", ["core.pager"]),
    (b"[user]\n\tname = \"a\\nb\"\n\tpager = x\n[core]\n\teditor = \"vi\\tx\"\n", ["core.editor"]),
    (b"[user]\n\tname = \xff\xfe\n[core \"\xff\"]\n\tx = 1\n", ["core.\udcff.x"]),
    (b"\xef\xbb\xbf[core]\r\n\thooksPath = h\r\n", ["core.hookspath"]),
    (b"[core]\n\tbare\n\tsshCommand\n", ["core.sshcommand"]),
    (b"[core]\n\tbare ; git takes no comment after a bare key\n", [UNPARSEABLE]),
    (b"[core]\n\tfsmonitor = \"evil ; x\" # c\n", ["core.fsmonitor"]),
    # unparseable: the whole file is unsafe
    (b"[core\n\tfsmonitor = evil\n", [UNPARSEABLE]),
    (b"[core]\n\tfsmonitor = \"evil\n", [UNPARSEABLE]),
    (b"[core]\n\tfsmonitor = ev\\il\n", [UNPARSEABLE]),
    (b"[core]\n\t-x = 1\n", [UNPARSEABLE]),
    (b"fsmonitor = evil\n", [UNPARSEABLE]),
    (b"[core]\n\tbare = true\0\n", [UNPARSEABLE]),
    (b"\xef\xbb[core]\n", [UNPARSEABLE]),
    (b'[ "x"]\n\ty = 1\n', [UNPARSEABLE]),
    (b"[core]\n\tbare = 1\n", []),
    (b"", []),
]


@pytest.mark.parametrize(("data", "dropped"), FILES)
def test_files_judged_as_git_reads_them(data: bytes, dropped: list[str]) -> None:
    result = gc.sanitized_config(data)
    assert (result[1] if result else []) == dropped
    if ours(data) is not None:
        assert ours(data) == git_list(data)  # we read what git reads
    if result and result[1] != [UNPARSEABLE]:
        kept = git_list(result[0])
        assert kept is not None
        assert [k for k, _ in kept] == [k for k, _ in ours(data) or [] if k not in dropped]


TRICKY = [
    b"[a]b", b"[a]\nb=", b"[a]\nb =  x  y  ", b"[a]\nb = \"  x \" y", b"[a]\nb=x\\",
    b"[a]\n\nb\n", b"[a]\nb = x\\\n\n", b"[a \"b\"]c=d", b"[a  \"b\"]\nc=d",
    b"[a \"b\" ]\nc=d", b"[a\t\"b\"]\nc=d",
    b"[a.b.c]\nd=e", b"[a-1]\nb-2 = 3", b"[a]\nb\t=\tc\r", b"[a]\nb = c\rd", b"[a]\nb = \"c\rd\"",
    b"[a]\r\nb = c\r\n\r\n", b"[a]\nb = #x", b"[a]\nb = ;x", b"[a]\nb = \"#\"x", b"[a]\n\tB = 1",
    b"[a \"\"]\nb=1", b"[a \"\\\\\"]\nb=1", b"[a \"x\\y\"]\nb=1", b"[a]b=1\n[c]d=2", b"[]\nb=1",
    b"[a]\n1b=1", b"[a]\nb=\"\\b\\t\\n\"", b"[a]\nb = x\\\"y", b"[a.]\nb=1", b"[.a]\nb=1",
    b"[a..b]\nc=1", b"[a]\nb = x\ty", b"[a]\nb = x\x0c", b"[a]\nb = x\x0by", b"[A-B]\nC-d=E",
    b"[a \"b\"] c = d\n", b"[a]\nb\r\n", b"[a]\nb = c  \t \r\n", b"[a]\nb = c d  e",
    b"[a]\nb = c\x00", b"[a \"\xff\"]\nb = \xfe", b"[a]\nb=c;d", b"[a]\nb=c #d",
    b"[a]\n b=c\n\tb=d", b"[a]\nb = \xc3\xa9\x1b[31m", b"[a]\nb = \"\\\n\"", b"[a]\n  # c\n  b",
]


@pytest.mark.parametrize("data", TRICKY)
def test_parser_reads_what_git_reads(data: bytes) -> None:
    mine = ours(data)
    theirs = git_list(data)
    assert mine is None or mine == theirs
    if theirs is None:
        assert mine is None


_PIECES = st.sampled_from([
    "[", "]", "[a]", "[A \"B\"]", "[a.b]", "\"", "\\", "\\\n", "\n", "\r\n", "\r", " ", "\t", "=",
    ";", "#", "x", "Y", "-", "1", "b = c", "é", "\x1b", "\xff", "\\n", "\\t", "\\q", ".",
    "\nk", "\n\tk = ", "\nk=", "[s \"", "\"]", "\nk = \"",
])  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.lists(_PIECES, max_size=14))
def test_parser_never_reads_other_than_git(header: bool, pieces: list[str]) -> None:
    text = ("[s]\n" if header else "") + "".join(pieces)
    data = text.encode().replace("\xff".encode(), b"\xff")
    mine = ours(data)
    if mine is not None:
        assert mine == git_list(data)


# --- the merge ----------------------------------------------------------------------

ORIGINAL = b"""# the user's own config: comments stay
[core]
\trepositoryformatversion = 0
\tfilemode = true ; why
\tbare = false
\tlogallrefupdates = true
\tfsmonitor = .git/my-watchman
[remote "origin"]
\turl = https://example.com/x.git
\tfetch = +refs/heads/*:refs/remotes/origin/*
[branch "main"]
\tremote = origin
\tmerge = refs/heads/main
[branch "old"]
\tremote = origin
\tmerge = refs/heads/old
[alias]
\tlg = !git log --graph
"""


def _git_config(path: Path, *args: str) -> None:
    subprocess.run(["git", "config", "--file", str(path), *args], check=True, env=GIT_ENV)


MERGES = [
    # (what the session does with `git config --file`, keys applied, keys dropped)
    ([["user.email", "a@b.c"]], ["user.email"], []),
    ([["remote.up.url", "u"], ["--add", "remote.up.fetch", "+refs/heads/*:refs/remotes/up/*"]],
     ["remote.up.url", "remote.up.fetch"], []),
    ([["--remove-section", "branch.old"]], ["branch.old.remote", "branch.old.merge"], []),
    ([["--unset", "branch.main.merge"]], ["branch.main.merge"], []),
    ([["core.bare", "true"]], ["core.bare"], []),
    ([["core.fsmonitor", "evil"]], [], ["core.fsmonitor"]),
    ([["--unset", "core.fsmonitor"]], [], ["core.fsmonitor"]),
    ([["--remove-section", "core"]], ["core.repositoryformatversion", "core.filemode",
                                      "core.bare", "core.logallrefupdates"], ["core.fsmonitor"]),
    ([["alias.st", "-c core.fsmonitor=evil status"]], [], ["alias.st"]),
    ([["alias.st", "status -sb"]], ["alias.st"], []),
    ([["--unset", "alias.lg"]], ["alias.lg"], []),
    ([["include.path", "../../tools/git.cfg"]], [], ["include.path"]),
    ([["includeIf.gitdir:/.path", "x"]], [], ["includeif.gitdir:/.path"]),
    ([["Core.HooksPath", ".husky"], ["user.name", "n"]], ["user.name"], ["core.hookspath"]),
    ([["remote.origin.url", "https://other/x.git"], ["remote.origin.uploadpack", "evil"]],
     ["remote.origin.url"], ["remote.origin.uploadpack"]),
    ([["user.name", "line1\nline2 \"q\" \\ \t;#"]], ["user.name"], []),
    ([["remote.we\"ird\\name.url", "\xe9"]], ['remote.we"ird\\name.url'], []),
    ([["--add", "remote.origin.fetch", "+refs/tags/*:refs/tags/*"]], ["remote.origin.fetch"], []),
    ([["imap.tunnel", "evil"], ["lfs.extension.x.clean", "evil"]], [],
     ["imap.tunnel", "lfs.extension.x.clean"]),
]


@pytest.mark.parametrize(("commands", "applied", "dropped"), MERGES)
def test_merge_of_what_git_config_wrote(tmp_path: Path, commands: list[list[str]],
                                        applied: list[str], dropped: list[str]) -> None:
    path = tmp_path / "config"
    path.write_bytes(ORIGINAL)
    for args in commands:
        _git_config(path, *args)
    session = path.read_bytes()
    merged, got = merge_config(ORIGINAL, session)
    assert got == sorted(dropped)
    before, after, now = git_list(ORIGINAL), git_list(session), git_list(merged)
    assert before is not None and after is not None and now is not None
    for key in {k for k, _ in before} | {k for k, _ in after}:
        want = after if key in applied else before
        assert [v for k, v in now if k == key] == [v for k, v in want if k == key], key
    assert b"# the user's own config: comments stay" in merged
    assert (b"; why" in merged) is ("core.filemode" not in applied)


def test_merge_of_nothing_and_of_garbage() -> None:
    assert merge_config(ORIGINAL, ORIGINAL) == (ORIGINAL, [])
    assert merge_config(ORIGINAL, b"[core\n") == (ORIGINAL, [UNPARSEABLE])
    assert merge_config(b"[core\n", ORIGINAL) == (b"[core\n", [UNPARSEABLE])
    merged, dropped = merge_config(b"", b"[user]\n\tname = n\n[core]\n\tpager = x\n")
    assert dropped == ["core.pager"] and git_list(merged) == [("user.name", b"n")]
    merged, _ = merge_config(b"[user]name=a", b"[user]name=a\nemail=b")  # no final newline
    assert git_list(merged) == [("user.name", b"a"), ("user.email", b"b")]
    merged, _ = merge_config(b"[user]", b"[user]\n\temail = b")
    assert git_list(merged) == [("user.email", b"b")]


def _run(cwd: Path, *args: str) -> str:
    env = {**GIT_ENV, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@x"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, env=env, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone with a branch 'old' tracked, and a planted-looking user original."""
    base = tmp_path_factory.mktemp("merge")
    _run(base, "init", "-q", "--bare", "-b", "main", "up.git")
    _run(base, "clone", "-q", "up.git", "work")
    work = base / "work"
    _run(work, "commit", "-q", "--allow-empty", "-m", "one")
    _run(work, "push", "-q", "origin", "main")
    _run(work, "branch", "old")
    _run(work, "push", "-q", "origin", "old")
    _run(work, "branch", "--set-upstream-to=origin/old", "old")
    _run(work, "remote", "add", "up2", "../up.git")
    return work


REAL = [
    (["remote", "add", "up", "../up.git"], ["remote.up.url", "remote.up.fetch"]),
    (["remote", "remove", "up2"], ["remote.up2.url", "remote.up2.fetch"]),
    (["remote", "set-url", "origin", "../up2.git"], ["remote.origin.url"]),
    (["config", "user.email", "agent@example.com"], ["user.email"]),
    (["push", "-q", "-u", "origin", "main:topic"], ["branch.main.merge"]),
    (["push", "-q", "-u", "origin", "old:old2"], ["branch.old.merge"]),
    (["push", "-q", "-u", "up2", "main"], ["branch.main.remote"]),
    (["branch", "-D", "old"], ["branch.old.remote", "branch.old.merge"]),
    (["branch", "-m", "old", "renamed"], ["branch.old.remote", "branch.old.merge",
                                          "branch.renamed.remote", "branch.renamed.merge"]),
    (["remote", "rename", "up2", "up3"], ["remote.up2.url", "remote.up2.fetch",
                                          "remote.up3.url", "remote.up3.fetch"]),
    (["checkout", "-q", "--track", "-b", "t2", "origin/old"], ["branch.t2.remote",
                                                                "branch.t2.merge"]),
]


@pytest.mark.parametrize(("args", "applied"), REAL)
def test_merge_of_real_git_commands(tmp_path: Path, repo: Path, args: list[str],
                                    applied: list[str]) -> None:
    work = tmp_path / "work"
    shutil.copytree(repo, work, symlinks=True)
    shutil.copytree(repo.parent / "up.git", tmp_path / "up.git", symlinks=True)
    config = work / ".git" / "config"
    original = config.read_bytes()
    _run(work, *args)
    _run(work, "config", "core.fsmonitor", "touch planted")  # and a plant beside it
    _run(work, "config", "alias.st", "-c core.fsmonitor=evil status")
    _run(work, "config", "include.path", "../evil.cfg")
    session = config.read_bytes()
    merged, dropped = merge_config(original, session)
    assert dropped == ["alias.st", "core.fsmonitor", "include.path"]
    config.write_bytes(merged)
    now = _run(work, "config", "--file", str(config), "--list").splitlines()
    before, after = git_list(original) or [], git_list(session) or []
    for key in applied:  # each one changed
        assert [v for k, v in before if k == key] != [v for k, v in after if k == key], key
    for key in {k for k, _ in before} | {k for k, _ in after}:
        want = before if key in dropped or key not in applied else after
        expect = [f"{k}={(v or b'').decode()}" for k, v in want if k == key]
        assert [line for line in now if line.startswith(key + "=")] == expect, key
    assert _run(work, "status", "--short") == ""  # the merged file is one git reads


# --- what a config makes git read or run ---------------------------------------------

TARGETS = [
    (b"[core]\n\thooksPath = .husky\n", "/w", ["/w/.husky"]),
    (b"[core]\n\thooksPath = /abs/hooks\n", None, ["/abs/hooks"]),
    (b"[core]\n\thooksPath = hooks\n", None, ["/w/.git/hooks"]),
    (b"[include]\n\tpath = ../tools/git.cfg\n", "/w", ["/w/.git/../tools/git.cfg"]),
    (b"[include]\n\tpath = ~/x.cfg\n\tpath = ~u/y\n", "/w", ["~/x.cfg", "~u/y"]),
    (b'[includeIf "gitdir:/w/"]\n\tpath = a\n[includeIf "onbranch:x"]\n\tpath = /b\n', "/w",
     ["/w/.git/a", "/b"]),
    (b"[Include]\n\tPath = a\n\tpath = a\n[core]\n\tfsmonitor = x\n", "/w", ["/w/.git/a"]),
    (b"[include]\n\tpath\n\tpath =\n[x]\n\tpath = no\n[include \"s\"]\n\tpath = no\n", "/w", []),
    (b"[include]\n\tpath = %(prefix)/etc/x\n", "/w", ["%(prefix)/etc/x"]),
    (b"[include]\n\tpath = \xff\n", "/w", ["/w/.git/\udcff"]),
    (b"[include\n", "/w", None),
]


@pytest.mark.parametrize(("data", "worktree", "paths"), TARGETS)
def test_config_targets(data: bytes, worktree: str | None, paths: list[str] | None) -> None:
    assert config_targets(data, "/w/.git", worktree) == paths


def test_relative_targets_resolve_where_git_looks(tmp_path: Path) -> None:
    """A relative include is read from beside the config: the real git agrees."""
    (tmp_path / "inc.cfg").write_text("[user]\n\tname = from-include\n")
    (tmp_path / "sub").mkdir()
    cfg = tmp_path / "sub" / "config"
    cfg.write_bytes(b"[include]\n\tpath = ../inc.cfg\n")
    (target,) = config_targets(cfg.read_bytes(), str(cfg.parent)) or []
    assert Path(target).resolve() == tmp_path / "inc.cfg"
    out = subprocess.run(["git", "config", "--file", str(cfg), "--includes", "user.name"],
                         capture_output=True, text=True, env=GIT_ENV, check=True).stdout
    assert out.strip() == "from-include"


# --- any config, any change: the merge against the real git's reading ---------------

_KEYS = st.sampled_from([
    "user.name", "user.email", "core.bare", "core.fsmonitor", "core.hooksPath", "alias.st",
    "remote.origin.url", "remote.origin.fetch", "remote.Up stream.url", 'remote.q"\\.url',
    "branch.main.merge", "branch.main.remote", "branch.x/y.remote", "include.path",
    "filter.lfs.smudge", "x.y", "color.ui", "submodule.m.update",
])  # fmt: skip
_VALUES = st.sampled_from(["v", "a b", "!evil", "status", "-c x=y status", "x\ny", "q\"\\;#",
                           "\xe9", " lead", "trail "])
_OPS = st.one_of(
    st.tuples(st.just("set"), _KEYS, _VALUES),
    st.tuples(st.just("--add"), _KEYS, _VALUES),
    st.tuples(st.just("--unset-all"), _KEYS),
    st.tuples(st.just("--remove-section"), st.sampled_from(
        ["core", "user", "remote.origin", "branch.main", "alias", "include", "x"])),
    st.tuples(st.just("--rename-section"), st.just("branch.main"), st.just("branch.next")),
)


def _apply(path: Path, ops: list[tuple[str, ...]]) -> None:
    for op in ops:
        args = list(op[1:]) if op[0] == "set" else list(op)
        subprocess.run(["git", "config", "--file", str(path), *args], env=GIT_ENV,
                       capture_output=True, check=False)  # an unset of nothing fails: fine


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(_OPS, max_size=6), st.lists(_OPS, max_size=6))
def test_any_merge_keeps_the_user_keys_and_only_allowed_changes(
        tmp_path: Path, before_ops: list[tuple[str, ...]], session_ops: list[tuple[str, ...]]
) -> None:
    path = tmp_path / "config"
    path.write_bytes(b"# mine\n[core]\n\trepositoryformatversion = 0\n")
    _apply(path, before_ops)
    original = path.read_bytes()
    _apply(path, session_ops)
    session = path.read_bytes()
    merged, dropped = merge_config(original, session)
    before, after, now = git_list(original), git_list(session), git_list(merged)
    assert before is not None and after is not None and now is not None
    for key in {k for k, _ in before} | {k for k, _ in after}:
        was = [v for k, v in before if k == key]
        then = [v for k, v in after if k == key]
        got = [v for k, v in now if k == key]
        if was == then:
            assert got == was and key not in dropped
        elif key in dropped:
            assert got == was and any(key_runs(key, v) for v in then or was)
        else:
            assert got == then and all(not key_runs(key, v) for v in then)
    assert merged.startswith(b"# mine\n")


def test_a_config_too_big_is_refused_whole() -> None:
    big = b"[user]\n\tname = n\n" + b"# pad\n" * ((gc.MAX_CONFIG - 17) // 6)
    assert len(big) <= gc.MAX_CONFIG
    merged, dropped = merge_config(b"", big + b"[user]\n\temail = e\n")
    assert (merged, dropped) == (b"", [gc.TOO_BIG])
    merged, dropped = merge_config(b"", big)
    assert dropped == [] and git_list(merged) == [("user.name", b"n")]
    assert config_targets(big + b"[include]\n\tpath = x\n", "/w") is None
