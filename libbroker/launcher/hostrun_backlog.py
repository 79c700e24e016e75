"""The live guard's slow lane: judgements that take milliseconds, off the fast path.

Moving a planted ``commondir`` or gitlink aside is one rename and must not
wait behind a new repository's config, which git itself parses (a process,
tens of milliseconds on a busy machine), nor behind a config merge.  The
watcher (:mod:`.hostrun_live`) hands those here by key; a key submitted
again before its turn runs once, with the latest work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from libbroker.quick_thread import QuickThread


class Backlog:
    """One thread running submitted work in order, each key at most once per turn."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._work: dict[str, Callable[[], None]] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = False
        self._on_error = on_error
        self._thread = QuickThread(self._run, name="hostrun-backlog")  # (its start: no wait)
        self._thread.start()

    def submit(self, key: str, work: Callable[[], None]) -> None:
        with self._cond:
            self._work[key] = work
            self._cond.notify()

    def idle(self, timeout: float) -> bool:
        """Wait until nothing is queued or running (tests, the end); whether it got there."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._work and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._work or self._stopping)
                if self._stopping:
                    return
                key = next(iter(self._work))
                work = self._work.pop(key)
                self._busy = True
            try:
                work()
            except Exception as exc:  # the end sweep still judges it; the person is told
                self._on_error(exc)

    def stop(self) -> None:
        """Finish what is queued, then end the thread."""
        self.idle(30.0)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
