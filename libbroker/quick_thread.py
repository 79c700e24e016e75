"""A thread whose start does not wait for it to run: the session's threads before go.

``threading.Thread.start()`` returns only once the new thread has run its first
steps, which needs a free core and then the GIL.  A cold session starts about
eight threads on its way to go (the host-run scan and its tidy, the live
guard, its backlog, the gate, the sandbox's settle steps, the Landlock door)
while egress-proxy and bwrap take the two cores, so each start waited 1-6 ms:
measured with every start in the launcher not waiting, go came 5-6 ms earlier
under bwrap and ~10 ms under Landlock (medians of 40 and 30 interleaved runs,
load 2-2.8).  :class:`QuickThread` starts the same daemon thread
with ``_thread`` and does not wait; :meth:`QuickThread.join` waits on a lock the
thread releases when its target returns or raises (an exception is printed by
``sys.unraisablehook``, as ``threading`` prints it with its ``excepthook``).

It is not in ``threading.enumerate()``, and ends with the interpreter, as a
daemon thread does.
"""

from __future__ import annotations

import _thread

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class QuickThread:
    """``target(*args)`` in a daemon thread once :meth:`start` is called."""

    def __init__(self, target: Callable[..., object], args: tuple[Any, ...] = (),
                 name: str = "") -> None:  # fmt: skip
        self.name = name  # for a reader of this code: the kernel's name stays python's
        self._target = target
        self._args = args
        self._done = _thread.allocate_lock()  # held from start until the target is done
        self._started = False
        self._ident: int | None = None

    def start(self) -> None:
        """Start it, without waiting for it to run; RuntimeError if it cannot start."""
        if self._started:
            raise RuntimeError("a thread can be started once")
        self._started = True
        self._done.acquire()
        try:
            _thread.start_new_thread(self._run, ())
        except BaseException:
            self._done.release()
            raise

    def _run(self) -> None:
        self._ident = _thread.get_ident()
        try:
            self._target(*self._args)
        finally:
            self._done.release()

    def join(self, timeout: float | None = None) -> None:
        """Until the target has returned (or raised), at most ``timeout`` seconds."""
        if self._done.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            self._done.release()

    def is_alive(self) -> bool:
        """Started and its target not done."""
        return self._done.locked()

    def is_current(self) -> bool:
        """Whether the caller is this thread."""
        return self._ident == _thread.get_ident()
