"""The file-tool policy: what a session's commands and file tools may read, write and reach.

A :class:`Policy` is loaded from the JSON the launcher writes for each session
(DESIGN 2.3) and validated strictly: unknown keys, relative or unclean paths
and wrongly typed values are refused with a message naming the key, because a
typo in a policy must never silently widen it.

This module sits on the hook's per-call import path, so it imports nothing but
``json`` and ``os`` (and the project's stdlib-only error module).
"""

from __future__ import annotations

import json
import os

from libbroker.errors import PolicyError
from libpolicy.hostrun import DEFAULT, HostRunError, Table

# The contract keys (DESIGN 2.3) and the optional rendering keys this project adds.
CONTRACT_KEYS = ("home", "runtime", "read", "write", "deny", "harness", "tool_write",
                 "domains", "proxy_port")
OPTIONAL_KEYS = ("socks_port", "egress", "env", "hook", "hostrun")
KNOWN_KEYS = frozenset(CONTRACT_KEYS + OPTIONAL_KEYS)

# egress-proxy's allow patterns: names, *.suffixes, host:port, [IPv6]:port.
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-_*:[]")
_ENV_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_ENV_REST = _ENV_FIRST | frozenset("0123456789")


def clean_absolute(value: object, key: str) -> str:
    """``value`` if it is an absolute, clean path (what ``os.path.normpath`` keeps)."""
    if not isinstance(value, str):
        kind = type(value).__name__
        raise PolicyError(f"policy key {key!r}: a path must be a string, not {kind}")
    if "\x00" in value:
        raise PolicyError(f"policy key {key!r}: path contains a NUL byte")
    if not value.startswith("/") or value.startswith("//"):
        raise PolicyError(f"policy key {key!r}: {value!r} is not an absolute path")
    if os.path.normpath(value) != value:
        raise PolicyError(
            f"policy key {key!r}: {value!r} is not clean "
            f"(write {os.path.normpath(value)!r}: no '.', '..', repeated or trailing '/')"
        )
    return value


def _optional_dir(value: object, key: str) -> str:
    # "" (or null) means the session has no such directory.
    if value is None or value == "":
        return ""
    return clean_absolute(value, key)


def _path_list(value: object, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PolicyError(f"policy key {key!r}: must be a list of paths")
    return tuple(clean_absolute(item, key) for item in value)


def _domains(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PolicyError("policy key 'domains': must be a list of host names")
    out = []
    for item in value:
        if not isinstance(item, str) or not item or not set(item.lower()) <= _HOST_CHARS:
            raise PolicyError(f"policy key 'domains': {item!r} is not a host pattern")
        out.append(item)
    return tuple(out)


def _port(value: object, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise PolicyError(f"policy key {key!r}: {value!r} is not a TCP port (1-65535)")
    return value


def _env(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PolicyError("policy key 'env': must be an object of strings")
    out: dict[str, str] = {}
    for name, val in value.items():
        if not (name and name[0] in _ENV_FIRST and set(name) <= _ENV_REST):
            raise PolicyError(f"policy key 'env': {name!r} is not a variable name")
        if not isinstance(val, str) or "\x00" in val:
            raise PolicyError(f"policy key 'env': the value of {name} must be a string")
        out[name] = val
    return out


def _hostrun(value: object) -> Table:
    if value is None:
        return DEFAULT
    try:
        return Table.from_dict(value)
    except HostRunError as exc:
        raise PolicyError(f"policy key 'hostrun': {exc}") from None


def _hook(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or "\x00" in value or "\n" in value:
        raise PolicyError("policy key 'hook': must be a one-line command string")
    return value


class Policy:
    """What an agent session's commands and file tools may read, write and reach.

    - ``home``: denied for reading, apart from ``read``, ``write`` and ``tool_write``.
    - ``runtime``: the user's runtime directory, denied for reading like home ("" = none).
    - ``read``: paths (typically under home) that may be read.
    - ``write``: paths that may be written, and read.
    - ``deny``: paths inside the above that may be neither read nor written.
    - ``harness``: the harness's config directory, which commands never write and the
      file tools write only under ``tool_write`` ("" = none).
    - ``tool_write``: paths only the harness's file tools may write (memory, plans).
    - ``domains``: the hosts commands reach; ``proxy_port``: the egress proxy's port.

    Optional, for rendering the managed settings: ``socks_port``, ``egress`` (the
    egress directory of CA bundle and gh config), ``env`` (extra variables), ``hook``
    (the command Claude Code runs for the hook), ``hostrun`` (the host-run list's
    additions, opt-outs and root: :mod:`libpolicy.hostrun`; the built-in list without it).
    """

    __slots__ = ("deny", "domains", "egress", "env", "harness", "home", "hook", "hostrun",
                 "proxy_port", "read", "runtime", "socks_port", "tool_write", "write")

    def __init__(
        self,
        home: str,
        *,
        runtime: str | None = "",
        read: tuple[str, ...] | list[str] = (),
        write: tuple[str, ...] | list[str] = (),
        deny: tuple[str, ...] | list[str] = (),
        harness: str | None = "",
        tool_write: tuple[str, ...] | list[str] = (),
        domains: tuple[str, ...] | list[str] = (),
        proxy_port: int | None = None,
        socks_port: int | None = None,
        egress: str | None = "",
        env: dict[str, str] | None = None,
        hook: str = "",
        hostrun: Table = DEFAULT,
    ) -> None:
        self.home = clean_absolute(home, "home")
        self.runtime = _optional_dir(runtime, "runtime")
        self.read = _path_list(list(read), "read")
        self.write = _path_list(list(write), "write")
        self.deny = _path_list(list(deny), "deny")
        self.harness = _optional_dir(harness, "harness")
        self.tool_write = _path_list(list(tool_write), "tool_write")
        self.domains = _domains(list(domains))
        self.proxy_port = _port(proxy_port, "proxy_port")
        self.socks_port = _port(socks_port, "socks_port")
        self.egress = _optional_dir(egress, "egress")
        self.env = _env(env)
        self.hook = _hook(hook)
        self.hostrun = hostrun

    @classmethod
    def from_dict(cls, data: object) -> Policy:
        """Validate a decoded policy document (see the class docstring for the keys)."""
        if not isinstance(data, dict):
            raise PolicyError("policy must be a JSON object")
        unknown = sorted(str(k) for k in data if k not in KNOWN_KEYS)
        if unknown:
            raise PolicyError(
                f"policy key {unknown[0]!r} is not known (known: {', '.join(sorted(KNOWN_KEYS))})"
            )
        if "home" not in data:
            raise PolicyError("policy key 'home' is missing")
        return cls(
            data["home"],
            runtime=data.get("runtime"),
            read=_path_list(data.get("read"), "read"),
            write=_path_list(data.get("write"), "write"),
            deny=_path_list(data.get("deny"), "deny"),
            harness=data.get("harness"),
            tool_write=_path_list(data.get("tool_write"), "tool_write"),
            domains=_domains(data.get("domains")),
            proxy_port=data.get("proxy_port"),
            socks_port=data.get("socks_port"),
            egress=data.get("egress"),
            env=_env(data.get("env")),
            hook=_hook(data.get("hook")),
            hostrun=_hostrun(data.get("hostrun")),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Policy:
        """Parse and validate a policy document."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PolicyError(f"policy is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str) -> Policy:
        """Read and validate the policy file at ``path``."""
        try:
            with open(path, "rb") as fh:
                text = fh.read()
        except OSError as exc:
            raise PolicyError(f"cannot read policy {path}: {exc.strerror or exc}") from None
        try:
            return cls.from_json(text)
        except PolicyError as exc:
            raise PolicyError(f"{path}: {exc}") from None

    def to_dict(self) -> dict[str, object]:
        """The policy as its JSON document (contract keys always, optional keys when set)."""
        out: dict[str, object] = {
            "home": self.home,
            "runtime": self.runtime,
            "read": list(self.read),
            "write": list(self.write),
            "deny": list(self.deny),
            "harness": self.harness,
            "tool_write": list(self.tool_write),
            "domains": list(self.domains),
            "proxy_port": self.proxy_port,
        }
        if self.socks_port is not None:
            out["socks_port"] = self.socks_port
        if self.egress:
            out["egress"] = self.egress
        if self.env:
            out["env"] = dict(self.env)
        if self.hook:
            out["hook"] = self.hook
        if self.hostrun is not DEFAULT:
            out["hostrun"] = self.hostrun.to_dict()
        return out

    def to_json(self) -> str:
        """The policy serialised as the JSON the hook and ``render`` read back."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def __repr__(self) -> str:
        return f"Policy.from_dict({self.to_dict()!r})"
