"""The config's values for egress-proxy, checked with egress-proxy's own rules (pure).

egress-proxy refuses a bad ``--allow``, ``--inject``, ``--resolve``,
``--allow-cidr``, ``--repos`` or ``--secrets`` entry when it starts; by then
the launcher has made a runtime directory and the message names a file the
person never wrote (``/tmp/.../secrets.json: entry 0``).  So the config
check calls the same pure functions (libegress's ``allowlist``, ``hosts``,
``route``, ``addresses``, ``scope``, ``secrets``) first, and a refusal names
the key, the file and line, or the flag.  Every function takes ``where``,
the label of the value's origin (:class:`.origins.Origins`).

libegress's modules are imported where they are used: a session's config is
read while its servers start, and the secrets' and repos' checks (json,
shlex, the GraphQL parser) cost ms a config without those keys need not pay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from libbroker.errors import ConfigError, UsageError
from libbroker.named_tuple import NamedTuple
from libegress.allowlist import parse_pattern
from libegress.hosts import BadHost, canonical_host

SECRET_KEYS = frozenset({"host", "header", "format", "command", "every", "env"})


class Secret(NamedTuple):
    """A ``[[secret]]`` table: egress-proxy's --secrets entry plus the sandbox's variable."""

    host: str
    header: str
    command: str
    format: str = "Bearer {}"
    every: int = 300
    env: str = ""
    login: str = ""  # an agent's OAuth login held on the host (launcher.logins), never config

    def proxy_entry(self) -> dict[str, object]:
        """The entry as egress-proxy's --secrets file holds it."""
        entry: dict[str, object] = {"host": self.host, "header": self.header,
                                    "format": self.format, "command": self.command,
                                    "every": self.every}
        if self.login:
            entry["login"] = self.login
        return entry


def domains(values: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``domains`` entries, as egress-proxy's --allow patterns (the first one refused named)."""
    for value in values:
        if "," in value:  # --allow is comma-separated: one entry would become two
            raise ConfigError(f"{where}: entry {value!r} holds a comma: one host per entry")
        try:
            pattern = parse_pattern(value)
        except BadHost as exc:  # egress-proxy's reason names the value
            raise ConfigError(f"{where}: {exc}") from None
        if not value.isascii():  # the policy and the agents' settings carry ASCII names
            raise ConfigError(f"{where}: entry {value!r}: write the name as {pattern.host}")
    return tuple(v.lower() for v in values)


def hosts(values: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``inject`` entries: one host name each, in egress-proxy's spelling."""
    out = []
    for value in values:
        try:
            out.append(canonical_host(value))
        except BadHost:
            raise ConfigError(f"{where}: entry {value!r} is not a host name") from None
        if "," in value:
            raise ConfigError(f"{where}: entry {value!r} is not a host name")
    return tuple(out)


def resolve(values: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``resolve`` pins: ``HOST:IP``, ``HOST:IP:PORT`` or ``HOST:[IPv6]:PORT``."""
    if not values:
        return values
    from libegress.route import parse_pin

    for value in values:
        try:
            parse_pin(value)
        except ValueError:
            raise ConfigError(f"{where}: entry {value!r} must be HOST:IP or HOST:IP:PORT "
                              "(an IPv6 address in brackets)") from None
    return values


def cidrs(values: tuple[str, ...], where: str) -> tuple[str, ...]:
    if not values:
        return values
    from libegress.addresses import parse_cidr

    for value in values:
        try:
            parse_cidr(value)
        except ValueError:
            raise ConfigError(f"{where}: entry {value!r} is not a CIDR range") from None
    return values


def repos(values: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``repos``: OWNER/NAME entries for egress-proxy's --repos (GitHub's spelling)."""
    if not values:
        return values
    from libegress.scope import parse_repos

    for value in values:
        try:
            parse_repos(value)
        except ValueError:
            raise ConfigError(f"{where}: entry {value!r} is not OWNER/NAME") from None
        if "," in value:
            raise ConfigError(f"{where}: entry {value!r} is not OWNER/NAME")
    return values


def command(value: str, where: str) -> str:
    """A command egress-proxy splits like a shell line (and runs without one)."""
    import shlex

    try:
        shlex.split(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot be split like a shell line: {exc}") from None
    return value


def secrets(
    tables: Any,
    where: Callable[[int, str], str],
    inject: tuple[str, ...],
    check_env: Callable[[str, str], None],
    top: str,
) -> tuple[Secret, ...]:
    """The ``[[secret]]`` tables, each checked by egress-proxy's own entry check.

    ``where(n, host)``: the label of the nth table (from 1); ``top``: the key's
    own label, for a ``secret`` that is not a list of tables.
    """
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ConfigError(f"{top}: must be [[secret]] tables")
    if not tables:
        return ()
    from libegress import secrets as egress_secrets

    if len(tables) > egress_secrets.MAX_SECRETS:
        raise ConfigError(f"{top}: more than {egress_secrets.MAX_SECRETS} [[secret]] tables")
    out: list[Secret] = []
    for index, table in enumerate(tables, 1):
        raw = table.get("host")
        label = where(index, raw.strip() if isinstance(raw, str) else "")
        unknown = sorted(k for k in table if k not in SECRET_KEYS)
        if unknown:
            raise ConfigError(f"{label}: unknown key {unknown[0]!r} "
                              f"(known: {', '.join(sorted(SECRET_KEYS))})")
        entry = {k: v for k, v in table.items() if k != "env"}
        try:
            checked = egress_secrets.parse_entry(entry, label)
        except UsageError as exc:
            raise ConfigError(str(exc)) from None
        every = table.get("every", 300)
        if not isinstance(every, int) or isinstance(every, bool):
            raise ConfigError(f"{label}: 'every' must be a whole number of seconds")
        env = table.get("env", "")
        if not isinstance(env, str):
            raise ConfigError(f"{label}: 'env' must be a variable name")
        if env:
            check_env(env, f"{label}: 'env'")
        host = checked.host
        if host in inject:
            raise ConfigError(f"{label}: host {host} is an inject host (the GitHub token's)")
        if any(s.host == host for s in out):
            raise ConfigError(f"{label}: host {host} has a [[secret]] already")
        if env and any(s.env == env for s in out):
            raise ConfigError(f"{label}: env {env} is another secret's already")
        out.append(Secret(host, checked.header, table["command"].strip(), checked.format,
                          every, env))
    return tuple(out)
