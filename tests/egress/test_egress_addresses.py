"""Address rules: only public unicast addresses are dialled."""

from __future__ import annotations

import ipaddress

import pytest

from libegress.addresses import parse_cidr, refusal


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.255.0.9", "10.0.0.1", "172.16.5.4", "192.168.1.1", "100.64.0.1",
     "169.254.169.254", "0.0.0.0", "224.0.0.1", "255.255.255.255", "240.0.0.1",
     "192.0.2.1", "198.18.0.1", "::", "::1", "fe80::1", "fc00::1", "fd12:3456::1",
     "ff02::1", "::ffff:127.0.0.1", "::ffff:8.8.8.8", "::127.0.0.1", "64:ff9b::8.8.8.8",
     "2002:7f00:1::", "2001:0:4136:e378::1", "2001:db8::1", "fec0::1"],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "140.82.112.3", "1.1.1.1",
                                     "2606:4700:4700::1111", "2a00:1450:4001:80b::200e"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_allow_cidr_opens_exactly_its_range() -> None:
    allow = [parse_cidr("127.0.0.1/32"), parse_cidr("10.1.0.0/16")]
    assert refusal(ipaddress.ip_address("127.0.0.1"), allow) is None
    assert refusal(ipaddress.ip_address("127.0.0.2"), allow) is not None
    assert refusal(ipaddress.ip_address("10.1.200.3"), allow) is None
    assert refusal(ipaddress.ip_address("10.2.0.1"), allow) is not None
    # The mapped form is not unwrapped into the v4 range.
    assert refusal(ipaddress.ip_address("::ffff:127.0.0.1"), allow) is not None


def test_reasons_name_the_class() -> None:
    assert "link-local" in str(refusal(ipaddress.ip_address("169.254.169.254")))
    assert "IPv4-embedded" in str(refusal(ipaddress.ip_address("::ffff:1.2.3.4")))
