"""The servers start first: before the launcher has parsed its command line.

Interpreter start and imports are most of egress-proxy's and broker-server's
start-up.  ``agent-sandbox run`` therefore spawns both as its very first
step, each in the deferred boot of :func:`.boot.deferred_python_argv`: a server
imports what it needs, then waits for its arguments on stdin, which the
session writes once the config is read and the runtime directory exists
(:meth:`.child.Child.send_args`).  Meanwhile the launcher parses, reads
the config and prepares the sandbox: its work overlaps the servers' warm-up
instead of coming before it.

A run that ends before a session takes the servers (a usage or config error)
ends them with :func:`discard`.  They also exit by themselves on end of file
before their arguments, and by PR_SET_PDEATHSIG when the launcher dies.

This module and what it imports (:mod:`.boot`, :mod:`.child`, :mod:`.trace`)
stay light: every ms spent importing before the spawn delays the session.
"""

from __future__ import annotations

import os
import sys

from libbroker.errors import LaunchError
from libbroker.launcher import boot, helper_fork, serve_link
from libbroker.launcher.child import Child, spawn
from libbroker.launcher.handoff import Sockets
from libbroker.launcher.serve_link import Link
from libbroker.launcher.trace import trace

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the per-call budget)
if TYPE_CHECKING:
    from libbroker.launcher.lazy_broker import LazyBroker

# What egress-proxy imports before its arguments arrive: everything it needs
# up to its ``listening`` line (asyncio and the server load after it:
# libegress.serving).  Not cryptography's OpenSSL backend (~5 ms of CPU): the
# CA is made and signed without it (libegress.ca).  Not docopt: the session's
# command line is read without it (bin.egress_proxy.quick_args).  And what its
# first use would load after the arguments, on that same way (~3 ms of CPU,
# which the proxy needs once serving in any case): the idna codec (with
# stringprep, unicodedata and a regex compiled), which spells the allow list's
# and inject hosts' names (libegress.hosts.canonical_host), and ``_ssl``, which
# names the system's roots for the egress dir (libegress.egress_dir.system_roots).
# libegress.startup_gc first: the collector is off while the proxy starts.
PROXY_WARM = ("libegress.startup_gc", "libegress.app", "encodings.idna", "_ssl")
# What broker-server imports before its arguments (the resident service's
# zygote, libbroker.launcher.broker_zygote; our own broker starts late, with
# its arguments at once: lazy_broker).
BROKER_WARM = (
    "libbroker.broker.server",
    "libbroker.broker.profile",
    "libbroker.broker.audit",
    "libbroker.broker.executor",
    "libbroker.broker.executor_choice",
)
# (and the chosen backend's executor: libbroker.sandbox.backend.Backend.executor)
# run's options that take a value (docopt also accepts it as the next word).
_VALUED = ("--config", "--workdir", "--sandbox", "--agent", "--limit")
_SINGLE = _VALUED[:-1]  # --limit may repeat
# What docopt says of report's and watch's words on a run command line.
_REPORT_KEYS: dict[str, object] = {
    "report": False, "watch": False, "--json": False, "--last": False, "--list": False,
    "--verbose": False,
    "--verify": False, "--propose": False, "SESSION": None, "serve": False, "--socket": None,
    "gate-service": False, "--patience": "10",  # docopt's default, as the usage says
}


class Servers:
    """egress-proxy, started and waiting for its arguments, and the servers' sockets.

    ``broker`` is None: broker-server starts on the first brokered connection
    (:mod:`.lazy_broker`).  With the resident service (:mod:`.serve_link`),
    ``service`` is the link to it, ``broker`` the one its zygote forked, and
    ``proxy`` is None: the session's tenant lives in its gateway.
    ``sockets``: the servers' listening sockets, made here and handed to them
    at the spawn (:mod:`.handoff`); the broker's is bound by the session.
    ``tenant`` and ``lazy`` are the session's to set once it took them.
    """

    def __init__(self, proxy: Child | None, broker: Child | None, sockets: Sockets,
                 service: Link | None = None) -> None:
        self.proxy = proxy
        self.broker = broker
        self.sockets = sockets
        self.service = service
        self.taken = False  # a session owns them from then on
        # The Landlock helper, forked by the session's box once the launcher has
        # its imports (:func:`start_helper`, :meth:`.session_box.Box.begin`).
        self.helper: Helper | None = None
        # The session's, once it owns them:
        self.tenant = False  # its egress is a tenant of the service's gateway
        self.lazy: LazyBroker | None = None  # broker-server until its first connection


class Helper:
    """The Landlock session's helper, started and waiting for its parts (:func:`start_helper`).

    ``spec``: the write end of the pipe of its three parts
    (:mod:`libbroker.sandbox.landlock_helper`); ``life``: of its signal pipe, whose
    end of file ends the command.  End of file on the first before a part is
    written ends the helper itself: a launcher that dies leaves nothing running.
    """

    def __init__(self, child: Child, spec: int, life: int) -> None:
        self.child = child
        self.spec = spec
        self.life = life

    def drop(self) -> None:
        """Not used (the session ended before its box took it): it ends, and is reaped."""
        os.close(self.spec)
        os.close(self.life)
        _end(self.child)


def start_helper(own_group: bool) -> Helper:
    """The Landlock session's helper (:mod:`libbroker.sandbox.landlock_helper`), started now.

    It waits for its parts.  A fork of the launcher while it runs one thread
    (:mod:`.helper_fork`), at the session's start (:meth:`.session_box.Box.begin`),
    once the launcher has imported most of what the helper needs: those pages are
    shared, not imported again (~25 ms of CPU less than a fork at the prestart,
    on cores the proxy and the launcher need then); else a new interpreter.
    ``own_group``: the helper calls setsid() (no terminal on stdin).  LaunchError
    if it cannot start.
    """
    r, w = os.pipe()  # its parts: the first once the session's group exists, the last at go
    life_r, life_w = os.pipe()  # then signal numbers; its end of file ends the command
    os.set_inheritable(r, True)
    os.set_inheritable(life_r, True)
    # No PR_SET_PDEATHSIG: the helper becomes the command's reaper, which
    # must outlive even a launcher killed by SIGKILL long enough to kill
    # everything below it.  End of file on either pipe tells it.
    path = os.environ.get("PATH", "/usr/bin:/bin")
    try:
        if helper_fork.can_fork():  # no interpreter start (a warm run: no imports either)
            child = helper_fork.fork((r, life_r), path)
            trace("Landlock helper forked")
        else:
            helper = "libbroker.sandbox.landlock_helper"
            slow = [os.path.realpath(sys.executable), "-I", "-m", helper]
            argv = [*boot.python_argv("agent-sandbox", helper, slow), str(r), str(life_r)]
            child = spawn("sandbox", argv, env={"PATH": path}, pass_fds=[r, life_r],
                          pipes=False)
    except LaunchError:
        os.close(w)
        os.close(life_w)
        raise
    finally:
        os.close(r)
        os.close(life_r)
    child.own_group = own_group
    return Helper(child, w, life_w)


def drop_helper(servers: Servers | None) -> None:
    """A helper forked at the session's start that no box took (the start ended before
    the box's open): it ends."""
    if servers is not None and servers.helper is not None:
        helper, servers.helper = servers.helper, None
        helper.drop()


def _words(argv: list[str]) -> list[tuple[str, str]]:
    """(option, value) and ("", word) pairs of ``argv`` before ``--``."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        word = argv[i]
        name, eq, value = word.partition("=")
        if name in _VALUED and not eq:
            out.append((name, argv[i + 1] if i + 1 < len(argv) else ""))
            i += 2
            continue
        out.append((name, value) if word.startswith("-") else ("", word))
        i += 1
    return out


def wants_servers(argv: list[str]) -> bool:
    """Whether the command line asks for ``run`` (docopt still has the last word)."""
    words = [w for opt, w in _words(argv) if not opt]
    return bool(words) and words[0] == "run"


def run_args(argv: list[str]) -> dict[str, object] | None:
    """docopt's answer for the plain ``run [--OPTION=VALUE]... -- CMD...`` shape, else None.

    Parsing with docopt costs the launcher ~8 ms of CPU while the servers
    start.  The usual command line (``agent-sandbox run [--config=F]
    [--workdir=D] [--sandbox=K] [--agent=A] [--limit=N=V]... [--learn] -- CMD...``,
    each option but --limit at most once and spelled out with ``=``) is read here
    instead, giving exactly what docopt would (a test checks); anything else
    (no ``--``, abbreviations, repeats, -h, unknown words) is left to docopt,
    errors included.
    """
    if "--" not in argv:
        return None
    cut = argv.index("--")
    cmd = argv[cut + 1 :]
    if not cmd:
        return None
    values: dict[str, str | None] = dict.fromkeys(_SINGLE)
    limits: list[str] = []
    run = learn = False
    for word in argv[:cut]:
        name, eq, value = word.partition("=")
        if word == "run" and not run:
            run = True
        elif word == "--learn" and not learn:
            learn = True
        elif name in values and eq and value and values[name] is None:
            values[name] = value
        elif name == "--limit" and eq and value:
            limits.append(value)
        else:
            return None
    if not run:
        return None
    return {
        "run": True,
        **values,
        "--limit": limits,
        "--learn": learn,
        "--": True,
        "CMD": cmd,
        "doctor": False,
        "render-settings": False,
        **_REPORT_KEYS,
        "--help": False,
        "--version": False,
    }


def start_proxy(sockets: Sockets) -> Child:
    """egress-proxy in its deferred boot, with its listeners (LaunchError if it cannot start)."""
    proxy = spawn(
        "egress-proxy",
        boot.deferred_python_argv("egress-proxy", "bin.egress_proxy", PROXY_WARM),
        stdin_pipe=True,
        pass_fds=sockets.proxy_fds,
    )
    sockets.proxy_taken()
    return proxy


def start() -> Servers:
    """egress-proxy in its deferred boot, and the servers' sockets (LaunchError if not).

    The proxy gets its listeners at the spawn (:mod:`.handoff`); our own
    broker-server starts later, on the session's first brokered connection
    (:mod:`.lazy_broker`; with the resident service, its zygote forks it then).
    When the resident service answers on its socket, no proxy is spawned: the
    session's egress becomes a tenant of its gateway (or, for a config the
    gateway cannot serve, its own proxy, started then by the session).
    """
    service = serve_link.connect()
    try:
        sockets = Sockets(proxy=service is None)
    except OSError as exc:
        if service is not None:
            service.close()
        raise LaunchError(f"cannot make the servers' sockets: {exc.strerror or exc}") from None
    try:
        proxy = None if service is not None else start_proxy(sockets)
    except LaunchError:
        sockets.close()
        raise
    return Servers(proxy, None, sockets, service)


def try_start(argv: list[str]) -> Servers | None:
    """:func:`start` when ``argv`` asks for ``run``; None otherwise or on failure.

    A failure here is not reported: the session starts the servers again and
    reports what goes wrong then.
    """
    if not wants_servers(argv):
        return None
    try:
        servers = start()
    except LaunchError:
        return None
    trace("servers spawned")
    # Where the repository is: git answers while the launcher parses and reads
    # its config (libbroker.launcher.gitfacts; config_file.load takes it).
    from libbroker.launcher import gitfacts

    named = [value for opt, value in _words(argv) if opt == "--workdir"]
    home = os.path.expanduser("~")
    try:
        cwd = os.getcwd()
    except OSError:  # a cwd removed under us: the config check reports it
        return servers
    gitfacts.ask_early(gitfacts.start_dir(named[-1] if named else cwd, cwd, home), home)
    return servers


def _end(child: Child) -> None:
    child.send(boot.SIGKILL)
    child.wait(60)
    child.close()


def discard(servers: Servers | None) -> None:
    """End servers no session took (the run ended before it started), and git's question."""
    from libbroker.launcher import gitfacts

    gitfacts.discard_early()
    if servers is not None and not servers.taken:
        servers.taken = True
        drop_helper(servers)
        servers.sockets.close()
        for child in (servers.broker, servers.proxy):
            if child is not None:
                _end(child)
        if servers.service is not None:
            servers.service.close()
