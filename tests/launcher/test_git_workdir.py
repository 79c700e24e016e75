"""The workdir is the repository, found from where the person stands: real sessions, real git.

Started in a subdirectory, a linked worktree or a submodule, the session
grants the repository's top level (and the git dirs git writes outside it:
the main repository's .git, the superproject's .git/modules/NAME) and starts
the command where the person stands; ``git status``, ``commit`` and ``log``
work inside on both backends, and the git dirs outside the workdir are
guarded like its own .git (held read-only under bwrap, swept at the end).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from launcher_world import World

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed")

BACKENDS = ["bwrap", "nono"]
INSIDE = r"""
echo "pwd=$(pwd)"
git status --porcelain >/dev/null && echo status=ok
echo "made inside" > inside.txt
git add inside.txt && git commit -qm "made inside" && echo commit=ok
echo "log=$(git log -1 --format=%s)"
echo planted > "$GITDIR/hooks/pre-commit" 2>/dev/null; echo "plant_hook=$?"
echo '[core] fsmonitor = touch /tmp/pwned' >> "$GITDIR/config" 2>/dev/null; echo "plant_config=$?"
"""


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.test",
           "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.test",
           "GIT_ALLOW_PROTOCOL": "file"}
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, (args, done.stderr)
    return done


def _repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "README").write_text("hello\n")
    _git(path, "add", "README")
    _git(path, "commit", "-qm", "first")
    return path


def _config(world: World) -> Path:
    """The world's config with no workdir key: the session finds it from the cwd."""
    path = world.config()
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                            if not line.startswith("workdir =")))
    return path


def _session(world: World, cwd: Path, gitdir: Path, backend: str) -> dict[str, str]:
    (world.home / ".gitconfig").write_text("[user]\n\tname = T\n\temail = t@example.test\n")
    done = world.run("sh", "-c", f"GITDIR={gitdir}\n{INSIDE}", config=_config(world),
                     sandbox=backend, cwd=str(cwd))
    assert done.returncode == 0, done.stderr + done.stdout
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def _held(seen: dict[str, str], gitdir: Path, backend: str) -> None:
    """The git dir's hooks: read-only under bwrap and under Landlock where its helper has a
    mount namespace, else swept back; its config never keeps a key that runs a command
    (held, or merged back without it)."""
    from libbroker.sandbox import pidns

    if backend == "bwrap" or pidns.supported():
        assert seen["plant_hook"] != "0", seen
    else:  # Landlock cannot hold a file inside a granted tree: the sweep puts it back
        assert seen["plant_hook"] == "0", seen
    assert not (gitdir / "hooks" / "pre-commit").exists()
    assert "fsmonitor" not in (gitdir / "config").read_text()


@pytest.mark.parametrize("backend", BACKENDS)
def test_started_in_a_subdirectory(world: World, backend: str) -> None:
    repo = _repo(world.workdir / "project")
    sub = repo / "src" / "deep"
    sub.mkdir(parents=True)
    seen = _session(world, sub, repo / ".git", backend)
    assert seen["pwd"] == str(sub)
    assert (seen["status"], seen["commit"], seen["log"]) == ("ok", "ok", "made inside"), seen
    assert _git(repo, "log", "-1", "--format=%s").stdout.strip() == "made inside"
    assert (sub / "inside.txt").exists()
    _held(seen, repo / ".git", backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_started_in_a_linked_worktree(world: World, backend: str) -> None:
    main = _repo(world.workdir / "main")
    tree = world.workdir / "feature"
    _git(main, "worktree", "add", "-q", "-b", "feature", str(tree))
    (tree / "lib").mkdir()
    seen = _session(world, tree / "lib", main / ".git", backend)
    assert seen["pwd"] == str(tree / "lib")
    assert (seen["status"], seen["commit"], seen["log"]) == ("ok", "ok", "made inside"), seen
    assert _git(main, "log", "-1", "--format=%s", "feature").stdout.strip() == "made inside"
    assert _git(main, "log", "-1", "--format=%s", "main").stdout.strip() == "first"
    _held(seen, main / ".git", backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_started_in_a_submodule(world: World, backend: str) -> None:
    source = _repo(world.root / "source")
    top = _repo(world.workdir / "super")
    _git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(source), "mod")
    _git(top, "commit", "-qm", "with a submodule")
    gitdir = top / ".git" / "modules" / "mod"
    seen = _session(world, top / "mod", gitdir, backend)
    assert seen["pwd"] == str(top / "mod")
    assert (seen["status"], seen["commit"], seen["log"]) == ("ok", "ok", "made inside"), seen
    assert _git(top / "mod", "log", "-1", "--format=%s").stdout.strip() == "made inside"
    _held(seen, gitdir, backend)


def _doctor(world: World, cwd: Path, config: Path) -> str:
    done = subprocess.run(["agent-sandbox", "doctor", f"--config={config}"], env=world.env(),
                          cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    return next(x for x in done.stdout.splitlines() if " workdir " in x)


def test_doctor_says_which_directory_and_why(world: World) -> None:
    repo = _repo(world.workdir / "project")
    (repo / "sub").mkdir()
    line = _doctor(world, repo / "sub", _config(world))
    assert line.startswith(f"ok   workdir {repo}: the top level of the repository"), line
    assert "(sub, where the command starts)" in line
    # Named in the config (or by --workdir): as named, even inside a repository.
    line = _doctor(world, repo / "sub", world.config(workdir=str(repo / "sub")))
    assert line.startswith(f"ok   workdir {repo / 'sub'}: named by"), line
    # A linked worktree: its common git dir is granted too.
    tree = world.workdir / "feature"
    _git(repo, "worktree", "add", "-q", "-b", "feature", str(tree))
    line = _doctor(world, tree, _config(world))
    assert line.endswith(f"also granted, its git dirs: {repo / '.git'}"), line


def test_a_repository_at_home_is_never_the_workdir(world: World) -> None:
    """A dotfiles repository at ~: started in ~/notes, the workdir is ~/notes itself."""
    _repo(world.home)
    notes = world.home / "notes"
    notes.mkdir()
    line = _doctor(world, notes, _config(world))
    assert line.startswith(f"ok   workdir {notes}: the current directory: its repository "
                           f"{world.home} holds the home directory"), line
    done = world.run("pwd", config=_config(world), cwd=str(notes))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(notes)
    # Started at ~ itself: refused, as before (exit 2, one line).
    done = world.run("true", config=_config(world), cwd=str(world.home))
    assert done.returncode == 2
    assert "contains the home directory" in done.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_as_an_ordinary_user_in_a_subdirectory(backend: str) -> None:
    """Not root: the repository found, git works, a refused key's line reaches git's stderr
    (gpg-shim opens its parent's stderr through /proc as that user, in its sandbox)."""
    import os
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))
    from as_user import ordinary_user

    user = ordinary_user()
    if user.unavailable:
        pytest.skip(user.unavailable)
    base = Path(tempfile.mkdtemp(prefix="as-git-", dir="/tmp"))  # short: sun_path
    try:
        base.chmod(0o755)
        home, runtime = base / "home", base / "rt"
        home.mkdir()
        runtime.mkdir(mode=0o700)
        (home / ".gitconfig").write_text("[user]\n\tname = T\n\temail = t@example.test\n")
        repo = _repo(base / "repo")
        sub = repo / "deep" / "er"
        sub.mkdir(parents=True)
        config = base / "config.toml"
        config.write_text('token_command = ""\nstart_timeout = 60\n')
        user.own(home, runtime, repo, config)
        script = (
            'echo "pwd=$(pwd)"; git status --porcelain >/dev/null && echo status=ok; '
            'git commit -q --allow-empty -m as-user && echo commit=ok; '
            f"git -c user.signingkey={'0' * 40} commit -S --allow-empty -qm no 2>&1 "
            "| grep '^gpg-shim: ' | head -1"
        )
        env = user.env(home, XDG_RUNTIME_DIR=str(runtime))
        env["PATH"] = os.path.dirname(sys.executable) + ":" + env.get("PATH", "/usr/bin:/bin")
        done = subprocess.run(
            user.argv(["agent-sandbox", "run", f"--sandbox={backend}", f"--config={config}",
                       "--", "sh", "-c", script]),
            env=env, cwd=sub, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr + done.stdout
        lines = done.stdout.splitlines()
        assert lines[:3] == [f"pwd={sub}", "status=ok", "commit=ok"], done.stdout
        assert "is not enabled on this broker" in lines[3], done.stdout
        shown = _git(repo, "-c", "safe.directory=*", "log", "-1", "--format=%s")
        assert shown.stdout.strip() == "as-user"
    finally:
        shutil.rmtree(base, ignore_errors=True)
