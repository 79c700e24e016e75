"""The launcher's `repos = [...]`: egress-proxy's --repos for the GitHub token."""

from __future__ import annotations

import pytest

from libbroker.errors import ConfigError
from libbroker.launcher import plan
from libbroker.launcher.config import HostFacts, from_mapping
from libbroker.launcher.runtime import Runtime

FACTS = HostFacts(home="/home/u", cwd="/home/u/work", gh_present=True)
RT = Runtime("/run/user/1/agent-sandbox/session-x")


def test_repos_become_the_proxy_flag() -> None:
    cfg = from_mapping({"repos": ["acme/widgets", "Acme/tools.git"]}, FACTS)
    assert cfg.repos == ("acme/widgets", "Acme/tools.git")
    assert "--repos=acme/widgets,Acme/tools.git" in plan.proxy_args(cfg, RT)


def test_without_repos_no_flag() -> None:
    for data in ({}, {"repos": []}):
        cfg = from_mapping(data, FACTS)
        assert not any(a.startswith("--repos") for a in plan.proxy_args(cfg, RT))


@pytest.mark.parametrize("value", ["acme", "acme/", "/x", "a/b/c", "ac me/x", "acme/..",
                                   "-acme/x", "acme/x,evil/y", "acme/x%2f"])
def test_a_bad_entry_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="repos: entry"):
        from_mapping({"repos": [value]}, FACTS)


def test_repos_must_be_a_list_of_strings() -> None:
    with pytest.raises(ConfigError):
        from_mapping({"repos": "acme/widgets"}, FACTS)
