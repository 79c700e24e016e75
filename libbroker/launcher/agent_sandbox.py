"""The agent sandbox's shape, as data: bwrap argv, Landlock spec, environment.

Pure functions of the config, the runtime directory and a few facts about the
host (:class:`Host`), so every rule is tested without starting anything.

What both backends give the command:

- the system (``/usr``, ``/etc``, ...) read-only; ``/proc``; a fresh ``/tmp``;
- the home directory hidden, except the config's ``read`` (read-only) and
  ``write`` (read-write) paths, the Python installation and the project (our
  own executables, broker-client and gpg-shim, run inside);
- the workdir read-write; ``deny`` paths hidden even inside those;
- the runtime directory read-only (broker socket, proxy bridge, egress dir);
- network only to the egress proxy: bwrap has no network namespace of its own
  beyond loopback, where the forwarder listens on :3128 and :1080; Landlock
  allows TCP connect to the proxy's two ports only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from libbroker.launcher.config import Config
from libbroker.launcher.runtime import Runtime
from libbroker.paths import under

HTTP_PORT = 3128
SOCKS_PORT = 1080
# The system, read-only; merged-/usr symlinks are recreated as symlinks.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# Readable system files that hold secrets when the session runs as root.
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
# Variables taken from the launcher's own environment, when set.
PASS_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "COLORTERM",
    "HOME",
    "USER",
    "LOGNAME",
    "TZ",
    "SHELL",
)
# Files in the workdir that run code on the host when the person next uses
# git there (hooks; core.hooksPath, core.fsmonitor, aliases in .git/config):
# read-only inside, so a sandboxed command cannot plant an escape (bwrap).
PROTECTED_IN_WORKDIR = (".git/hooks", ".git/config")
# Device files a command may write (Landlock; bwrap makes its own /dev).
DEV_WRITE = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts", "/dev/shm")


class Host(NamedTuple):
    """Facts about this machine the sandbox's shape depends on."""

    python: str  # the interpreter that runs the forwarder
    python_dirs: tuple[str, ...]  # sys.prefix, sys.base_prefix (deduplicated)
    project_dir: str  # where libbroker is installed from
    forwarder: str  # forwarder.py's path
    bin_dir: str  # where the console scripts are (gpg-shim, broker-client)
    cwd: str
    symlinks: Mapping[str, str]  # system dirs that are symlinks: path -> target
    existing: frozenset[str]  # which of the paths we may bind exist


def proxy_urls(http_port: int, socks_port: int) -> tuple[str, str]:
    return f"http://127.0.0.1:{http_port}", f"socks5h://127.0.0.1:{socks_port}"


def environment(
    cfg: Config,
    rt: Runtime,
    host_env: Mapping[str, str],
    *,
    bin_dir: str,
    http_port: int,
    socks_port: int,
    kubeconfig: str = "",
    tmpdir: str = "",
) -> dict[str, str]:
    """The command's whole environment: nothing else from the launcher's."""
    env = {k: host_env[k] for k in (*PASS_ENV, *cfg.env) if k in host_env}
    path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PATH"] = bin_dir + ":" + path if bin_dir not in path.split(":") else path
    http, socks = proxy_urls(http_port, socks_port)
    bundle = rt.ca_bundle
    env.update(
        {
            "AGENT_SANDBOX": "1",
            "AGENT_SANDBOX_BROKER_SOCKET": rt.broker_socket,
            "AGENT_SANDBOX_POLICY": rt.policy,
            "HTTP_PROXY": http,
            "HTTPS_PROXY": http,
            "http_proxy": http,
            "https_proxy": http,
            "ALL_PROXY": socks,
            "all_proxy": socks,
            "NO_PROXY": "",
            "no_proxy": "",
            "SSL_CERT_FILE": bundle,
            "REQUESTS_CA_BUNDLE": bundle,
            "CURL_CA_BUNDLE": bundle,
            "NODE_EXTRA_CA_CERTS": os.path.join(rt.egress_dir, "ca.pem"),
            "GIT_SSL_CAINFO": bundle,
            "GH_CONFIG_DIR": rt.gh_config,
        }
    )
    git = [("gpg.program", rt.gpg_program)]
    if cfg.sign_key:
        git.append(("user.signingkey", cfg.sign_key))
    env["GIT_CONFIG_COUNT"] = str(len(git))
    for i, (key, value) in enumerate(git):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    if tmpdir:
        env["TMPDIR"] = tmpdir
    # Defence in depth: config.py already refuses these names in `env`.
    for name in ("GITHUB_TOKEN", "GH_TOKEN", "GH_ENTERPRISE_TOKEN"):
        env.pop(name, None)
    return env


def inside_cwd(cfg: Config, cwd: str) -> str:
    """Where the command starts: the launcher's cwd when inside the workdir."""
    if under(cwd, cfg.workdir):
        return cwd
    return cfg.workdir


def bwrap_argv(
    cfg: Config,
    rt: Runtime,
    host: Host,
    cmd: list[str],
    *,
    control_fd: int,
    seccomp_fd: int | None,
    tty: bool,
) -> list[str]:
    """bwrap's argv for the session's command, wrapped in the forwarder.

    ``--new-session`` (which drops the controlling tty) is used only without a
    tty: an interactive shell needs its terminal for job control, and the
    seccomp filter (:mod:`.seccomp`) refuses TIOCSTI either way.  Without a
    seccomp filter for this machine, ``--new-session`` is always used.
    """
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--hostname", "agent-sandbox"]
    if not tty or seccomp_fd is None:
        argv.append("--new-session")
    for d in SYSTEM_DIRS:
        if d in host.symlinks:
            argv += ["--symlink", host.symlinks[d], d]
        elif d in host.existing:
            argv += ["--ro-bind", d, d]
    for f in MASKED_FILES:
        if f in host.existing:
            argv += ["--ro-bind", "/dev/null", f]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/var/tmp"]
    if cfg.home not in ("/", ""):
        argv += ["--tmpfs", cfg.home]
    for p in host.python_dirs:
        argv += ["--ro-bind", p, p]
    if host.project_dir not in host.python_dirs:
        argv += ["--ro-bind", host.project_dir, host.project_dir]
    for p in cfg.read:
        argv += ["--ro-bind-try", p, p]
    for p in cfg.write:
        argv += ["--bind-try", p, p]
    argv += ["--bind", cfg.workdir, cfg.workdir]
    for p in protected_paths(cfg):
        if p in host.existing:
            argv += ["--ro-bind", p, p]
    for p in cfg.deny:
        if p in host.existing:
            argv += ["--tmpfs", p] if os.path.isdir(p) else ["--ro-bind", "/dev/null", p]
    argv += ["--ro-bind", rt.root, rt.root]
    argv += ["--chdir", inside_cwd(cfg, host.cwd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += [
        "--",
        host.python,
        "-I",
        "-S",
        host.forwarder,
        "--listen",
        f"{HTTP_PORT}={rt.http_relay}",
        "--listen",
        f"{SOCKS_PORT}={rt.socks_relay}",
        "--control",
        str(control_fd),
    ]
    if not tty:
        argv.append("--own-group")
    return [*argv, "--", *cmd]


def protected_paths(cfg: Config) -> list[str]:
    """The workdir's files that stay read-only in the sandbox (PROTECTED_IN_WORKDIR)."""
    if not cfg.protect_git:
        return []
    return [os.path.join(cfg.workdir, rel) for rel in PROTECTED_IN_WORKDIR]


def bind_candidates(cfg: Config) -> list[str]:
    """Every path whose existence :func:`bwrap_argv` asks about."""
    return [*SYSTEM_DIRS, *MASKED_FILES, *cfg.deny, *protected_paths(cfg)]


def landlock_spec(
    cfg: Config,
    rt: Runtime,
    host: Host,
    cmd: list[str],
    *,
    http_port: int,
    socks_port: int,
    tmpdir: str,
    tty: bool,
) -> dict[str, object]:
    """What the Landlock helper (:mod:`.landlock_exec`) applies before exec."""
    read = [d for d in SYSTEM_DIRS if d in host.existing and d not in host.symlinks]
    read += ["/proc", "/dev", *host.python_dirs, host.project_dir, rt.root]
    read += [p for p in cfg.read if os.path.exists(p)]
    write = [cfg.workdir, tmpdir, *(p for p in cfg.write if os.path.exists(p))]
    write += [p for p in DEV_WRITE if os.path.exists(p)]
    return {
        "read": read,
        "write": write,
        "deny": list(cfg.deny),
        "ports": [http_port, socks_port],
        "cwd": inside_cwd(cfg, host.cwd),
        "new_session": not tty,
        "argv": cmd,
    }
