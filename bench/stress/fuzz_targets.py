"""The decoders under fuzz, each as ``target(data: bytes) -> None``.

Shared by the hypothesis runs and the atheris runs.  A target raises one of
its :data:`EXPECTED` exceptions for input the code refuses (that is correct
behaviour), :class:`Broken` when an invariant of the contract fails, and
anything else is a crash: an exception the code under test did not mean to
raise, which the command-line shells would turn into an "internal error".
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import h11

from libbroker.errors import AgentSandboxError, ProtocolError, RequestRefused
from libbroker.wire import CLIENT_CHANNELS, OPS, FrameDecoder, parse_request
from libegress import socks5
from libegress.addresses import refusal
from libegress.allowlist import parse_patterns
from libegress.heads import head_end, same_host, smuggling_reason
from libegress.hosts import BadHost, canonical_host, ip_of
from libegress.http1 import HttpError
from libegress.http_proxy import absolute_target, connect_target
from libegress.intercept import inner_target
from libegress.kubeconfig import proxify
from libegress.route import EgressPolicy, Refused, Route, route
from libpolicy.hook import evaluate
from libpolicy.model import Policy

# The chunked-body differential's harness, shared with its test.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "egress"))
from chunk_differential import reference, through_pumps


class Broken(Exception):
    """An invariant of the contract does not hold for this input."""


MAX_HEAD = 32 * 1024

# --- broker ----------------------------------------------------------------------


def frames(data: bytes) -> None:
    """FrameDecoder over the same bytes chunked two ways (by the first byte, and whole)."""
    step = (data[0] % 7) + 1 if data else 1
    body = data[1:]
    chunks = [body[i:i + step] for i in range(0, len(body), step)]
    dec = FrameDecoder(accept=CLIENT_CHANNELS)
    got: list[tuple[int, bytes]] = []
    error = False
    try:
        for chunk in chunks:
            got += [(int(f.channel), f.payload) for f in dec.feed(chunk)]
    except ProtocolError:
        error = True
    whole = FrameDecoder(accept=CLIENT_CHANNELS)
    try:
        at_once = [(int(f.channel), f.payload) for f in whole.feed(body)]
        whole_error = False
    except ProtocolError:
        at_once, whole_error = [], True
    if error != whole_error:
        raise Broken(f"chunked error={error} but whole error={whole_error}")
    if not error and got != at_once:
        raise Broken("chunking changes the frames decoded")
    if not error and dec.buffered != len(body) - sum(5 + len(p) for _, p in got):
        raise Broken("buffered count does not match the bytes not yet framed")
    if error:
        try:
            dec.feed(b"")
        except ProtocolError:
            pass
        else:
            raise Broken("a FrameDecoder fed on after an error")
        raise ProtocolError("refused")


def request(data: bytes) -> None:
    """parse_request: only the contract's fields, never env, cwd absolute."""
    req = parse_request(data)
    if req.op not in OPS:
        raise Broken(f"op {req.op!r} accepted")
    if req.op == "exec" and not req.argv:
        raise Broken("an exec request without argv accepted")
    if not req.cwd.startswith("/") or "\0" in req.cwd or any("\0" in a for a in req.argv):
        raise Broken("a bad cwd or argv accepted")
    body = json.loads(data.decode("utf-8"))
    if "env" in body or set(body) - {"argv", "cwd", "with_stdin", "op", "key"}:
        raise Broken("a request with extra fields accepted")
    if parse_request(req.to_json()) != req:
        raise Broken("request does not survive its own encoding")


# --- proxy -----------------------------------------------------------------------

POLICY = EgressPolicy(
    allow=parse_patterns("example.com,*.example.org,10.0.0.1:8080,127.0.0.1:6443,[::1]:443"),
    inject=("github.com", "api.github.com"),
)


def proxy_head(data: bytes) -> None:
    """The HTTP listener's decision for one request head (ClientSide's pure steps).

    Raises HttpError/Refused/BadHost for what the proxy answers with an error; a
    request that would be dialled must be allowed and public (or PASS to a name).
    """
    end = head_end(data)
    if end is None:
        raise HttpError(408, "incomplete")
    if end > MAX_HEAD:
        raise HttpError(431, "too large")
    reason = smuggling_reason(bytes(data[:end]))
    if reason is not None:
        raise HttpError(400, reason)
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(bytes(data))
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise HttpError(400, str(exc)) from None
    if not isinstance(event, h11.Request):
        raise HttpError(400, "no request")
    if event.method == b"CONNECT":
        host, port = connect_target(event)
        how = route(POLICY, host, port, tls=True)
    else:
        host, port, target = absolute_target(event)
        how = route(POLICY, host, port, tls=False)
        if not target.startswith(b"/"):
            raise Broken(f"origin-form target {target!r} does not start with /")
        if how is Route.INTERCEPT:
            raise Broken("plain HTTP routed to an inject host")
    if canonical_host(host) != host:
        raise Broken(f"host {host!r} is not canonical")
    literal = ip_of(host)
    if literal is not None and refusal(literal) is not None:
        # The address rule refuses it before any dial: that is the expected path.
        raise Refused("blocked-address", f"{literal}")
    if how is Route.INTERCEPT:
        # Inside the tunnel: the same head as an inner request to the CONNECT host.
        inner(data, host, port)


def inner(data: bytes, host: str, port: int) -> None:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(bytes(data))
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return
    if not isinstance(event, h11.Request) or event.method == b"CONNECT":
        return
    try:
        target = inner_target(event, host, port)
    except HttpError:
        return
    hosts = [v for n, v in event.headers if n.lower() == b"host"]
    if len(hosts) != 1 or not same_host(hosts[0], host, port) or not target.startswith(b"/"):
        raise Broken("an inner request for another host was let through")


def socks(data: bytes) -> None:
    """Greeting then request, as serve_socks consumes them, then the host rules."""
    greeting = socks5.parse_greeting(data)
    if greeting is None:
        raise socks5.SocksError(None, "short")
    _, used = greeting
    if used > len(data):
        raise Broken("greeting size beyond the input")
    parsed = socks5.parse_request(data[used:])
    if parsed is None:
        raise socks5.SocksError(None, "short")
    if parsed.size > len(data) - used or not 0 <= parsed.port <= 65535:
        raise Broken("request size or port out of range")
    host = canonical_host(parsed.host)
    route(POLICY, host, parsed.port, tls=True)
    literal = ip_of(host)
    if literal is not None and refusal(literal) is not None:
        raise Refused("blocked-address", host)


# --- hook and kubeconfig -------------------------------------------------------------

_POLICY: list[Policy] = []


def hook_world(root: Path | None = None) -> Policy:
    """A small world (home with a secret, a workdir, symlinks) and its policy."""
    if _POLICY:
        return _POLICY[0]
    root = root or Path(tempfile.mkdtemp(prefix="stress-hook-"))
    home = root / "home"
    for d in ("home/.ssh", "home/proj/src", "home/proj/secret", "home/.claude/memory", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (home / ".ssh/id").write_text("KEY")
    with_links = {"to_ssh": home / ".ssh", "rel": Path("../.ssh"), "loop1": home / "proj/loop2",
                  "loop2": home / "proj/loop1"}
    for name, target in with_links.items():
        link = home / "proj" / name
        if not link.is_symlink():
            os.symlink(target, link)
    policy = Policy(str(home), runtime=str(root / "run"), write=[str(home / "proj")],
                    deny=[str(home / "proj/secret")], harness=str(home / ".claude"),
                    tool_write=[str(home / ".claude/memory")])
    _POLICY.append(policy)
    return policy


def hook(data: bytes) -> None:
    out = evaluate(hook_world(), data)
    if out is not None:
        doc = json.loads(out)
        if doc["hookSpecificOutput"]["permissionDecision"] != "deny":
            raise Broken("the hook printed something other than a denial")


def kubeconfig(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    out, changed = proxify(text, "socks5://127.0.0.1:1080")
    if changed:
        again, more = proxify(out, "socks5://127.0.0.1:1080")
        if more or again != out:
            raise Broken("proxify is not idempotent")
    elif out != text:
        raise Broken("an unchanged kubeconfig came back different")


EXPECTED: dict[str, tuple[type[BaseException], ...]] = {
    "frames": (ProtocolError,),
    "request": (RequestRefused,),
    "proxy_head": (HttpError, Refused, BadHost),
    "socks": (socks5.SocksError, Refused, BadHost),
    "hook": (AgentSandboxError,),
    "kubeconfig": (AgentSandboxError,),
    "chunks": (),
}

def chunks(data: bytes) -> None:
    """A chunked body read by h11 alone and as a pump reads it: the same bytes, the same end.

    The first byte picks where the body is cut into reads and where pumps take
    over and hand back; the rest is the body.  The harness is the differential
    test's (tests/egress/chunk_differential.py).
    """
    if not data:
        return
    rng = random.Random(data[0])
    body = data[1:]
    cuts = sorted({rng.randrange(len(body) + 1) for _ in range(data[0] % 8)})
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if b > a]
    alone = reference(pieces, eof=True)
    pumped = through_pumps(pieces, True, rng)  # where pumps start and end: rng's
    if alone != pumped:
        raise Broken(f"h11 alone: {str(alone)[:120]}; with a pump: {str(pumped)[:120]}")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "frames": frames,
    "request": request,
    "proxy_head": proxy_head,
    "socks": socks,
    "hook": hook,
    "kubeconfig": kubeconfig,
    "chunks": chunks,
}


def seeds() -> dict[str, list[bytes]]:
    """A few valid inputs per target, for atheris to start from."""
    from libbroker.wire import Channel, Request, encode_frame, encode_request
    policy = hook_world()
    home = policy.home
    req = encode_request(Request(argv=("echo", "hi"), cwd="/tmp"))
    return {
        "frames": [b"\x03" + req + encode_frame(Channel.STDIN, b"abc") +
                   encode_frame(Channel.STDIN, b"") + encode_frame(Channel.SIGNAL, b"\x0f")],
        "request": [Request(argv=("ls", "-l"), cwd="/w").to_json(),
                    b'{"op":"sign","key":"ABC","argv":[],"cwd":"/"}', b'{"op":"ping"}'],
        "proxy_head": [b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
                       b"GET http://example.com/x?y HTTP/1.1\r\nHost: example.com\r\n"
                       b"Content-Length: 3\r\n\r\nabc",
                       b"CONNECT github.com:443 HTTP/1.1\r\nHost: github.com\r\n\r\n"],
        "socks": [b"\x05\x01\x00\x05\x01\x00\x03\x0bexample.com\x01\xbb",
                  b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x19\x2b"],
        "hook": [json.dumps({"tool_name": t, "cwd": f"{home}/proj",
                             "tool_input": {"file_path": f"{home}/proj/to_ssh/id",
                                            "path": "..", "pattern": "**/*"}}).encode()
                 for t in ("Read", "Write", "Grep", "Glob")],
        "chunks": [b"\x05" + b"4\r\nabcd\r\n10\r\n" + b"x" * 16 + b"\r\n0\r\nT: 1\r\n\r\n",
                   b"\x03" + b"5\r\nhelloXX", b"\x07" + b"1" * 21 + b"\r\n"],
        "kubeconfig": [b"apiVersion: v1\nclusters:\n- name: a\n  cluster:\n"
                       b"    server: https://127.0.0.1:6443\n- name: b\n  cluster:\n"
                       b"    server: https://k.example.com\n"],
    }
