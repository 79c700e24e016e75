"""An agent's OAuth login stays on the host: placeholders inside, the token at the proxy.

Claude Code's subscription login (``~/.claude/.credentials.json``,
``claudeAiOauth``), Codex's ChatGPT login (``~/.codex/auth.json``,
``tokens``) and Gemini CLI's Google login (``~/.gemini/oauth_creds.json``) used
to reach the session in its private copy: a process
inside could send the refresh token anywhere it may reach and keep the
person's plan after the session.  Now, with no config to write:

- :func:`take` (before egress-proxy gets its arguments): the login seen, a
  ``[[secret]]`` of its own for the agent's API host, whose command is
  :mod:`libegress.login_keeper` on the person's own file (it prints the
  access token, refreshed before it expires, the rotated pair written back
  atomically with the file's mode); the session's ``resolve`` pins and
  ``upstream_ca`` go with it, so the refresh reaches what the proxy would;
  the entries name the login's kind, so egress-proxy also serves the agent's
  token host (:mod:`libegress.token_endpoint`): a refresh from inside is
  answered with placeholders, a ``/login`` inside is kept in the person's file;
- :func:`placeholder_copy` (once the private copy is made): the copy's login
  holds fixed placeholders (:mod:`libegress.placeholders`) and an expiry
  far ahead, so the agent never refreshes by itself; the manifest records the
  rewritten file as copied, and :mod:`.agent_home` never brings back a login
  file that holds a placeholder.

The agent adds its login's headers (``anthropic-beta: oauth-2025-04-20``,
``chatgpt-account-id``) itself, as it would with the real token;
egress-proxy replaces only ``Authorization``, on the API hosts only (and
Gemini CLI's tokeninfo).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from typing import TYPE_CHECKING

from libbroker.launcher.egress_values import Secret
from libbroker.named_tuple import NamedTuple

if TYPE_CHECKING:
    from libbroker.launcher.agents import Profile
    from libbroker.launcher.config import Config

# How often egress-proxy asks the keeper (a file read; a refresh only when due).
EVERY = 60
EVERY_VAR = "AGENT_SANDBOX_LOGIN_EVERY"  # seconds: shorter, for tests and the impatient


class Login(NamedTuple):
    """An agent's OAuth login found on the host."""

    kind: str  # libegress.oauth_login.KINDS
    path: str  # the person's own file
    copy: str  # the file in the private copy, relative to its root
    hosts: tuple[str, ...]  # the hosts that get the access token (the API's first)


_FILES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "claude": ("~/.claude/.credentials.json", "claude/.credentials.json", ("api.anthropic.com",)),
    # Codex with a ChatGPT login talks to chatgpt.com/backend-api (codex/responses).
    "codex": ("~/.codex/auth.json", "codex/auth.json", ("chatgpt.com",)),
    # Gemini CLI with a Google login: Code Assist, and the token's own checks at
    # start (userinfo when no account is cached; tokeninfo, with the bearer, on
    # oauth2.googleapis.com, the token host: libegress.token_endpoint sets the
    # token on /tokeninfo only, never on /token).
    "gemini": ("~/.gemini/oauth_creds.json", "home/.gemini/oauth_creds.json",
               ("cloudcode-pa.googleapis.com", "oauth2.googleapis.com", "www.googleapis.com")),
}


def known(profile: Profile, home: str) -> Login | None:
    """Where the agent's OAuth login is or would be in ``home``, or None (an agent
    with no login we hold)."""
    if profile.name not in _FILES:
        return None
    where, copy, hosts = _FILES[profile.name]
    return Login(profile.name, os.path.join(home, where[2:]), copy, hosts)


def detect(profile: Profile, home: str) -> Login | None:
    """The agent's OAuth login in ``home``, or None (none, or not one we can hold)."""
    login = known(profile, home)
    if login is None:
        return None
    try:
        with open(login.path, encoding="utf-8") as fh:
            text = fh.read(1 << 20)
    except (OSError, UnicodeDecodeError):
        return None
    # Only where a login file is: its parser (and base64) is ~2 ms of every agent
    # session's start otherwise.
    from libegress import oauth_login

    try:
        oauth_login.parse(oauth_login.KINDS[profile.name], text)
    except oauth_login.LoginError:
        return None
    return login


def _every() -> int:
    value = os.environ.get(EVERY_VAR, "")
    return int(value) if value.isdigit() and 0 < int(value) <= EVERY else EVERY


def take(profile: Profile, cfg: Config) -> tuple[Config, Login | None, str]:
    """``cfg`` with the login's secret, the login, and the line that says so.

    An agent with no login on the host yet gets the same secrets (their
    keeper holds nothing until a login exists, and says nothing), so a first
    ``/login`` inside is kept on the host too; the Login returned is None
    then (no copy to fill with placeholders) and no line is said.  Its API
    host with a key already (an exported key, a ``[[secret]]``) is left to
    the key.
    """
    login = detect(profile, cfg.home)
    later = known(profile, cfg.home) if login is None else None
    held = {s.host for s in cfg.secrets}
    if later is not None:
        if later.hosts[0] in held or later.hosts[0] in cfg.inject:
            return cfg, None, ""
        return _secrets(cfg, later, held), None, ""
    if login is None:
        return cfg, None, ""
    if login.hosts[0] in held:  # an API key is used there
        return cfg, login, (f"agent-sandbox: {profile.name}'s login stays on this host "
                            "(placeholders in the session; its API host has a key already)")
    line = (f"agent-sandbox: {profile.name}'s login stays on this host: egress-proxy sends "
            f"its token to {login.hosts[0]} and refreshes it (the session holds placeholders)")
    return _secrets(cfg, login, held), login, line


def _secrets(cfg: Config, login: Login, held: set[str]) -> Config:
    """``cfg`` with the login's secrets (the keeper's command on its file) and their hosts."""
    argv = [sys.executable, "-m", "libegress.login_keeper", login.kind, login.path,
            *(f"--resolve={pin}" for pin in cfg.resolve)]
    if cfg.upstream_ca:
        argv.append(f"--ca={cfg.upstream_ca}")
    if cfg.unsafe_login_switch:
        argv.append("--switch-ok")
    added = tuple(Secret(host, "Authorization", shlex.join(argv), "Bearer {}", _every(),
                         login=login.kind)
                  for host in login.hosts if host not in held and host not in cfg.inject)
    domains = (*cfg.domains, *(s.host for s in added if s.host not in cfg.domains))
    return cfg._replace(secrets=(*cfg.secrets, *added), domains=domains)


def placeholder_copy(login: Login, root: str, runtime: str) -> None:
    """Put the placeholders in the private copy's login; record it as copied."""
    from libbroker.launcher.agent_home import MANIFEST
    from libegress import oauth_login, placeholders

    path = os.path.join(root, login.copy)
    kind = oauth_login.KINDS[login.kind]
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        data = {}
    data = placeholders.login_file(kind, data)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a fresh file: never the host's inode
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    st = os.stat(path)
    manifest_path = os.path.join(runtime, MANIFEST)
    with open(manifest_path, encoding="utf-8") as fh:
        manifest = json.load(fh)
    manifest.setdefault("copied", {})[login.copy] = [st.st_size, st.st_mtime_ns]
    with open(manifest_path, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh)
