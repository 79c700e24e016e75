"""libbroker.quick_thread: a thread whose start does not wait for it, joined by its lock."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from libbroker.quick_thread import QuickThread


def test_start_returns_before_the_target_runs_and_join_waits_for_it() -> None:
    gate = threading.Event()
    ran: list[int] = []

    def target(n: int) -> None:
        gate.wait(10)
        ran.append(n)

    thread = QuickThread(target, (7,), name="test")
    assert not thread.is_alive()
    thread.start()
    assert thread.is_alive() and ran == []  # started, and held back by the gate
    thread.join(0.05)  # a timeout returns with the target still waiting
    assert thread.is_alive()
    gate.set()
    thread.join()
    assert ran == [7] and not thread.is_alive()


def test_a_target_that_raises_still_ends_the_join(monkeypatch: pytest.MonkeyPatch) -> None:
    """And the exception is reported (sys.unraisablehook, which prints it by default)."""
    reported: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))

    def target() -> None:
        raise OSError("boom")

    thread = QuickThread(target)
    thread.start()
    t0 = time.monotonic()
    thread.join(10)
    assert time.monotonic() - t0 < 5 and not thread.is_alive()
    while not reported and time.monotonic() - t0 < 10:  # reported once _run has returned
        time.sleep(0.01)
    assert [str(exc) for exc in reported] == ["boom"]


def test_it_starts_once() -> None:
    thread = QuickThread(lambda: None)
    thread.start()
    thread.join()
    with pytest.raises(RuntimeError):
        thread.start()
    thread.join(1)  # and a refused start leaves nothing to wait for


def test_is_current_only_inside_it() -> None:
    seen: list[bool] = []
    thread = QuickThread(lambda: seen.append(thread.is_current()))
    thread.start()
    thread.join()
    assert seen == [True] and not thread.is_current()
