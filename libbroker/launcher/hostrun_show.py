"""The host-run guard's printed words: safe to paste into a shell, safe to show on a terminal.

Every path and link target in a sweep line goes through :func:`shown`, every
printed command is built by :func:`command`: a word of printable ASCII is
quoted as POSIX ``sh`` quotes it (``'...'``); any other byte (ESC, CR, LF,
DEL, a byte of a name that is not UTF-8, a UTF-8 letter) makes it a bash
``$'...'`` word with that byte as ``\\xHH``.  No raw control byte reaches
the terminal (no forged line, no title, no OSC 52), and what is pasted names
exactly the bytes of the file.
"""

from __future__ import annotations

import os
import shlex


def shown(word: str) -> str:
    """``word`` (a str from the filesystem: surrogates for bytes that are not UTF-8), quoted."""
    raw = os.fsencode(word)
    if raw and all(0x20 <= b < 0x7F for b in raw):
        return shlex.quote(word)
    out = []
    for b in raw:
        if 0x20 <= b < 0x7F and b not in (0x27, 0x5C):  # ' and \ are escaped too
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


def command(*words: str) -> str:
    """A command line of ``words``, each :func:`shown`."""
    return " ".join(shown(w) for w in words)
