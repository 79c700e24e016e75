"""Profiles and the pure parts of the backends: env policy, bwrap argv, Landlock rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.broker.bwrap_executor import bwrap_args
from libbroker.broker.landlock_executor import landlock_rules
from libbroker.broker.profile import (
    DEFAULT_ENV_ALLOW,
    Profile,
    command_environment,
    default_profile,
    parse_profile,
)
from libbroker.errors import ConfigError
from libbroker.sandbox.landlock import Rule


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8)), st.lists(st.text()))
def test_environment_is_exactly_the_allowed_server_values(env, allow) -> None:
    got = command_environment(env, allow, tmpdir="/t")
    assert got["TMPDIR"] == "/t"
    for name, value in got.items():
        if name != "TMPDIR":
            assert name in allow and env[name] == value and not name.startswith("NONO_")


def test_nono_variables_never_pass() -> None:
    env = {"NONO_PROFILE": "x", "PATH": "/bin", "TMPDIR": "/host-tmp"}
    assert command_environment(env, ["NONO_PROFILE", "PATH", "TMPDIR"]) == {"PATH": "/bin"}


def test_default_profile() -> None:
    p = default_profile()
    assert p.env_allow == DEFAULT_ENV_ALLOW and p.proxy_port is None
    assert "/usr" in p.read and p.write == () and p.deny == ()


def test_parse_profile() -> None:
    p = parse_profile(
        {
            "filesystem": {"read": ["/srv/data/"], "write": ["/srv/out"], "deny": ["/srv/data/k"]},
            "network": {"mode": "proxy", "port": 3128},
            "environment": {"allow_vars": ["PATH", "AGENT_SANDBOX"]},
        }
    )
    assert "/srv/data" in p.read and p.write == ("/srv/out",) and p.deny == ("/srv/data/k",)
    assert p.proxy_port == 3128 and p.env_allow == ("PATH", "AGENT_SANDBOX")


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"fs": {}},
        {"filesystem": {"read": "/x"}},
        {"filesystem": {"read": ["relative"]}},
        {"network": {"mode": "proxy"}},
        {"network": {"mode": "proxy", "port": 70000}},
        {"network": {"mode": "none", "port": 1}},
        {"network": {"mode": "all"}},
        {"environment": {"allow_vars": ["A=B"]}},
        {"environment": {"allow_vars": ["NONO_BLOCK_NET"]}},
    ],
)
def test_bad_profiles_are_refused(body) -> None:
    with pytest.raises(ConfigError):
        parse_profile(body)


def test_bwrap_args_shape(tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("x")
    profile = Profile(read=("/usr", "/etc"), write=(), deny=(str(secret),))
    args = bwrap_args(profile, str(tmp_path), str(tmp_path), 9)
    joined = " ".join(args)
    assert args[:7] == ["--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
                        "--new-session", "--info-fd", "9"]  # fmt: skip
    assert "--ro-bind /usr /usr" in joined and "--tmpfs /tmp" in joined
    assert f"--bind {tmp_path} {tmp_path}" in joined
    # The deny comes after the workdir bind, so it covers it.
    assert joined.index(f"--ro-bind /dev/null {secret}") > joined.index(f"--bind {tmp_path}")
    assert args[-2:] == ["--chdir", str(tmp_path)]


def test_landlock_rules(tmp_path) -> None:
    (tmp_path / "w").mkdir()
    w = str(tmp_path / "w")
    rules = landlock_rules(Profile(read=("/usr", "/nonexistent-xyz")), w).rules
    assert Rule("/usr", False, True) in rules and Rule(w, True, True) in rules
    assert Rule("/dev/null", True, False) in rules and Rule("/proc", False, True) in rules
    assert not any(r.path == "/nonexistent-xyz" for r in rules)
    # deny wins over a grant inside it; a deny inside a grant cannot be enforced.
    rules = landlock_rules(Profile(read=("/usr/share",), deny=("/usr",)), w).rules
    assert not any(r.path.startswith("/usr") for r in rules)
    with pytest.raises(ConfigError, match="cannot deny /usr/share"):
        landlock_rules(Profile(read=("/usr",), deny=("/usr/share",)), w)
