"""The CA: P-256, path length 0, critical NameConstraints; clients enforce them."""

from __future__ import annotations

import socket
import ssl
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from egress_upstreams import HTTP_OK, serve_once
from egress_world import require

from libegress.ca import LeafCache, issue_leaf, make_authority, server_context

INJECT = ["github.com", "api.github.com"]


def test_ca_shape() -> None:
    authority = make_authority(INJECT)
    cert = authority.cert
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    names = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert names.critical
    assert [n.value for n in names.value.permitted_subtrees or []] == INJECT
    validity = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert validity.days <= 15
    assert b"PRIVATE" not in authority.cert_pem()


def test_leaf_cache_issues_once_and_only_for_inject_hosts() -> None:
    cache = LeafCache(make_authority(INJECT), INJECT)
    assert cache.context_for("github.com") is cache.context_for("github.com")
    with pytest.raises(Exception, match="not an inject host"):
        cache.context_for("evil.test")


@pytest.fixture(scope="module")
def authority_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    authority = make_authority(INJECT)
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca_file.write_bytes(authority.cert_pem())
    return authority, ca_file


def test_python_ssl_accepts_inside_and_rejects_outside(
    authority_files: tuple[object, Path],
) -> None:
    authority, ca_file = authority_files
    for host, ok in (("github.com", True), ("evil.test", False)):
        cert, key = issue_leaf(authority, host)  # type: ignore[arg-type]
        port, thread = serve_once(server_context(cert, key, authority.cert), HTTP_OK)  # type: ignore[attr-defined]
        client = ssl.create_default_context(cafile=str(ca_file))
        with socket.create_connection(("127.0.0.1", port)) as raw:
            if ok:
                with client.wrap_socket(raw, server_hostname=host) as tls:
                    tls.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    assert tls.recv(100).endswith(b"ok")
            else:
                with pytest.raises(ssl.SSLCertVerificationError, match="permitted subtree"):
                    client.wrap_socket(raw, server_hostname=host)
        thread.join(5)


def test_curl_rejects_a_leaf_outside_the_constraints(authority_files: tuple[object, Path]) -> None:
    require("curl")
    authority, ca_file = authority_files
    for host, ok in (("api.github.com", True), ("evil.test", False)):
        cert, key = issue_leaf(authority, host)  # type: ignore[arg-type]
        port, thread = serve_once(server_context(cert, key, authority.cert), HTTP_OK)  # type: ignore[attr-defined]
        out = subprocess.run(
            ["curl", "-sS", "--max-time", "10", "--cacert", str(ca_file), "--resolve",
             f"{host}:{port}:127.0.0.1", f"https://{host}:{port}/"],
            capture_output=True, text=True, check=False)
        if ok:
            assert out.returncode == 0 and out.stdout == "ok", out.stderr
        else:
            assert out.returncode == 60, out.stderr
            assert "subtree" in out.stderr.lower() or "certificate" in out.stderr.lower()
        thread.join(5)


def test_no_inject_hosts_still_constrains() -> None:
    cert = make_authority([]).cert
    names = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    assert [n.value for n in names.permitted_subtrees or []] == ["no-inject-hosts.invalid"]
