"""The proxy's certificate authority, made in memory for one run.

The CA exists so the proxy can terminate TLS for the inject hosts (and set the
token there).  A client that trusts it must trust it for those hosts alone, so
the CA carries a *critical* NameConstraints extension permitting only their DNS
names (and excluding every IP address), a path length of 0, and a short
validity.  Its private key lives in this process's memory only: it is never
serialised.  Leaf keys are handed to OpenSSL through an anonymous memory file
(memfd), since ``ssl`` loads certificates from paths alone.
"""

from __future__ import annotations

import datetime
import os
import threading
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from libbroker.errors import EgressError
from libegress import der

if TYPE_CHECKING:
    import ssl

    from cryptography import x509

CA_NAME = "agent-sandbox egress proxy CA"
CA_VALIDITY = datetime.timedelta(days=14)
LEAF_VALIDITY = datetime.timedelta(days=3)
# Leaves are reissued this long before they expire.
LEAF_RENEW_MARGIN = datetime.timedelta(hours=6)
# Tolerates a client clock a little behind ours.
BACKDATE = datetime.timedelta(hours=1)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Authority:
    """A CA certificate (DER) and its in-memory key.

    ``cryptography.x509`` is imported only when the parsed certificate is
    needed (:attr:`cert`: issuing the first leaf), not to make the CA.
    """

    def __init__(self, cert_der: bytes, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert_der = cert_der
        self.key = key
        self._cert: x509.Certificate | None = None

    @property
    def cert(self) -> x509.Certificate:
        """The CA certificate, parsed."""
        if self._cert is None:
            from cryptography import x509

            self._cert = x509.load_der_x509_certificate(self.cert_der)
        return self._cert

    def cert_pem(self) -> bytes:
        """The CA certificate, PEM (public; this is what clients trust)."""
        return der.pem(self.cert_der)


class _EcdsaSha256(ec.ECDSA):
    """ecdsa-with-SHA256, randomised (RFC 5758), as ``ec.ECDSA(hashes.SHA256())`` is.

    Without ``ec.ECDSA.__init__``, which imports cryptography's whole OpenSSL
    backend (RSA, ciphers, random...: ~5 ms of CPU before the proxy's
    ``listening``) only to check the deterministic variant asked for; key.sign
    reads these two properties (tests/egress/test_egress_der.py verifies the
    signature).
    """

    def __init__(self) -> None:  # not ec.ECDSA's (above)
        pass

    @property
    def algorithm(self) -> hashes.HashAlgorithm:
        return hashes.SHA256()

    @property
    def deterministic_signing(self) -> bool:
        return False


def key_identifier(public_point: bytes) -> bytes:
    """RFC 5280 4.2.1.2 method 1: SHA-1 of the subjectPublicKey bits.

    With cryptography's SHA-1, loaded already: hashlib (its _hashlib) would cost
    the proxy ~2.7 ms of CPU before ``listening`` for this one digest.
    """
    digest = hashes.Hash(hashes.SHA1())  # noqa: S303 - RFC 5280's identifier, not a signature
    digest.update(public_point)
    return digest.finalize()


def make_authority(permitted_hosts: list[str]) -> Authority:
    """A new CA whose certificates are valid for ``permitted_hosts`` only.

    The shape (see :func:`libegress.der.ca_tbs`): P-256, BasicConstraints CA
    with path length 0, critical NameConstraints permitting the hosts' DNS
    names and excluding every IP address, KeyUsage keyCertSign and cRLSign.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    numbers = key.public_key().public_numbers()
    point = der.p256_point(numbers.x, numbers.y)
    now = _now().replace(microsecond=0)
    # With no inject host the CA still permits one name only, under the reserved
    # ".invalid" TLD (RFC 6761): an empty permitted list would mean no DNS limit.
    permitted = permitted_hosts or ["no-inject-hosts.invalid"]
    tbs = der.ca_tbs(
        cn=CA_NAME,
        # As x509.random_serial_number(): 159 random bits.
        serial=int.from_bytes(os.urandom(20), "big") >> 1,
        not_before=now - BACKDATE,
        not_after=now + CA_VALIDITY,
        spki=der.p256_spki(point),
        key_id=key_identifier(point),
        permitted_dns=permitted,
    )
    signature = key.sign(tbs, _EcdsaSha256())
    return Authority(der.certificate(tbs, signature), key)


def issue_leaf(
    authority: Authority, host: str
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for ``host`` signed by ``authority``.

    This does not check ``host`` against the constraints: :class:`LeafCache`
    does, and the tests use this to show clients reject an outside host.
    """
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + LEAF_VALIDITY, authority.cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
            critical=False,
        )
        .sign(authority.key, hashes.SHA256())
    )
    return cert, key


def server_context(
    cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, chain: x509.Certificate
) -> ssl.SSLContext:
    """A TLS server context presenting ``cert`` (and its CA) with ``key``.

    The PEM goes to OpenSSL through a memfd, which never touches a file system.
    """
    import ssl  # with the first leaf: the CA is made before the proxy says `listening`, ssl after

    from cryptography.hazmat.primitives import serialization

    pem = (
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + cert.public_bytes(serialization.Encoding.PEM)
        + chain.public_bytes(serialization.Encoding.PEM)
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    fd = os.memfd_create("egress-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return ctx


class LeafCache:
    """Server contexts for the inject hosts, issued on first use and cached."""

    def __init__(self, authority: Authority, hosts: list[str]) -> None:
        self.authority = authority
        self._hosts = frozenset(hosts)
        self._cache: dict[str, tuple[ssl.SSLContext, datetime.datetime]] = {}
        self._lock = threading.Lock()

    def context_for(self, host: str) -> ssl.SSLContext:
        """The server context for inject host ``host``; others are refused."""
        if host not in self._hosts:
            raise EgressError(f"no certificate is issued for {host}: not an inject host")
        with self._lock:
            hit = self._cache.get(host)
            if hit is not None and hit[1] - LEAF_RENEW_MARGIN > _now():
                return hit[0]
            cert, key = issue_leaf(self.authority, host)
            ctx = server_context(cert, key, self.authority.cert)
            self._cache[host] = (ctx, cert.not_valid_after_utc)
            return ctx

    def forget(self) -> None:
        """Drop every cached leaf (the benchmark measures a cold issuance)."""
        with self._lock:
            self._cache.clear()
