"""The C fast path for the signing tests: as `just setup` built it, else built here."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture(scope="session")
def native_gpg_shim(native_program: Callable[[str], str]) -> str:
    """The compiled fast path (skips only where no C compiler exists at all)."""
    return native_program("gpg-shim")
