"""A realistic home for the agents' private config copy (issue 26): a year of use.

- Claude Code: 60 projects x 40 transcripts (~64 KiB each, ~150 MiB) under
  ~/.claude/projects, the workdir's among them; history.jsonl (2 MiB), a
  300 KiB ~/.claude.json, shell snapshots, todos, debug logs, statsig;
- Codex: 20 ``tmp/arg0-linux/codex-arg0*`` dirs of 3 links each to the real
  codex binary (as Codex 0.171 leaves them), a year of sessions (365 days x 3
  rollouts of ~48 KiB, ~50 MiB), history.jsonl, log/;
- Gemini CLI: 30 projects' ``tmp/<project>/chats`` (the workdir's among
  them), ``tmp/bin/rg`` (a program), history/ checkpoints;
- 1 GiB of caches spread over the three (``cache/``, ``.cache/``,
  ``node_modules/``...), as sparse files: the copy must not even open them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

KIB = 1 << 10


def _fill(path: Path, size: int, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = b'{"type":"message","text":"' + b"x" * 200 + b'"}\n'
    path.write_bytes(line * (size // len(line) + 1))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


def build(home: Path, workdir: str, codex: str | None) -> None:
    """Fill ``home`` (which holds the agents' logins already) with a year of use.

    ``codex``: the CLI whose binary the arg0 links name (as Codex makes them).
    """
    now = 1_780_000_000.0
    day = 86400.0
    claude = home / ".claude"
    key = re.sub(r"[^A-Za-z0-9]", "-", workdir)
    for p in range(60):
        name = key if p == 0 else f"-home-user-src-project{p}"
        for t in range(40):
            _fill(claude / "projects" / name / f"{p:02d}{t:04d}-uuid.jsonl", 64 * KIB,
                  now - t * 9 * day)
    _fill(claude / "history.jsonl", 2 << 20)
    state = json.loads((home / ".claude.json").read_text())
    state["projects"] = {f"/home/user/src/project{p}": {"allowedTools": [], "history": ["x" * 400]
                                                        * 10} for p in range(60)}
    (home / ".claude.json").write_text(json.dumps(state))
    for d in ("shell-snapshots", "todos", "debug", "statsig", "file-history"):
        for i in range(50):
            _fill(claude / d / f"f{i}.json", 8 * KIB)
    codex = home / ".codex"
    target = os.path.realpath(codex) if codex else "/usr/bin/true"
    for i in range(20):
        arg0 = codex / "tmp" / "arg0-linux" / f"codex-arg0{i:04d}"
        arg0.mkdir(parents=True)
        (arg0 / ".lock").write_text("")
        for name in ("apply_patch", "applypatch", "codex-linux-sandbox"):
            (arg0 / name).symlink_to(target)
    for d in range(365):
        for r in range(3):
            t = now - d * day - r * 3600
            _fill(codex / "sessions" / "2026" / f"{d // 31 + 1:02d}" / f"{d % 31 + 1:02d}"
                  / f"rollout-{d:03d}-{r}.jsonl", 48 * KIB, t)
    _fill(codex / "history.jsonl", 1 << 20)
    _fill(codex / "log" / "codex-tui.log", 20 << 20)
    gemini = home / ".gemini"
    projects = {workdir: "work"} | {f"/home/user/src/p{p}": f"p{p}" for p in range(1, 30)}
    (gemini / "projects.json").write_text(json.dumps({"projects": projects}))
    for name in projects.values():
        for c in range(20):
            _fill(gemini / "tmp" / name / "chats" / f"session-{c}.json", 32 * KIB)
        _fill(gemini / "tmp" / name / "logs.json", 16 * KIB)
    (gemini / "tmp" / "bin").mkdir(parents=True)
    rg = shutil.which("rg") or "/usr/bin/true"
    shutil.copyfile(rg, gemini / "tmp" / "bin" / "rg")
    for i in range(10):
        _fill(gemini / "history" / f"h{i}" / "objects" / "pack", 256 * KIB)
    caches = [claude / "cache", claude / "node_modules" / "pkg", codex / ".cache" / "models",
              codex / "cache", gemini / "models-cache", gemini / "tmp" / "work" / "cache"]
    for i, where in enumerate(caches):
        _sparse(where / f"blob{i}", (1 << 30) // len(caches))


def measure(path: Path) -> tuple[int, int]:
    """(files, bytes) below ``path``, links not followed."""
    files = size = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            files += 1
            size += st.st_size
    return files, size
