"""The one quoting of every shell command and name printed for a person to read or paste.

Names come from a tree the agent wrote, so they may hold anything a file
name can: quotes, ``;``, ``$(..)``, spaces, a leading ``-``, newlines, ESC
(a forged line, a terminal title, an OSC 52 write to the clipboard), bytes
that are not UTF-8.  Two functions cover every case:

- :func:`quote` (and :func:`command` for a whole line) makes one word bash
  reads back as exactly the original bytes.  A printable name gets plain
  single quotes (as ``shlex.quote``); a name with any control byte, a byte
  that is not UTF-8, or an invisible Unicode format character gets bash's
  ANSI-C ``$'...'`` quoting with ``\\xNN`` escapes, so no such byte reaches
  the terminal, and a pasted line cannot be split or extended by one.
- :func:`shown` escapes the same characters in text that is not a command
  (a reason, a key name), so a message prints as one honest line.

Strings from the file system carry undecodable bytes as surrogates
(``surrogateescape``, as ``os.fsdecode`` makes them); bytes work as well.
"""

from __future__ import annotations

import re
import unicodedata

_PLAIN = re.compile(rb"[A-Za-z0-9@%+=:,./_-]+")  # shlex.quote's safe set: no quoting needed
# Inside $'...': every byte outside printable ASCII, and the ones ANSI-C
# quoting or a paste treats specially (\ and ' end or escape; ! is history
# expansion, which bash's history code does not know to skip inside $'...').
_ANSI_LITERAL = frozenset(range(0x20, 0x7F)) - {ord("\\"), ord("'"), ord("!")}


def _bytes(text: str | bytes) -> bytes:
    if isinstance(text, bytes):
        return text
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no file system name decodes to
        return text.encode("utf-8", "surrogatepass")


def _invisible(ch: str) -> bool:
    """A character a terminal acts on or a reader cannot see: controls, format, separators."""
    if ch == " ":
        return False
    return unicodedata.category(ch)[0] in "CZ"  # Cc Cf Cs Co Cn, Zs Zl Zp


def _needs_ansi(raw: bytes) -> bool:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return any(_invisible(ch) for ch in text)


def quote(word: str | bytes) -> str:
    """One shell word that bash reads back as exactly ``word``'s bytes; safe to print and paste.

    Raises ValueError for a NUL byte, which no file name or argument holds.
    """
    raw = _bytes(word)
    if b"\0" in raw:
        raise ValueError("a NUL byte cannot be passed in a shell word")
    if _PLAIN.fullmatch(raw):
        return raw.decode("ascii")
    if not _needs_ansi(raw):
        return "'" + raw.decode("utf-8").replace("'", "'\"'\"'") + "'"
    return "$'" + "".join(
        chr(b) if b in _ANSI_LITERAL else f"\\x{b:02x}" for b in raw
    ) + "'"


def command(*words: str | bytes) -> str:
    """A command line of ``words``, each quoted by :func:`quote`."""
    return " ".join(quote(w) for w in words)


def shown(text: str | bytes) -> str:
    """``text`` for a message: controls, invisible characters and undecodable bytes escaped.

    Backslashes are doubled, so what is shown maps back to one text only.
    """
    return "".join(_escaped(ch) for ch in _bytes(text).decode("utf-8", "surrogateescape"))


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e", "\\": "\\\\"}


def _escaped(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # a byte that is not UTF-8 (surrogateescape)
    if not _invisible(ch):
        return ch
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else (
        f"\\U{code:08x}")
