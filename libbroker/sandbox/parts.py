"""The Landlock session helper's parts on its one pipe: a length, then the bytes.

The launcher writes three parts at three moments (:mod:`.landlock_helper`), and
three processes read them in turn (the helper, the init, the command's
process): each reads exactly its own, so the next stays in the pipe for the
next reader.  Only ``os``: the launcher imports this on its start path.
"""

from __future__ import annotations

import os

LIMIT = 64 << 20
"""The largest part accepted (a spec is a few KiB; anything near this is a bug)."""


def frame(data: bytes) -> bytes:
    """``data`` as :func:`read` reads it: 4 bytes of length (big-endian), then ``data``."""
    if len(data) > LIMIT:
        raise ValueError(f"a part of {len(data)} bytes")
    return len(data).to_bytes(4, "big") + data


def read(fd: int) -> bytes | None:
    """One part from ``fd``, exactly its bytes; None at end of file (even mid-part).

    ValueError for a length over :data:`LIMIT`."""
    head = _exactly(fd, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > LIMIT:
        raise ValueError(f"a part of {size} bytes")
    return _exactly(fd, size)


def _exactly(fd: int, size: int) -> bytes | None:
    got = b""
    while len(got) < size:
        chunk = os.read(fd, size - len(got))
        if not chunk:
            return None
        got += chunk
    return got
