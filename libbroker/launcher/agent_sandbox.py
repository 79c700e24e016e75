"""The agent session's sandbox, as data: its Shape, bwrap argv, Landlock spec, environment.

Pure functions of the config, the runtime directory and a few facts about the
host (:class:`Host`), so every rule is tested without starting anything.  The
sandbox itself is :mod:`libbroker.sandbox`'s, the same one brokered commands
get: this module only says what the session's :class:`Shape` holds.

What both backends give the command:

- the system (``/usr``, ``/etc``, ...) read-only; ``/proc``; a fresh ``/tmp``
  (Landlock: a private directory named by TMPDIR);
- the home directory hidden, except the config's ``read`` (read-only) and
  ``write`` (read-write) paths, the Python installation and the project (our
  own executables, broker-client and gpg-shim, run inside);
- the workdir read-write; ``deny`` paths hidden even inside those;
- the runtime directory read-only (broker socket, proxy bridge, egress dir);
- no capabilities, even for root; the seccomp filter of
  :mod:`libbroker.sandbox.seccomp` (no TIOCSTI, no keyring; under Landlock no
  socket but TCP and NETLINK_ROUTE);
- network only to the egress proxy: bwrap has a network namespace of its own
  with nothing but loopback, where :3128 and :1080 are bridged to the proxy
  (:mod:`libbroker.sandbox.bridge`);
  Landlock allows TCP connect to the proxy's two ports only, and reaches the
  broker through a loopback port relayed to its socket (:mod:`.door`), since it may create
  no unix socket.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from libbroker.errors import LaunchError
from libbroker.launcher.config import SECRET_PLACEHOLDER, Config
from libbroker.launcher.runtime import Runtime
from libbroker.named_tuple import NamedTuple
from libbroker.paths import under
from libbroker.sandbox import bwrap
from libbroker.sandbox.shape import DEVICES, SYSTEM_READ, TERMINAL_DEVICES, Shape

HTTP_PORT = 3128
SOCKS_PORT = 1080
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
DOOR_ENV_VAR = "AGENT_SANDBOX_BROKER_DOOR"


class Host(NamedTuple):
    """Facts about this machine the sandbox's shape depends on."""

    python: str  # the interpreter that runs the forwarder
    python_dirs: tuple[str, ...]  # sys.prefix, sys.base_prefix (deduplicated)
    project_dir: str  # where libbroker is installed from
    forwarder: str  # forwarder.py's path
    bin_dir: str  # where the console scripts are (gpg-shim, broker-client)
    cwd: str
    # The forwarder in C (libbroker.native), when built: bwrap runs it rather than
    # forwarder.py, whose interpreter's start is ~15 ms of CPU on every session.
    native_forwarder: str | None = None


def proxy_urls(http_port: int, socks_port: int, credential: str = "") -> tuple[str, str]:
    """The proxy variables' URLs; ``credential`` (``user:password``) for a gateway tenant."""
    who = credential + "@" if credential else ""
    return f"http://{who}127.0.0.1:{http_port}", f"socks5h://{who}127.0.0.1:{socks_port}"


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
    credential: str = "",
) -> dict[str, str]:
    """The command's whole environment: nothing else from the launcher's.

    ``credential``: the session's own proxy credential when its egress is a
    tenant of the resident gateway (docs/serve.md), in the proxy URLs.
    """
    env = {k: host_env[k] for k in (*PASS_ENV, *cfg.env) if k in host_env}
    path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PATH"] = bin_dir + ":" + path if bin_dir not in path.split(":") else path
    env.update(_session_vars(rt, *proxy_urls(http_port, socks_port, credential)))
    env.update(_git_config(cfg, rt))
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    if tmpdir:
        env["TMPDIR"] = tmpdir
    # A [[secret]]'s variable holds the placeholder, never the host's value:
    # the proxy sets the real one on the way out.
    for secret in cfg.secrets:
        if secret.env:
            env[secret.env] = SECRET_PLACEHOLDER
    # Defence in depth: config.py already refuses these names in `env`.
    for name in ("GITHUB_TOKEN", "GH_TOKEN", "GH_ENTERPRISE_TOKEN"):
        env.pop(name, None)
    return env


def _session_vars(rt: Runtime, http: str, socks: str) -> dict[str, str]:
    """The session's own variables: the broker, the policy, the proxies, the CA bundle."""
    bundle = rt.ca_bundle
    return {
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


def _git_config(cfg: Config, rt: Runtime) -> dict[str, str]:
    """git's config from the environment: gpg-shim as gpg.program, the key it signs with."""
    git = [("gpg.program", rt.gpg_program)]
    if cfg.sign_key:
        git.append(("user.signingkey", cfg.sign_key))
    env = {"GIT_CONFIG_COUNT": str(len(git))}
    for i, (key, value) in enumerate(git):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def inside_cwd(cfg: Config, cwd: str) -> str:
    """Where the command starts: the launcher's cwd when inside the workdir."""
    if under(cwd, cfg.workdir):
        return cwd
    return cfg.workdir


def bwrap_shape(
    cfg: Config,
    rt: Runtime,
    host: Host,
    env: Mapping[str, str],
    *,
    tty: bool,
    tmpdir: str = "",
    pin: tuple[str, ...] = (),
    hold: tuple[str, ...] | None = None,
    overlays: tuple[tuple[str, str], ...] = (),
    binds: tuple[tuple[str, str], ...] = (),
) -> Shape:
    """The agent session's :class:`Shape` under bwrap.

    The home directory is an empty tmpfs under the grants, the workdir's
    host-run files (``hold``: every repository's hooks and config, the
    agents' and editors' project files, from the guard's snapshot; without
    one, the top repository's hooks and config) are held read-only, every
    repository's ``.git`` is bound onto itself (``pin``: a mount point cannot
    be renamed or replaced), the agent's session-only files are mounted over
    its own paths (``overlays``: Claude Code's managed settings), each
    repository's config is the session's private copy (``binds``:
    :mod:`.hostrun_gitconfig`), /tmp is a tmpfs of the configured size, and
    the hostname is the sandbox's.  The rest: :func:`_shape`.
    """
    guard = cfg.protect_git and not cfg.workdir_read_only
    held = tuple(protected_paths(cfg)) if hold is None else hold
    return _shape(cfg, rt, host, env, tty=tty, tmpdir=tmpdir)._replace(
        write=(*_writes(cfg), *(pin if guard else ()), *((tmpdir,) if tmpdir else ())),
        protect=held if guard else (),
        empty=() if cfg.home in ("/", "") else (cfg.home,),
        tmp_size=cfg.limits.tmp,
        hostname="agent-sandbox",
        overlays=overlays,
        binds=_binds(cfg, binds),
    )  # fmt: skip


def landlock_shape(
    cfg: Config,
    rt: Runtime,
    host: Host,
    env: Mapping[str, str],
    *,
    tty: bool,
    ports: tuple[int, ...] = (),
    tmpdir: str = "",
    hold: tuple[str, ...] | None = None,
    binds: tuple[tuple[str, str], ...] = (),
    links: tuple[str, ...] = (),
) -> Shape:
    """The agent session's :class:`Shape` under Landlock.

    A private TMPDIR (``tmpdir``, a host directory), TCP connect to the
    proxy's ``ports`` only.  Landlock cannot take rights back inside a
    granted tree, but its helper's mount namespace (``hold`` is given only
    where the probe found one; pidns refuses holds without one) can hold the
    same entries read-only as bwrap does, bind the private git configs
    (``binds``: written at the bind's path, which in that namespace is the
    private copy) and make the config ``links`` mount points.  See
    :func:`_shape` for the rest.
    """
    binds = _binds(cfg, binds)
    guard = hold is not None and cfg.protect_git and not cfg.workdir_read_only
    return _shape(cfg, rt, host, env, tty=tty, tmpdir=tmpdir)._replace(
        write=(*_writes(cfg), *((tmpdir,) if tmpdir else ()), *(inside for _, inside in binds)),
        protect=hold if guard and hold is not None else (),
        tcp_connect=ports,
        binds=binds,
        links=links if binds else (),
    )  # fmt: skip


def _writes(cfg: Config) -> tuple[str, ...]:
    """The writable trees: the config's, and the workdir and its git dirs unless read-only
    (codex -s read-only: nothing of the workdir is written)."""
    work = () if cfg.workdir_read_only else (cfg.workdir, *cfg.git_dirs)
    return (*cfg.write, *work)


def _binds(cfg: Config, binds: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The private git configs, where the workdir's configs are guarded and written."""
    return binds if cfg.protect_git and not cfg.workdir_read_only else ()


def _shape(cfg: Config, rt: Runtime, host: Host, env: Mapping[str, str], *, tty: bool,
           tmpdir: str) -> Shape:
    """What both backends grant: the system's, the interpreter's, the project's and the
    config's trees to read (the workdir too when it is read-only), the config's denials,
    the devices and the terminal's, the start directory, the environment, the private tmp.
    ``--new-session`` (which drops the controlling tty) only without a tty: an
    interactive shell needs its terminal for job control, and the seccomp filter refuses
    TIOCSTI either way.  Each backend replaces the rest of the :class:`Shape` with its own."""
    read = (*SYSTEM_READ, *host.python_dirs, host.project_dir, *cfg.read, rt.root)
    read += (cfg.workdir, *cfg.git_dirs) if cfg.workdir_read_only else ()
    return Shape(
        read=tuple(dict.fromkeys(read)),
        deny=cfg.deny,
        devices=(*DEVICES, *TERMINAL_DEVICES),
        cwd=inside_cwd(cfg, host.cwd),
        env=dict(env),
        tmp=tmpdir,
        new_session=not tty,
    )


def fits_bwrap(pin: tuple[str, ...], hold: tuple[str, ...], cmd: list[str], *,
               binds: tuple[tuple[str, str], ...] = (), argv: list[str] | None = None) -> None:
    """LaunchError unless bwrap takes the session: past :data:`.bwrap.MAX_ARGS` it dies
    with a line that names no cause, after its start.

    ``pin``, ``hold``, ``binds``: the workdir's git directories' paths, three arguments
    each; ``cmd``: the command.  Without ``argv`` (before the live configs are made: a
    few ms a repository, and a bind each in the host's namespace), what its length will
    be at least: a config the live configs swap leaves the holds and becomes a bind
    (:meth:`.hostrun_gitmerge.LiveConfigs.held_elsewhere`, ``binds``), one for one."""
    if argv is None:
        guard = 3 * (len(pin) + len(hold))
        total, least = guard + len(cmd), True
    else:
        total, least = len(argv), False
        guard = 3 * (len(pin) + len(hold) + len(binds))
    if total > bwrap.MAX_ARGS:
        raise LaunchError(too_many_args(total, repos=len(pin), guard=guard, own=len(cmd),
                                        least=least))


def too_many_args(total: int, *, repos: int, guard: int, own: int, least: bool = False) -> str:
    """Why bwrap cannot take a session whose argv is ``total`` long (``least``: at least):
    ``guard`` of them pin and hold the ``repos`` git directories of the workdir, ``own``
    are the command's."""
    head = (f"bwrap cannot take this session: its command line would be "
            f"{'at least ' if least else ''}{total} arguments long and bwrap takes at most "
            f"{bwrap.MAX_ARGS}; ")
    if guard >= own:
        return head + (f"{guard} of them pin and hold read-only the hooks and configs of the "
                       f"workdir's {repos} git directories: start it in one repository (or "
                       "name one with --workdir), or use --sandbox=nono")
    return head + f"{own} of them are the command's: pass them in a file, or use --sandbox=nono"


def bwrap_argv(
    shape: Shape,
    rt: Runtime,
    host: Host,
    cmd: list[str],
    *,
    facts: bwrap.Facts,
    control_fd: int,
    seccomp_fd: int,
    info_fd: int | None = None,
    rlimits: Sequence[tuple[int, int]] = (),
) -> list[str]:
    """bwrap's argv for the session's command, wrapped in the forwarder.

    ``facts``: what exists on the host among the shape's paths
    (:func:`libbroker.sandbox.bwrap.shape_facts`).  ``info_fd``: where bwrap
    tells the sandbox's pid, whose network namespace the bridge opens the
    proxy's ports in (:mod:`libbroker.sandbox.bridge`).  ``rlimits``: what
    the forwarder sets on itself before go (under rlimits; none with cgroups).
    """
    options = bwrap.argv(shape, facts, info_fd=info_fd, seccomp_fd=seccomp_fd)
    forwarder = [host.native_forwarder] if host.native_forwarder else [
        host.python, "-I", "-S", host.forwarder]  # fmt: skip
    argv = ["bwrap", *options, "--", *forwarder]
    argv += ["--control", str(control_fd)]
    if shape.new_session:
        argv.append("--own-group")
    for which, value in rlimits:
        argv += ["--rlimit", f"{which}={value}"]
    return [*argv, "--", *cmd]


def protected_paths(cfg: Config) -> list[str]:
    """The workdir's files that stay read-only in the sandbox (PROTECTED_IN_WORKDIR)."""
    if not cfg.protect_git:
        return []
    return [os.path.join(cfg.workdir, rel) for rel in PROTECTED_IN_WORKDIR]
