"""kubeconfig-proxify's pure rewrite: which clusters change, and nothing else does."""

from __future__ import annotations

import copy
import ipaddress
import socket

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from libbroker.errors import KubeconfigError, UsageError
from libegress.kubeconfig import (
    check_proxy_url,
    is_loopback_host,
    parse_inet_aton,
    proxify,
    server_host,
)

PROXY = "socks5://127.0.0.1:1080"


def kubeconfig(*servers: str, extra: str = "") -> str:
    """A kubectl-shaped kubeconfig with one cluster per server."""
    clusters = "".join(
        f"- cluster:\n"
        f"    certificate-authority-data: TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2s=\n"
        f"    server: {server}\n"
        f"  name: c{i}\n"
        for i, server in enumerate(servers)
    )
    return (
        "apiVersion: v1\n"
        f"clusters:\n{clusters}"
        "contexts:\n- context:\n    cluster: c0\n    user: u0\n  name: c0\n"
        "current-context: c0\nkind: Config\npreferences: {}\n"
        "users:\n- name: u0\n  user:\n    token: abc\n" + extra
    )


def proxied(text: str) -> list[str | None]:
    return [c["cluster"].get("proxy-url") for c in yaml.safe_load(text)["clusters"]]


# --- loopback -----------------------------------------------------------------

LOOPBACK = [
    "127.0.0.1", "127.255.255.254", "127.1", "127.0.1", "0x7f.1", "0x7F000001",
    "0177.0.0.1", "2130706433", "017700000001", "localhost", "LOCALHOST", "localhost.",
    "api.localhost", "::1", "0:0:0:0:0:0:0:1", "::1%lo", "::ffff:127.0.0.1",
    "0.0.0.0", "0", "::",
]
REMOTE = [
    "128.0.0.1", "126.255.255.255", "10.0.0.1", "192.168.1.1", "8.8.8.8", "2001:db8::1",
    "::2", "fe80::1", "example.com", "localhost.example.com", "mylocalhost", "127.0.0.1.nip.io",
    "2147483648", "4294967296", "0x", "127.0.0.256", "0x7f.0.0.0.1", "127..1", "", "0189.0.0.1",
]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_spellings_count_as_loopback(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", REMOTE)
def test_other_hosts_do_not(host: str) -> None:
    assert not is_loopback_host(host)


def _spell(number: int, parts: int, bases: list[int]) -> str:
    """``number`` written the inet_aton way, in ``parts`` parts and the given bases."""
    sizes = [1] * (parts - 1) + [4 - (parts - 1)]
    values, shift = [], 32
    for size in sizes:
        shift -= 8 * size
        values.append((number >> shift) & ((1 << (8 * size)) - 1))
    out = []
    for value, base in zip(values, bases, strict=False):
        out.append({10: str(value), 8: "0" + format(value, "o"), 16: hex(value)}[base])
    return ".".join(out)


@given(
    number=st.integers(0, 2**32 - 1),
    parts=st.integers(1, 4),
    bases=st.lists(st.sampled_from([8, 10, 16]), min_size=4, max_size=4),
)
def test_inet_aton_spellings_match_the_c_library(number: int, parts: int, bases: list[int]) -> None:
    text = _spell(number, parts, bases)
    assert parse_inet_aton(text) == ipaddress.IPv4Address(number)
    assert socket.inet_aton(text) == ipaddress.IPv4Address(number).packed
    assert is_loopback_host(text) == (number >> 24 == 127 or number == 0)


@given(st.text(alphabet="0123456789abcdefxX.", max_size=20))
def test_inet_aton_agrees_with_the_c_library_or_refuses(text: str) -> None:
    ours = parse_inet_aton(text)
    if ours is not None:  # every address we read, the resolver reads the same way
        assert socket.inet_aton(text) == ours.packed


@pytest.mark.parametrize(
    ("server", "host"),
    [
        ("https://127.0.0.1:6443", "127.0.0.1"),
        ("https://[::1]:6443", "::1"),
        ("https://LocalHost:6443/prefix", "localhost"),
        ("localhost:6443", "localhost"),  # client-go adds https://
        ("http://10.1.2.3", "10.1.2.3"),
    ],
)
def test_server_host(server: str, host: str) -> None:
    assert server_host(server) == host


@pytest.mark.parametrize(
    "server",
    ["", "https://[::1:6443", "https://127.0.0.1:99999", "https://127.0.0.1:port",
     "ftp://127.0.0.1", "https://", "https://127.0.0.1 :6443", "https://a\nb"],
)
def test_unparseable_servers_are_errors(server: str) -> None:
    with pytest.raises(KubeconfigError, match="cannot be parsed"):
        server_host(server)


@pytest.mark.parametrize("url", ["socks5://127.0.0.1:1080", "http://127.0.0.1:3128",
                                 "https://proxy.example:443"])
def test_proxy_urls_client_go_understands(url: str) -> None:
    assert check_proxy_url(url) == url


@pytest.mark.parametrize("url", ["", "127.0.0.1:1080", "ftp://x:1", "socks5://", "socks4://x:1",
                                 "socks5://x:0x50", "socks5://x :1"])
def test_other_proxy_urls_are_usage_errors(url: str) -> None:
    with pytest.raises(UsageError):
        check_proxy_url(url)


# --- the rewrite --------------------------------------------------------------


def test_kind_cluster_gets_the_proxy() -> None:
    text = kubeconfig("https://127.0.0.1:41235").replace("name: c0\n", "name: kind-lab\n", 1)
    out, changed = proxify(text, PROXY)
    assert changed == 1
    before, after = yaml.safe_load(text), yaml.safe_load(out)
    expected = copy.deepcopy(before)
    expected["clusters"][0]["cluster"]["proxy-url"] = PROXY
    assert after == expected
    assert after["clusters"][0]["name"] == "kind-lab"
    # proxy-url sits right after server; every other key keeps its place.
    assert list(after["clusters"][0]["cluster"]) == [
        "certificate-authority-data", "server", "proxy-url"]
    assert list(after) == list(before)


def test_mixed_loopback_and_remote_clusters() -> None:
    servers = ["https://127.0.0.1:6443", "https://k8s.example.com", "https://[::1]:6443",
               "https://10.0.0.5:6443", "https://localhost.:6443", "https://2130706433:6443",
               "https://[2001:db8::1]:443"]
    out, changed = proxify(kubeconfig(*servers), PROXY)
    assert changed == 4
    assert proxied(out) == [PROXY, None, PROXY, None, PROXY, PROXY, None]
    before, after = yaml.safe_load(kubeconfig(*servers)), yaml.safe_load(out)
    for b, a in zip(before["clusters"], after["clusters"], strict=True):
        a["cluster"].pop("proxy-url", None)
        assert a == b


def test_already_proxified_is_unchanged_byte_for_byte() -> None:
    once, changed = proxify(kubeconfig("https://127.0.0.1:6443", "https://example.com"), PROXY)
    assert changed == 1
    twice, changed_again = proxify(once, PROXY)
    assert (twice, changed_again) == (once, 0)


def test_no_loopback_cluster_returns_the_input_itself() -> None:
    text = "# a comment that must survive\n" + kubeconfig("https://example.com:443")
    assert proxify(text, PROXY) == (text, 0)


def test_a_stale_proxy_is_replaced_in_place() -> None:
    text = kubeconfig("https://127.0.0.1:6443").replace(
        "    server: https://127.0.0.1:6443\n",
        "    proxy-url: socks5://127.0.0.1:9\n    server: https://127.0.0.1:6443\n")
    out, changed = proxify(text, PROXY)
    assert changed == 1
    cluster = yaml.safe_load(out)["clusters"][0]["cluster"]
    assert list(cluster) == ["certificate-authority-data", "proxy-url", "server"]
    assert cluster["proxy-url"] == PROXY


def test_untouched_scalars_keep_their_source_form() -> None:
    extra = "x-octal: 0123\nx-quoted: 'yes'\nx-flow: {a: 1, b: [2, 3]}\nx-date: 2024-01-01\n"
    out, changed = proxify(kubeconfig("https://127.0.0.1:6443", extra=extra), PROXY)
    assert changed == 1
    for line in extra.splitlines():
        assert line in out.splitlines()


def test_shared_cluster_via_alias_changes_once_per_entry() -> None:
    text = ("clusters:\n- name: a\n  cluster: &c\n    server: https://127.0.0.1:1\n"
            "- name: b\n  cluster: *c\n")
    out, changed = proxify(text, PROXY)
    assert changed == 1  # the second entry is the same node, already changed
    assert proxied(out) == [PROXY, PROXY]


@given(st.lists(st.sampled_from(LOOPBACK[:12] + REMOTE[:10]), min_size=1, max_size=6),
       st.sampled_from([PROXY, "http://127.0.0.1:3128"]))
def test_idempotent_and_exactly_the_loopback_ones(hosts: list[str], proxy: str) -> None:
    servers = [f"https://[{h}]:6443" if ":" in h else f"https://{h}:6443" for h in hosts]
    text = kubeconfig(*servers)
    out, changed = proxify(text, proxy)
    expected = [proxy if is_loopback_host(h) else None for h in hosts]
    assert proxied(out) == expected
    assert changed == sum(e is not None for e in expected)
    assert proxify(out, proxy) == (out, 0)


# --- refusals -----------------------------------------------------------------

BAD: list[tuple[str, str]] = [
    ("clusters: [\n", "not valid YAML"),
    ("a: 1\n---\nb: 2\n", "not valid YAML"),
    ("", "not a mapping"),
    ("- just\n- a list\n", "not a mapping"),
    ("apiVersion: v1\nkind: Config\n", "no clusters"),
    ("clusters: []\n", "no clusters"),
    ("clusters: {a: 1}\n", "no clusters"),
    ("clusters:\n- 42\n", "not a mapping"),
    ("clusters:\n- name: x\n", "no cluster mapping"),
    ("clusters:\n- name: x\n  cluster: {}\n", "no server"),
    ("clusters:\n- name: x\n  cluster: {server: [1]}\n", "no server"),
    ("clusters:\n- name: x\n  cluster: {server: 'https://[::1'}\n", "cannot be parsed"),
    ("clusters:\n- name: x\n  cluster:\n    server: https://127.0.0.1:1\n"
     "    server: https://e.com\n", "twice"),
    ("base: &b {server: https://127.0.0.1:1}\nclusters:\n- name: x\n  cluster:\n    <<: *b\n",
     "merge key"),
    ("clusters:\n- cluster: !!python/object:os.system {server: x}\n  name: x\n", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_unusable_input_is_refused_with_a_message(text: str, message: str) -> None:
    with pytest.raises(KubeconfigError, match=message):
        proxify(text, PROXY)


def test_an_error_in_a_later_cluster_refuses_the_whole_file() -> None:
    with pytest.raises(KubeconfigError, match="'c1'"):
        proxify(kubeconfig("https://127.0.0.1:6443", "https://127.0.0.1:99999"), PROXY)
