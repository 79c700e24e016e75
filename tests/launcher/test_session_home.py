"""Every command's HOME in a session: private and writable, on both backends.

bwrap gives the command an empty home tmpfs holding only the config's grants;
Landlock now gives it the same (libbroker.launcher.agent_session.landlock_home):
before, a plain command under Landlock kept the real HOME, which it could not
write, and ``npm`` advised ``sudo chown``.  With the default config, real
tools write their caches there: npm (``npm pack`` of a package in the
workdir), pip (``pip download`` of a local wheel, its cache), git (``clone``
of a local bare repository into the home); cargo runs where its install is
granted.
Nothing of the real home but the grants is readable through it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from launcher_world import SSH_KEY, World

BACKENDS = ("bwrap", "nono")

SCRIPT = r"""
set -u
echo "HOME=$HOME"
touch "$HOME/.probe" && echo HOME-WRITABLE
cat "$HOME/.ssh/id_rsa" 2>/dev/null || echo SSH-NOT-IN-HOME
cat {real}/.ssh/id_rsa 2>/dev/null || echo SSH-REFUSED
ls -A "$HOME" | tr '\n' ' '; echo
if command -v npm >/dev/null; then
  echo "NPM-CACHE=$(npm config get cache)"
  (cd pkg && npm pack --pack-destination .. >/dev/null 2>npm.err && echo NPM-PACK-OK) \
    || cat pkg/npm.err
  ls "$(npm config get cache)/_logs" >/dev/null 2>&1 && echo NPM-CACHE-WRITTEN
fi
{python} -m pip download --no-index --find-links=wheels -d dl tinypkg -q && echo PIP-DOWNLOAD-OK
echo "PIP-CACHE=$({python} -m pip cache dir)"
git clone -q {bare} "$HOME/clone" && git -C "$HOME/clone" log --format=%s && echo GIT-CLONE-OK
"""


def tiny_wheel(where: Path) -> None:
    """A real (pure) wheel, as pip builds them: METADATA, WHEEL, RECORD."""
    where.mkdir()
    info = "tinypkg-1.0.dist-info"
    files = {
        "tinypkg/__init__.py": "X = 1\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(where / "tinypkg-1.0-py3-none-any.whl", "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)


def bare_repo(root: Path) -> Path:
    src, bare = root / "src-repo", root / "bare.git"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(src)], check=True)
    (src / "f").write_text("x")
    subprocess.run([*git, "-C", str(src), "add", "f"], check=True)
    subprocess.run([*git, "-C", str(src), "commit", "-qm", "first-commit"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(bare)], check=True)
    return bare


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_command_gets_a_private_writable_home(world: World, backend: str) -> None:
    w = world
    bare = bare_repo(w.root)
    tiny_wheel(w.workdir / "wheels")
    (w.workdir / "pkg").mkdir()
    (w.workdir / "pkg" / "package.json").write_text('{"name": "tiny", "version": "1.0.0"}')
    script = SCRIPT.format(real=w.home, python=sys.executable, bare=bare)
    cfg = w.config(read=["~/.gitconfig", "~/.config/git", str(bare)])
    done = w.run("bash", "-c", script, config=cfg, sandbox=backend)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-2000:]
    home = out.split("HOME=", 1)[1].split("\n", 1)[0]
    if backend == "nono":  # its own, in the runtime directory: not the real one
        assert home != str(w.home) and home.startswith(str(w.runtime_parent))
    for mark in ("HOME-WRITABLE", "SSH-NOT-IN-HOME", "SSH-REFUSED", "PIP-DOWNLOAD-OK",
                 "GIT-CLONE-OK", "first-commit"):
        assert mark in out, out + done.stderr[-2000:]
    assert SSH_KEY not in out
    assert f"PIP-CACHE={home}/.cache/pip" in out
    assert (w.workdir / "dl" / "tinypkg-1.0-py3-none-any.whl").exists()
    if shutil.which("npm"):
        assert f"NPM-CACHE={home}/.npm" in out and "NPM-PACK-OK" in out, out
        assert "NPM-CACHE-WRITTEN" in out and "sudo chown" not in out + done.stderr
        assert (w.workdir / "tiny-1.0.0.tgz").exists()
    # The real home was never written.
    assert not (w.home / ".npm").exists() and not (w.home / ".cache").exists()
    assert not any(w.runtime_parent.iterdir()) or w.leftovers() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_cargo_runs_where_its_install_is_granted(world: World, backend: str) -> None:
    """rustup's cargo lives in ~/.cargo and ~/.rustup: granted read-only, it runs."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("no cargo here")
    real = Path(os.path.realpath(cargo))
    read = ["~/.gitconfig"]
    for name in (".cargo", ".rustup"):
        mine = Path(os.path.expanduser("~")) / name
        if mine.is_dir() and str(real).startswith(str(mine.parent) + "/"):
            (world.home / name).symlink_to(mine)  # the user's own install, in this home
            read.append(f"~/{name}")
            cargo = cargo.replace(str(mine), str(world.home / name))  # as ~/.cargo/bin in PATH
    cfg = world.config(read=read)
    done = world.run(cargo, "--version", config=cfg, sandbox=backend)
    assert done.returncode == 0 and done.stdout.startswith("cargo "), done.stderr[-2000:]
