"""A small real filesystem for the policy tests: a home with secrets, a workdir, symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libpolicy.model import Policy


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Policy]:
    """``(root, policy)`` of a freshly laid out world (see :func:`build`)."""
    root = tmp_path / "w"
    return root, build(root)


def build(root: Path) -> Policy:
    """Lay out the world under ``root`` and return its policy.

    root/home                 home (denied for reading)
    root/home/.ssh/id         a secret
    root/home/.config/gh      read
    root/home/proj            write (the workdir); proj/secret is deny
    root/home/.claude         harness; .claude/memory is tool_write
    root/run                  runtime; run/egress is read
    root/outside              neither home nor runtime
    """
    home = root / "home"
    for d in ("home/.ssh", "home/.config/gh", "home/proj/src", "home/proj/secret",
              "home/.claude/memory", "home/.claude/plans", "run/egress", "run/agent",
              "outside/sub"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (home / ".ssh/id").write_text("KEY")
    (home / ".config/gh/hosts.yml").write_text("gh")
    (home / "proj/src/main.py").write_text("print()")
    (home / "proj/secret/index").write_text("s")
    (home / ".claude/settings.json").write_text("{}")
    (root / "outside/sub/file").write_text("o")
    proj = home / "proj"
    links = {
        "to_ssh": home / ".ssh",                 # symlink into home
        "rel_ssh": Path("../.ssh"),              # relative symlink into home
        "dangling": home / ".ssh/newkey",        # dangling, target in home
        "dangling_ok": proj / "src/new.py",      # dangling, target in the workdir
        "to_outside": root / "outside",          # symlink out of the workdir (readable)
        "to_secret": proj / "secret",            # into a deny path
        "to_harness": home / ".claude",          # into the harness
        "to_memory": home / ".claude/memory",    # into tool_write
        "to_run": root / "run/agent",            # into runtime
        "to_proj": proj,                         # to the workdir itself
        "loop1": proj / "loop2",
        "loop2": proj / "loop1",
        "to_home": home,                         # to home itself
        "chain1": proj / "chain2",               # chain1 -> chain2 -> .ssh
        "chain2": home / ".ssh",
        "to_self_root": Path("/proc/self/root") / str(home / ".ssh").lstrip("/"),
    }
    for name, target in links.items():
        os.symlink(target, proj / name)
    # A symlink deep inside a not-yet-existing-looking path: proj/src/deep -> home
    os.symlink(home, proj / "src/deep")
    return Policy(
        str(home),
        runtime=str(root / "run"),
        read=[str(home / ".config/gh"), str(root / "run/egress")],
        write=[str(proj)],
        deny=[str(proj / "secret")],
        harness=str(home / ".claude"),
        tool_write=[str(home / ".claude/memory")],
        domains=["github.com", "*.pypi.org"],
        proxy_port=3128,
        socks_port=1080,
    )


@pytest.fixture
def policy_file(world: tuple[Path, Policy]) -> Path:
    """The world's policy written where the hook reads it."""
    root, policy = world
    path = root / "policy.json"
    path.write_text(policy.to_json())
    return path
