"""Shared test helpers: run a console script as a real subprocess."""

from __future__ import annotations

import shutil

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a test that takes seconds")


def require(tool: str) -> str:
    """The path of ``tool``, or skip the test naming what is missing."""
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed")
    return path
