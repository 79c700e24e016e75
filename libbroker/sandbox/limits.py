"""Resource limits for every sandbox: tasks, memory, /tmp size, CPU, a wall clock.

A runaway (a fork bomb, a leak in a test run) must end that process, not the
machine, and never the session's servers.  Two halves:

- :class:`Limits` is pure data with pure parsing (:func:`parse_size`,
  :func:`from_mapping`): the config's ``limits`` table, ``--limit NAME=VALUE``
  and the broker profile's ``"limits"`` object all go through it;
- the *mechanism* (:mod:`.cgroups`), chosen once per process, strongest
  first:

  1. ``cgroup2``, delegated: a cgroup v2 subtree the user may write (a
     systemd user service, a writable subtree of the current cgroup) with
     the memory and pids controllers enabled;
  2. ``cgroup2`` or ``cgroup1`` as root: a child group (v2; or the v1
     ``memory`` and ``pids`` hierarchies of a hybrid host);
  3. ``rlimit``: RLIMIT_NPROC (counted above the user's tasks, or inside the
     sandbox's own user namespace), RLIMIT_DATA (not RLIMIT_AS: V8 and other
     JITs reserve far more address space than they use, node's wasm alone
     8 GiB+) and RLIMIT_FSIZE (the /tmp size, per file).

This module is the pure half; the mechanism is :mod:`.cgroups`.
"""

from __future__ import annotations

import os

from libbroker.named_tuple import NamedTuple

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
DEFAULT_TASKS = 4096
DEFAULT_TMP = 2 * GiB
CPU_PERIOD_US = 100_000
NAMES = ("tasks", "memory", "tmp", "cpu", "timeout")
"""The keys of a limits table, a ``--limit`` flag and a profile's ``"limits"``."""
PREFIX = "agent-sandbox-"
_UNITS = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}
_DURATIONS = {"": 1, "s": 1, "m": 60, "h": 3600}


class LimitsError(ValueError):
    """A limit's name or value is not acceptable (the message names it)."""


def default_memory() -> int:
    """The smaller of 8 GiB and half the RAM."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 8 * GiB
    return min(8 * GiB, ram // 2)


class Limits(NamedTuple):
    """What one sandbox may use; None is "no limit".

    ``tasks``: processes and threads; ``memory``: bytes of RAM (and swap);
    ``tmp``: bytes of bwrap's /tmp (a tmpfs); ``cpu``: cores' worth of CPU
    time (1.5 = one and a half cores); ``timeout``: seconds of wall clock
    for a brokered command (the session has none).  A NamedTuple, not a
    dataclass: the launcher's start does without that module (~7 ms of CPU);
    the memory default is :func:`default_memory`, read once.
    """

    tasks: int | None = DEFAULT_TASKS
    memory: int | None = default_memory()
    tmp: int | None = DEFAULT_TMP
    cpu: float | None = None
    timeout: float | None = None

    def to_mapping(self) -> dict[str, object]:
        """What :func:`from_mapping` reads back (the broker profile's ``"limits"``)."""
        return {name: ("off" if v is None else v) for name, v in self._asdict().items()}


def parse_size(value: object, name: str = "size") -> int:
    """Bytes from ``8G``, ``512M``, ``2GiB``, ``64k``, ``1048576`` (binary units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), ""
    elif isinstance(value, str):
        text = value.strip().lower().removesuffix("b").removesuffix("i")
        digits = text.rstrip("kmgt")
        unit = text[len(digits) :]
        try:
            number = float(digits)
        except ValueError:
            number = -1.0
        if unit not in _UNITS:
            number = -1.0
    else:
        number, unit = -1.0, ""
    scaled = number * _UNITS.get(unit, 1)
    size = int(scaled) if 1 <= scaled < 2**62 else 0  # not NaN, not infinite
    if size < 1:
        raise LimitsError(f"{name} must be a size such as 512M or 8G, not {value!r}")
    return size


def _number(value: object, name: str, units: dict[str, int], want: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        digits = text.rstrip("".join(units))
        try:
            number = float(digits) * units[text[len(digits) :]]
        except (ValueError, KeyError):
            number = -1.0
    else:
        number = -1.0
    if not number > 0 or number == float("inf"):
        raise LimitsError(f"{name} must be {want}, not {value!r}")
    return number


def parse_value(name: str, value: object) -> int | float | None:
    """One limit's value, checked; None for ``"off"``."""
    if isinstance(value, str) and value.strip().lower() in ("off", "none", "unlimited"):
        return None
    if name == "tasks":
        tasks = _number(value, name, {"": 1}, "a number of tasks such as 4096")
        if tasks != int(tasks) or tasks < 8:
            raise LimitsError(f"tasks must be a whole number of at least 8, not {value!r}")
        return int(tasks)
    if name in ("memory", "tmp"):
        return parse_size(value, name)
    if name == "cpu":
        return _number(value, name, {"": 1}, "a number of cores such as 1.5")
    if name == "timeout":
        return _number(value, name, _DURATIONS, "a duration such as 600, 90s, 10m or 2h")
    raise LimitsError(f"unknown limit {name!r} (known: {', '.join(NAMES)})")


def from_mapping(data: object, where: str, base: Limits | None = None) -> Limits:
    """``base`` (the defaults) with the limits ``data`` names; LimitsError naming the key."""
    if not isinstance(data, dict):
        raise LimitsError(f"{where} must be a table of {', '.join(NAMES)}")
    changes: dict[str, object] = {}
    for name, value in data.items():
        if name not in NAMES:
            raise LimitsError(f"{where}: unknown limit {name!r} (known: {', '.join(NAMES)})")
        try:
            changes[name] = parse_value(name, value)
        except LimitsError as exc:
            raise LimitsError(f"{where}: {exc}") from None
    return (base if base is not None else Limits())._replace(**changes)  # type: ignore[arg-type]


def parse_flags(flags: list[str]) -> dict[str, str]:
    """``--limit NAME=VALUE`` flags as a table (the last of a name wins)."""
    out: dict[str, str] = {}
    for flag in flags:
        name, eq, value = flag.partition("=")
        if not eq or not value:
            raise LimitsError(f"--limit {flag!r}: expected NAME=VALUE, e.g. memory=4G")
        if name not in NAMES:
            raise LimitsError(f"--limit: unknown limit {name!r} (known: {', '.join(NAMES)})")
        out[name] = value
    return out


def size_text(size: int) -> str:
    """``8 GiB``, ``256 MiB``, ``1536 KiB``: the largest unit that divides it."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


def summary(limits: Limits) -> str:
    """One line for doctor and the README: every limit in effect."""
    parts = [
        f"tasks {limits.tasks or 'off'}",
        f"memory {size_text(limits.memory) if limits.memory else 'off'}",
        f"/tmp {size_text(limits.tmp) if limits.tmp else 'off'}",
        f"cpu {limits.cpu:g} cores" if limits.cpu else "cpu off",
    ]
    if limits.timeout:
        parts.append(f"brokered commands {limits.timeout:g}s")
    return ", ".join(parts)
