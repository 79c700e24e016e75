"""Fixtures of the sandbox battery (helpers in battery.py, as_user.py, probe.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from battery import Cell, CellResult, cannot_run, run_cell, the_user


@pytest.fixture(scope="module")
def cell_result(request: pytest.FixtureRequest) -> CellResult:
    """One probe run per cell, shared by every check of that cell."""
    cell: Cell = request.param
    if why := cannot_run(cell):
        pytest.skip(why)
    return run_cell(cell, the_user() if cell.who == "user" else None)


@pytest.fixture(params=["c", "python"])
def forwarder_argv(request: pytest.FixtureRequest) -> list[str]:
    """bwrap's forwarder as the session runs it: libbroker/native/forwarder.c, built, or
    forwarder.py under ``python -I -S`` (tests/sandbox/test_forwarder_programs.py)."""
    if request.param == "c":
        return [request.getfixturevalue("native_program")("forwarder")]
    from libbroker.sandbox import forwarder

    return [sys.executable, "-I", "-S", forwarder.__file__]
