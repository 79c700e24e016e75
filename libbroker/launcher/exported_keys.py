"""An agent's API key exported on the host: kept there, sent by egress-proxy (pure).

A session never inherits the launcher's environment, so ``ANTHROPIC_API_KEY``
and the like stay outside.  Without more, the agent inside is "not logged
in".  So the launcher turns an exported key into a ``[[secret]]`` of its own,
exactly what the config's tables make: egress-proxy runs ``printenv VAR`` on
the host (it inherits the launcher's environment), sets the header on the
agent's API host only, and the variable inside holds the placeholder.  The
session says so in one line.

Listing the variable in ``env`` would carry the real key inside, where the
agent (or anything it runs) can read it and send it to any host it may reach:
refused unless the variable is named in ``unsafe_env`` too (:func:`check_env`).

Pure: the profile, the environment and the config in; a config and lines out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from libbroker.errors import ConfigError
from libbroker.launcher.egress_values import Secret
from libbroker.named_tuple import NamedTuple

if TYPE_CHECKING:  # config imports this module (check_env)
    from libbroker.launcher.agents import Profile
    from libbroker.launcher.config import Config


class KeyUse(NamedTuple):
    """Where an agent sends the key a variable holds, and in which header."""

    host: str
    header: str
    format: str


# The agents' own variables (libbroker.launcher.agents' key_env), by what each
# CLI does with it (read in the installed CLIs).  CLAUDE_CODE_OAUTH_TOKEN is
# `claude setup-token`'s long-lived login: a bearer, like ANTHROPIC_AUTH_TOKEN.
KEY_USES = {
    "ANTHROPIC_API_KEY": KeyUse("api.anthropic.com", "x-api-key", "{}"),
    "ANTHROPIC_AUTH_TOKEN": KeyUse("api.anthropic.com", "Authorization", "Bearer {}"),
    "CLAUDE_CODE_OAUTH_TOKEN": KeyUse("api.anthropic.com", "Authorization", "Bearer {}"),
    "OPENAI_API_KEY": KeyUse("api.openai.com", "Authorization", "Bearer {}"),
    "CODEX_API_KEY": KeyUse("api.openai.com", "Authorization", "Bearer {}"),
    "GEMINI_API_KEY": KeyUse("generativelanguage.googleapis.com", "x-goog-api-key", "{}"),
    "GOOGLE_API_KEY": KeyUse("generativelanguage.googleapis.com", "x-goog-api-key", "{}"),
}
# Gemini CLI reads GOOGLE_API_KEY for Vertex AI only (aiplatform.googleapis.com,
# a host of the project's choosing): not sent anywhere by itself.
NOT_AUTOMATIC = frozenset({"GOOGLE_API_KEY"})
UNSAFE_KEY = "unsafe_env"


def check_env(env: tuple[str, ...], unsafe: tuple[str, ...], where: str) -> None:
    """Refuse an agent's key variable in ``env`` unless ``unsafe`` names it too."""
    for name in env:
        use = KEY_USES.get(name)
        if use is not None and name not in unsafe:
            raise ConfigError(
                f"{where}: {name} would carry your key into the session, where anything "
                f"it runs can read it and send it anywhere it may reach; without it, the "
                f"key stays on this host and egress-proxy sends it to {use.host}; to carry "
                f"it in anyway, name it in {UNSAFE_KEY} too"
            )


def take(profile: Profile, host_env: Mapping[str, str], cfg: Config) -> tuple[Config, str]:
    """``cfg`` with a secret for each exported key of the agent's, and the line saying so.

    One secret per host: the first variable of the profile's ``key_env`` that
    is set wins (the others are left to :mod:`.key_notice`).  A variable the
    config passes in (``env``) or already holds as a secret is left alone.
    """
    handled = {*cfg.env, *(s.env for s in cfg.secrets)}
    hosts = {s.host for s in cfg.secrets}
    added: list[Secret] = []
    for name in profile.key_env:
        use = KEY_USES.get(name)
        if use is None or name in NOT_AUTOMATIC or not host_env.get(name) or name in handled:
            continue
        if use.host in hosts or use.host in cfg.inject:
            continue
        hosts.add(use.host)
        added.append(Secret(use.host, use.header, f"printenv {name}", use.format, 300, name))
    if not added:
        return cfg, ""
    said = "; ".join(f"{s.env} stays on this host: egress-proxy sends it to {s.host}"
                     for s in added)
    line = f"agent-sandbox: {said} (the session sees a placeholder)"
    domains = (*cfg.domains, *(s.host for s in added if s.host not in cfg.domains))
    return cfg._replace(secrets=(*cfg.secrets, *added), domains=domains), line
