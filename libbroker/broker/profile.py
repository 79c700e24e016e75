"""The command profile: what a brokered command may see, write and reach.

Pure data and pure decisions; the sandbox backends turn a :class:`Profile`
into bwrap arguments or a Landlock ruleset.  ``--profile FILE`` is JSON::

    {"filesystem": {"read": [..], "write": [..], "deny": [..]},
     "network": {"mode": "none"} | {"mode": "proxy", "port": N},
     "environment": {"allow_vars": [..]},
     "limits": {"tasks": 4096, "memory": "8G", "tmp": "2G", "cpu": 2, "timeout": 600}}

Every key is optional; an unknown key is an error (a typo must not silently
widen or narrow a sandbox).  Paths must be absolute.  The workdir is always
read-write and is not part of the file.  ``limits`` (each key optional,
``"off"`` for none; :mod:`libbroker.sandbox.limits`) bound every command:
tasks, memory, bwrap's /tmp, CPU cores and the wall clock in seconds.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from libbroker.errors import ConfigError
from libbroker.sandbox.limits import Limits, LimitsError, from_mapping
from libbroker.sandbox.shape import SYSTEM_READ, Shape

DEFAULT_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TERM", "HOME", "USER", "TZ")


def toolchain_read() -> tuple[str, ...]:
    """Python's own prefixes (often under $HOME with pyenv) and this project's
    source tree (an editable install imports from there): what a command needs
    to run python3 and our own console scripts."""
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tuple(sorted({sys.prefix, sys.base_prefix, project}))


@dataclass(frozen=True)
class Profile:
    """Filesystem, network and environment rules for every brokered command."""

    read: tuple[str, ...] = SYSTEM_READ
    write: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    proxy_port: int | None = None
    env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW
    source: str = "built-in default"
    limits: Limits = field(default_factory=Limits)


def default_profile() -> Profile:
    """The built-in profile: system dirs, Python and the project read-only, no network."""
    return Profile(read=SYSTEM_READ + toolchain_read())


def with_env_allow(profile: Profile, names: Iterable[str]) -> Profile:
    """``profile`` with the environment allow list replaced (``--env-allow``)."""
    return replace(profile, env_allow=_env_names(list(names), "--env-allow"))


def load_profile(path: str) -> Profile:
    """Read and validate the JSON profile at ``path``."""
    try:
        with open(path, encoding="utf-8") as fh:
            body = json.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read profile {path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"profile {path} is not valid JSON: {exc}") from None
    return parse_profile(body, source=path)


def parse_profile(body: object, *, source: str = "profile") -> Profile:
    """Validate an already-decoded profile object."""
    where = f"profile {source}"
    obj = _object(body, where, {"filesystem", "network", "environment", "limits"})
    fs = _object(obj.get("filesystem", {}), f"{where}: filesystem", {"read", "write", "deny"})
    net = _object(obj.get("network", {"mode": "none"}), f"{where}: network", {"mode", "port"})
    env = _object(obj.get("environment", {}), f"{where}: environment", {"allow_vars"})

    mode = net.get("mode", "none")
    port: int | None = None
    if mode == "proxy":
        raw_port = net.get("port")
        if not isinstance(raw_port, int) or isinstance(raw_port, bool) or not 0 < raw_port < 65536:
            raise ConfigError(f"{where}: network.port must be a TCP port number for mode proxy")
        port = raw_port
    elif mode != "none" or "port" in net:
        raise ConfigError(f"{where}: network.mode must be 'none' or 'proxy' (with a port)")

    allow = env.get("allow_vars", list(DEFAULT_ENV_ALLOW))
    try:
        limits = from_mapping(obj.get("limits", {}), f"{where}: limits")
    except LimitsError as exc:
        raise ConfigError(str(exc)) from None
    return Profile(
        read=SYSTEM_READ + toolchain_read() + _paths(fs.get("read", []), f"{where}: read"),
        write=_paths(fs.get("write", []), f"{where}: write"),
        deny=_paths(fs.get("deny", []), f"{where}: deny"),
        proxy_port=port,
        env_allow=_env_names(allow, f"{where}: environment.allow_vars"),
        source=source,
        limits=limits,
    )


def command_shape(profile: Profile, workdir: str, cwd: str, tmp: str = "") -> Shape:
    """A brokered command's sandbox, for either backend: the profile's paths, the workdir.

    Its intents, each realised by the backend that can: network only to the
    proxy's port in proxy mode (bwrap: a namespace of its own, the port
    relayed in; Landlock: connect to that port alone); a private tmp (bwrap: a
    fresh /tmp of at most the profile's size; Landlock: ``tmp``, a private
    directory granted read-write).
    """
    write = (*profile.write, workdir, *((tmp,) if tmp else ()))
    ports = () if profile.proxy_port is None else (profile.proxy_port,)
    return Shape(
        read=profile.read, write=write, deny=profile.deny, cwd=cwd, tcp_connect=ports, tmp=tmp,
        tmp_size=profile.limits.tmp,
    )  # fmt: skip


def command_environment(
    server_env: Mapping[str, str], allow: Iterable[str], *, tmpdir: str | None = None
) -> dict[str, str]:
    """The exact environment of a command: the server's own values of ``allow``.

    ``NONO_*`` never passes (nono reads its policy from such names).  ``TMPDIR``
    is set to the backend's private temporary directory when there is one,
    whatever the server's own value.
    """
    env = {
        name: server_env[name]
        for name in allow
        if name in server_env and not name.startswith("NONO_") and name != "TMPDIR"
    }
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    return env


def _object(value: object, where: str, keys: set[str]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a JSON object")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}")
    return value


def _paths(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ConfigError(f"{where} must be a list of paths")
    for p in value:
        if not p.startswith("/") or "\0" in p:
            raise ConfigError(f"{where}: {p!r} is not an absolute path")
    return tuple(os.path.normpath(p) for p in value)


def _env_names(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise ConfigError(f"{where} must be a list of variable names")
    for name in value:
        if not name or "=" in name or "\0" in name:
            raise ConfigError(f"{where}: {name!r} is not a variable name")
        if name.startswith("NONO_"):
            raise ConfigError(f"{where}: {name} is refused (NONO_* configures the sandbox itself)")
    return tuple(value)
