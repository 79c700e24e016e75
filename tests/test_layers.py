"""The layering rule of docs/LAYOUT.md, checked over every module with ``ast``.

Every ``import`` and ``from ... import`` counts, at the top of a file or
inside a function (the start-up tricks put many there).  The rule:

- a module imports only its own layer or lower ones (L0 base, L1 pure cores,
  L2 I/O shells, L3 the launcher, L4 the ``bin/`` faces);
- the pure layers (L0, L1) never import socket, select, asyncio, subprocess,
  threading, ctypes or mmap (nor their C halves);
- libpolicy and libegress import nothing of libbroker beyond its base, and
  never each other; libbroker below the launcher imports neither;
- the launcher never imports libegress's shells (egress-proxy runs as a
  process), only its pure cores, so the config check refuses with egress-proxy's
  own rules what egress-proxy would refuse at start; of libpolicy, too, only
  its pure modules; native/ imports only libbroker's base;
- nothing but ``bin/agent_sandbox.py`` imports the launcher.

A new module gets a layer by its package (see :func:`layer_of`); a pure core
is named in ``PURE``.  ``test_the_rule_catches_*`` show that the checker
itself sees a violation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("libbroker", "libpolicy", "libegress", "bin")

BASE = {
    "libbroker.errors", "libbroker.paths", "libbroker.cli", "libbroker.shellquote",
    "libbroker.server_lines", "libbroker.proc_tcp", "libbroker.unix_listen", "libbroker.which",
    "libbroker.named_tuple",
}  # fmt: skip
# The base's one module that touches a socket: the servers' unix listening
# socket, shared by broker-server and egress-proxy (libegress may use only the base).
BASE_SOCKET = {"libbroker.unix_listen"}
PURE = {
    "libbroker.wire",
    "libbroker.broker.exchange",
    "libbroker.broker.profile",
    "libbroker.sandbox.shape",
    "libbroker.sandbox.kinds",
    "libbroker.sandbox.bwrap",
    "libbroker.signing.args",
    "libbroker.sandbox.limits",
    # the launcher's pure cores: the config's rules and what they use
    *(f"libbroker.launcher.{m}" for m in (
        "config", "git_answers", "egress_values", "exported_keys", "grants", "origins", "agents",
        "plan", "agent_sandbox", "runtime", "agent_argv", "agent_settings",
    )),
    *(f"libegress.{m}" for m in (
        "hosts", "allowlist", "addresses", "heads", "der", "limits", "route", "secrets", "scope",
        "graphql", "oauth_login", "proxyauth", "control_frames", "outcome", "placeholders",
        "token_endpoint", "chunks",
    )),
}  # fmt: skip
IMPURE_IN_LIBPOLICY = {"libpolicy.hook"}  # the rest of libpolicy is pure
FORBIDDEN_IN_PURE = {
    "socket", "_socket", "select", "selectors", "asyncio", "subprocess", "_posixsubprocess",
    "threading", "_thread", "ctypes", "_ctypes", "mmap",
}  # fmt: skip
NAMES = {0: "L0 base", 1: "L1 pure core", 2: "L2 I/O shell", 3: "L3 launcher", 4: "L4 face"}


def layer_of(module: str) -> int:
    if module in BASE:
        return 0
    if module in PURE or (module.startswith("libpolicy.") and module not in IMPURE_IN_LIBPOLICY):
        return 1
    if module == "libpolicy" or module.startswith("libpolicy."):
        return 2
    if module.startswith("libbroker.launcher"):
        return 3
    if module.startswith("bin"):
        return 4
    return 2  # libbroker's and libegress's shells, and the packages' __init__


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``source``; ``from a import b`` gives
    ``a.b`` when that is a module of ours, else ``a``."""
    ours = set(modules())
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                parent = module.split(".")[: -node.level] if node.level else []
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((node.lineno, full if full in ours else base))
    return out


def ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def violations(module: str, source: str) -> list[str]:
    here = layer_of(module)
    top = module.split(".")[0]
    found = []
    for line, name in imports(source, module):
        where = f"{module}:{line} imports {name}"
        if not ours(name):
            io_ok = module in BASE_SOCKET and name == "socket"
            if here <= 1 and name.split(".")[0] in FORBIDDEN_IN_PURE and not io_ok:
                found.append(f"{where}: a {NAMES[here]} does no I/O of that kind")
            continue
        there = layer_of(name)
        other = name.split(".")[0]
        if there > here:
            found.append(f"{where}: {NAMES[here]} may not import {NAMES[there]}")
        if top in ("libpolicy", "libegress") and other == "libbroker" and there != 0:
            found.append(f"{where}: {top} uses only libbroker's base")
        if {top, other} == {"libpolicy", "libegress"}:
            found.append(f"{where}: libpolicy and libegress never import each other")
        launcher = module.startswith("libbroker.launcher")  # its pure cores too
        if top == "libbroker" and here < 3 and not launcher and other in ("libpolicy", "libegress"):
            found.append(f"{where}: libbroker below the launcher imports neither library")
        if module.startswith("libbroker.launcher") and other == "libegress" and there != 1:
            found.append(f"{where}: the launcher runs egress-proxy, imports only its pure cores")
        if module.startswith("libbroker.launcher") and other == "libpolicy" and there != 1:
            found.append(f"{where}: the launcher uses libpolicy's pure modules only")
        native = module.startswith("libbroker.native") and not name.startswith("libbroker.native")
        if native and other == "libbroker" and there != 0:
            found.append(f"{where}: native/ uses only libbroker's base")
        if name.startswith("libbroker.launcher") and not module.startswith(
            ("libbroker.launcher", "bin.agent_sandbox")
        ):
            found.append(f"{where}: only bin/agent_sandbox.py imports the launcher")
    return found


def test_every_module_keeps_the_layering_rule() -> None:
    found = []
    for module, path in modules().items():
        found += violations(module, path.read_text())
    assert found == [], "\n".join(found)


def test_every_named_pure_core_exists() -> None:
    missing = sorted((PURE | BASE) - set(modules()))
    assert missing == []


@pytest.mark.parametrize(
    ("module", "source", "says"),
    [
        ("libbroker.wire", "def f():\n    import socket\n", "does no I/O"),
        ("libbroker.sandbox.shape", "import threading\n", "does no I/O"),
        ("libpolicy.decide", "from libbroker.broker import dial\n", "L1 pure core may not"),
        ("libegress.app", "from libbroker.broker.pipes import set_pipe_size\n", "only libbroker"),
        ("libegress.app", "import libpolicy.model\n", "never import each other"),
        ("libbroker.broker.server", "from libegress import hosts\n", "imports neither"),
        ("libbroker.launcher.session", "from libegress.app import main\n", "only its pure"),
        ("libbroker.launcher.session", "from libpolicy import hook\n", "pure modules only"),
        ("libbroker.native", "from libbroker.signing import shim\n", "native/ uses only"),
        ("libbroker.broker.client", "from libbroker.launcher import session\n", "may not import"),
        ("libbroker.broker.client", "from libbroker.launcher import plan\n", "only bin/"),
        ("libbroker.launcher.plan", "from libbroker.launcher import runtime_dir\n", "may not"),
        ("libbroker.launcher.config", "import subprocess\n", "does no I/O"),
    ],
)
def test_the_rule_catches_each_kind_of_violation(module: str, source: str, says: str) -> None:
    assert any(says in v for v in violations(module, source)), violations(module, source)
