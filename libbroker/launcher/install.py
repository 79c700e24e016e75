"""This installation: where its programs and its Python are, and the argv that starts ours.

Looked up on the host (the interpreter's prefixes, the scripts directory);
the session's plan (:mod:`.plan`, pure) takes these facts as data.
"""

from __future__ import annotations

import os
import sys

from libbroker.launcher.agent_sandbox import Host
from libbroker.launcher.boot import project_dir, python_argv
from libbroker.launcher.config import Config
from libbroker.launcher.plan import broker_args, proxy_args
from libbroker.launcher.runtime import Runtime


def scripts_dir() -> str:
    """Where this installation's console scripts (egress-proxy, gpg-shim, ...) are."""
    # sysconfig's "scripts" path is <prefix>/bin for a venv, pyenv or any prefix
    # install; when ours are there, that answer costs no sysconfig import (ms of
    # CPU while the servers start).  Other layouts ask sysconfig.
    usual = os.path.join(sys.prefix, "bin")
    if os.access(os.path.join(usual, "agent-sandbox"), os.X_OK):
        return usual
    import sysconfig

    return sysconfig.get_path("scripts")


def exe(name: str) -> str:
    """Our own executable ``name`` from this installation, else from PATH."""
    path = os.path.join(scripts_dir(), name)
    return path if os.access(path, os.X_OK) else name


def host_facts(cwd: str) -> Host:
    """The facts about this installation the session's sandbox depends on."""
    from libbroker.native import built  # light: the launcher imports it for gpg.program too
    project = project_dir()
    prefixes: list[str] = []
    for p in (sys.prefix, sys.base_prefix):
        p = os.path.realpath(p)
        if p not in prefixes:
            prefixes.append(p)
    return Host(
        python=os.path.realpath(sys.executable),
        python_dirs=tuple(prefixes),
        project_dir=project,
        forwarder=os.path.join(project, "libbroker", "sandbox", "forwarder.py"),
        bin_dir=scripts_dir(),
        cwd=cwd,
        native_forwarder=built("forwarder"),
    )


def proxy_argv(cfg: Config, rt: Runtime) -> list[str]:
    """egress-proxy's whole argv (its arguments go by pipe: :func:`.plan.proxy_args`)."""
    return [*python_argv("egress-proxy", "bin.egress_proxy"), *proxy_args(cfg, rt)]


def broker_argv(cfg: Config, rt: Runtime, backend: str) -> list[str]:
    """broker-server's whole argv."""
    return [*python_argv("broker-server", "bin.broker_server"), *broker_args(cfg, rt, backend)]
