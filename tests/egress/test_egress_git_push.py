"""A real 10 MiB ``git push`` through the token path, and a clone of it back (issue 20).

git posts the pack (chunked: it is over http.postBuffer) to the stand-in
github.com (``git http-backend`` behind a Basic token check) through the proxy,
which sets the token.  The upstream's branch must then name the pushed commit.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from egress_proxyproc import ProxyProc
from egress_world import World, require


def _git(*args: str, env: dict[str, str], cwd: Path | None = None) -> str:
    out = subprocess.run(["git", *args], env=env, cwd=cwd, capture_output=True, text=True,
                         check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_10_mib_push_and_its_clone(proxy: ProxyProc, world: World, tmp_path: Path) -> None:
    require("git")
    env = {
        "PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_TERMINAL_PROMPT": "0",
        "HTTPS_PROXY": proxy.http,
        "GIT_SSL_CAINFO": str(proxy.egress_dir / "bundle.pem"),  # type: ignore[operator]
        "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
        "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com",
    }
    upstream = world.tmp / "push10.git"
    _git("init", "-q", "--bare", "-b", "main", str(upstream), env=env)
    work = tmp_path / "work"
    _git("init", "-q", "-b", "main", str(work), env=env)
    blob = os.urandom(10 << 20)  # random: the pack cannot compress it away
    (work / "big.bin").write_bytes(blob)
    _git("add", "big.bin", env=env, cwd=work)
    _git("commit", "-qm", "ten MiB", env=env, cwd=work)
    commit = _git("rev-parse", "HEAD", env=env, cwd=work)
    _git("push", "-q", "https://github.com/push10.git", "main", env=env, cwd=work)
    assert _git("--git-dir", str(upstream), "rev-parse", "main", env=env) == commit

    clone = tmp_path / "clone"
    _git("clone", "-q", "https://github.com/push10.git", str(clone), env=env)
    assert _git("rev-parse", "HEAD", env=env, cwd=clone) == commit
    assert (clone / "big.bin").read_bytes() == blob
    assert "431" not in proxy.log_text()
