"""The sandbox backends there are, and what ``auto`` means: one definition for launcher and broker.

``auto`` is the first backend of :data:`AUTO_ORDER` that works here: bwrap
(namespaces hide more than Landlock can: other processes, unix sockets,
/proc), then Landlock (``nono``).  Never no sandbox.  Each side tells
"works" its own way, at its own cost: the launcher, before anything
starts, by bwrap being installed (:func:`choose_backend`); the broker by building
each backend's executor in turn (``libbroker.broker.executor_choice``).
Beside the names, what a caller must know of a backend before its
:class:`~.backend.Backend` object is at hand (pure, and light enough for the
launcher's prestart): :func:`denies_inside_grants`.
"""

from __future__ import annotations

from libbroker.which import which

AUTO = "auto"
BWRAP = "bwrap"
LANDLOCK = "nono"  # the name users type (--sandbox=nono), after the library it first used
AUTO_ORDER = (BWRAP, LANDLOCK)
SANDBOX_KINDS = (AUTO, *AUTO_ORDER)
_PROGRAM = {BWRAP: "bwrap"}  # a backend that needs a program on PATH; Landlock is the kernel's
# Whether a backend can hide a path inside a tree it grants: bwrap mounts over
# it; Landlock grants a tree whole (libbroker.sandbox.landlock refuses the deny).
_DENIES_INSIDE_GRANTS = {BWRAP: True, LANDLOCK: False}


def not_a_kind(kind: str) -> str | None:
    """Why ``kind`` is no sandbox kind (``must be one of ..., not 'vm'``), else None."""
    if kind in SANDBOX_KINDS:
        return None
    return f"must be one of {', '.join(SANDBOX_KINDS)}, not {kind!r}"


def choose_backend(kind: str) -> str:
    """The backend ``kind`` names: itself, or for ``auto`` the first installed of AUTO_ORDER."""
    if kind != AUTO:
        return kind
    for backend in AUTO_ORDER:
        program = _PROGRAM.get(backend)
        if program is None or which(program):
            return backend
    return AUTO_ORDER[-1]


def denies_inside_grants(backend: str) -> bool:
    """Whether ``backend`` (not ``auto``: :func:`choose_backend` first) can deny a path
    inside a tree it grants."""
    return _DENIES_INSIDE_GRANTS[backend]
