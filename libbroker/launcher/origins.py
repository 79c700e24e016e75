"""Where each setting came from, so a refusal names it: a flag, a line of the file, a default.

The config check (:mod:`.config`) refuses a value with ``{origin}: {problem}``,
and the origin is what a person edits to fix it:

- ``--sandbox``, ``--workdir``, ``--limit``, ``--agent``: the command line;
- ``/home/u/.config/agent-sandbox/config.toml line 7: domains``: the file,
  at the line where the key is set (``[[secret]] #2 (api.anthropic.com)``
  for the second ``[[secret]]`` table, counted from 1 as a reader counts);
- ``workdir (default: the current directory)``: nothing named it.

tomllib gives values without positions, so :func:`key_lines` finds them in
the text: good enough for the plain files people write (one key per line),
and an origin without a line still names the file.  Pure: text in, labels out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# A bare or quoted key at the start of a line: the first part of a dotted key.
_KEY = re.compile(r'^\s*(?:"([^"]*)"|\'([^\']*)\'|([A-Za-z0-9_-]+))\s*(?:=|\.)')
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
DEFAULTS = {"workdir": "workdir (default: the current directory)"}

Lines = dict[tuple[str, str], int]


def key_lines(text: str) -> Lines:
    """``(table, key) -> line`` (1-based) of each key's first line in TOML ``text``.

    ``table`` is "" for the top level, the dotted name of a ``[table]``, or
    ``secret#N`` for the Nth ``[[secret]]``; ``(table, "")`` is its header's line.
    """
    out: Lines = {}
    table = ""
    counts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            name = header.group(2).replace(" ", "").replace('"', "")
            if header.group(1) == "[[":
                counts[name] = counts.get(name, 0) + 1
                table = f"{name}#{counts[name]}"
            else:
                table = name
            out.setdefault((table, ""), number)
            top = name.split(".")[0]
            out.setdefault(("", top), number)  # [limits] sets the key limits
            continue
        key = _KEY.match(line)
        if key:
            name = next(g for g in key.groups() if g is not None)
            out.setdefault((table, name), number)
    return out


class Origins:
    """Labels for refusals: flags over the file's keys over the defaults.

    ``present``: the keys the file (or the caller's mapping) sets; any other key
    has its default value.
    """

    def __init__(
        self,
        present: frozenset[str] = frozenset(),
        *,
        file: str = "",
        lines: Lines | None = None,
        flags: Mapping[str, str] | None = None,
    ) -> None:
        self.present = present
        self.file = file
        self.lines = lines or {}
        self.flags = dict(flags or {})

    def __call__(self, key: str, sub: str = "") -> str:
        """Where ``key`` (of the top level; ``sub``: a key or table inside it) was set."""
        if key in self.flags:
            return self.flags[key]
        if key not in self.present:
            return DEFAULTS.get(key, f"{key} (default)")
        label = f"{key}.{sub}" if sub else key
        if not self.file:
            return label
        line = (sub and (self.lines.get((key, sub)) or self.lines.get((label, ""))))
        line = line or self.lines.get(("", key))
        return f"{self.file} line {line}: {label}" if line else f"{self.file}: {label}"

    def place(self, key: str) -> str:
        """``FILE line N: `` for a key the file sets that has no meaning (or "")."""
        if not self.file:
            return ""
        line = self.lines.get(("", key))
        return f"{self.file} line {line}: " if line else f"{self.file}: "

    def secret(self, index: int, host: str) -> str:
        """``[[secret]] #index (host)``, at its table's line in the file."""
        label = f"[[secret]] #{index}" + (f" ({host})" if host else "")
        if not self.file:
            return label
        line = self.lines.get((f"secret#{index}", ""))
        return f"{self.file} line {line}: {label}" if line else f"{self.file}: {label}"


def toml_error(file: str, message: str) -> str:
    """tomllib's ``... (at line L, column C)`` as ``FILE line L, column C: not valid TOML: ...``."""
    found = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if not found:
        found = re.search(r"\s*\(at end of document\)$", message)
        where = f"{file} at its end" if found else file
    else:
        where = f"{file} line {found.group(1)}, column {found.group(2)}"
    text = message[: found.start()] if found else message
    return f"{where}: not valid TOML: {text}"


def utf8_error(file: str, raw: bytes, exc: UnicodeDecodeError) -> str:
    """Where the first byte that is not UTF-8 is: line and column, as an editor counts."""
    before = raw[: exc.start]
    line = before.count(b"\n") + 1
    column = exc.start - (before.rfind(b"\n") + 1) + 1
    return (f"{file} line {line}, column {column}: not UTF-8 "
            f"(byte 0x{raw[exc.start]:02x}); TOML files are UTF-8")
