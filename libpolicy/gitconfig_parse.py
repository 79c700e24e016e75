"""A git config file's bytes, read the way git 2.39's ``config.c`` reads them.

The guard must judge a config the agent wrote without starting ``git`` for
every file, and must edit the user's file without losing a byte of what it
does not change; so this parser mirrors ``git_parse_source``,
``get_base_var``, ``get_value`` and ``parse_value`` step by step, and records
where each entry and section header lies in the file.  Each entry's key is
flattened the way git hands it to its callbacks: ``section[.subsection].name``
with the section and name in lower case (the subsection as written, or in
lower case in the old ``[section.sub]`` form).

Where git would still accept something odd (a key before any section, an
empty section name, a NUL byte), this parser refuses: the caller treats a
file it cannot parse as one that runs commands, so refusing fails closed.
``tests/policy/test_policy_gitconfig.py`` checks it against the real git.
"""

from __future__ import annotations

import re

from libbroker.named_tuple import NamedTuple

_SPACE = frozenset(b" \t\n\r")  # git's isspace(): sane_ctype's GIT_SPACE
_NL = 10
_BOM = b"\xef\xbb\xbf"


class Item(NamedTuple):
    """One ``name [= value]`` entry: ``value`` None when there is no ``=`` (a bare true)."""

    key: str  # flattened, as git lists it; subsection bytes decoded with surrogateescape
    value: bytes | None
    start: int  # the entry's first byte (its name), and the byte after its line
    end: int
    block: int  # index into Parsed.blocks: the section header it is under


class Block(NamedTuple):
    """One ``[section ...]`` header."""

    prefix: str  # "section" or "section.subsection", as in the keys beneath it
    start: int  # the "[" and the byte after the "]"
    end: int


class Parsed(NamedTuple):
    items: list[Item]
    blocks: list[Block]


def _iskeychar(c: int) -> bool:
    return (48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122) or c == 45


def _isalpha(c: int) -> bool:
    return (65 <= c <= 90) or (97 <= c <= 122)


def _lower(c: int) -> int:
    return c + 32 if 65 <= c <= 90 else c


class _Syntax(Exception):
    """Where git would print "bad config line" (or where this parser refuses)."""


class _Reader:
    """git's get_next_char(): CR LF reads as LF; the end reads as LF, with ``eof`` set."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.eof = False

    def next(self) -> int:
        data, pos = self.data, self.pos
        if pos >= len(data):
            self.eof = True
            return _NL
        c = data[pos]
        self.pos = pos + 1
        if c == 13 and pos + 1 < len(data) and data[pos + 1] == _NL:
            self.pos = pos + 2
            return _NL
        return c


def parse(data: bytes) -> Parsed | None:
    """Every entry and section header of ``data``; None where git (or this) would refuse."""
    if b"\0" in data:
        return None
    try:
        return _parse(data)
    except _Syntax:
        return None


# Fast paths for the common lines, each matching only where the byte-by-byte
# reading below gives the same result (anything else falls through to it).
_SKIP = re.compile(rb"(?:[ \t\r\n]+|[#;][^\n]*)*")
_SIMPLE_HEADER = re.compile(rb'\[([A-Za-z0-9-]+)(?:[ \t]+"([^"\\\r\n]*)")?\]')
_SIMPLE_ENTRY = re.compile(
    rb"([A-Za-z][A-Za-z0-9-]*)[ \t]*(?:(=)[ \t]*"
    rb'([^"\\;#\s](?:[^"\\;#\t\r\n]*[^"\\;#\s])?)?[ \t]*)?(?:\n|\Z)'
)


def _parse(data: bytes) -> Parsed:
    reader = _Reader(data)
    if data.startswith(_BOM):
        reader.pos = len(_BOM)  # a partial one fails below: 0xef is not a letter
    items: list[Item] = []
    blocks: list[Block] = []
    while True:
        start = reader.pos = _SKIP.match(data, reader.pos).end()  # type: ignore[union-attr]
        if start >= len(data):
            return Parsed(items, blocks)
        if data[start] == ord("["):
            if found := _SIMPLE_HEADER.match(data, start):
                prefix = found.group(1).lower().decode()
                if found.group(2) is not None:
                    prefix += "." + found.group(2).decode("utf-8", "surrogateescape")
                reader.pos = found.end()
            else:
                reader.pos += 1
                prefix = _base_var(reader)
            blocks.append(Block(prefix, start, reader.pos))
            continue
        if not _isalpha(data[start]) or not blocks:
            raise _Syntax("a key must start with a letter, under a section")
        if found := _SIMPLE_ENTRY.match(data, start):
            name = found.group(1).lower().decode()
            value = (found.group(3) or b"") if found.group(2) else None
            reader.pos = found.end()
        else:
            reader.pos += 1
            name, value = _get_value(reader, data[start])
        items.append(Item(f"{blocks[-1].prefix}.{name}", value, start, reader.pos,
                          len(blocks) - 1))


def _base_var(reader: _Reader) -> str:
    """``[section]``, ``[section.sub]`` or ``[section "sub"]``: the key prefix it sets."""
    name = bytearray()
    while True:
        c = reader.next()
        if reader.eof:
            raise _Syntax("the file ends inside a section header")
        if c == ord("]"):
            break
        if c in _SPACE:
            return _extended_base_var(reader, bytes(name), c)
        if not _iskeychar(c) and c != ord("."):
            raise _Syntax("a section name holds only letters, digits, '-' and '.'")
        name.append(_lower(c))
    if not name or name.startswith(b".") or name.endswith(b".") or b".." in name:
        raise _Syntax("an empty section or subsection name")  # git takes some; we refuse
    return name.decode("ascii")


def _extended_base_var(reader: _Reader, section: bytes, c: int) -> str:
    while c in _SPACE:
        if c == _NL:
            raise _Syntax("a section header must end on its line")
        c = reader.next()
    if c != ord('"') or not section or b"." in section:
        raise _Syntax('the form is [section "subsection"]')
    sub = bytearray()
    while True:
        c = reader.next()
        if c == _NL:
            raise _Syntax("a section header must end on its line")
        if c == ord('"'):
            break
        if c == ord("\\"):
            c = reader.next()
            if c == _NL:
                raise _Syntax("a section header must end on its line")
        sub.append(c)
    if reader.next() != ord("]"):
        raise _Syntax('a section header ends with "]"')
    return section.decode("ascii") + "." + bytes(sub).decode("utf-8", "surrogateescape")


def _get_value(reader: _Reader, first: int) -> tuple[str, bytes | None]:
    name = bytearray([_lower(first)])
    while True:
        c = reader.next()
        if reader.eof or not _iskeychar(c):
            break
        name.append(_lower(c))
    while c in b" \t":
        c = reader.next()
    if c == _NL:
        return name.decode("ascii"), None
    if c != ord("="):
        raise _Syntax("a key is followed by '=' or the end of its line")
    return name.decode("ascii"), _parse_value(reader)


_ESCAPES = {ord("t"): 9, ord("b"): 8, ord("n"): _NL, ord("\\"): ord("\\"), ord('"'): ord('"')}


def _parse_value(reader: _Reader) -> bytes:
    value = bytearray()
    quote = comment = False
    space = 0
    while True:
        c = reader.next()
        if c == _NL:
            if quote:
                raise _Syntax("a quoted value must end on its line")
            return bytes(value)
        if comment:
            continue
        if c in _SPACE and not quote:
            if value:
                space += 1
            continue
        if not quote and c in b";#":
            comment = True
            continue
        value += b" " * space
        space = 0
        if c == ord("\\"):
            c = reader.next()
            if c == _NL:
                continue  # a continuation line (or a backslash at the very end)
            if c not in _ESCAPES:
                raise _Syntax("an unknown escape in a value")
            value.append(_ESCAPES[c])
            continue
        if c == ord('"'):
            quote = not quote
            continue
        value.append(c)


def render_header(prefix: str) -> bytes:
    """The ``[section "subsection"]`` line for keys that start with ``prefix``."""
    section, dot, sub = prefix.partition(".")
    if not dot:
        return f"[{section}]\n".encode()
    quoted = sub.encode("utf-8", "surrogateescape").replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    return f"[{section} \"".encode() + quoted + b'"]\n'


def render_item(name: str, value: bytes | None) -> bytes:
    """One ``\\tname = "value"`` line that git reads back as exactly ``value``."""
    if value is None:
        return f"\t{name}\n".encode()
    escaped = (value.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\n", b"\\n")
               .replace(b"\t", b"\\t").replace(b"\b", b"\\b"))
    return f"\t{name} = \"".encode() + escaped + b'"\n'
