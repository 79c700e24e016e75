"""The exported-key notice: a [[secret]] table the launcher's own config loader takes.

Every agent variable's table, as printed, goes through ``config.load`` (TOML
file, the whole check) and comes out as the secret egress-proxy will use; the
notice never advises ``env`` (which would carry the key inside).  The table
pasted into a real session is tests/agents/test_agents_e2e.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libbroker.launcher import agents, config_file
from libbroker.launcher.config import HostFacts, from_mapping
from libbroker.launcher.key_notice import KEY_USES, notice

FACTS = HostFacts(home="/home/u", cwd="/srv/w", gh_present=False)
PROFILE_OF = {var: p for p in agents.PROFILES.values() for var in p.key_env}


def test_every_agent_variable_has_its_use() -> None:
    assert set(PROFILE_OF) == set(KEY_USES)


@pytest.mark.parametrize("var", sorted(KEY_USES))
def test_the_printed_table_loads_as_the_secret_it_names(tmp_path: Path, var: str) -> None:
    profile = PROFILE_OF[var]
    text = notice(profile, {var: "sk-real"}, from_mapping({}, FACTS))
    head, sep, table = text.partition("add to the config:\n")
    assert sep and "sk-real" not in text and "`env`" not in text
    assert head.startswith(f"agent-sandbox: {var} is set here but not passed into the session")
    path = tmp_path / "config.toml"
    path.write_text(table + "\n")
    cfg = config_file.load(str(path), FACTS._replace(cwd=str(tmp_path)))
    (secret,) = cfg.secrets
    use = KEY_USES[var]
    assert (secret.host, secret.header, secret.format) == (use.host, use.header, use.format)
    assert (secret.command, secret.env) == (f"printenv {var}", var)
    assert use.host in profile.domains
    # Taken, the table ends the notice.
    assert notice(profile, {var: "sk-real"}, cfg) == ""


def test_a_variable_passed_or_absent_needs_no_notice() -> None:
    claude = agents.PROFILES["claude"]
    assert notice(claude, {}, from_mapping({}, FACTS)) == ""
    assert notice(claude, {"ANTHROPIC_API_KEY": ""}, from_mapping({}, FACTS)) == ""
    passed = from_mapping({"env": ["ANTHROPIC_API_KEY"], "unsafe_env": ["ANTHROPIC_API_KEY"]},
                          FACTS)
    assert notice(claude, {"ANTHROPIC_API_KEY": "k"}, passed) == ""


def test_a_host_with_a_secret_already_gets_no_second_table() -> None:
    cfg = from_mapping({"secret": [{"host": "api.anthropic.com", "header": "x-api-key",
                                    "format": "{}", "command": "pass claude"}]}, FACTS)
    text = notice(agents.PROFILES["claude"], {"ANTHROPIC_AUTH_TOKEN": "k"}, cfg)
    assert "ANTHROPIC_AUTH_TOKEN is set here" in text and "[[secret]]" not in text


def test_two_variables_name_both_and_table_the_first() -> None:
    text = notice(agents.PROFILES["gemini"], {"GEMINI_API_KEY": "a", "GOOGLE_API_KEY": "b"},
                  from_mapping({}, FACTS))
    assert "GEMINI_API_KEY, GOOGLE_API_KEY are set here" in text
    assert 'env = "GEMINI_API_KEY"' in text and 'env = "GOOGLE_API_KEY"' not in text
