"""Point a kubeconfig's loopback clusters at the egress proxy.

A lab cluster (kind) publishes its API server on the host's loopback, which
every HTTP client exempts from the proxy environment variables, and which a
sandbox with its own network namespace cannot reach at all.  Setting the
cluster's ``proxy-url`` (client-go honours ``http``, ``https`` and ``socks5``)
sends kubectl's connection through the egress proxy instead, where the allow
list decides whether that one loopback port may be reached.

This module is pure: text in, text out.  It works on PyYAML's *node graph*
(composed with the safe loader, so no tag can construct an object) rather
than on constructed Python values, because a node keeps each scalar's source
text and quoting: ``0123`` stays ``0123`` instead of becoming the integer 83,
and key order, flow style and quoting of every untouched field survive.
Comments do not survive a change (PyYAML drops them); an input that needs no
change is returned byte for byte.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import stat
import sys
import tempfile
from urllib.parse import SplitResult, urlsplit

import yaml

from libbroker.errors import KubeconfigError, UsageError
from libegress.hosts import BadHost, parse_ipv4_loose

_STR = "tag:yaml.org,2002:str"
# The pure-Python safe loader, not libyaml's: the C loader recurses on the C
# stack and a deeply nested document ("[" * 30000) kills the process with
# SIGSEGV, while the Python one stops at the interpreter's recursion limit.
_SAFE_LOADER = yaml.SafeLoader
# A kubeconfig is a few KiB; anything near this is not one, and parsing it
# would only burn time.
MAX_BYTES = 4 * 1024 * 1024
_PROXY_SCHEMES = frozenset({"http", "https", "socks5"})
_SERVER_SCHEMES = frozenset({"http", "https"})
# Bytes Go's url.Parse refuses in a URL and that no server address contains.
_BAD_URL_CHARS = re.compile(r"[\x00-\x20\x7f]")


# --- loopback classification --------------------------------------------------


def parse_inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the classic ``inet_aton`` reads from ``text``, or None.

    Resolvers (glibc's getaddrinfo, so cgo Go programs too) accept more than
    dotted quads: ``127.1``, ``0x7f.0.0.1``, ``0177.0.0.1``, ``2130706433``.
    Every such spelling of a loopback address must count as loopback; the
    parser is the proxy's own (:func:`libegress.hosts.parse_ipv4_loose`), so
    the two can never disagree on what a spelling means.
    """
    try:
        return parse_ipv4_loose(text)
    except BadHost:
        return None


def is_loopback_host(host: str) -> bool:
    """Whether connecting to ``host`` (a URL's host, brackets removed) stays on this machine.

    Loopback is 127.0.0.0/8 in any inet_aton spelling, ``::1`` (also with a
    zone or IPv4-mapped), the unspecified addresses (which Linux connects to
    the local host), and ``localhost`` with its subdomains (RFC 6761), with or
    without the trailing root dot.
    """
    name = host.lower()
    if name.endswith(".") and not name.endswith(".."):
        name = name[:-1]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    v4 = parse_inet_aton(name)
    if v4 is not None:
        return v4.is_loopback or v4.is_unspecified
    try:
        v6 = ipaddress.IPv6Address(name)
    except ValueError:
        return False
    mapped = v6.ipv4_mapped
    if mapped is not None:
        return mapped.is_loopback or mapped.is_unspecified
    return v6.is_loopback or v6.is_unspecified


def server_host(server: str) -> str:
    """The host of a cluster's ``server`` URL, as client-go would read it.

    client-go prefixes ``https://`` to a server written without a scheme
    (``localhost:6443``), so the same is done here.  Raises KubeconfigError
    for anything that is not a usable http(s) URL with a host.
    """
    if not server or _BAD_URL_CHARS.search(server):
        raise KubeconfigError(f"server URL {server!r} cannot be parsed")
    try:
        parts = urlsplit(server if "://" in server else "https://" + server)
        _check_url(parts, _SERVER_SCHEMES)
    except ValueError as exc:
        raise KubeconfigError(f"server URL {server!r} cannot be parsed: {exc}") from None
    assert parts.hostname is not None  # checked by _check_url
    return parts.hostname


def check_proxy_url(url: str) -> str:
    """``url`` if it is a proxy URL client-go can use, else a UsageError."""
    try:
        if _BAD_URL_CHARS.search(url):
            raise ValueError("it contains spaces or control characters")
        _check_url(urlsplit(url), _PROXY_SCHEMES)
    except ValueError as exc:
        raise UsageError(
            f"--proxy {url!r} is not a proxy URL (socks5://HOST:PORT or http://HOST:PORT): {exc}"
        ) from None
    return url


def _check_url(parts: SplitResult, schemes: frozenset[str]) -> None:
    if parts.scheme.lower() not in schemes:
        raise ValueError(f"scheme {parts.scheme!r} is not one of {', '.join(sorted(schemes))}")
    if not parts.hostname:
        raise ValueError("it has no host")
    _ = parts.port  # raises ValueError for a port out of range or not a number


# --- the rewrite --------------------------------------------------------------


def proxify(text: str, proxy_url: str) -> tuple[str, int]:
    """Set ``proxy-url`` on every loopback cluster of the kubeconfig ``text``.

    Returns the new text and how many clusters changed.  A cluster already
    carrying exactly ``proxy_url`` does not count, and when nothing changes the
    input comes back unchanged, so the function is idempotent.  Raises
    KubeconfigError (nothing half-done: the caller writes nothing) for text that
    is not one YAML mapping with a non-empty ``clusters`` list, or for a
    cluster whose server cannot be parsed.
    """
    root = _compose(text)
    clusters = _mapping_value(root, "clusters", "the kubeconfig")
    if not isinstance(clusters, yaml.SequenceNode) or not clusters.value:
        raise KubeconfigError("the kubeconfig has no clusters")
    changed = 0
    for index, entry in enumerate(clusters.value):
        where = f"clusters[{index}]"
        if not isinstance(entry, yaml.MappingNode):
            raise KubeconfigError(f"{where} is not a mapping")
        name = _mapping_value(entry, "name", where)
        if isinstance(name, yaml.ScalarNode):
            where = f"cluster {name.value!r}"
        cluster = _mapping_value(entry, "cluster", where)
        if not isinstance(cluster, yaml.MappingNode):
            raise KubeconfigError(f"{where} has no cluster mapping")
        if _set_proxy(cluster, proxy_url, where):
            changed += 1
    if not changed:
        return text, 0
    explicit_start = text.lstrip().startswith("---")
    out = yaml.serialize(
        root,
        Dumper=yaml.SafeDumper,
        allow_unicode=True,
        width=1 << 16,  # never fold a long scalar (certificate data, tokens)
        explicit_start=explicit_start,
    )
    return out, changed


def _compose(text: str) -> yaml.MappingNode:
    try:
        # Constructing once refuses what the safe loader does not know (a
        # python/object tag, a bad timestamp); the node graph is what is edited.
        yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader, chosen below
        root = yaml.compose(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise KubeconfigError("not valid YAML: nested too deeply") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # The safe constructors raise these for values they cannot build
        # (``!!timestamp x``, an out-of-range date); the input is at fault.
        raise KubeconfigError(
            f"not valid YAML: a value cannot be constructed ({type(exc).__name__})"
        ) from None
    if not isinstance(root, yaml.MappingNode):
        raise KubeconfigError("not a kubeconfig: the document is not a mapping")
    return root


def _one_line(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem and exc.problem_mark:
        mark = exc.problem_mark
        context = f"{exc.context}, " if exc.context else ""
        return f"{context}{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _mapping_value(node: yaml.MappingNode, key: str, where: str) -> yaml.Node | None:
    """The value of ``key`` in ``node``; a duplicate key or a merge key is refused.

    Go's YAML parser refuses duplicate keys; taking either copy here could
    proxify a server kubectl never uses, so both are errors.
    """
    found: yaml.Node | None = None
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise KubeconfigError(f"{where} uses a YAML merge key, which is not supported")
        if key_node.value == key:
            if found is not None:
                raise KubeconfigError(f"{where} has the key {key!r} twice")
            found = value_node
    return found


def _set_proxy(cluster: yaml.MappingNode, proxy_url: str, where: str) -> bool:
    server = _mapping_value(cluster, "server", where)
    if not isinstance(server, yaml.ScalarNode) or server.tag != _STR:
        raise KubeconfigError(f"{where} has no server URL")
    try:
        host = server_host(server.value)
    except KubeconfigError as exc:
        raise KubeconfigError(f"{where}: {exc}") from None
    if not is_loopback_host(host):
        return False
    current = _mapping_value(cluster, "proxy-url", where)
    if isinstance(current, yaml.ScalarNode) and current.value == proxy_url:
        return False
    new_value = yaml.ScalarNode(_STR, proxy_url)
    for i, (key_node, _value) in enumerate(cluster.value):
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "proxy-url":
            cluster.value[i] = (key_node, new_value)
            return True
    # Right after the server, where a reader looks for it.
    position = 1 + next(
        i
        for i, (key_node, _value) in enumerate(cluster.value)
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "server"
    )
    cluster.value.insert(position, (yaml.ScalarNode(_STR, "proxy-url"), new_value))
    return True


# --- the thin I/O shell -------------------------------------------------------


def read_text(path: str | None) -> str:
    """The kubeconfig at ``path`` (stdin for None), decoded as UTF-8."""
    try:
        if path is None:
            data = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            limit = MAX_BYTES // (1024 * 1024)
            raise KubeconfigError(f"{path or 'stdin'} is larger than {limit} MiB: not a kubeconfig")
        return data.decode("utf-8")
    except OSError as exc:
        raise KubeconfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise KubeconfigError(f"{path or 'stdin'} is not UTF-8 text") from None


def write_atomic(path: str, text: str) -> None:
    """Replace the file at ``path`` with ``text`` all at once, keeping mode and owner.

    The new content goes to a temporary file in the same directory (so the
    rename cannot cross file systems) and is synced before the rename: a
    reader sees the old file or the new one, never a half-written one.  A
    symbolic link is followed, so the link itself stays in place.
    """
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    try:
        st = os.stat(target)
        fd, tmp = tempfile.mkstemp(prefix=".kubeconfig-", dir=directory)
    except OSError as exc:
        raise KubeconfigError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
            if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                # root editing a person's file: the file stays theirs
                with contextlib.suppress(PermissionError):
                    os.fchown(f.fileno(), st.st_uid, st.st_gid)
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise KubeconfigError(f"cannot write {path}: {exc.strerror}") from None
        raise
