"""Shared test helpers: run a console script as a real subprocess."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable

import pytest

# The console scripts the tests run as subprocesses (agent-sandbox, egress-proxy,
# ...) are those of the interpreter running the tests: the project's .venv under
# `just test`, whatever PATH the caller had.
_SCRIPTS = os.path.join(sys.prefix, "bin")
if os.environ.get("PATH", "").split(":")[0] != _SCRIPTS:
    os.environ["PATH"] = _SCRIPTS + ":" + os.environ.get("PATH", os.defpath)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a test that takes seconds")


@pytest.fixture(scope="session")
def native_program(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """``native_program(name)``: a compiled program of libbroker/native.

    As ``just setup`` built it, else built here once per session; a test
    skips only where no C compiler exists at all.
    """
    from libbroker.errors import BuildError
    from libbroker.native import build, built

    made: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in made:
            found = built(name)
            if found is None:
                if shutil.which(os.environ.get("CC", "cc")) is None:
                    pytest.skip(f"no C compiler: the native {name} cannot be built here")
                try:
                    found = build(name, str(tmp_path_factory.mktemp("native") / name))
                except BuildError as exc:
                    pytest.fail(str(exc))
            made[name] = found
        return made[name]

    return get
