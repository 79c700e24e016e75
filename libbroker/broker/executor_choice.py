"""The choice between the sandbox executors: ``--sandbox=KIND`` to an :class:`.Executor`.

Apart from :mod:`.executor` (the interface the backends implement) so that
no backend imports the module that imports it: the interface knows no
backend, and only this module knows them all.  Each backend is imported
when chosen, so a broker loads one.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from libbroker.broker.executor import Executor
from libbroker.broker.profile import Profile
from libbroker.errors import ConfigError, SandboxUnavailable, UsageError
from libbroker.sandbox.kinds import AUTO_ORDER, BWRAP, LANDLOCK, not_a_kind


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
    if kind in _BUILDERS:
        return _BUILDERS[kind](profile, workdir, server_env)
    reasons = []
    for backend in AUTO_ORDER:
        try:
            executor = _BUILDERS[backend](profile, workdir, server_env)
        except (SandboxUnavailable, ConfigError) as exc:
            reasons.append(str(exc))
            continue
        sys.stderr.write(f"broker-server: sandbox auto: using {executor.describe()}\n")
        return executor
    raise SandboxUnavailable("no sandbox backend works here: " + "; ".join(reasons))


def _bwrap(profile: Profile, workdir: str, env: Mapping[str, str]) -> Executor:
    from libbroker.broker.bwrap_executor import BwrapExecutor

    return BwrapExecutor(profile, workdir, env)


def _landlock(profile: Profile, workdir: str, env: Mapping[str, str]) -> Executor:
    from libbroker.broker.landlock_executor import LandlockExecutor

    return LandlockExecutor(profile, workdir, env)


_BUILDERS = {BWRAP: _bwrap, LANDLOCK: _landlock}
