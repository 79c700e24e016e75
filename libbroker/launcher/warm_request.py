"""The warm launch's request: what a run hands the service's launcher zygote (docs/serve.md).

Pure: the shape of the ``launch`` request and its check, shared by the client
(:mod:`.warm_client`), the service (:mod:`.serve`) and the zygote
(:mod:`.launcher_zygote`), so the three agree on one definition.

``{"op": "launch", "argv": [...], "env": {...}, "umask": N, "rlimits": [[R, SOFT,
HARD], ...], "nice": N, "ids": [UID, EUID, GID, EGID, [GROUPS...]], "signals":
{"ignored": [...], "blocked": [...]}, "install": [PYTHON, PREFIX, PROJECT],
"privs": [...]}`` with four
descriptors: the run's stdin, stdout, stderr and its working directory (an
``O_PATH`` descriptor: the child ``fchdir``s to it, never to a path the client
wrote).  Everything a launcher reads from its own process is in it; what the
child cannot reproduce (other groups, a lower nice value, a raised limit,
another installation of the code) is refused, and the client runs cold.

No field is ever logged: argv and the environment may hold secrets.
"""

from __future__ import annotations

import os
import sys

from libbroker.launcher.boot import project_dir

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the client's start)
if TYPE_CHECKING:
    from typing import Any

# The request line's limit: the zygote's socket carries it as one message,
# which the kernel bounds by the socket's buffer (about 200 KiB for an
# ordinary user).  A run whose argv and environment are larger runs cold.
MAX_REQUEST = 160 * 1024
MAX_REPLY = 4096
KEYS = {"op", "argv", "env", "umask", "rlimits", "nice", "ids", "signals", "install", "privs"}
# What of /proc/self/status a fork cannot give back once the zygote has it (or
# lacks it): no_new_privs, seccomp and the capability sets.  Under a systemd
# unit with NoNewPrivileges=yes the zygote has no_new_privs: a run from a
# shell, without it, is refused (setuid programs, a setuid bwrap, would fail).
PRIVS = ("NoNewPrivs", "Seccomp", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
N_FDS = 4  # stdin, stdout, stderr, the working directory
_MAX_SIGNAL = 64
_RLIM_INFINITY = (1 << 64) - 1  # resource.RLIM_INFINITY as an unsigned value


def _ints(value: object, low: int, high: int) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in value)


def _limit(value: object) -> bool:
    return (isinstance(value, list) and len(value) == 3 and _ints(value[:1], 0, 63)
            and _ints(value[1:], -1, _RLIM_INFINITY))


def check(frame: object) -> dict[str, Any]:
    """The launch request ``frame`` (parsed JSON), checked; ValueError naming what is wrong.

    The message never quotes a value: argv and the environment are the run's own.
    """
    if not isinstance(frame, dict) or frame.get("op") != "launch":
        raise ValueError("not a launch request")
    extra = sorted(set(frame) - KEYS)
    missing = sorted(KEYS - set(frame))
    if extra or missing:
        raise ValueError(f"unknown key {extra[0]!r}" if extra else f"no {missing[0]!r}")
    argv, env = frame["argv"], frame["env"]
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) and "\0" not in a
                                                     for a in argv)):
        raise ValueError("'argv' must be a list of strings")
    if not (isinstance(env, dict) and all(
            isinstance(k, str) and k and "=" not in k and "\0" not in k
            and isinstance(v, str) and "\0" not in v for k, v in env.items())):
        raise ValueError("'env' must map names to strings")
    if not _ints([frame["umask"]], 0, 0o777):
        raise ValueError("'umask' must be a number from 0 to 0o777")
    rlimits = frame["rlimits"]
    if not (isinstance(rlimits, list) and len(rlimits) <= 64 and all(map(_limit, rlimits))):
        raise ValueError("'rlimits' must be [resource, soft, hard] triples")
    if not _ints([frame["nice"]], -20, 19):
        raise ValueError("'nice' must be a number from -20 to 19")
    ids = frame["ids"]
    if not (isinstance(ids, list) and len(ids) == 5 and _ints(ids[:4], 0, (1 << 32) - 1)
            and _ints(ids[4], 0, (1 << 32) - 1) and len(ids[4]) <= 65536):
        raise ValueError("'ids' must be [uid, euid, gid, egid, [groups]]")
    signals = frame["signals"]
    if not (isinstance(signals, dict) and set(signals) == {"ignored", "blocked"}
            and _ints(signals["ignored"], 1, _MAX_SIGNAL)
            and _ints(signals["blocked"], 1, _MAX_SIGNAL)):
        raise ValueError("'signals' must be {\"ignored\": [...], \"blocked\": [...]}")
    install = frame["install"]
    if not (isinstance(install, list) and len(install) == 3
            and all(isinstance(p, str) for p in install)):
        raise ValueError("'install' must be [python, prefix, project directory]")
    privs = frame["privs"]
    if not (isinstance(privs, list) and len(privs) == len(PRIVS)
            and all(isinstance(p, str) and len(p) <= 32 for p in privs)):
        raise ValueError("'privs' must be the process's " + ", ".join(PRIVS))
    checked: dict[str, Any] = frame
    return checked


def install() -> list[str]:
    """This installation: the interpreter (its real file), its prefix (a venv's) and the
    project's directory.  The client's and the zygote's must be the same, or the run is
    cold: a child of the zygote runs the zygote's code."""
    return [os.path.realpath(sys.executable), sys.prefix, project_dir()]


def ids() -> list[object]:
    """This process's uid, euid, gid, egid and groups: the client's and the zygote's must
    be the same, or the run is cold (a fork keeps the zygote's)."""
    return [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())]


def privs() -> list[str]:
    """This process's no_new_privs, seccomp mode and capability sets, as /proc says them."""
    try:
        with open("/proc/self/status", "rb") as fh:
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return ["?"] * len(PRIVS)  # a zygote that cannot tell either refuses: "?" != its own
    found = dict(line.split(":", 1) for line in lines if ":" in line)
    return [found.get(name, "?").strip() for name in PRIVS]


def exit_code(status: int) -> int:
    """A wait status as the launcher's exit code: its own, or 128+N for a death by signal N."""
    signum = status & 0x7F
    if signum == 0:
        return (status >> 8) & 0xFF
    if signum == 0x7F:  # stopped: not an end (never sent)
        return 1
    return 128 + signum
