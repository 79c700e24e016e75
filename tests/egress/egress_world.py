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
