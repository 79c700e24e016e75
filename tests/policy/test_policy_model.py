"""The Policy model: strict loading, clear errors naming the key, a faithful round trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.errors import PolicyError
from libpolicy.model import CONTRACT_KEYS, Policy

FULL: dict[str, Any] = {
    "home": "/home/u",
    "runtime": "/run/user/1000",
    "read": ["/home/u/.config/gh", "/run/user/1000/egress"],
    "write": ["/home/u/src/proj"],
    "deny": ["/home/u/src/proj/.scan"],
    "harness": "/home/u/.claude",
    "tool_write": ["/home/u/.claude/projects"],
    "domains": ["github.com", "*.pythonhosted.org", "example.com:8443"],
    "proxy_port": 3128,
}


def test_the_contract_document_loads_and_round_trips() -> None:
    policy = Policy.from_json(json.dumps(FULL))
    assert policy.to_dict() == FULL
    assert Policy.from_json(policy.to_json()) == policy
    assert tuple(FULL) == CONTRACT_KEYS


def test_optional_rendering_fields_round_trip() -> None:
    doc = dict(FULL, socks_port=1080, egress="/run/user/1000/egress",
               env={"GIT_CONFIG_COUNT": "1"}, hook="/usr/bin/policy-hook")
    policy = Policy.from_dict(doc)
    assert policy.to_dict() == doc
    assert Policy.from_json(policy.to_json()) == policy


def test_built_in_python_equals_loaded() -> None:
    built = Policy("/home/u", runtime="/run/user/1000", read=FULL["read"], write=FULL["write"],
                   deny=FULL["deny"], harness="/home/u/.claude", tool_write=FULL["tool_write"],
                   domains=FULL["domains"], proxy_port=3128)
    assert built == Policy.from_dict(FULL)
    assert hash(built) == hash(Policy.from_dict(FULL))


def test_only_home_is_required() -> None:
    policy = Policy.from_dict({"home": "/h"})
    assert (policy.runtime, policy.read, policy.harness, policy.proxy_port) == ("", (), "", None)


@pytest.mark.parametrize(("change", "fragment"), [
    ({"allow": []}, "'allow' is not known"),
    ({"tool-write": []}, "'tool-write' is not known"),
    ({"home": "home/u"}, "'home'"),
    ({"home": 3}, "'home': a path must be a string"),
    ({"home": "/home/u/"}, "'home'"),
    ({"runtime": "/run//user"}, "'runtime'"),
    ({"read": ["/home/u/./x"]}, "'read'"),
    ({"write": ["/home/u/a/../b"]}, "'write'"),
    ({"write": "/home/u/x"}, "'write': must be a list"),
    ({"deny": ["relative"]}, "'deny'"),
    ({"deny": ["//home/u"]}, "'deny'"),
    ({"harness": "/x\x00y"}, "'harness'"),
    ({"tool_write": [None]}, "'tool_write'"),
    ({"domains": ["exa mple.com"]}, "'domains'"),
    ({"domains": "github.com"}, "'domains'"),
    ({"domains": [""]}, "'domains'"),
    ({"proxy_port": 0}, "'proxy_port'"),
    ({"proxy_port": 70000}, "'proxy_port'"),
    ({"proxy_port": "3128"}, "'proxy_port'"),
    ({"proxy_port": True}, "'proxy_port'"),
    ({"socks_port": -1}, "'socks_port'"),
    ({"env": {"1BAD": "x"}}, "'env'"),
    ({"env": {"OK": 1}}, "'env'"),
    ({"env": []}, "'env'"),
    ({"hook": "a\nb"}, "'hook'"),
    ({"egress": "rel"}, "'egress'"),
])
def test_invalid_documents_name_the_bad_key(change: dict[str, object], fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({**FULL, **change})
    assert fragment in str(info.value)


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "not valid JSON"),
    ("[]", "must be a JSON object"),
    ("{}", "'home' is missing"),
    (b"\xff", "not valid JSON"),
])
def test_not_a_policy_document(text: str | bytes, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_json(text)
    assert fragment in str(info.value)


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    with pytest.raises(PolicyError, match="cannot read policy"):
        Policy.load(str(path))
    path.write_text('{"home": "/h", "wirte": []}')
    with pytest.raises(PolicyError, match=f"{path}: policy key 'wirte'"):
        Policy.load(str(path))


clean_paths = st.lists(st.from_regex(r"[a-z0-9_.-]{1,8}", fullmatch=True)
                       .filter(lambda s: s not in (".", "..")), min_size=1, max_size=4).map(
    lambda parts: "/" + "/".join(parts))


@given(home=clean_paths, read=st.lists(clean_paths, max_size=3),
       write=st.lists(clean_paths, max_size=3), deny=st.lists(clean_paths, max_size=2),
       port=st.none() | st.integers(1, 65535))
def test_round_trip_property(home: str, read: list[str], write: list[str], deny: list[str],
                             port: int | None) -> None:
    policy = Policy(home, read=read, write=write, deny=deny, proxy_port=port)
    assert Policy.from_json(policy.to_json()) == policy
