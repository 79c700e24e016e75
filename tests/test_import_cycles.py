"""No import cycle among our modules: every import that runs, deferred ones included.

An import inside a function still ties two modules together (the cycle only
waits for the first call to bite), so it counts; an import under
``if TYPE_CHECKING:`` never runs and does not.  The cycles are found as the
strongly connected components of the import graph (Tarjan), each printed with
its modules so the fix is plain.  ``test_the_finder_sees_*`` show that the
finder itself sees a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # as the subfolders' conftest.py do

from test_layers import modules  # the same modules the layering rule walks

Graph = dict[str, set[str]]


def imported(source: str, module: str, known: set[str]) -> set[str]:
    """Our modules that ``source`` imports when it runs (``from a import b``: ``a.b``
    where that is a module)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []  # never runs
    package = module.split(".")
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        out |= {n for n in names if n in known and n != module}
    return out


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def import_graph() -> Graph:
    found = modules()
    known = set(found)
    return {name: imported(path.read_text(), name, known) for name, path in found.items()}


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_finder_sees_a_cycle_through_a_deferred_import() -> None:
    known = {"libbroker.a", "libbroker.b", "libbroker.c"}
    graph = {
        "libbroker.a": imported("from libbroker import b\n", "libbroker.a", known),
        "libbroker.b": imported("def f():\n    from libbroker.c import x\n", "libbroker.b", known),
        "libbroker.c": imported("import libbroker.a\n", "libbroker.c", known),
    }
    assert cycles(graph) == [["libbroker.a", "libbroker.b", "libbroker.c"]]


def test_the_finder_skips_type_checking_imports() -> None:
    known = {"libbroker.a", "libbroker.b"}
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from libbroker import a\n"
    graph = {
        "libbroker.a": imported("from libbroker import b\n", "libbroker.a", known),
        "libbroker.b": imported(source, "libbroker.b", known),
    }
    assert cycles(graph) == []
