"""The cyclic garbage collector off while egress-proxy starts; what the start made, frozen.

A proxy a session starts (libbroker.launcher.prestart) imports several thousand
objects' worth of modules (its own, cryptography, asyncio, h11): allocations
that set off ~40 young-generation collections, ~5-9 ms of CPU on cores the
launcher and then the agent need, for nearly no garbage (module objects live
as long as the process).  Imported first in its warm-up (``PROXY_WARM``), this
module turns the collector off; :func:`settle`, once the server is imported,
moves every object made so far to the permanent generation (``gc.freeze``:
never traversed again, so the collector's later runs do not pay for the
start's objects either) and turns it back on, so that the running proxy
collects its cycles as any Python program does.  The few cycles the start
made are kept, not collected.
"""

from __future__ import annotations

import gc

gc.disable()


def settle() -> None:
    """Freeze what the start made and collect as usual from now on (idempotent)."""
    gc.freeze()
    gc.enable()
