"""Request-head rules the proxy adds on top of h11 (pure).

h11 parses every head; it is also lenient where a proxy must not be: it unfolds
obsolete line folding, merges identical duplicate Content-Length headers and
lets Transfer-Encoding win over Content-Length.  A proxy forwarding such a head
to a server that reads it differently is how requests get smuggled, so those
heads are refused here, from the raw bytes h11 has already accepted, before the
request goes anywhere.  The functions that rewrite headers for the upstream
live here too.
"""

from __future__ import annotations

import base64
import re

from libegress.hosts import BadHost, parse_authority

Headers = list[tuple[bytes, bytes]]

# RFC 9110 7.6.1 hop-by-hop fields, plus the proxy's own.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
     b"transfer-encoding", b"upgrade"}
)
_HEAD_END = re.compile(rb"\r?\n\r?\n")


def head_end(buffer: bytes | bytearray) -> int | None:
    """Where the head in ``buffer`` ends (after its blank line), or None."""
    match = _HEAD_END.search(buffer)
    return match.end() if match else None


def smuggling_reason(head: bytes) -> str | None:
    """Why a raw request head is refused, or None when it is acceptable."""
    if b"\n" in head.replace(b"\r\n", b""):
        return "bare LF line ending in the request head"
    lines = head.split(b"\r\n")[1:]
    content_lengths = 0
    transfer_encodings = 0
    for line in lines:
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            return "obsolete line folding in the request head"
        name = line.split(b":", 1)[0].lower()
        if name != name.strip():
            return "whitespace around a header name"
        if name == b"content-length":
            content_lengths += 1
            if b"," in line:
                return "a list in Content-Length"
        elif name == b"transfer-encoding":
            transfer_encodings += 1
    if content_lengths > 1:
        return "duplicate Content-Length headers"
    if content_lengths and transfer_encodings:
        return "both Content-Length and Transfer-Encoding"
    return None


def connection_tokens(headers: Headers) -> set[bytes]:
    """Field names listed in Connection (also hop-by-hop)."""
    names: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            names.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return names


def forward_headers(headers: Headers, *, drop_auth: bool) -> Headers:
    """``headers`` without hop-by-hop fields (and credentials when asked).

    Framing (Content-Length or chunked) is kept as one field h11 re-applies.
    """
    listed = connection_tokens(headers)
    out: Headers = []
    chunked = False
    for name, value in headers:
        low = name.lower()
        if low == b"transfer-encoding":
            chunked = True
            continue
        if low in HOP_BY_HOP or low in listed or low.startswith(b"proxy-"):
            continue
        if drop_auth and low == b"authorization":
            continue
        out.append((name, value))
    if chunked:
        out.append((b"Transfer-Encoding", b"chunked"))
    return out


def authorization(host: str, token: str) -> bytes:
    """The header value the token goes to ``host`` with.

    git's endpoint on github.com takes Basic only; the API hosts take Bearer.
    """
    if host == "github.com":
        pair = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        return f"Basic {pair}".encode()
    return f"Bearer {token}".encode()


def host_header(headers: Headers) -> bytes | None:
    """The request's Host value; None when absent or given more than once."""
    values = [v for n, v in headers if n.lower() == b"host"]
    return values[0] if len(values) == 1 else None


def same_host(value: bytes, host: str, port: int) -> bool:
    """Whether a Host value names ``host`` (on ``port``, or the default)."""
    try:
        named, named_port = parse_authority(value.decode("ascii"), default_port=port)
    except (BadHost, UnicodeDecodeError):
        return False
    return named == host and named_port == port
