"""libbroker.named_tuple.NamedTuple makes the class typing.NamedTuple makes, without
turning each annotation into a ForwardRef (~4 ms of the cold launcher's CPU before go),
and every named tuple of the project is made by it."""

from __future__ import annotations

import ast
import pickle
import typing
from pathlib import Path

import pytest

from libbroker.named_tuple import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


def _pair() -> tuple[type, type]:
    made = []
    for base in (NamedTuple, typing.NamedTuple):

        class Point(base):  # type: ignore[valid-type, misc]
            """A point."""

            x: int
            y: str = "y"
            z: tuple[str, ...] = ()

            @property
            def twice(self) -> int:
                return self.x * 2

            def moved(self, by: int) -> Point:
                return self._replace(x=self.x + by)  # type: ignore[no-any-return]

            @classmethod
            def origin(cls) -> Point:
                return cls(0)  # type: ignore[no-any-return]

        made.append(Point)
    return made[0], made[1]


def test_the_class_is_typings() -> None:
    ours, theirs = _pair()
    for cls in (ours, theirs):
        p = cls(1, z=("a",))
        assert p == (1, "y", ("a",)) and hash(p) == hash((1, "y", ("a",)))
        assert p.twice == 2 and p.moved(2).x == 3 and cls.origin() == (0, "y", ())
        assert repr(p) == "Point(x=1, y='y', z=('a',))"
        assert p._asdict() == {"x": 1, "y": "y", "z": ("a",)}
        assert cls.__mro__ == (cls, tuple, object)
        assert cls.__doc__ == "A point."
        with pytest.raises(AttributeError):
            p.x = 2  # type: ignore[misc]
        with pytest.raises(TypeError):
            cls()
    for attr in ("_fields", "_field_defaults", "__module__", "__qualname__", "__name__",
                 "__slots__", "__match_args__"):  # fmt: skip
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    # The annotations as written (strings here), not typing's ForwardRefs of them.
    assert ours.__annotations__ == {"x": "int", "y": "str", "z": "tuple[str, ...]"}


def test_it_pickles() -> None:
    from libbroker.sandbox.limits import Limits

    limits = Limits()
    assert pickle.loads(pickle.dumps(limits)) == limits


def test_typings_refusals() -> None:
    with pytest.raises(TypeError, match="Non-default namedtuple field b"):

        class Late(NamedTuple):
            a: int = 1
            b: int

    with pytest.raises(AttributeError, match="_replace"):

        class Overwrite(NamedTuple):
            a: int

            def _replace(self) -> None: ...

    with pytest.raises(TypeError, match="inherit"):

        class Mixed(NamedTuple, dict[str, int]):  # type: ignore[misc]
            a: int


def test_every_named_tuple_is_made_by_it() -> None:
    """typing.NamedTuple costs ~0.15 ms of CPU per class at import (see the module)."""
    found = []
    for package in ("bin", "libbroker", "libpolicy", "libegress"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                typing_import = (isinstance(node, ast.ImportFrom) and node.module == "typing"
                                 and any(a.name == "NamedTuple" for a in node.names))  # fmt: skip
                in_checking = path.name == "named_tuple.py"  # its TYPE_CHECKING branch
                if typing_import and not in_checking:
                    found.append(str(path.relative_to(ROOT)))
                if isinstance(node, ast.Attribute) and node.attr == "NamedTuple":
                    found.append(str(path.relative_to(ROOT)))
    assert found == [], "use libbroker.named_tuple.NamedTuple"
