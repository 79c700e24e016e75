"""egress-proxy's wiring: options checked and turned into a running proxy."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import resource
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

from libbroker.errors import EgressError, UsageError
from libbroker.named_tuple import NamedTuple
from libegress.addresses import parse_cidr
from libegress.allowlist import parse_patterns
from libegress.ca import make_authority
from libegress.egress_dir import write_egress_dir
from libegress.eventlog import EventLog
from libegress.hosts import BadHost, canonical_host, parse_port
from libegress.limits import Limits
from libegress.listen import Listen, announce_lines, bind, inherited
from libegress.record import Recorder
from libegress.route import EgressPolicy, Pin, parse_pin
from libegress.token_command import token_argv

if TYPE_CHECKING:
    import socket

    from libegress.secrets import Secret

# Up to its `listening` line egress-proxy loads only what checking its options,
# making the CA and writing the egress dir need: asyncio, ssl, h11, the server
# and its services load after it (libegress.serving), while the launcher starts
# the command (docs/fast-start.md).  So secrets, repos and the loop are imported
# where they are used.  Its values (these options, the policy, the limits, the
# listeners, an outcome) are NamedTuples, not dataclasses: the dataclasses
# module loads inspect (~10 ms of CPU with it) and each dataclass execs its
# generated methods (~0.5-1 ms each) on the way to `listening`.

DEFAULT_INJECT = "github.com,api.github.com"


class Options(NamedTuple):
    """Everything egress-proxy was asked to do, checked."""

    listen: Listen
    socks: Listen | None
    policy: EgressPolicy
    egress_dir: str | None = None
    token_argv: list[str] | None = None
    token_every: float = 300.0
    token_timeout: float = 30.0
    upstream_ca: str | None = None
    log_file: str | None = None
    log_allowed: bool = False
    limits: Limits = Limits()
    secrets: tuple[Secret, ...] = ()
    github_inject: tuple[str, ...] = ()  # --inject alone: the token's hosts
    repos: frozenset[str] | None = None  # --repos: the token's writes held to these
    record_file: str | None = None  # --record: one JSON line per decision
    control: str | None = None  # --control: gateway mode, tenants added over this socket


def read_secrets(path: str, inject: tuple[str, ...]) -> tuple[Secret, ...]:
    """The checked ``--secrets`` file; UsageError naming what is wrong."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read((1 << 20) + 1)
    except OSError as exc:
        raise UsageError(f"--secrets {path}: {exc.strerror or exc}") from None
    if len(raw) > 1 << 20:
        raise UsageError(f"--secrets {path}: larger than 1 MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--secrets {path}: not UTF-8") from None
    from libegress.secrets import parse_secrets

    return parse_secrets(text, path, inject)


def _listen(text: str, scheme: str) -> Listen:
    try:
        if text.startswith("[") or text.count(":") == 1:
            head, _, port_text = text.rpartition(":")
            host = head.strip("[]")
            ipaddress.ip_address(host)
            return Listen(host, 0 if port_text == "0" else parse_port(port_text, text), scheme)
    except (ValueError, BadHost):
        pass
    raise UsageError(f"listen address must be IP:PORT (port 0 picks one): {text!r}")


def _listen_fd(text: str, scheme: str) -> Listen:
    """``--listen-fd`` / ``--socks-fd``: a listening socket handed over (docs/fast-start.md)."""
    flag = "--listen-fd" if scheme == "http" else "--socks-fd"
    if not text.isdigit() or len(text) > 7:
        raise UsageError(f"{flag} must be a descriptor number: {text!r}")
    try:
        return inherited(int(text), scheme)
    except EgressError as exc:
        raise UsageError(str(exc)) from None


def _listener(args: dict[str, Any], scheme: str) -> Listen | None:
    """The listener for ``scheme``: an address to bind, a handed-over socket, or none."""
    addr, fd = ("--listen", "--listen-fd") if scheme == "http" else ("--socks", "--socks-fd")
    if args.get(fd) is not None:
        return _listen_fd(str(args[fd]), scheme)
    return _listen(args[addr], scheme) if args.get(addr) else None


def _pin(text: str) -> tuple[str, Pin]:
    try:
        return parse_pin(text)
    except ValueError as exc:  # BadHost is one
        raise UsageError(f"--resolve {text!r}: {exc}") from None


def _seconds(value: Any, name: str, default: float) -> float:
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise UsageError(f"{name} must be a number of seconds: {value!r}") from None
    if not 0 < seconds < 1e7:
        raise UsageError(f"{name} must be positive: {value!r}")
    return seconds


# In gateway mode these are each tenant's own (docs/gateway.md), never the process's.
TENANT_FLAGS = ("--allow", "--egress-dir", "--token-command", "--secrets", "--repos",
                "--resolve", "--allow-cidr", "--record", "--learn")


def _no_tenant_flags(args: dict[str, Any]) -> None:
    """With --control, a tenant's options come in its add request, never as flags."""
    given = [f for f in TENANT_FLAGS if args.get(f)]
    if given:
        raise UsageError(f"{given[0]} is a tenant's option with --control: send it in "
                         "the tenant's add request (docs/gateway.md)")


def _limits(args: dict[str, Any]) -> Limits:
    """--idle-timeout, --connect-timeout and --max-conns as :class:`Limits`."""
    idle = _seconds(args.get("--idle-timeout"), "--idle-timeout", 120.0)
    max_conns = str(args.get("--max-conns") or 1024)
    if not max_conns.isdigit() or not 0 < int(max_conns) < 1 << 20:
        raise UsageError(f"--max-conns must be a positive number: {max_conns!r}")
    return Limits(
        idle_timeout=idle,
        head_timeout=min(idle, Limits().head_timeout),
        connect_timeout=_seconds(args.get("--connect-timeout"), "--connect-timeout", 10.0),
        max_connections=int(max_conns),
    )


def options_from_args(args: dict[str, Any]) -> Options:
    """Check docopt's ``args`` and build :class:`Options`; UsageError when wrong."""
    control = args.get("--control")
    if control is not None:
        _no_tenant_flags(args)
    try:
        allow = parse_patterns(args.get("--allow") or "")
        inject_text = args.get("--inject")
        inject = tuple(
            canonical_host(h) for h in (inject_text if inject_text is not None
                                        else DEFAULT_INJECT).split(",") if h.strip()
        )
    except BadHost as exc:
        raise UsageError(str(exc)) from None
    try:
        cidrs = tuple(parse_cidr(c) for c in args.get("--allow-cidr") or [])
    except ValueError as exc:
        raise UsageError(f"--allow-cidr: {exc}") from None
    pins = dict(_pin(p) for p in args.get("--resolve") or [])
    command = args.get("--token-command")
    limits = _limits(args)
    upstream_ca = args.get("--upstream-ca")
    if upstream_ca is not None and not os.path.isfile(upstream_ca):
        raise UsageError(f"--upstream-ca: no such file {upstream_ca!r}")
    repos_text = args.get("--repos")
    try:
        repos = None
        if repos_text is not None:
            from libegress.scope import parse_repos

            repos = parse_repos(repos_text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    secrets_file = args.get("--secrets")
    secrets = read_secrets(secrets_file, inject) if secrets_file else ()
    listen = _listener(args, "http")
    if listen is None:
        raise UsageError("one of --listen or --listen-fd is needed")
    return Options(
        listen=listen,
        socks=_listener(args, "socks5"),
        policy=EgressPolicy(allow=allow, inject=_inject_hosts(inject, secrets),
                            pins=pins, allow_cidrs=cidrs, learn=bool(args.get("--learn"))),
        secrets=secrets,
        github_inject=inject,
        repos=repos,
        egress_dir=args.get("--egress-dir"),
        token_argv=token_argv(command) if command else None,
        token_every=_seconds(args.get("--token-every"), "--token-every", 300.0),
        token_timeout=_seconds(args.get("--token-timeout"), "--token-timeout", 30.0),
        upstream_ca=upstream_ca,
        log_file=args.get("--log"),
        log_allowed=bool(args.get("--log-allowed")),
        limits=limits,
        record_file=args.get("--record"),
        control=control,
    )


def _inject_hosts(inject: tuple[str, ...], secrets: tuple[Secret, ...]) -> tuple[str, ...]:
    """--inject's hosts, each secret's, and each held login's token host, once each."""
    held: tuple[str, ...] = ()
    if secrets:
        from libegress.secrets import login_hosts

        held = login_hosts(secrets)
    return tuple(dict.fromkeys((*inject, *(s.host for s in secrets), *held)))


def raise_fd_limit() -> None:
    """Tunnels hold two sockets each: take the hard limit of descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@contextlib.contextmanager
def log_stream(path: str | None) -> Iterator[TextIO | None]:
    if path is None:
        yield None
        return
    try:
        fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise UsageError(f"--log {path}: {exc.strerror}") from None
    try:
        yield fh
    finally:
        fh.close()


def serve(options: Options) -> int:
    """Run the proxy until SIGTERM/SIGINT; the exit status."""
    raise_fd_limit()
    with log_stream(options.log_file) as stream:
        log = EventLog(stream, log_allowed=options.log_allowed)
        try:
            record = Recorder.open(options.record_file, options.policy)
        except OSError as exc:
            raise UsageError(f"--record {options.record_file}: {exc.strerror}") from None
        if record.on:
            log.record = record
        authority = make_authority(list(options.policy.inject))
        if options.egress_dir:
            # gh's login names the token's hosts only.
            write_egress_dir(options.egress_dir, authority.cert_pem(),
                             list(options.github_inject))
        listeners: list[tuple[socket.socket, str]] = [(bind(options.listen), "http")]
        if options.socks is not None:
            listeners.append((bind(options.socks), "socks5"))
        announce = announce_lines(listeners)
        if all(listen.fd >= 0 for listen in (options.listen, options.socks) if listen):
            # Handed-over sockets listen already: a connection waits in their
            # backlog until the loop below accepts it (after the first token,
            # as before), so `listening` can be said now; it then tells the
            # launcher that the egress dir is written (docs/fast-start.md).
            announce()
            announce = _said
        from libegress import serving  # the loop and the server: after `listening` (above)
        from libegress.startup_gc import settle

        settle()  # the collector, off while the proxy started, on again (libegress.startup_gc)

        try:
            serving.run(options, log, authority, listeners, announce)
        finally:
            record.close()
    return 0


def _said() -> None:
    """The ``listening`` lines were printed before the loop started."""
