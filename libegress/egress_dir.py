"""The egress directory: what a sandbox needs to trust and use the proxy.

- ``ca.pem``: the proxy's CA certificate;
- ``bundle.pem``: the system's roots followed by that CA, for clients that take
  one file of roots (curl, git, OpenSSL, Python, Node via NODE_EXTRA_CA_CERTS);
- ``gh/``: a gh configuration whose login is a fixed word, not a token: gh
  refuses to call GitHub without a login, and the proxy replaces the header.

Nothing here is secret; files are written whole (temporary file and rename),
readable by everyone who can reach the directory.
"""

from __future__ import annotations

import contextlib
import os

from libbroker.errors import EgressError

CA_FILE = "ca.pem"
BUNDLE_FILE = "bundle.pem"
GH_DIR = "gh"
# gh's login in the sandbox: no secret, the proxy sets the real header.
GH_TOKEN_WORD = "agent-sandbox-egress-proxy"  # noqa: S105 - a fixed word, no secret
GH_USER = "agent-sandbox"
GH_CONFIG = b'version: "1"\ngit_protocol: https\nprompt: disabled\n'


def system_roots() -> bytes:
    """The system's trusted roots as PEM, or empty when none are found.

    Where ``ssl.get_default_verify_paths()`` looks (``SSL_CERT_FILE``, else
    OpenSSL's built-in file), asked of ``_ssl`` itself: the ``ssl`` module costs
    egress-proxy milliseconds before its ``listening`` line, and loads after it.
    """
    import _ssl

    env_name, openssl_cafile = _ssl.get_default_verify_paths()[:2]
    for candidate in (os.environ.get(env_name, openssl_cafile), openssl_cafile,
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and os.path.isfile(candidate):
            with open(candidate, "rb") as fh:
                return fh.read()
    return b""


def gh_hosts_yaml(hosts: list[str]) -> str:
    """gh's hosts.yml naming the fixed login for each GitHub host."""
    lines = []
    for host in hosts:
        if host.startswith("api."):
            continue
        lines += [
            f"{host}:",
            f"    oauth_token: {GH_TOKEN_WORD}",
            f"    user: {GH_USER}",
            "    git_protocol: https",
        ]
    return "\n".join(lines) + "\n"


def _write(path: str, data: bytes) -> None:
    head, name = os.path.split(path)
    # A new name of our own (O_EXCL), as tempfile.mkstemp makes it, without tempfile's imports.
    tmp = os.path.join(head, f".{name}.{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_egress_dir(directory: str, ca_pem: bytes, inject_hosts: list[str]) -> None:
    """Create or refresh the egress directory (see module doc)."""
    gh = os.path.join(directory, GH_DIR)
    try:
        os.makedirs(gh, exist_ok=True)
        roots = system_roots()
        if roots and not roots.endswith(b"\n"):
            roots += b"\n"
        _write(os.path.join(directory, CA_FILE), ca_pem)
        _write(os.path.join(directory, BUNDLE_FILE), roots + ca_pem)
        _write(os.path.join(gh, "hosts.yml"), gh_hosts_yaml(inject_hosts).encode())
        _write(os.path.join(gh, "config.yml"), GH_CONFIG)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise EgressError(f"cannot write the egress directory {directory}: {why}") from None
