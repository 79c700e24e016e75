"""Exported API keys: a [[secret]] of their own by default, refused in ``env`` unless opted in.

The sessions that use them (each real agent CLI with only the exported
variable, the key nowhere inside) are tests/agents/test_agents_e2e.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libbroker.errors import ConfigError
from libbroker.launcher import agents, config_file, plan
from libbroker.launcher.config import HostFacts, from_mapping
from libbroker.launcher.exported_keys import KEY_USES, NOT_AUTOMATIC, take

FACTS = HostFacts(home="/home/u", cwd="/srv/w", gh_present=False)
PROFILE_OF = {var: p for p in agents.PROFILES.values() for var in p.key_env}
AUTOMATIC = sorted(set(KEY_USES) - NOT_AUTOMATIC)


@pytest.mark.parametrize("var", AUTOMATIC)
def test_an_exported_key_becomes_a_secret_on_its_agents_host(var: str) -> None:
    profile = PROFILE_OF[var]
    cfg, line = take(profile, {var: "sk-real"}, from_mapping({}, FACTS))
    (secret,) = cfg.secrets
    use = KEY_USES[var]
    assert (secret.host, secret.header, secret.format) == (use.host, use.header, use.format)
    assert (secret.command, secret.env) == (f"printenv {var}", var)
    assert use.host in cfg.domains and use.host in profile.domains
    assert line == (f"agent-sandbox: {var} stays on this host: egress-proxy sends it to "
                    f"{use.host} (the session sees a placeholder)")
    assert "sk-real" not in line and "sk-real" not in plan.secrets_json(cfg)


def test_absent_empty_passed_or_held_keys_are_left_alone() -> None:
    claude = agents.PROFILES["claude"]
    empty = from_mapping({}, FACTS)
    assert take(claude, {}, empty) == (empty, "")
    assert take(claude, {"ANTHROPIC_API_KEY": ""}, empty) == (empty, "")
    passed = from_mapping({"env": ["ANTHROPIC_API_KEY"], "unsafe_env": ["ANTHROPIC_API_KEY"]},
                          FACTS)
    assert take(claude, {"ANTHROPIC_API_KEY": "k"}, passed) == (passed, "")
    held = from_mapping({"secret": [{"host": "api.anthropic.com", "header": "x-api-key",
                                     "format": "{}", "command": "pass claude"}]}, FACTS)
    assert take(claude, {"ANTHROPIC_API_KEY": "k"}, held) == (held, "")


def test_one_secret_per_host_the_first_variable_wins() -> None:
    cfg, _ = take(agents.PROFILES["claude"],
                  {"CLAUDE_CODE_OAUTH_TOKEN": "b", "ANTHROPIC_API_KEY": "a"},
                  from_mapping({}, FACTS))
    assert [(s.env, s.header) for s in cfg.secrets] == [("ANTHROPIC_API_KEY", "x-api-key")]


def test_google_api_key_is_vertex_only_and_not_sent_by_itself() -> None:
    gemini = agents.PROFILES["gemini"]
    assert take(gemini, {"GOOGLE_API_KEY": "g"}, from_mapping({}, FACTS))[0].secrets == ()


@pytest.mark.parametrize("var", sorted(KEY_USES))
def test_a_key_in_env_is_refused_with_the_risk_unless_opted_in(tmp_path: Path, var: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'env = ["PATH", "{var}"]\n')
    with pytest.raises(ConfigError) as err:
        config_file.load(str(path), FACTS._replace(cwd=str(tmp_path)))
    host = KEY_USES[var].host
    assert str(err.value) == (
        f"{path} line 1: env: {var} would carry your key into the session, where anything "
        "it runs can read it and send it anywhere it may reach; without it, the key stays "
        f"on this host and egress-proxy sends it to {host}; to carry it in anyway, name it "
        "in unsafe_env too")
    path.write_text(f'env = ["{var}"]\nunsafe_env = ["{var}"]\n')
    assert config_file.load(str(path), FACTS._replace(cwd=str(tmp_path))).env == (var,)
