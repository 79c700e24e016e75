"""The Backend protocol's promises that need no sandbox: each backend says how it realises
(or refuses) every Shape field, and names resolve as ``auto`` says."""

from __future__ import annotations

import importlib

import pytest

from libbroker.sandbox import backends
from libbroker.sandbox.kinds import AUTO, AUTO_ORDER, choose_backend
from libbroker.sandbox.shape import Shape


@pytest.mark.parametrize("backend", backends.each(), ids=lambda b: b.name)
def test_each_backend_says_what_it_makes_of_every_shape_field(backend) -> None:
    assert set(backend.realises) == set(Shape._fields)
    assert all(how.strip() for how in backend.realises.values())
    assert importlib.import_module(backend.executor).EXECUTOR.name == backend.name


def test_names_resolve_once() -> None:
    assert tuple(b.name for b in backends.each()) == AUTO_ORDER
    assert backends.of(AUTO).name == choose_backend(AUTO)
    assert [backends.of(name).name for name in AUTO_ORDER] == list(AUTO_ORDER)
