"""Host canonicalisation: one spelling per host, numeric hosts are addresses."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libegress import hosts
from libegress.hosts import BadHost, canonical_host, parse_authority, parse_ipv4_loose


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("EXAMPLE.com.", "example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("XN--BCHER-KVA.example", "xn--bcher-kva.example"),
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7F.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("0", "0.0.0.0"),
        ("127.0.0.1.", "127.0.0.1"),
        ("[::1]", "::1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("[::FFFF:127.0.0.1]", "::ffff:7f00:1"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
        ("_srv.example.com", "_srv.example.com"),
        ("123.example", "123.example"),
    ],
)
def test_canonical_host(raw: str, canonical: str) -> None:
    assert canonical_host(raw) == canonical


@pytest.mark.parametrize(
    "raw",
    ["", ".", "a..b", "exa mple.com", "example.com/x", "user@example.com", "256.1.1.1",
     "4294967296", "0x100000000", "09.1.1.1", "1.2.3.4.5", "example.123", "example.0x1",
     "[::1%eth0]", "fe80::1%25eth0", "-bad.example", "bad-.example", "a" * 64 + ".com",
     "exa\x00mple.com", "exa\r\nmple.com", "[::1", "*.example.com"],
)
def test_bad_hosts_are_refused(raw: str) -> None:
    with pytest.raises(BadHost):
        canonical_host(raw)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("github.com:443", ("github.com", 443)),
        ("GitHub.com.:443", ("github.com", 443)),
        ("[::1]:8080", ("::1", 8080)),
        ("2130706433:80", ("127.0.0.1", 80)),
    ],
)
def test_parse_authority(raw: str, expected: tuple[str, int]) -> None:
    assert parse_authority(raw) == expected


@pytest.mark.parametrize("raw", ["github.com", "github.com:0", "github.com:65536", "a:b:c",
                                 "user@github.com:443", "github.com:+443", "github.com: 443",
                                 "[::1]x:1", "github.com:443/x"])
def test_bad_authorities_are_refused(raw: str) -> None:
    with pytest.raises(BadHost):
        parse_authority(raw)


def test_authority_default_port() -> None:
    assert parse_authority("example.com", default_port=80) == ("example.com", 80)


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_numeric_spelling_is_the_address(n: int) -> None:
    address = ipaddress.IPv4Address(n)
    a, b, c, d = address.packed
    spellings = [str(n), hex(n), oct(n).replace("0o", "0"), f"{a}.{(b << 16) | (c << 8) | d}",
                 f"{a}.{b}.{(c << 8) | d}", f"{hex(a)}.{oct(b).replace('0o', '0')}.{c}.{d}"]
    for spelling in spellings:
        assert canonical_host(spelling) == str(address), spelling
        assert parse_ipv4_loose(spelling) == address


@given(st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9](\.[a-z][a-z0-9]{0,10}){1,3}", fullmatch=True))
def test_names_are_stable_under_case_and_trailing_dot(name: str) -> None:
    assert canonical_host(name.upper() + ".") == canonical_host(name) == name


@pytest.mark.parametrize("text", ["0x", "0X", "0x.1", "1.0x"])
def test_a_bare_0x_is_no_number_as_for_inet_aton(text: str) -> None:
    # glibc's inet_aton refuses these; so must the one parser the proxy and
    # kubeconfig-proxify share, or the two would read a spelling differently.
    assert parse_ipv4_loose(text) is None


def _by_the_codec(raw: str) -> str:
    """canonical_host's answer when every name went through the idna codec (as before
    ASCII names skipped it) and every address through ipaddress."""
    host = raw.strip()
    host = host[:-1] if host.endswith(".") else host
    if not host or len(host) > hosts._MAX_HOST:
        raise BadHost(raw)
    v4 = parse_ipv4_loose(host)
    if v4 is not None:
        return str(v4)
    try:
        ascii_host = host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise BadHost(raw) from None
    labels = ascii_host.split(".")  # the label rules after the codec are unchanged
    if not all(hosts._LABEL.match(x) for x in labels) or hosts._NUMERIC_LABEL.match(labels[-1]):
        raise BadHost(raw)
    return ascii_host


@given(st.one_of(
    st.text(alphabet="abcXYZ019-_.", max_size=80),
    st.text(alphabet=st.characters(max_codepoint=127, exclude_characters=":[]"), max_size=70),
    st.builds(lambda n, m: ".".join(["a" * n] * m), st.integers(0, 70), st.integers(1, 5)),
    st.from_regex(r"\A(0[xX][0-9a-f]{1,9}|[0-9]{1,11})(\.(0[xX][0-9a-f]{1,3}|[0-9]{1,4})){0,3}\.?\Z"),
))  # fmt: skip
def test_ascii_names_and_addresses_as_the_codec_and_ipaddress_spell_them(raw: str) -> None:
    """An ASCII name skips the idna codec and a numeric host ipaddress (the launcher's
    config check loads neither, ~2.5 ms of CPU): same answers, same refusals."""
    try:
        expected: str | None = _by_the_codec(raw)
    except BadHost:
        expected = None
    try:
        got: str | None = canonical_host(raw)
    except BadHost:
        got = None
    assert got == expected
