"""The C fast path for the signing tests: as `just setup` built it, else built here."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from libbroker.errors import BuildError
from libbroker.native import build_gpg_shim, built_gpg_shim


@pytest.fixture(scope="session")
def native_gpg_shim() -> Iterator[str]:
    """The compiled fast path (skips only where no C compiler exists at all)."""
    native = built_gpg_shim()
    if native is not None:
        yield native
        return
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: the fast path cannot be built here")
    where = tempfile.mkdtemp(prefix="gsn-build-")
    try:
        yield build_gpg_shim(os.path.join(where, "gpg-shim"))
    except BuildError as exc:
        pytest.fail(str(exc))
    finally:
        shutil.rmtree(where, ignore_errors=True)
