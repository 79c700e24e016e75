"""The proxy CA's certificate as DER bytes, built without ``cryptography.x509`` (pure).

Importing ``cryptography.x509`` costs more than half of egress-proxy's start
(its Python modules compile dozens of regular expressions and enums), and the
CA must exist before the proxy says ``listening``.  Its certificate has one
fixed shape (:mod:`libegress.ca`), so it is encoded here from the few values
that vary; the signature comes from the key itself (``cryptography``'s
``ec`` module, which is cheap).  Leaves are issued later, on the first
connection to an inject host, with the full X.509 builder.

A test holds :func:`ca_tbs` byte-for-byte equal to what
``x509.CertificateBuilder`` makes from the same values.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress

# Object identifiers, DER-encoded (tag, length and value).
OID_COMMON_NAME = bytes.fromhex("0603550403")  # 2.5.4.3
OID_ECDSA_SHA256 = bytes.fromhex("06082a8648ce3d040302")  # 1.2.840.10045.4.3.2
OID_BASIC_CONSTRAINTS = bytes.fromhex("0603551d13")  # 2.5.29.19
OID_NAME_CONSTRAINTS = bytes.fromhex("0603551d1e")  # 2.5.29.30
OID_KEY_USAGE = bytes.fromhex("0603551d0f")  # 2.5.29.15
OID_SUBJECT_KEY_ID = bytes.fromhex("0603551d0e")  # 2.5.29.14

# SubjectPublicKeyInfo of a P-256 key up to its point: SEQUENCE { SEQUENCE {
# id-ecPublicKey, prime256v1 }, BIT STRING (65 bytes: 04 || X || Y) }.
_P256_SPKI_HEAD = bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d030107034200")

_SEQUENCE, _SET = 0x30, 0x31
_TRUE = b"\x01\x01\xff"


def tlv(tag: int, value: bytes) -> bytes:
    """One DER element: tag, definite length, value."""
    n = len(value)
    if n < 0x80:
        return bytes([tag, n]) + value
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + value


def seq(*items: bytes) -> bytes:
    return tlv(_SEQUENCE, b"".join(items))


def integer(value: int) -> bytes:
    """A DER INTEGER (two's complement, shortest form)."""
    if value < 0:
        raise ValueError("only non-negative integers are encoded here")
    return tlv(0x02, value.to_bytes(value.bit_length() // 8 + 1, "big"))


def bit_string(data: bytes) -> bytes:
    """A BIT STRING of whole bytes (no unused bits)."""
    return tlv(0x03, b"\x00" + data)


def time(when: datetime.datetime) -> bytes:
    """RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime after; whole seconds, UTC."""
    when = when.astimezone(datetime.UTC)
    if when.year < 2050:
        return tlv(0x17, when.strftime("%y%m%d%H%M%SZ").encode())
    return tlv(0x18, when.strftime("%Y%m%d%H%M%SZ").encode())


def common_name(cn: str) -> bytes:
    """A Name with one CN attribute, as a UTF8String."""
    return seq(tlv(_SET, seq(OID_COMMON_NAME, tlv(0x0C, cn.encode()))))


def _extension(oid: bytes, value: bytes, critical: bool) -> bytes:
    return seq(oid, _TRUE if critical else b"", tlv(0x04, value))


def name_constraints(permitted_dns: list[str]) -> bytes:
    """Permitted: those DNS names; excluded: every IPv4 and IPv6 address."""
    permitted = b"".join(seq(tlv(0x82, h.encode("ascii"))) for h in permitted_dns)
    excluded = b"".join(
        seq(tlv(0x87, net.network_address.packed + net.netmask.packed))
        for net in (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
    )
    return seq(tlv(0xA0, permitted), tlv(0xA1, excluded))


def p256_point(x: int, y: int) -> bytes:
    """The uncompressed point of a P-256 public key (SEC 1: 04 || X || Y)."""
    return b"\x04" + x.to_bytes(32, "big") + y.to_bytes(32, "big")


def p256_spki(point: bytes) -> bytes:
    """The DER SubjectPublicKeyInfo of a P-256 public key's uncompressed ``point``."""
    if len(point) != 65 or point[0] != 4:
        raise ValueError("not an uncompressed P-256 point")
    return _P256_SPKI_HEAD + point


def ca_tbs(
    *,
    cn: str,
    serial: int,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    spki: bytes,
    key_id: bytes,
    permitted_dns: list[str],
) -> bytes:
    """The CA's TBSCertificate: self-issued, ecdsa-with-SHA256, and these extensions:

    BasicConstraints (critical, CA, path length 0), NameConstraints
    (critical), KeyUsage (critical: keyCertSign, cRLSign), SubjectKeyIdentifier.
    ``spki`` is the DER SubjectPublicKeyInfo, ``key_id`` its identifier
    (:func:`libegress.ca.key_identifier`).
    """
    name = common_name(cn)
    extensions = [
        _extension(OID_BASIC_CONSTRAINTS, seq(_TRUE, integer(0)), critical=True),
        _extension(OID_NAME_CONSTRAINTS, name_constraints(permitted_dns), critical=True),
        # Bits 5 (keyCertSign) and 6 (cRLSign): 0b00000110, one unused bit.
        _extension(OID_KEY_USAGE, tlv(0x03, b"\x01\x06"), critical=True),
        _extension(OID_SUBJECT_KEY_ID, tlv(0x04, key_id), critical=False),
    ]
    return seq(
        tlv(0xA0, integer(2)),  # version: v3
        integer(serial),
        seq(OID_ECDSA_SHA256),
        name,
        seq(time(not_before), time(not_after)),
        name,
        spki,
        tlv(0xA3, seq(*extensions)),
    )


def certificate(tbs: bytes, signature: bytes) -> bytes:
    """The Certificate: ``tbs`` and its DER ECDSA ``signature`` (ecdsa-with-SHA256)."""
    return seq(tbs, seq(OID_ECDSA_SHA256), bit_string(signature))


def pem(der: bytes) -> bytes:
    """A CERTIFICATE PEM block (64-character lines), as OpenSSL writes it."""
    body = base64.b64encode(der)
    lines = b"".join(body[i : i + 64] + b"\n" for i in range(0, len(body), 64))
    return b"-----BEGIN CERTIFICATE-----\n" + lines + b"-----END CERTIFICATE-----\n"
