"""Shared names of the egress tests: the test token and the stand-in world."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from egress_upstreams import Upstream

TOKEN = "ghs_TESTTOKEN0123456789abcdefSECRET"


@dataclass
class World:
    tmp: Path
    ca_file: Path  # the stand-ins' own CA
    git: Upstream
    api: Upstream
    plain: Upstream  # an allowed non-inject TLS host (allowed.test)
    repo: Path
    token_file: Path


def require(tool: str) -> str:
    """The path of ``tool``, or skip naming what is missing."""
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed")
    return path


def proxy_args(w: World, egress_dir: Path) -> list[str]:
    """The egress-proxy arguments that put the stand-in world behind the proxy."""
    return [
        "--allow", f"allowed.test:{w.plain.port}",
        "--resolve", f"github.com:127.0.0.1:{w.git.port}",
        "--resolve", f"api.github.com:127.0.0.1:{w.api.port}",
        "--resolve", "allowed.test:127.0.0.1",
        "--upstream-ca", str(w.ca_file),
        "--egress-dir", str(egress_dir),
        "--token-command", f"cat {w.token_file}",
    ]
