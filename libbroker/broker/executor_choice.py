"""The choice between the sandbox executors: ``--sandbox=KIND`` to an :class:`.Executor`.

Apart from :mod:`.executor` (the interface the backends implement) so that
no backend imports the module that imports it: the interface knows no
backend, and this module asks :mod:`libbroker.sandbox.backends` for them.
Each backend's executor (its module's ``EXECUTOR``, which the
:class:`~libbroker.sandbox.backend.Backend` names) is imported when chosen,
so a broker loads one.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

from libbroker.broker.executor import Executor
from libbroker.broker.profile import Profile
from libbroker.errors import ConfigError, SandboxUnavailable, UsageError
from libbroker.sandbox import backends
from libbroker.sandbox.backend import Backend
from libbroker.sandbox.kinds import AUTO, not_a_kind


def make_executor(
    kind: str, profile: Profile, workdir: str, server_env: Mapping[str, str]
) -> Executor:
    """The executor for ``--sandbox=kind``; ``auto`` says on stderr what it picked.

    ``auto`` (:mod:`libbroker.sandbox.kinds`) is the first of AUTO_ORDER whose
    executor can be built here: bwrap, then Landlock.  There is no
    unsandboxed fallback: if nothing works, SandboxUnavailable.
    """
    problem = not_a_kind(kind)
    if problem is not None:
        raise UsageError(f"--sandbox {problem}")
    if kind != AUTO:
        return _build(backends.of(kind), profile, workdir, server_env)
    reasons = []
    for backend in backends.each():
        try:
            executor = _build(backend, profile, workdir, server_env)
        except (SandboxUnavailable, ConfigError) as exc:
            reasons.append(str(exc))
            continue
        sys.stderr.write(f"broker-server: sandbox auto: using {executor.describe()}\n")
        return executor
    raise SandboxUnavailable("no sandbox backend works here: " + "; ".join(reasons))


def _build(
    backend: Backend, profile: Profile, workdir: str, env: Mapping[str, str]
) -> Executor:
    """``backend``'s executor for this profile (SandboxUnavailable, ConfigError if it cannot)."""
    made: Callable[[Profile, str, Mapping[str, str]], Executor]
    made = importlib.import_module(backend.executor).EXECUTOR
    return made(profile, workdir, env)
