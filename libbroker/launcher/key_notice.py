"""The notice for an agent's API key exported on the host: how to use it without carrying it in.

A session never inherits the launcher's environment, so ``ANTHROPIC_API_KEY``
and the like stay outside.  Listing one in the config's ``env`` would carry
the real key into the sandbox, where the agent (or anything it runs) can
read it and send it anywhere it may reach.  The way that keeps it outside is
a ``[[secret]]`` table: egress-proxy runs its command on the host and sets
the header on requests to the agent's API host only; inside, the variable
holds a placeholder so the agent starts.  The notice prints that table,
ready to paste (``printenv`` reads the key the launcher was started with).

Pure: the profile, the environment's names and the config in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping

from libbroker.launcher.agents import Profile
from libbroker.launcher.config import Config
from libbroker.launcher.exported_keys import KEY_USES, KeyUse

__all__ = ["KEY_USES", "KeyUse", "notice", "secret_table"]


def secret_table(name: str, use: KeyUse) -> str:
    """The ``[[secret]]`` TOML for variable ``name`` (tested through the config loader)."""
    return (
        "[[secret]]\n"
        f'host = "{use.host}"\n'
        f'header = "{use.header}"\n'
        f'format = "{use.format}"\n'
        f'command = "printenv {name}"\n'
        f'env = "{name}"\n'
    )


def notice(profile: Profile, host_env: Mapping[str, str], cfg: Config) -> str:
    """The lines saying an exported key stays outside, and the table that uses it; or ""."""
    handled = {*cfg.env, *(s.env for s in cfg.secrets)}
    secret_hosts = {s.host for s in cfg.secrets}
    dropped = [k for k in profile.key_env if host_env.get(k) and k not in handled]
    if not dropped:
        return ""
    names = ", ".join(dropped)
    head = (f"agent-sandbox: {names} {'is' if len(dropped) == 1 else 'are'} set here but "
            "not passed into the session (there the agent could read and send it anywhere)")
    use = KEY_USES.get(dropped[0])
    if use is None and profile.domains:  # a config's own agent: its first host
        use = KeyUse(profile.domains[0], "Authorization", "Bearer {}")
    if use is None or use.host in secret_hosts:
        return head
    return (f"{head}; to have egress-proxy send it to {use.host} while the session sees a "
            "placeholder, add to the config:\n" + secret_table(dropped[0], use).rstrip("\n"))
