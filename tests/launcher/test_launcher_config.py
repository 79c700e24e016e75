"""The launcher's config: defaults, checks, and errors that name the key (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.errors import ConfigError
from libbroker.launcher import config, config_file
from libbroker.launcher.config import DEFAULT_DOMAINS, HostFacts, from_mapping

FACTS = HostFacts(home="/home/u", cwd="/home/u/project", gh_present=True)
NO_GH = HostFacts(home="/home/u", cwd="/srv/w", gh_present=False)


def test_defaults_need_no_file() -> None:
    cfg = from_mapping({}, FACTS)
    assert cfg.workdir == "/home/u/project"
    assert cfg.sandbox == "auto"
    assert cfg.domains == DEFAULT_DOMAINS
    assert "api.anthropic.com" in cfg.domains and "github.com" in cfg.domains
    assert cfg.inject == ("github.com", "api.github.com")
    assert cfg.token_command == "gh auth token"
    assert cfg.sign_key is None  # git's user.signingkey, looked up later
    assert cfg.home == "/home/u"
    assert cfg.harness == "/home/u/.claude"
    # The agent's real config is never writable: a session gets a private copy.
    assert cfg.write == ()
    assert cfg.agent == "" and cfg.agent_write_back == () and cfg.agents == ()


def test_explicit_write_paths_still_work() -> None:
    cfg = from_mapping({"write": ["~/project/out", "/data"]}, FACTS)
    assert cfg.write == ("/home/u/project/out", "/data")


def test_a_grant_that_reopens_an_agent_config_needs_unsafe_grants() -> None:
    with pytest.raises(ConfigError, match=r"^write: ~/\.claude covers Claude Code's config "):
        from_mapping({"write": ["~/.claude"]}, FACTS)
    cfg = from_mapping({"write": ["~/.claude"], "unsafe_grants": ["~/.claude"]}, FACTS)
    assert cfg.write == ("/home/u/.claude",)


def test_agent_keys_are_checked() -> None:
    cfg = from_mapping(
        {
            "agent_write_back": ["claude:mcpServers", "gemini:mcpServers"],
            "agents": {"mine": {"commands": ["aider"], "config": ["~/.aider"],
                                "domains": ["api.example.com"], "write_back": [".aider/hist/**"]}},
        },
        FACTS,
    )
    assert cfg.agent_write_back == ("claude:mcpServers", "gemini:mcpServers")
    assert dict(cfg.agents)["mine"].commands == ("aider",)
    for bad in (
        {"agent_write_back": ["claude"]},
        {"agent_write_back": ["nobody:key"]},
        {"agent_write_back": ["codex:mcp_servers"]},  # config.toml never comes back
        {"agents": {"mine": {"bogus": 1}}},
        {"agents": {"claude": {}}},
        {"agents": {"mine": {"config": ["/etc/x"]}}},
    ):
        with pytest.raises(ConfigError):
            from_mapping(bad, FACTS)


def test_no_gh_means_no_token_command() -> None:
    assert from_mapping({}, NO_GH).token_command == ""


def test_paths_expand_home_and_workdir_is_relative_to_cwd() -> None:
    cfg = from_mapping({"workdir": "sub", "read": ["~/.cargo"], "write": ["/data/x/"]}, FACTS)
    assert cfg.workdir == "/home/u/project/sub"
    assert cfg.read == ("/home/u/.cargo",)
    assert cfg.write == ("/data/x",)


def test_relative_read_paths_are_refused() -> None:
    with pytest.raises(ConfigError, match="read: path 'x' must be absolute"):
        from_mapping({"read": ["x"]}, FACTS)


@given(st.text(min_size=1).filter(lambda k: k not in config._KEYS))
def test_every_unknown_key_is_refused_by_name(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping({key: 1}, FACTS)
    assert repr(key) in str(info.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"sandbox": "docker"}, "sandbox: must be one of"),
        ({"domains": "github.com"}, "domains: must be a list of strings"),
        ({"domains": ["a.com, b.com"]}, "holds a comma"),
        ({"domains": ["*"]}, "a wildcard may only lead"),
        ({"inject": ["a b"]}, "not a host name"),
        ({"token_every": 0}, "token_every: must be at least 1"),
        ({"token_every": True}, "token_every: must be an integer"),
        ({"start_timeout": -1}, "start_timeout"),
        ({"resolve": ["github.com"]}, "HOST:IP"),
        ({"resolve": ["github.com:300.1.1.1"]}, "HOST:IP"),
        ({"allow_cidr": ["10.0.0.0/33"]}, "not a CIDR"),
        ({"hostrun_allow": ["nonsense"]}, "turns nothing off"),
        ({"env": ["GITHUB_TOKEN"]}, "may not be passed"),
        ({"env": ["NONO_PROFILE"]}, "may not be passed"),
        ({"env": ["AGENT_SANDBOX_POLICY"]}, "may not be passed"),
        ({"env": ["1BAD"]}, "not a variable name"),
        ({"protect_git": "yes"}, "protect_git: must be true or false"),
        ({"workdir": "a\0b"}, "NUL"),
        ({"workdir": "/home/u"}, "contains the home directory"),
        ({"workdir": "/"}, "contains the home directory"),
    ],
)
def test_bad_values_are_refused_with_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping(data, FACTS)


@pytest.mark.parametrize(
    "pin", ["github.com:127.0.0.1", "github.com:127.0.0.1:8443", "h.test:[::1]:443", "h.test:::1"]
)
def test_resolve_pins_take_egress_proxy_forms(pin: str) -> None:
    assert from_mapping({"resolve": [pin]}, FACTS).resolve == (pin,)


def test_explicit_empty_sign_key_disables_signing() -> None:
    assert from_mapping({"sign_key": ""}, FACTS).sign_key == ""
    cfg = from_mapping({"sign_key": "ABCD"}, FACTS)
    assert config_file.resolve_sign_key(cfg).sign_key == "ABCD"


def test_load_reads_toml_and_names_the_file(tmp_path: Path) -> None:
    good = tmp_path / "c.toml"
    good.write_text('sandbox = "nono"\ndomains = ["pypi.org"]\n')
    facts = FACTS._replace(cwd=str(tmp_path))  # load also checks the host: a real workdir
    cfg = config_file.load(str(good), facts)
    assert cfg.sandbox == "nono" and cfg.domains == ("pypi.org",)
    bad = tmp_path / "bad.toml"
    bad.write_text("sandbox = \n")
    with pytest.raises(ConfigError, match=r"bad\.toml line 1, column 11: not valid TOML"):
        config_file.load(str(bad), facts)
    with pytest.raises(ConfigError, match="does not exist"):
        config_file.load(str(tmp_path / "missing.toml"), facts)


def test_command_line_overrides_win(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('sandbox = "nono"\n')
    facts = FACTS._replace(cwd=str(tmp_path))
    cfg = config_file.load(str(f), facts, overrides={"sandbox": "bwrap", "workdir": None})
    assert cfg.sandbox == "bwrap"
    assert cfg.workdir == str(tmp_path)


def test_a_missing_default_file_is_fine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config_file.load(None, FACTS._replace(cwd=str(tmp_path))).sandbox == "auto"
