"""A strict reader of GraphQL request documents: enough to tell reads from writes (pure).

``--repos`` lets a mutation through only when it can be tied to a listed
repository, so the proxy must see a document's structure exactly as the
server will: which operations it holds, of which type, and each mutation's
top-level fields with their arguments.  This is a parser of the executable
part of the GraphQL grammar (October 2021 spec: operations, fragments,
selections, arguments, values, variables, directives), written to refuse
rather than guess: a character outside the grammar, a block string where a
value is needed, a document nested too deep, a duplicate argument or object
field is a :class:`GraphQLError`, and the caller refuses the request.

Lexing follows the spec's ignored tokens exactly (spaces, tabs, commas, the
three line terminators, ``#`` comments up to ``\\n`` or ``\\r``), so a comment
cannot hide an operation the server would read, nor the reverse.  A byte
order mark is refused rather than ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypeAlias

MAX_DEPTH = 64
MAX_TOKENS = 200_000


class GraphQLError(ValueError):
    """The document is outside what this reader understands (a refusal)."""


@dataclass(frozen=True)
class Variable:
    """A ``$name`` in a value."""

    name: str


@dataclass(frozen=True)
class Enum:
    """An enum value (a bare name other than true/false/null)."""

    name: str


@dataclass(frozen=True)
class BlockString:
    """A block string; its value (indentation rules) is never needed, so not kept."""


@dataclass(frozen=True)
class Number:
    """An Int or Float literal, as written."""

    text: str


Value: TypeAlias = (Variable | Enum | Number | BlockString | str | bool
                    | tuple["Value", ...] | dict[str, "Value"] | None)


@dataclass(frozen=True)
class Field:
    """A field selection: ``alias: name(arguments) @directives { selections }``."""

    name: str
    alias: str | None = None
    arguments: dict[str, Value] = field(default_factory=dict)
    directives: tuple[str, ...] = ()
    selections: tuple[Selection, ...] = ()


@dataclass(frozen=True)
class FragmentSpread:
    """``...Name``."""

    name: str
    directives: tuple[str, ...] = ()


@dataclass(frozen=True)
class InlineFragment:
    """``... on Type { selections }`` (or without a type condition)."""

    type_condition: str | None
    directives: tuple[str, ...] = ()
    selections: tuple[Selection, ...] = ()


Selection: TypeAlias = "Field | FragmentSpread | InlineFragment"


@dataclass(frozen=True)
class Operation:
    """One operation definition; ``kind`` is query, mutation or subscription."""

    kind: str
    name: str | None
    variables: tuple[str, ...]
    directives: tuple[str, ...]
    selections: tuple[Selection, ...]


@dataclass(frozen=True)
class Document:
    """A request document: its operations and fragment definitions (by name)."""

    operations: tuple[Operation, ...]
    fragments: dict[str, tuple[Selection, ...]]


# ---------------------------------------------------------------------------
# Lexing

_NAME = re.compile(r"[_A-Za-z][_0-9A-Za-z]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_PUNCT = frozenset("!$&():=@[]{}|")
_IGNORED = frozenset(" \t,\n\r")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
            "t": "\t"}


@dataclass(frozen=True)
class Token:
    kind: str  # punct, name, number, string, block
    text: str  # the punctuator, the name, the number as written, the string's value


def tokens(source: str) -> list[Token]:
    """The tokens of ``source``; GraphQLError for anything outside the lexical grammar."""
    out: list[Token] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c in _IGNORED:
            i += 1
        elif c == "#":
            while i < n and source[i] not in "\n\r":
                i += 1
        elif c in _PUNCT:
            out.append(Token("punct", c))
            i += 1
        elif c == ".":
            if source.startswith("...", i):
                out.append(Token("punct", "..."))
                i += 3
            else:
                raise GraphQLError("a lone '.'")
        elif c == '"':
            if source.startswith('"""', i):
                i = _block_string(source, i, out)
            else:
                i = _string(source, i, out)
        elif (m := _NAME.match(source, i)) is not None:
            out.append(Token("name", m.group()))
            i = m.end()
        elif (m := _NUMBER.match(source, i)) is not None and m.group() not in ("", "-"):
            end = m.end()
            if end < n and (source[end] in "._" or source[end].isalnum()):
                raise GraphQLError("a number runs into a name or a dot")
            out.append(Token("number", m.group()))
            i = end
        else:
            raise GraphQLError(f"unexpected character U+{ord(c):04X}")
        if len(out) > MAX_TOKENS:
            raise GraphQLError("too many tokens")
    return out


def _string(source: str, i: int, out: list[Token]) -> int:
    chars: list[str] = []
    i += 1
    n = len(source)
    while True:
        if i >= n:
            raise GraphQLError("an unterminated string")
        c = source[i]
        if c == '"':
            out.append(Token("string", "".join(chars)))
            return i + 1
        if c in "\n\r":
            raise GraphQLError("a line break inside a string")
        if c < " " and c != "\t":
            raise GraphQLError("a control character inside a string")
        if c == "\\":
            esc = source[i + 1:i + 2]
            if esc in _ESCAPES:
                chars.append(_ESCAPES[esc])
                i += 2
                continue
            if esc == "u":
                m = re.compile(r"u(?:\{([0-9A-Fa-f]{1,6})\}|([0-9A-Fa-f]{4}))").match(source, i + 1)
                if m is None:
                    raise GraphQLError("a bad \\u escape in a string")
                code = int(m.group(1) or m.group(2), 16)
                if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                    # Surrogate pairs are legal but rare; refusing them is safe.
                    raise GraphQLError("a surrogate or out-of-range \\u escape")
                chars.append(chr(code))
                i = m.end()
                continue
            raise GraphQLError("an unknown escape in a string")
        chars.append(c)
        i += 1


def _block_string(source: str, i: int, out: list[Token]) -> int:
    i += 3
    n = len(source)
    while i < n:
        if source.startswith('\\"""', i):
            i += 4
        elif source.startswith('"""', i):
            # The raw text stands in for the value: block strings are never
            # accepted where a value matters (see Parser.id_string).
            out.append(Token("block", ""))
            return i + 3
        else:
            c = source[i]
            if c < " " and c not in "\t\n\r":
                raise GraphQLError("a control character inside a block string")
            i += 1
    raise GraphQLError("an unterminated block string")


# ---------------------------------------------------------------------------
# Parsing

class Parser:
    """Recursive descent over :func:`tokens`, depth-bounded."""

    def __init__(self, source: str) -> None:
        self.toks = tokens(source)
        self.pos = 0
        self.depth = 0

    # -- token helpers
    def peek(self, offset: int = 0) -> Token | None:
        j = self.pos + offset
        return self.toks[j] if j < len(self.toks) else None

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == kind and (text is None or tok.text == text)

    def take(self, kind: str, text: str | None = None) -> Token:
        tok = self.peek()
        if tok is None or tok.kind != kind or (text is not None and tok.text != text):
            want = text or kind
            got = "the end" if tok is None else repr(tok.text)
            raise GraphQLError(f"expected {want}, found {got}")
        self.pos += 1
        return tok

    def name(self) -> str:
        return self.take("name").text

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise GraphQLError(f"nested deeper than {MAX_DEPTH}")

    # -- document
    def document(self) -> Document:
        operations: list[Operation] = []
        fragments: dict[str, tuple[Selection, ...]] = {}
        if not self.toks:
            raise GraphQLError("an empty document")
        while self.peek() is not None:
            if self.at("punct", "{"):
                operations.append(Operation("query", None, (), (), self.selection_set()))
            elif self.at("name", "fragment"):
                self.pos += 1
                name = self.name()
                if name == "on":
                    raise GraphQLError("a fragment named 'on'")
                self.take("name", "on")
                self.name()
                self.directives()
                if name in fragments:
                    raise GraphQLError(f"fragment {name} defined twice")
                fragments[name] = self.selection_set()
            elif (tok := self.peek()) is not None and tok.kind == "name" and tok.text in (
                    "query", "mutation", "subscription"):
                self.pos += 1
                kind = tok.text
                op_name = self.name() if self.at("name") else None
                variables = self.variable_definitions() if self.at("punct", "(") else ()
                directives = self.directives()
                operations.append(Operation(kind, op_name, variables, directives,
                                            self.selection_set()))
            else:
                raise GraphQLError(f"not an executable definition at {tok.text if tok else ''!r}")
        if not operations:
            raise GraphQLError("no operation")
        return Document(tuple(operations), fragments)

    def variable_definitions(self) -> tuple[str, ...]:
        self.take("punct", "(")
        names: list[str] = []
        while not self.at("punct", ")"):
            self.take("punct", "$")
            names.append(self.name())
            self.take("punct", ":")
            self.type_ref()
            if self.at("punct", "="):
                self.pos += 1
                self.value(const=True)
            self.directives()
        self.take("punct", ")")
        if not names:
            raise GraphQLError("empty variable definitions")
        if len(set(names)) != len(names):
            raise GraphQLError("a variable defined twice")
        return tuple(names)

    def type_ref(self) -> None:
        self.enter()
        if self.at("punct", "["):
            self.pos += 1
            self.type_ref()
            self.take("punct", "]")
        else:
            self.name()
        if self.at("punct", "!"):
            self.pos += 1
        self.depth -= 1

    def directives(self) -> tuple[str, ...]:
        names: list[str] = []
        while self.at("punct", "@"):
            self.pos += 1
            names.append(self.name())
            if self.at("punct", "("):
                self.arguments()
        return tuple(names)

    def selection_set(self) -> tuple[Selection, ...]:
        self.enter()
        self.take("punct", "{")
        out: list[Selection] = []
        while not self.at("punct", "}"):
            out.append(self.selection())
        self.pos += 1
        if not out:
            raise GraphQLError("an empty selection set")
        self.depth -= 1
        return tuple(out)

    def selection(self) -> Selection:
        if self.at("punct", "..."):
            self.pos += 1
            if self.at("name", "on"):
                self.pos += 1
                cond: str | None = self.name()
                return InlineFragment(cond, self.directives(), self.selection_set())
            if self.at("name"):
                return FragmentSpread(self.name(), self.directives())
            return InlineFragment(None, self.directives(), self.selection_set())
        first = self.name()
        alias: str | None = None
        name = first
        if self.at("punct", ":"):
            self.pos += 1
            alias, name = first, self.name()
        arguments = self.arguments() if self.at("punct", "(") else {}
        directives = self.directives()
        selections = self.selection_set() if self.at("punct", "{") else ()
        return Field(name, alias, arguments, directives, selections)

    def arguments(self) -> dict[str, Value]:
        self.take("punct", "(")
        out: dict[str, Value] = {}
        while not self.at("punct", ")"):
            key = self.name()
            self.take("punct", ":")
            if key in out:
                raise GraphQLError(f"argument {key} given twice")
            out[key] = self.value(const=False)
        self.pos += 1
        if not out:
            raise GraphQLError("empty arguments")
        return out

    def value(self, *, const: bool) -> Value:
        tok = self.peek()
        if tok is None:
            raise GraphQLError("a value expected, found the end")
        self.enter()
        try:
            return self._value(tok, const)
        finally:
            self.depth -= 1

    def _value(self, tok: Token, const: bool) -> Value:
        self.pos += 1
        if tok.kind == "punct" and tok.text == "$" and not const:
            return Variable(self.name())
        if tok.kind == "number":
            return Number(tok.text)
        if tok.kind == "string":
            return tok.text
        if tok.kind == "block":
            return BlockString()
        if tok.kind == "name":
            return {"true": True, "false": False, "null": None}.get(tok.text, Enum(tok.text))
        if tok.kind == "punct" and tok.text == "[":
            items: list[Value] = []
            while not self.at("punct", "]"):
                items.append(self.value(const=const))
            self.pos += 1
            return tuple(items)
        if tok.kind == "punct" and tok.text == "{":
            fields: dict[str, Value] = {}
            while not self.at("punct", "}"):
                key = self.name()
                self.take("punct", ":")
                if key in fields:
                    raise GraphQLError(f"object field {key} given twice")
                fields[key] = self.value(const=const)
            self.pos += 1
            return fields
        raise GraphQLError(f"not a value: {tok.text!r}")


def parse(source: str) -> Document:
    """The document in ``source``; GraphQLError when it is not one this reader knows."""
    return Parser(source).document()
