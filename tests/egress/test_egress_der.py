"""The CA certificate built without cryptography.x509 equals the X.509 builder's, byte for byte."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from libegress import ca, der
from libegress.ca import CA_NAME, make_authority

_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
_HOST = st.lists(_LABEL, min_size=1, max_size=4).map(".".join)
_KEY = ec.generate_private_key(ec.SECP256R1())


def _builder_tbs(key: ec.EllipticCurvePrivateKey, serial: int, start: datetime.datetime,
                 end: datetime.datetime, hosts: list[str]) -> bytes:
    """What cryptography's builder makes of the CA's shape (libegress.ca before der.py)."""
    import ipaddress

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    constraints = x509.NameConstraints(
        permitted_subtrees=[x509.DNSName(h) for h in hosts],
        excluded_subtrees=[
            x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
            x509.IPAddress(ipaddress.ip_network("::/0")),
        ],
    )
    usage = x509.KeyUsage(
        digital_signature=False, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(constraints, critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.tbs_certificate_bytes


def _our_tbs(key: ec.EllipticCurvePrivateKey, serial: int, start: datetime.datetime,
             end: datetime.datetime, hosts: list[str]) -> bytes:
    public = key.public_key()
    point = der.p256_point(public.public_numbers().x, public.public_numbers().y)
    assert point == public.public_bytes(serialization.Encoding.X962,
                                        serialization.PublicFormat.UncompressedPoint)
    assert der.p256_spki(point) == public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return der.ca_tbs(
        cn=CA_NAME, serial=serial, not_before=start, not_after=end,
        spki=der.p256_spki(point), key_id=ca.key_identifier(point), permitted_dns=hosts,
    )


@settings(max_examples=60, deadline=None)
@given(
    serial=st.integers(1, (1 << 159) - 1),
    start=st.datetimes(min_value=datetime.datetime(1990, 1, 1),
                       max_value=datetime.datetime(2080, 1, 1)).map(
        lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)),
    days=st.integers(1, 40),
    hosts=st.lists(_HOST, min_size=1, max_size=12),
)
def test_the_tbs_equals_the_x509_builders(serial: int, start: datetime.datetime, days: int,
                                          hosts: list[str]) -> None:
    end = start + datetime.timedelta(days=days)
    assert _our_tbs(_KEY, serial, start, end, hosts) == _builder_tbs(_KEY, serial, start, end,
                                                                     hosts)


def test_a_made_authority_parses_verifies_and_has_the_shape() -> None:
    authority = make_authority(["github.com", "api.github.com"])
    cert = x509.load_pem_x509_certificate(authority.cert_pem())
    assert cert.public_bytes(serialization.Encoding.DER) == authority.cert_der
    assert cert.public_bytes(serialization.Encoding.PEM) == authority.cert_pem()
    cert.verify_directly_issued_by(cert)  # self-signed, ecdsa-with-SHA256, the key's own
    assert cert.signature_hash_algorithm is not None
    assert cert.signature_hash_algorithm.name == "sha256"
    assert cert.subject == cert.issuer
    assert cert.subject.rfc4514_string() == f"CN={CA_NAME}"
    assert 0 < cert.serial_number < 1 << 159
    # The certificate's key is the authority's in-memory key.
    assert cert.public_key() == authority.key.public_key()
    # The same certificate, rebuilt by cryptography from its own values, is identical.
    tbs = _builder_tbs(authority.key, cert.serial_number, cert.not_valid_before_utc,
                       cert.not_valid_after_utc, ["github.com", "api.github.com"])
    assert tbs == cert.tbs_certificate_bytes


def test_long_values_take_long_form_lengths() -> None:
    assert der.tlv(0x04, b"x" * 0x7F)[:2] == b"\x04\x7f"
    assert der.tlv(0x04, b"x" * 0x80)[:3] == b"\x04\x81\x80"
    assert der.tlv(0x04, b"x" * 0x1234)[:4] == b"\x04\x82\x12\x34"
    assert der.integer(0) == b"\x02\x01\x00"
    assert der.integer(0x80) == b"\x02\x02\x00\x80"
