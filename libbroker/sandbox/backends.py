"""The backends by name: ``--sandbox=KIND`` to its :class:`~.backend.Backend`, ``auto`` resolved.

The names and what ``auto`` means are :mod:`.kinds`'s; this is where a name
becomes the object every caller asks instead of testing the name.
"""

from __future__ import annotations

from libbroker.sandbox.backend import Backend
from libbroker.sandbox.bwrap_backend import BwrapBackend
from libbroker.sandbox.kinds import AUTO_ORDER, choose_backend
from libbroker.sandbox.landlock_backend import LandlockBackend

_BACKENDS: dict[str, Backend] = {b.name: b for b in (BwrapBackend(), LandlockBackend())}
assert tuple(_BACKENDS) == AUTO_ORDER


def of(kind: str) -> Backend:
    """The backend ``kind`` names (a kind :func:`.kinds.not_a_kind` accepts): ``auto``'s
    choice (:func:`.kinds.choose_backend`) for ``auto``."""
    return _BACKENDS[choose_backend(kind)]


def each() -> tuple[Backend, ...]:
    """Every backend, in ``auto``'s order."""
    return tuple(_BACKENDS.values())
