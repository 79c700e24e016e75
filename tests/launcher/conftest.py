"""Fixtures of the launcher's end-to-end tests (helpers in launcher_world.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from launcher_world import StandIn, World, kill_leftovers, make_world, start_standin


@pytest.fixture(scope="session")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    found, server = start_standin(tmp_path_factory.mktemp("launcher-standin"))
    yield found
    server.shutdown()
    server.server_close()


@pytest.fixture()
def world(tmp_path: Path, standin: StandIn) -> Iterator[World]:
    w = make_world(tmp_path, standin)
    yield w
    kill_leftovers(w)
