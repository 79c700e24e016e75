"""The one containment rule for clean absolute paths (pure, stdlib-free).

Every "is this inside the workdir / a grant / a denied region" question in the
project is asked through :func:`under`, so a prefix test that forgets the
separator (``/work`` matching ``/workshop``) can exist in at most one place.
"""

from __future__ import annotations


def under(path: str, root: str) -> bool:
    """Whether clean absolute ``path`` is ``root`` or lies beneath it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def under_any(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    """Whether ``path`` is under any of ``roots``."""
    return any(under(path, root) for root in roots)
