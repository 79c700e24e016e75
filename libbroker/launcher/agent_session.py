"""The agent profile in a session: what :mod:`.session` asks of it, in order.

1. :func:`pick` (before the proxy gets its arguments): the profile from the
   command's name or ``--agent``; its hosts join the allow list; the agent's
   own sandbox flags are translated (:mod:`.agent_argv`); an exported API key
   that stays outside is said, with the ``[[secret]]`` table that would
   use it (:mod:`.key_notice`);
2. :meth:`Agent.prepare` (while the servers start): the private copy of the
   agent's config (:mod:`.agent_home`), added to the session's ``write``;
   :meth:`Agent.overlays` (bwrap): its session-only files mounted over its
   own paths (Claude Code's managed settings);
3. :func:`environment`: the agent's variables, and the CA variables
   bundling the user's own CA files with ours (Landlock: a HOME of its own,
   :func:`landlock_home`, which every command gets);
4. :func:`write_cas` (once the proxy has written its CA, before the command
   runs); 5. the teardown and the janitor call :func:`.agent_home.write_back`.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from libbroker.errors import LaunchError
from libbroker.launcher import agents, runtime_dir
from libbroker.launcher.agents import Profile
from libbroker.launcher.config import Config
from libbroker.launcher.runtime import Runtime

if TYPE_CHECKING:
    from libbroker.launcher import agent_copy, logins

# The user's own CA files, which the session's bundles add to ours instead of
# replacing: (the user's variable, the session file, our part's file name).
_USER_CAS = (
    ("NODE_EXTRA_CA_CERTS", "node-ca.pem", "ca.pem"),
    ("SSL_CERT_FILE", "bundle.pem", "bundle.pem"),
)
_BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")


class Agent:
    """One session's agent: its profile, the config it runs under, its command."""

    def __init__(self, profile: Profile, cfg: Config, cmd: list[str]) -> None:
        self.profile = profile
        self.cfg = cfg
        self.cmd = cmd
        self.env: dict[str, str] = {}
        self.root = ""  # the private copy, once prepared
        self.copy_line = ""  # what the copy took and left out, in one line
        self._copy: threading.Thread | None = None  # the copy, until join()
        self._ready = threading.Event()  # the copy made (its record may still be written)
        self._waited = False
        self._report: agent_copy.Report | None = None
        self._error: Exception | None = None
        self.login: logins.Login | None = None  # an OAuth login held on the host

    def prepare(self, rt: Runtime) -> Config:
        """Start copying the agent's config into its private home; the config that grants it.

        The copy (a walk and many small files: tens of ms for a year of use,
        more on a busy disk) runs in a thread while the servers start, as the
        host-run scan does; :meth:`wait` joins it before the command runs.
        Its path, and so the grant and the agent's variables, are known now.
        """
        from libbroker.launcher import agent_home

        cfg = self.cfg
        claude = _claude_session(cfg, rt) if self.profile.reads_managed_settings() else None
        if claude is not None:  # under bwrap, mounted over the managed settings' path
            managed = json.dumps({"sandbox": {"enabled": False}, **claude})
            runtime_dir.write_private(_managed(rt), managed)
        try:
            self.root = agent_home.make_root(
                self.profile, cfg.home, os.environ, os.path.basename(rt.root)
            )
        except OSError as exc:
            raise self._failed(exc) from None
        self.env = agent_home.home_env(self.profile, self.root)
        self._copy = threading.Thread(
            target=self._make_copy, args=(rt, claude), name="agent-copy", daemon=True
        )
        self._copy.start()
        self.cfg = cfg._replace(write=(*cfg.write, self.root))
        return self.cfg

    def _make_copy(self, rt: Runtime, claude: dict[str, object] | None) -> None:
        from libbroker.launcher import agent_home

        cfg = self.cfg
        try:
            home = agent_home.prepare(
                self.profile,
                home=cfg.home,
                workdir=cfg.workdir,
                session=os.path.basename(rt.root),
                runtime=rt.root,
                env=os.environ,
                opted=agents.opted_keys(self.profile, cfg.agent_write_back),
                claude_session=claude,
                root=self.root,
                record_later=True,
            )
            if self.login is not None:  # before anything of the session runs
                from libbroker.launcher import logins

                logins.placeholder_copy(self.login, home.root, rt.root)
            self._report = home.report
        except Exception as exc:  # said, as the session's failure, by wait()
            self._error = exc
            return
        finally:
            self._ready.set()
        # While the session goes on (no sandbox reaches it): none, and the bytes decide.
        from libbroker.launcher import agent_reuse

        with contextlib.suppress(OSError):
            agent_reuse.write_record(self.root, home.record)

    def wait(self) -> None:
        """The copy made (before go): its failure ends the start; what it left out of the
        user's own is said in one line."""
        if self._copy is None or self._waited:
            return
        self._ready.wait()
        self._waited = True
        if self._error is not None:
            self.join()
            from libbroker.launcher import agent_reuse

            agent_reuse.remove(self.root)  # no manifest: nothing comes back
            error, self._error = self._error, None
            raise self._failed(error)
        if self._report is not None:
            self.copy_line = self._report.line(self.profile.name)
            if self._report.notable():  # the user's own files the agent will not see
                os.write(2, f"agent-sandbox: {self.copy_line}\n".encode())

    def join(self) -> None:
        """The copy's thread over, its record written (before the write-back keeps it)."""
        if self._copy is not None:
            self._copy.join()
            self._copy = None

    def _failed(self, exc: BaseException) -> LaunchError:
        if isinstance(exc, OSError):
            return LaunchError(f"cannot make {self.profile.name}'s private config: "
                               f"{exc.strerror} ({exc.filename})")
        return LaunchError(f"cannot make {self.profile.name}'s private config: {exc}")

    def overlays(self, rt: Runtime) -> tuple[tuple[str, str], ...]:
        """bwrap: the agent's session-only files, mounted read-only over its own paths.

        Claude Code's managed settings (the highest scope: a workdir
        ``.claude/settings.local.json`` with ``disableAllHooks`` turns off only
        the hooks below it) get the session's hook, deny rules and sandbox off,
        over any machine-wide drop-in of the same name.  Landlock mounts nothing.
        """
        if not self.profile.reads_managed_settings():
            return ()
        from libbroker.launcher.settings import target_path

        return ((_managed(rt), target_path()),)



def landlock_home(agent: Agent | None, cfg: Config, rt: Runtime) -> str:
    """Under Landlock: HOME, a writable home of the session's own, for every command.

    The real home is not granted there, so shells failed on ``~/.bashrc``
    before every command, and npm, pip or cargo could not write their caches
    (npm then advised ``sudo chown``).  This home is what bwrap's home tmpfs
    is (:func:`private_home`): an agent's lies in its private
    copy, any other command's in the runtime directory (granted read-write
    there, removed with it).  The caller adds it to the session's ``write``.
    Here, not in :mod:`.agent_home`: a plain command's session does not import
    that (~3 ms of CPU on the way to go).
    """
    root = agent.root if agent is not None and agent.root else rt.root
    return private_home(root, cfg.home, (*cfg.read, *cfg.write))


def private_home(root: str, home: str, grants: Sequence[str]) -> str:
    """``<root>/home``: a HOME for a Landlock session, holding only links to ``grants``.

    Under Landlock the real home stays where it is, unreadable but for the
    grants, so every shell the agent starts tried to source ``~/.bashrc`` (and
    ``~/.profile``) and printed "Permission denied" before each command's
    output.  This home is what bwrap's empty home tmpfs is: nothing of the
    user's but the config's read and write paths under the real home, here as
    symlinks to them (Landlock checks the target: the grants hold as before).
    It lies in the private copy, so it is writable and removed with it; the
    write-back never follows a link.
    """
    out = os.path.join(root, "home")
    os.makedirs(out, mode=0o700, exist_ok=True)
    def nests(a: str, b: str) -> bool:  # one is the other or beneath it
        return a == b or a.startswith(b + "/") or b.startswith(a + "/")

    prefix = home.rstrip("/") + "/"
    if prefix == "/":  # no home of the user's: nothing of it to link
        return out
    inside = sorted(g for g in grants if g.startswith(prefix) and not nests(g, root))
    done: list[str] = []
    for grant in inside:
        if any(grant.startswith(d + "/") for d in done):
            continue  # a link to an ancestor already reaches it
        rel = os.path.relpath(grant, home)
        link = os.path.join(out, rel)
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(link), mode=0o700, exist_ok=True)
            if not os.path.lexists(link):
                os.symlink(grant, link)
        done.append(grant)
    return out


def pick(cfg: Config, cmd: list[str], host_env: Mapping[str, str]) -> Agent | None:
    """The session's agent, or None for a command that is no known agent."""
    profile = agents.pick(cmd, cfg.agent, dict(cfg.agents))
    if profile is None:
        return None
    # An agent's modules only: a plain command's session never loads them (start-up).
    from libbroker.launcher import agent_argv, exported_keys, key_notice, logins

    argv = agent_argv.session_argv(profile, cmd)
    cfg, kept = exported_keys.take(profile, host_env, cfg)  # exported keys: secrets
    cfg, login, held = logins.take(profile, cfg)  # an OAuth login: a secret, placeholders
    for line in (argv.note, kept, held, key_notice.notice(profile, host_env, cfg)):
        if line:
            os.write(2, f"{'agent-sandbox: ' if line is argv.note else ''}{line}\n".encode())
    domains = (*cfg.domains, *(d for d in profile.domains if d not in cfg.domains))
    cfg = cfg._replace(domains=domains)
    if argv.read_only:  # codex -s read-only: as asked, the workdir is read-only
        cfg = cfg._replace(workdir_read_only=True)
    agent = Agent(profile, cfg, argv.argv)
    agent.login = login
    return agent


def _managed(rt: Runtime) -> str:
    return os.path.join(rt.root, "claude-managed-settings.json")


def _claude_session(cfg: Config, rt: Runtime) -> dict[str, object]:
    """The hook and deny rules Claude Code gets in a session (its settings, not the host's)."""
    from libbroker.launcher.plan import session_policy
    from libpolicy.render import session_settings

    rendered = session_settings(session_policy(cfg, rt.root), rt.policy)
    return {"hooks": rendered["hooks"], "permissions": rendered["permissions"]}


def environment(
    agent: Agent | None, env: dict[str, str], rt: Runtime, host_env: Mapping[str, str]
) -> dict[str, str]:
    """``env`` with the agent's variables and CA bundles that keep the user's own CAs."""
    if agent is not None:
        env.update(agent.env)
    for var, name, _ in _USER_CAS:
        if _user_ca(host_env, var):
            path = os.path.join(rt.root, name if var != "SSL_CERT_FILE" else "ssl-bundle.pem")
            for target in _BUNDLE_VARS if var == "SSL_CERT_FILE" else (var,):
                env[target] = path
    return env


def _user_ca(host_env: Mapping[str, str], var: str) -> str:
    path = host_env.get(var, "")
    return path if path and os.path.isfile(path) else ""


def _bundle(out: str, ours: str, user: str) -> None:
    """``out`` (new, 0644): ``ours``, a newline, then ``user``; copied by the kernel
    (sendfile: a system bundle is ~220 KB, read and written again in Python ~0.7 ms of
    CPU each, before go)."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for i, path in enumerate((ours, user)):
            if i:
                os.write(fd, b"\n")
            src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                while os.sendfile(fd, src, None, 1 << 24):  # to its end, as read() did
                    pass
            finally:
                os.close(src)
    finally:
        os.close(fd)


def write_cas(rt: Runtime, host_env: Mapping[str, str]) -> None:
    """Write the bundles :func:`environment` named: ours, then the user's CA file."""
    for var, name, ours in _USER_CAS:
        user = _user_ca(host_env, var)
        if not user:
            continue
        out = os.path.join(rt.root, name if var != "SSL_CERT_FILE" else "ssl-bundle.pem")
        try:
            _bundle(out, os.path.join(rt.egress_dir, ours), user)
        except OSError as exc:
            raise LaunchError(
                f"cannot bundle {var} ({user}) with the session's CA: {exc.strerror}"
            ) from None
