"""Issue 24's attacks as data: what the person had, what the session plants, what git runs next.

Helpers only (the tests are in test_hostrun_attack_sessions.py).  Each :class:`Attack`
lives in its own directory of the workdir, so that one session plants them
all: ``setup`` builds the person's state on the host before the session,
``plant`` is a bash snippet the session's command runs in that directory
(``$C`` is the canary directory, outside the workdir and not writable from
inside), and ``host`` lists what the person does afterwards, each a
directory and an argv for the host's real ``git``.  A planted command writes
``$C/<name>``; any file in the canary directory is a plant that ran.

:func:`plant_script` joins the snippets into one script; a snippet that ran
through prints ``PLANTED <name>``, so a test knows whether the guard had
something to neutralize at the end (bwrap refuses some plants outright).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_ALLOW_PROTOCOL": "file"}
MiB = 1 << 20
TiB = 1 << 40

# bash helpers the snippets use: a hook that writes its canary, an fsmonitor that does.
PRELUDE = r"""
export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@a GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@a
hook() { mkdir -p "$(dirname "$1")" && printf '#!/bin/sh\necho ran > %s/%s\n' "$C" "$2" > "$1" \
  && chmod +x "$1"; }
fsm() { git config -f "$1" core.bare false && git config -f "$1" core.fsmonitor \
  "echo ran > $C/$2; false"; }
bare() { git init -q --bare "$1" && fsm "$1/config" "$2" && hook "$1/hooks/pre-commit" "$2-hook"; }
deep() { i=0; while [ $i -lt "$2" ]; do mkdir d && cd d || return 1; i=$((i+1)); done; cd "$1"; }
"""


def git(cwd: Path, *args: str, check: bool = True, prefix: tuple[str, ...] = (),
        timeout: float = 60, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """The host's real git, as the person (``prefix``: run as another user)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, **GIT_ENV,
           **(env or {})}
    env.setdefault("HOME", str(cwd.anchor))
    return subprocess.run([*prefix, "git", "-c", "protocol.file.allow=always", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=check)


def commits(repo: Path, n: int) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q")
    for i in range(1, n + 1):
        (repo / f"f{i}").write_text(f"{i}\n")
        git(repo, "add", f"f{i}")
        git(repo, "commit", "-q", "-m", f"c{i}")


@dataclass
class Attack:
    name: str
    plant: str
    setup: Callable[[Path, Path], None] = lambda repo, lib: commits(repo, 1)
    host: list[tuple[str, tuple[str, ...]]] = field(default_factory=lambda: [
        (".", ("status",)), (".", ("commit", "-q", "--allow-empty", "-m", "host"))])
    backends: tuple[str, ...] = ("bwrap", "nono")


def _with_module(repo: Path, lib: Path) -> None:
    commits(repo, 1)
    git(repo, "submodule", "add", "-q", str(lib), "m")
    git(repo, "commit", "-q", "-m", "module")


def _status_commit(*where: str) -> list[tuple[str, tuple[str, ...]]]:
    out: list[tuple[str, tuple[str, ...]]] = []
    for d in where:
        out += [(d, ("status",)), (d, ("commit", "-q", "--allow-empty", "-m", "host"))]
    return out


def _hooks_full(repo: Path, _lib: Path) -> None:
    commits(repo, 1)
    for i in range(5001):
        (repo / f".git/hooks/e{i:05}").touch()


def _vscode_full(repo: Path, _lib: Path) -> None:
    (repo / ".vscode").mkdir(parents=True)
    for i in range(5001):
        (repo / f".vscode/e{i:05}").touch()


def _husky(repo: Path, _lib: Path) -> None:
    commits(repo, 1)
    (repo / ".husky").mkdir()
    (repo / ".husky/pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (repo / ".husky/pre-commit").chmod(0o755)
    (repo / "tools").mkdir()
    (repo / "tools/git.cfg").write_text("[user]\n\tname = shared\n")
    git(repo, "config", "core.hooksPath", ".husky")
    git(repo, "config", "include.path", "../tools/git.cfg")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "husky")


def _vscode_with(data: bytes) -> Callable[[Path, Path], None]:
    def setup(repo: Path, _lib: Path) -> None:
        (repo / ".vscode").mkdir(parents=True)
        (repo / ".vscode/settings.json").write_text('{"editor.tabSize": 4}\n')
        (repo / ".vscode/big.bin").write_bytes(data)
    return setup


def _existing(repo: Path, lib: Path) -> None:
    """The person's repository with a submodule (m) and a nested repository (sub)."""
    _with_module(repo, lib)
    commits(repo / "sub", 1)


def _three_on_main(repo: Path, _lib: Path) -> None:
    commits(repo, 3)
    git(repo, "branch", "-M", "main")


DEEP17 = "/".join(f"d{i}" for i in range(1, 17)) + "/g"

# Names a printed line must quote: shell syntax, a space, control bytes, not UTF-8.
HOSTILE_NAMES = ["x y;touch PWNED;z", "$(touch PWNED)", "`touch PWNED`", "it's", "-rf"]
# printf formats of names with control bytes and bytes that are not UTF-8
HOSTILE_MADE = [r"e\033]0;TITLE\007", r"c\rFORGED", r"n\nFORGED line",
                r"\033]52;c;cHduZWQ=\007", r"\377\376"]


def _hostile_plant() -> str:
    words = ["'" + n.replace("'", "'\\''") + "'" for n in HOSTILE_NAMES]
    words += [f"\"$(printf '{fmt}')\"" for fmt in HOSTILE_MADE]
    lines = [f'd={word} && mkdir -p -- "$d" && echo "export N={n}" > "$d/.envrc"'
             for n, word in enumerate(words)]
    # an existing .vscode replaced whole: the line that removes the old one first
    # (bwrap holds it read-only: that step may fail alone)
    return (" && ".join(lines) + "; { rm -rf 'v;touch PWNED;w/.vscode' && mkdir "
            "'v;touch PWNED;w/.vscode' && echo '{\"session\": 1}' > "
            "'v;touch PWNED;w/.vscode/settings.json'; true; }")


def _hostile_setup(repo: Path, _lib: Path) -> None:
    (repo / "v;touch PWNED;w/.vscode").mkdir(parents=True)
    (repo / "v;touch PWNED;w/.vscode/settings.json").write_text('{"person": 1}\n')


PRE_COMMIT_CONFIG = """repos:
- repo: local
  hooks:
  - id: check
    name: check
    entry: "true"
    language: system
    always_run: true
    pass_filenames: false
"""


def _pre_commit(repo: Path, _lib: Path) -> None:
    """The person uses pre-commit (https://pre-commit.com): its hook in .git/hooks runs
    the commands .pre-commit-config.yaml names, a tracked file of the worktree."""
    commits(repo, 1)
    (repo / ".pre-commit-config.yaml").write_text(PRE_COMMIT_CONFIG)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "pre-commit")
    tool = shutil.which("pre-commit")
    if tool is not None:
        subprocess.run([tool, "install"], cwd=repo, check=True, capture_output=True,
                       env={**os.environ, "PRE_COMMIT_HOME": str(repo.parent / ".pc")})


# not on issue 24's list: the agent commits its own pre-commit entry (--no-verify inside)
PRE_COMMIT = Attack(
    "precommit", "sed -i \"s|entry: \\\"true\\\"|entry: sh -c 'echo ran > $C/precommit'|\" "
    ".pre-commit-config.yaml && grep -q precommit .pre-commit-config.yaml "
    "&& git commit -q --no-verify -am 'lint config'", _pre_commit)


MAIN: list[Attack] = [
    Attack("nested", "bare .git/modules/m/x/g nested && mkdir sub "
           "&& echo 'gitdir: ../.git/modules/m/x/g' > sub/.git",
           _with_module, _status_commit(".", "sub")),
    Attack("deep17", f"bare .git/modules/{DEEP17} deep17 && mkdir sub "
           f"&& echo 'gitdir: ../.git/modules/{DEEP17}' > sub/.git",
           _with_module, _status_commit(".", "sub")),
    Attack("lnk", "ln -s .git/objects lnk && mkdir -p .git/.git/modules "
           "&& bare .git/.git/modules/x lnk && mkdir sub "
           "&& echo 'gitdir: ../lnk/../.git/modules/x' > sub/.git",
           _with_module, _status_commit(".", "sub")),
    Attack("hooks5k", "hook .git/hooks/pre-commit hooks5k", _hooks_full),
    Attack("vscode5k", "echo '{\"tasks\": [{\"command\": \"touch $C/vscode5k\"}]}' "
           "> .vscode/tasks.json", _vscode_full, []),
    Attack("newrepo5k", "git init -q nr && touch $(seq -f nr/.git/hooks/e%05g 5001) "
           "&& hook nr/.git/hooks/pre-commit newrepo5k && fsm nr/.git/config newrepo5k-fsm",
           lambda repo, lib: repo.mkdir(), _status_commit("nr")),
    Attack("chmod", "cp -r .git .gitc && hook .gitc/hooks/pre-commit chmod "
           "&& fsm .gitc/config chmod-fsm && echo ../.gitc > .git/commondir "
           "&& { hook .git/hooks/pre-commit chmod-own; true; } && chmod 0311 .git"),
    Attack("rebase", "GIT_SEQUENCE_EDITOR=\"sed -i '1i break'\" git rebase -q -i HEAD~2; "
           "test -d .git/rebase-merge && sed -i \"1i exec echo ran > $C/rebase\" "
           ".git/rebase-merge/git-rebase-todo && echo x/evil > .git/rebase-merge/strategy "
           "&& hook git-merge-x/evil rebase-strategy",
           lambda repo, lib: commits(repo, 3),
           [(".", ("status",)), (".", ("rebase", "--continue"))]),
    Attack("sequencer", "git checkout -q -b other HEAD~2 && echo x > f2 && git add f2 "
           "&& git commit -qm o "
           "&& { git cherry-pick main~2..main >/dev/null 2>&1; test -d .git/sequencer; } "
           "&& printf '[options]\\n\\tstrategy = x/evil\\n' >> .git/sequencer/opts "
           "&& hook git-merge-x/evil sequencer",
           _three_on_main,
           [(".", ("status",)), (".", ("add", "f2")), (".", ("cherry-pick", "--continue"))]),
    Attack("alias", "git config alias.st \"-c core.fsmonitor='echo ran > $C/alias; false' "
           "status\"", host=[(".", ("st",))]),
    Attack("husky", "hook .husky/pre-commit husky && printf '[core]\\n\\tfsmonitor = "
           "\"echo ran > %s/husky-include; false\"\\n' \"$C\" >> tools/git.cfg", _husky),
    # not on issue 24's list: VS Code runs these too (a dev container's initializeCommand
    # on the host itself, a workspace file's tasks)
    Attack("devcontainer", "echo '{\"tasks\": {\"tasks\": [{\"label\": \"x\", \"command\": "
           "\"touch $C/workspace\", \"runOptions\": {\"runOn\": \"folderOpen\"}}]}}' "
           "> x.code-workspace; echo '{\"initializeCommand\": \"touch $C/devcontainer\"}' "
           "> .devcontainer.json; mkdir .devcontainer && cp .devcontainer.json .devcontainer/"
           "devcontainer.json; test -f x.code-workspace",
           lambda repo, lib: repo.mkdir(), []),
    # a process that outlives the command (setsid, deaf to TERM/HUP) plants after 4 s
    Attack("late", "C=\"$C\" setsid sh -c 'trap \"\" TERM HUP INT; sleep 4; "
           "git init -q nr && printf \"#!/bin/sh\\necho ran > %s/late\\n\" \"$C\" "
           "> nr/.git/hooks/pre-commit && chmod +x nr/.git/hooks/pre-commit' "
           "</dev/null >/dev/null 2>&1 & true", lambda repo, lib: repo.mkdir(),
           _status_commit("nr")),
    PRE_COMMIT,
    Attack("dataloss", "echo '{\"editor.tabSize\": 2}' > .vscode/settings.json",
           _vscode_with(random.Random(24).randbytes(2 * MiB)), []),
    # The repositories that were there: a submodule's and a nested repository's hooks,
    # the top config's own fsmonitor, a bare repository inside .git/objects, and a new
    # gitlink to a planted one; beside the agent's own work, which stays.
    Attack("existing", "echo agent > agent-work.txt; "
           "hook .git/modules/m/hooks/pre-commit existing-module; "
           "hook sub/.git/hooks/pre-commit existing-sub; fsm .git/config existing-fsm; "
           "bare .git/objects/ab/evil existing-objects; "
           "bare .gitc existing-gitc && mkdir -p sub2 && echo 'gitdir: ../.gitc' > sub2/.git; "
           "mkdir -p evil && hook evil/pre-commit existing-hookspath "
           "&& git config core.hooksPath evil; test -f agent-work.txt", _existing,
           [*_status_commit(".", "m", "sub", "sub2"), (".git/objects/ab/evil", ("status",))]),
    # The repository moved away and a copy with a hook put in its place (bwrap: a mount
    # point cannot be moved); a nested repository's .git replaced by a gitlink to a copy
    # with a hook; the hooks directory replaced by a link to planted hooks.
    Attack("rename", "mv .git .git-away && cp -r .git-away .git "
           "&& hook .git/hooks/pre-commit rename"),
    Attack("gitlink", "cp -r sub/.git subgit && hook subgit/hooks/pre-commit gitlink "
           "&& rm -rf sub/.git && echo 'gitdir: ../subgit' > sub/.git", _existing,
           _status_commit(".", "sub")),
    Attack("link", "mkdir -p evilhooks && hook evilhooks/pre-commit link && rm -rf .git/hooks "
           "&& ln -s ../evilhooks .git/hooks"),
]


# Hostile names in printed lines: a session of their own (a name that is not UTF-8
# must not cost the other attacks' lines).
# FIFOs where git and the guard read files: neither may block (git would hang on the
# person's next command).
FIFO = ("mkfifo .envrc && { mkdir .vscode && mkfifo .vscode/settings.json; "
        "mkfifo .git/hooks/pre-commit; mkdir sub && mkfifo sub/.git; mkfifo .git/commondir; "
        "rm -f .git/config && mkfifo .git/config; true; }")
NAMES: list[Attack] = [Attack("hostile", _hostile_plant(), _hostile_setup, []),
                       Attack("fifo", FIFO, host=_status_commit(".", "sub"))]


def plant_script(attacks: list[Attack]) -> str:
    """One bash script planting every attack, each in its own directory (cwd: the workdir)."""
    parts = [PRELUDE, "top=$PWD"]
    for a in attacks:
        parts.append(f"cd \"$top/{a.name}\" && {{ {a.plant} ; }} >/dev/null 2>&1 "
                     f"&& echo PLANTED {a.name}; cd \"$top\"")
    return "\n".join(parts) + "\nexit 0\n"


def remove_tree(top: Path) -> None:
    """Remove ``top`` however deep it is, without recursion: each directory below is
    renamed up to a flat staging directory first (as root: any mode)."""
    if not top.exists() and not top.is_symlink():
        return
    if top.is_symlink() or not top.is_dir():
        top.unlink()
        return
    stage = top.parent / f".rm-{top.name}-{os.getpid()}"
    stage.mkdir()
    os.rename(top, stage / "0")
    todo, n = ["0"], 1
    for rel in _flatten(stage, todo):
        n += 1
        os.rename(stage / rel[0] / rel[1], stage / str(n))
        todo.append(str(n))
    for name in todo:
        (stage / name).rmdir()
    stage.rmdir()


def _flatten(stage: Path, todo: list[str]) -> Iterator[tuple[str, str]]:
    i = 0
    while i < len(todo):
        here = stage / todo[i]
        os.chmod(here, 0o700)
        for entry in list(os.scandir(here)):
            if entry.is_dir(follow_symlinks=False):
                yield todo[i], entry.name
            else:
                os.unlink(entry.path)
        i += 1


def _sparse(path: Path, size: int) -> None:
    """A sparse file of ``size`` bytes with a few marked places (the person's original)."""
    with open(path, "wb") as f:
        for where in (0, size // 2, size - 4096):
            f.seek(where)
            f.write(f"data at {where}\n".encode())
        f.truncate(size)


def _sized(size: int) -> Callable[[Path, Path], None]:
    def setup(repo: Path, _lib: Path) -> None:
        (repo / ".vscode").mkdir(parents=True)
        (repo / ".vscode/settings.json").write_text("{}\n")
        if size >= TiB:
            _sparse(repo / ".vscode/big.bin", size)
        else:
            (repo / ".vscode/big.bin").write_bytes(os.urandom(size))
    return setup


# The session changes the person's guarded file in place (and appends to it).
MODIFY = ("printf SESSION | dd of=.vscode/big.bin bs=1 conv=notrunc 2>/dev/null "
          "&& printf SESSION >> .vscode/big.bin")
SIZES = {"0": 0, "1m-1": MiB - 1, "1m": MiB, "1m+1": MiB + 1, "100m": 100 * MiB}
HEAVY: list[Attack] = [
    *(Attack(f"size-{label}", MODIFY, _sized(size), []) for label, size in SIZES.items())]
# 1 TiB sparse files, the person's and a new one: a session each (a guard that
# reads one whole fails the whole session).
HUGE: list[Attack] = [Attack("size-1t", MODIFY, _sized(TiB), [])]
SPARSE: list[Attack] = [
    Attack("sparse-new", "mkdir .vscode && truncate -s 1T .vscode/big "
           "&& echo '{\"tasks\": []}' > .vscode/tasks.json", lambda repo, lib: repo.mkdir(), []),
]
# With the quarantine on another filesystem (a tmpfs): every move aside is a copy.
DEEP = 1100
TMPFS: list[Attack] = [
    Attack("deep-vscode", "mkdir .vscode && echo '{\"tasks\": []}' > .vscode/tasks.json "
           f"&& cd .vscode && deep \"$PWD\" {DEEP}", lambda repo, lib: repo.mkdir(), []),
    Attack("deep-repo", "git init -q nr && hook nr/.git/hooks/pre-commit deep-repo "
           f"&& fsm nr/.git/config deep-repo-fsm && cd nr/.git/hooks && deep \"$PWD\" {DEEP}",
           lambda repo, lib: repo.mkdir(), _status_commit("nr")),
    Attack("deep-old", f"hook .git/hooks/pre-commit deep-old && cd .git/hooks "
           f"&& deep \"$PWD\" {DEEP}"),
    Attack("xfs-dataloss", "echo '{\"editor.tabSize\": 2}' > .vscode/settings.json",
           _vscode_with(random.Random(25).randbytes(2 * MiB)), []),
]
