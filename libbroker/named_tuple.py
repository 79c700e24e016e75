"""``NamedTuple`` for the class form, made without checking the annotations.

``class Shape(NamedTuple): ...`` with :class:`typing.NamedTuple` turns each
field's annotation into a ``ForwardRef`` (a ``compile`` of its text, since our
modules use ``from __future__ import annotations``) and compares it with
typing's special forms: ~0.15 ms per class on this project's 2-core machines,
~4 ms of the cold launcher's CPU before go for the ~30 classes it defines, and
nothing reads those objects.  This makes the very class typing's would
(``collections.namedtuple`` with the same fields, defaults, module and
methods, so equality, hash, immutability, ``_replace`` and pickling are
unchanged) and keeps the annotations as they were written.

mypy sees :class:`typing.NamedTuple` itself; ``tests/test_named_tuple.py``
holds the two to the same behaviour.  Only the class form is offered (no
functional form, no ``Generic`` named tuples: none is used).
"""

from __future__ import annotations

import collections

TYPE_CHECKING = False  # mypy takes it as true; typing itself is not imported for this
if TYPE_CHECKING:
    from typing import Any

__all__ = ["NamedTuple"]

# typing's own rules (3.11-3.13): what a class body may not set, what is not copied.
_PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                         "_field_defaults", "_make", "_replace", "_asdict", "_source"})  # fmt: skip
_SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})
_namedtuple: Any = collections.namedtuple  # called with names known at run time only


class _Maker(type):
    def __new__(mcls, typename: str, bases: tuple[type, ...], ns: dict[str, Any]) -> Any:
        if bases != (_Base,):
            raise TypeError("can only inherit from a NamedTuple type")
        annotations: dict[str, Any] = ns.get("__annotations__", {})
        default_names: list[str] = []
        for field in annotations:
            if field in ns:
                default_names.append(field)
            elif default_names:
                raise TypeError(f"Non-default namedtuple field {field} cannot follow default "
                                f"field{'s' if len(default_names) > 1 else ''} "
                                f"{', '.join(default_names)}")  # fmt: skip
        made = _namedtuple(typename, list(annotations),
                           defaults=[ns[n] for n in default_names],
                           module=ns["__module__"])  # fmt: skip
        made.__annotations__ = made.__new__.__annotations__ = dict(annotations)
        for key, value in ns.items():
            if key in _PROHIBITED:
                raise AttributeError("Cannot overwrite NamedTuple attribute " + key)
            if key not in _SPECIAL and key not in made._fields:
                setattr(made, key, value)
        return made


# The base a class names; _Maker returns the namedtuple, so no class has it in its MRO.
_Base = type.__new__(_Maker, "NamedTuple", (), {})

if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    NamedTuple = _Base
