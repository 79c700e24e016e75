"""Gateway credentials: the wire forms and the check (pure).

In gateway mode (``egress-proxy --control=PATH``) every client names its
tenant with a user name and password: ``Proxy-Authorization: Basic`` on HTTP
(RFC 9110 11.7.1, RFC 7617) and the username/password method on SOCKS5
(RFC 1929).  The proxy keeps only a SHA-256 digest of each password (they are
minted with 256 random bits, so a slow hash buys nothing) and compares digests
with :func:`hmac.compare_digest`; an unknown user name is compared against a
dummy digest, so the time taken says nothing about which names exist.
Nothing here logs or formats a password: a refusal's reason is one of the
fixed texts below.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets

from libbroker.named_tuple import NamedTuple

# SOCKS5 (RFC 1928 3, RFC 1929 2).
USERPASS = 0x02
AUTH_VERSION = 0x01
AUTH_OK = bytes([AUTH_VERSION, 0x00])
AUTH_FAILED = bytes([AUTH_VERSION, 0x01])

REALM = b'Basic realm="egress-proxy"'
MISSING = "proxy credentials required"
MALFORMED = "malformed proxy credentials"
WRONG = "wrong proxy credentials"
CHANGED = "proxy credentials changed on a kept-alive connection"

# A tenant's name is its user name: printable, no ':' (Basic splits there).
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A password given by the caller: long enough to be a secret, and sendable in
# both Basic and RFC 1929 (at most 255 bytes there).
PASSWORD = re.compile(r"^[\x21-\x7e]{24,255}$")
_DUMMY = hashlib.sha256(b"egress-proxy: no such tenant").digest()


class BadCredentials(ValueError):
    """A credential that cannot be read; the message is one of the fixed texts."""


class TenantFull(Exception):
    """A tenant holds as many connections as it may (its ``max_conns``): refuse one more."""


class Credentials(NamedTuple):
    """A client's user name (its tenant's name) and password, as it sent them."""

    user: str
    password: str


def mint_password() -> str:
    """A fresh password: 256 random bits, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def digest(password: str) -> bytes:
    return hashlib.sha256(password.encode("utf-8")).digest()


def parse_basic(values: list[bytes]) -> Credentials:
    """The credentials in the ``Proxy-Authorization`` values; BadCredentials if not one Basic."""
    if not values:
        raise BadCredentials(MISSING)
    if len(values) != 1:
        raise BadCredentials(MALFORMED)
    scheme, _, encoded = values[0].strip().partition(b" ")
    if scheme.lower() != b"basic":
        raise BadCredentials(MALFORMED)
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadCredentials(MALFORMED) from None
    user, colon, password = decoded.partition(":")
    if not colon:
        raise BadCredentials(MALFORMED)
    return Credentials(user, password)


def parse_userpass(buf: bytes) -> tuple[Credentials, int] | None:
    """An RFC 1929 request in ``buf`` and its size, or None for more bytes."""
    if len(buf) < 2:
        return None
    if buf[0] != AUTH_VERSION:
        raise BadCredentials(MALFORMED)
    user_end = 2 + buf[1]
    if len(buf) < user_end + 1:
        return None
    end = user_end + 1 + buf[user_end]
    if len(buf) < end:
        return None
    try:
        user = buf[2:user_end].decode("utf-8")
        password = buf[user_end + 1 : end].decode("utf-8")
    except UnicodeDecodeError:
        raise BadCredentials(MALFORMED) from None
    return Credentials(user, password), end


def userpass_request(user: str, password: str) -> bytes:
    """The RFC 1929 request a client sends (for tests and the bench)."""
    u, p = user.encode(), password.encode()
    return bytes([AUTH_VERSION, len(u)]) + u + bytes([len(p)]) + p


def matches(stored: bytes | None, password: str) -> bool:
    """Whether ``password`` hashes to ``stored``; constant time, also when there is none."""
    same = hmac.compare_digest(stored if stored is not None else _DUMMY, digest(password))
    return same and stored is not None
