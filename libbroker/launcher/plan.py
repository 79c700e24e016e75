"""What a session starts, as data: each child's argv, the broker's profile, the policy.

Pure functions of the config, the runtime directory's names and the host's
facts (:class:`.agent_sandbox.Host`, gathered by :mod:`.install`), kept apart
from :mod:`.session`, which runs them.  How our own Python programs are
started (argv without site, the deferred boot) is :mod:`.boot`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from libbroker.launcher import agent_sandbox, config
from libbroker.launcher.agent_sandbox import Host
from libbroker.launcher.config import Config
from libbroker.launcher.runtime import Runtime
from libbroker.server_lines import listening_url

if TYPE_CHECKING:
    from libpolicy.model import Policy

BROKER_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TERM", "HOME", "USER", "TZ")
# Where a server writes its events for the session record: its own stdout, a
# pipe the launcher polls anyway (the ``listening`` line comes that way).
RECORD_PIPE = "/dev/stdout"


class Listening:
    """What the servers' ``listening`` lines said."""

    def __init__(self) -> None:
        self.http_port = 0
        self.socks_port = 0
        self.broker = ""


def proxy_args(cfg: Config, rt: Runtime, fds: tuple[int, int] | None = None) -> list[str]:
    """egress-proxy's arguments for this session.

    ``fds``: its HTTP and SOCKS listeners, handed over (:mod:`.handoff`);
    without them it binds free ports itself.
    """
    listen = (["--listen=127.0.0.1:0", "--socks=127.0.0.1:0"] if fds is None
              else [f"--listen-fd={fds[0]}", f"--socks-fd={fds[1]}"])
    args = [
        *listen,
        "--allow=" + ",".join(cfg.domains),
        "--inject=" + ",".join(cfg.inject),
        "--egress-dir=" + rt.egress_dir,
        f"--token-every={cfg.token_every}",
    ]
    if cfg.token_command:
        args.append("--token-command=" + cfg.token_command)
    args += [f"--resolve={r}" for r in cfg.resolve]
    args += [f"--allow-cidr={c}" for c in cfg.allow_cidr]
    if cfg.upstream_ca:
        args.append("--upstream-ca=" + cfg.upstream_ca)
    if cfg.secrets:
        args.append("--secrets=" + rt.secrets)
    if cfg.repos:  # the token's writes held to these repositories
        args.append("--repos=" + ",".join(cfg.repos))
    if cfg.record:  # its events, on the pipe only the launcher reads (libbroker.launcher.record)
        args.append("--record=" + RECORD_PIPE)
    if cfg.learn:
        args.append("--learn")
    return args


def tenant_policy(cfg: Config, rt: Runtime, record: str = "") -> dict[str, object]:
    """The session's egress policy as a gateway tenant's (docs/gateway.md), as :func:`proxy_args`.

    ``record``: the FIFO the gateway writes the tenant's record lines to.
    The proxy-wide options (``upstream_ca``) have no tenant form.
    """
    policy: dict[str, object] = {
        "allow": ",".join(cfg.domains),
        "inject": ",".join(cfg.inject),
        "egress_dir": rt.egress_dir,
        "token_every": cfg.token_every,
    }
    if cfg.token_command:
        policy["token_command"] = cfg.token_command
    if cfg.resolve:
        policy["resolve"] = list(cfg.resolve)
    if cfg.allow_cidr:
        policy["allow_cidr"] = list(cfg.allow_cidr)
    if cfg.secrets:
        policy["secrets"] = rt.secrets
    if cfg.repos:
        policy["repos"] = ",".join(cfg.repos)
    if record:
        policy["record"] = record
    if cfg.learn:
        policy["learn"] = True
    return policy


def secrets_json(cfg: Config) -> str:
    """egress-proxy's --secrets file for this session (write it before its arguments go)."""
    import json

    return json.dumps([s.proxy_entry() for s in cfg.secrets])


def broker_args(cfg: Config, rt: Runtime, backend: str, fd: int = -1) -> list[str]:
    """broker-server's arguments for this session.

    ``fd``: its socket, bound at ``rt.broker_socket`` and handed over
    (:mod:`.handoff`); without it the broker binds that path itself.
    """
    args = [
        f"--socket-fd={fd}" if fd >= 0 else "--socket=" + rt.broker_socket,
        "--workdir=" + cfg.workdir,
        "--sandbox=" + backend,
        "--profile=" + rt.profile,
    ]
    if cfg.sign_key:
        args.append("--sign-key=" + cfg.sign_key)
    if cfg.record:  # its audit lines, to the launcher: see libbroker.launcher.record
        args.append("--audit=" + RECORD_PIPE)
    return args


def command_profile(cfg: Config, host: Host,
                    exists: Callable[[str], bool] = os.path.exists) -> dict[str, object]:
    """The broker's profile for commands it runs on the sandbox's behalf.

    Network is ``none``: the broker starts alongside the proxy, before its port
    exists, and a brokered command has no business bypassing the agent's proxy.
    ``exists`` is the host's answer (a read grant that is absent is left out).
    """
    read = [*host.python_dirs, host.project_dir, *(p for p in cfg.read if exists(p))]
    work = [cfg.workdir]
    return {
        "filesystem": {
            "read": read + work if cfg.workdir_read_only else read,
            "write": [] if cfg.workdir_read_only else work,
            "deny": list(cfg.deny),
        },
        "network": {"mode": "none"},
        "environment": {"allow_vars": [*BROKER_ENV_ALLOW, "AGENT_SANDBOX"]},
        "limits": cfg.limits.to_mapping(),  # each brokered command's own, as the session's
    }


def session_policy(
    cfg: Config,
    runtime: str,
    *,
    proxy_port: int = agent_sandbox.HTTP_PORT,
    socks_port: int = agent_sandbox.SOCKS_PORT,
    egress: str = "",
) -> Policy:
    """The config as libpolicy's Policy: the one place the two are tied together.

    The session's policy JSON, Claude Code's settings in a session and the
    machine-wide drop-in are all rendered from it.
    """
    from libpolicy.model import Policy

    return Policy(
        cfg.home,
        runtime=runtime,
        read=(*cfg.read, cfg.workdir, *cfg.git_dirs) if cfg.workdir_read_only else cfg.read,
        write=cfg.write if cfg.workdir_read_only else (cfg.workdir, *cfg.git_dirs, *cfg.write),
        deny=cfg.deny,
        harness=cfg.harness,
        tool_write=(),
        domains=cfg.domains,
        proxy_port=proxy_port,
        socks_port=socks_port,
        egress=egress,
        hostrun=config.hostrun_table(cfg),
    )


def policy_json(cfg: Config, rt: Runtime, proxy_port: int, socks_port: int) -> str:
    """The session's policy JSON (DESIGN 2.3), through libpolicy's model and checks."""
    policy = session_policy(
        cfg, rt.root, proxy_port=proxy_port, socks_port=socks_port, egress=rt.egress_dir
    )
    return policy.to_json()


def parse_listening(name: str, line: str, found: Listening) -> None:
    addr = listening_url(line)
    if addr is None:
        return
    if name == "broker-server" and addr.startswith("unix:"):
        found.broker = addr[5:]
    elif addr.startswith(("http://", "socks5://")):
        port = addr.rsplit(":", 1)[-1].rstrip("/")
        if port.isdigit():
            if addr.startswith("http://"):
                found.http_port = int(port)
            else:
                found.socks_port = int(port)
