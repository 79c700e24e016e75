"""The config's ``read``/``write`` grants checked against the home paths that stay shut.

The judgement is :mod:`libpolicy.home_grants`' (pure); this module resolves
links through the host's ``realpath`` its caller brings (the config's facts),
on both sides, so ``write = ["~/dots"]``
where ``~/.bashrc`` links into ``~/dots`` is refused like ``~/.bashrc``, and a
grant of a link to home is a grant of home.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from libbroker.errors import ConfigError
from libpolicy.home_grants import every_rel, refusal


def _spellings(path: str, realpath: Callable[[str], str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((path, realpath(path))))


def check(read: tuple[str, ...], write: tuple[str, ...], unsafe: tuple[str, ...], home: str,
          where: Callable[[str], str], realpath: Callable[[str], str]) -> None:
    """ConfigError for the first grant that reopens a shut home path and is not accepted.

    ``unsafe``: the grants the person accepts anyway (``unsafe_grants``);
    ``where(key)`` names the key's origin for the message; ``realpath`` is the
    host's (``os.path.realpath``).
    """
    shut = {rel: _spellings(os.path.join(home, rel), realpath) for rel in every_rel()}
    for kind, grants in (("write", write), ("read", read)):
        for grant in grants:
            if grant in unsafe:
                continue
            why = refusal(kind, _shown(grant, home), _spellings(grant, realpath), home, shut)
            if why is not None:
                raise ConfigError(f"{where(kind)}: {why}; remove it, or add "
                                  f"{_shown(grant, home)!r} to unsafe_grants to accept that")


def _shown(path: str, home: str) -> str:
    return "~" + path[len(home):] if path == home or path.startswith(home + "/") else path
