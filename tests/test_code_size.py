"""Issue 28's goals, held: no library module over 500 lines, no function over 60.

A newcomer reads a session, a connection or a sweep one screenful at a time: a
function that outgrows that is split into named steps, a module into modules
whose names say their role (docs/LAYOUT.md).  Tests are not held to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("libbroker", "libegress", "libpolicy", "bin")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for lib in LIBRARIES for p in (ROOT / lib).rglob("*.py"))


def test_there_is_code_to_hold() -> None:
    assert len(_modules()) > 100


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_functions_fit(path: Path) -> None:
    source = path.read_text()
    lines = source.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{lines} lines: split it by role"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], "split into named steps: " + ", ".join(long)
