"""Fixtures for the egress proxy's end-to-end tests: a test CA, stand-in GitHub
hosts on 127.0.0.1 and one proxy reaching them through --resolve/--upstream-ca."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

sys.path.insert(0, str(Path(__file__).parent))

from egress_proxyproc import ProxyProc, start_proxy
from egress_upstreams import bare_repo, start
from egress_world import TOKEN, World, proxy_args


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("egress")
    ca = trustme.CA()
    ca_file = tmp / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert = ca.issue_cert("github.com", "api.github.com", "allowed.test")
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    repo = bare_repo(tmp)
    git = start("git", str(cert_file), str(key_file), token=TOKEN, git_root=str(tmp))
    api = start("echo", str(cert_file), str(key_file))
    plain = start("echo", str(cert_file), str(key_file))
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    yield World(tmp, ca_file, git, api, plain, repo, token_file)
    for server in (git, api, plain):
        server.stop()



@pytest.fixture(scope="module")
def proxy(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    tmp = tmp_path_factory.mktemp("proxy")
    p = start_proxy(proxy_args(world, tmp / "egress"), log=tmp / "proxy.log", socks=True)
    p.egress_dir = tmp / "egress"
    yield p
    assert p.stop() == 0
