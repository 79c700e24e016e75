"""--repos: the GitHub token's writes held to listed repositories, through a real proxy.

Stand-ins with their own CA: github.com is ``git http-backend`` behind the
token check (two bare repositories, acme/widgets listed and acme/evil not);
api.github.com records every request and answers the proxy's own GraphQL
lookups (the listed repositories' node ids, an issue's or pull request's
repository) from a table.  Clients: git and curl, trusting the proxy's CA.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme
from egress_proxyproc import ProxyProc, start_proxy
from egress_upstreams import Upstream, _read_body, bare_repo, start
from egress_world import World, require

TOKEN = "ghs_SCOPETOKEN0123456789abcdefSECRET"
REPO_IDS = {"acme/widgets": "R_kgDOwidgets", "acme/evil": "R_kgDOevil"}
NODES = {"I_widgets": "Acme/Widgets", "PR_widgets": "acme/widgets", "I_evil": "acme/evil"}
GH_PR_CREATE = """
    mutation PullRequestCreate($input: CreatePullRequestInput!) {
        createPullRequest(input: $input) {
            pullRequest {
                id
                url
            }
        }
    }"""
GH_ISSUE_CREATE = """
    mutation IssueCreate($input: CreateIssueInput!) {
        createIssue(input: $input) {
            issue {
                id
                url
            }
        }
    }"""
GH_COMMENT = ("mutation CommentCreate($input:AddCommentInput!)"
              "{addComment(input: $input){commentEdge{node{url}}}}")


class ApiHandler(BaseHTTPRequestHandler):
    """The api.github.com stand-in: REST echo, GraphQL echo and the lookups' answers."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def _handle(self) -> None:
        body = _read_body(self)
        auth = self.headers.get("Authorization")
        kind, answer, status = "rest", {"ok": True, "path": self.path}, 200
        if self.path == "/graphql" and self.command == "POST":
            data = json.loads(body)
            query, variables = data["query"], data.get("variables") or {}
            if "repository(owner:$o" in query:
                kind = "lookup-repo"
                found = {}
                i = 0
                while f"o{i}" in variables:
                    key = f"{variables[f'o{i}']}/{variables[f'n{i}']}"
                    found[f"r{i}"] = {"id": REPO_IDS[key]} if key in REPO_IDS else None
                    i += 1
                answer = {"data": found}
            elif "node(id:$id)" in query:
                kind = "lookup-node"
                node = variables["id"]
                if node == "I_broken":
                    status, answer = 502, {"message": "bad gateway"}
                elif node in NODES:
                    answer = {"data": {"node": {"__typename": "Issue",
                                                "repository": {"nameWithOwner": NODES[node]}}}}
                else:
                    answer = {"data": {"node": None}}
            else:
                kind = "client"
                answer = {"data": {"ok": True}}
        if kind.startswith("lookup") and auth != f"Bearer {TOKEN}":
            status, answer = 401, {"message": "Bad credentials"}
        self.seen.append({"kind": kind, "method": self.command, "path": self.path,
                          "authorization": auth, "body": body})
        reply = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply)


def start_api(cert: str, key: str) -> tuple[ThreadingHTTPServer, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Api", (ApiHandler,), {"seen": seen}))
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server, seen


@dataclass
class Rig:
    tmp: Path
    proxy: ProxyProc
    egress: Path
    git: Upstream
    api_seen: list[dict[str, Any]]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    require("curl")
    require("git")
    tmp = tmp_path_factory.mktemp("repos")
    ca = trustme.CA()
    ca_file = tmp / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert = ca.issue_cert("github.com", "api.github.com")
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    root = tmp / "git"
    (root / "acme").mkdir(parents=True)
    widgets = bare_repo(root / "acme", "widgets.git")
    subprocess.run(["git", "clone", "-q", "--bare", str(widgets), str(root / "acme/evil.git")],
                   check=True)
    git = start("git", str(cert_file), str(key_file), token=TOKEN, git_root=str(root))
    api, seen = start_api(str(cert_file), str(key_file))
    (tmp / "token").write_text(TOKEN + "\n")
    egress = tmp / "egress"
    args = ["--repos", "Acme/Widgets,someone/else",
            "--resolve", f"github.com:127.0.0.1:{git.port}",
            "--resolve", f"api.github.com:127.0.0.1:{api.server_address[1]}",
            "--upstream-ca", str(ca_file), "--egress-dir", str(egress),
            "--token-command", f"cat {tmp / 'token'}"]
    proxy = start_proxy(args, log=tmp / "proxy.log")
    proxy.egress_dir = egress
    yield Rig(tmp, proxy, egress, git, seen)
    assert proxy.stop() == 0
    git.stop()
    api.shutdown()
    api.server_close()


def curl(rig: Rig, method: str, path: str, data: bytes | None = None,
         *headers: str) -> tuple[int, dict[str, str], str]:
    argv = ["curl", "-sS", "--max-time", "20", "-x", rig.proxy.http, "--path-as-is",
            "--cacert", str(rig.egress / "ca.pem"), "-X", method, "-D", "-",
            f"https://api.github.com{path}"]
    for h in headers:
        argv += ["-H", h]
    if data is not None:
        argv += ["--data-binary", "@-", "-H", "Content-Type: application/json"]
    out = subprocess.run(argv, input=data or b"", capture_output=True, check=False, timeout=30)
    assert out.returncode == 0, out.stderr
    rest = out.stdout.decode()
    while True:  # past the CONNECT's answer and any 100 Continue
        head, _, rest = rest.partition("\r\n\r\n")
        lines = head.split("\r\n")
        status = int(lines[0].split()[1])
        if status != 100 and "established" not in lines[0].lower():
            break
    body = rest
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return status, fields, body


def client_requests(rig: Rig) -> list[dict[str, Any]]:
    return [s for s in rig.api_seen if s["kind"] in ("rest", "client")]


def assert_refused(rig: Rig, status: int, fields: dict[str, str]) -> None:
    assert status == 403
    assert fields.get("x-proxy-error") == "blocked-by-scope"


# --- git ----------------------------------------------------------------------

def git_env(rig: Rig, home: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "GIT_TERMINAL_PROMPT": "0",
            "HTTPS_PROXY": rig.proxy.http, "GIT_SSL_CAINFO": str(rig.egress / "bundle.pem"),
            "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
            "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"}


def git(*args: str, env: dict[str, str], cwd: Path | None = None,
        ok: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["git", *args], env=env, cwd=cwd, capture_output=True, text=True,
                         check=False, timeout=60)
    if ok:
        assert out.returncode == 0, out.stderr
    return out


def test_push_to_a_listed_repo_and_not_to_another(rig: Rig, tmp_path: Path) -> None:
    env = git_env(rig, tmp_path)
    work = tmp_path / "work"
    git("clone", "-q", "https://github.com/acme/widgets.git", str(work), env=env)
    (work / "change").write_text("x\n")
    git("add", "change", env=env, cwd=work)
    git("commit", "-qm", "change", env=env, cwd=work)
    head = git("rev-parse", "HEAD", env=env, cwd=work).stdout.strip()
    # Listed, without .git (the stand-in's file system is case-sensitive, GitHub is not:
    # case is tested on the API path).
    git("push", "-q", "https://github.com/acme/widgets", "main", env=env, cwd=work)
    upstream = rig.tmp / "git/acme"
    assert git("--git-dir", str(upstream / "widgets.git"), "rev-parse", "main",
               env=env).stdout.strip() == head
    before = git("--git-dir", str(upstream / "evil.git"), "rev-parse", "main",
                 env=env).stdout.strip()
    refused = git("push", "-q", "https://github.com/acme/evil.git", "main", env=env, cwd=work,
                  ok=False)
    assert refused.returncode != 0
    assert "403" in refused.stderr
    assert git("--git-dir", str(upstream / "evil.git"), "rev-parse", "main",
               env=env).stdout.strip() == before
    # Fetch and clone of the unlisted repository still work, with the token.
    git("clone", "-q", "https://github.com/acme/evil.git", str(tmp_path / "evil"), env=env)
    log = rig.proxy.log_text()
    line = next(x for x in log.splitlines() if "/acme/evil.git/info/refs" in x)
    assert "refused host=github.com" in line
    assert "403 blocked-by-scope GET /acme/evil.git/info/refs: push to acme/evil.git" in line
    assert "service=" not in line  # the path, never the query
    assert TOKEN not in log


# --- REST -----------------------------------------------------------------------

@pytest.mark.parametrize("method, path", [
    ("POST", "/repos/acme/widgets/issues"),
    ("PATCH", "/repos/ACME/Widgets/pulls/3"),
    ("PUT", "/repos/acme/widgets/contents/README.md"),
    ("DELETE", "/repos/acme/widgets/labels/bug"),
    ("POST", "/repos/acme/%77idgets/issues"),
    ("GET", "/repos/acme/evil/issues"),
    ("GET", "/gists"),
])
def test_rest_inside_the_scope_carries_the_token(rig: Rig, method: str, path: str) -> None:
    status, _, body = curl(rig, method, path, b"{}" if method != "GET" else None)
    assert status == 200, body
    assert client_requests(rig)[-1]["authorization"] == f"Bearer {TOKEN}"
    assert client_requests(rig)[-1]["method"] == method


@pytest.mark.parametrize("method, path", [
    ("POST", "/repos/acme/evil/issues"),
    ("POST", "/gists"),
    ("PATCH", "/user"),
    ("POST", "/orgs/acme/repos"),
    ("PUT", "/user/starred/acme/widgets"),
    ("POST", "/repos/acme%2Fwidgets/issues"),
    ("POST", "/repos/acme%2fwidgets/x/issues"),
    ("POST", "/repos/acme/evil/../widgets/issues"),
    ("POST", "/repos/acme/widgets/../evil/issues"),
    ("POST", "/repos/acme/widgets/%2e%2e/evil/issues"),
    ("POST", "//repos/acme/widgets/issues"),
    ("POST", "/repos//acme/widgets/issues"),
    ("POST", "/repos/acme\\widgets/issues"),
    ("DELETE", "/repos/acme/%2577idgets"),
])
def test_rest_outside_the_scope_is_refused(rig: Rig, method: str, path: str) -> None:
    before = len(client_requests(rig))
    status, fields, body = curl(rig, method, path, b"{}")
    assert_refused(rig, status, fields)
    assert "blocked" in fields.get("x-proxy-error", "")
    assert body.startswith("egress-proxy: ")
    assert len(client_requests(rig)) == before  # nothing reached the upstream
    line = rig.proxy.log_text().splitlines()[-1]
    assert "refused host=api.github.com" in line
    assert f"reason=403 blocked-by-scope {method} " in line
    assert TOKEN not in rig.proxy.log_text()


# --- GraphQL ----------------------------------------------------------------------

def graphql(rig: Rig, query: str, variables: dict[str, Any] | None = None,
            *headers: str) -> tuple[int, dict[str, str], str]:
    data = json.dumps({"query": query, "variables": variables or {}}).encode()
    return curl(rig, "POST", "/graphql", data, *headers)


def test_gh_pr_create_to_a_listed_repo(rig: Rig) -> None:
    status, _, body = graphql(rig, GH_PR_CREATE, {"input": {
        "repositoryId": "R_kgDOwidgets", "baseRefName": "main", "headRefName": "f",
        "title": "t", "body": "b", "draft": False, "maintainerCanModify": True}})
    assert status == 200, body
    sent = client_requests(rig)[-1]
    assert sent["authorization"] == f"Bearer {TOKEN}"
    assert b"createPullRequest" in sent["body"]


def test_gh_issue_create_outside_is_refused(rig: Rig) -> None:
    before = len(client_requests(rig))
    status, fields, body = graphql(rig, GH_ISSUE_CREATE, {"input": {
        "repositoryId": "R_kgDOevil", "title": "t", "body": "b"}})
    assert_refused(rig, status, fields)
    assert "createIssue on a node outside" in body
    assert len(client_requests(rig)) == before


def test_gh_pr_comment_on_listed_and_unlisted_subjects(rig: Rig) -> None:
    status, _, _ = graphql(rig, GH_COMMENT, {"input": {"body": "hi", "subjectId": "I_widgets"}})
    assert status == 200
    status, fields, _ = graphql(rig, GH_COMMENT, {"input": {"body": "hi", "subjectId": "I_evil"}})
    assert_refused(rig, status, fields)
    status, fields, _ = graphql(rig, GH_COMMENT, {"input": {"body": "x", "subjectId": "U_nobody"}})
    assert_refused(rig, status, fields)
    # A failed lookup refuses (fail closed).
    status, fields, body = graphql(rig, GH_COMMENT, {"input": {"body": "x",
                                                                "subjectId": "I_broken"}})
    assert_refused(rig, status, fields)
    assert "lookup failed" in body


def test_lookups_are_cached_and_carry_the_token(rig: Rig) -> None:
    for _ in range(3):
        graphql(rig, GH_COMMENT, {"input": {"body": "hi", "subjectId": "PR_widgets"}})
        graphql(rig, GH_PR_CREATE, {"input": {"repositoryId": "R_kgDOwidgets"}})
    lookups = [s for s in rig.api_seen if s["kind"].startswith("lookup")]
    assert len([s for s in lookups if b"PR_widgets" in s["body"]]) == 1
    assert len([s for s in lookups if s["kind"] == "lookup-repo"]) == 1
    assert all(s["authorization"] == f"Bearer {TOKEN}" for s in lookups)


def test_reads_pass_and_unknown_mutations_do_not(rig: Rig) -> None:
    status, _, _ = graphql(rig, "query { viewer { login } }")
    assert status == 200
    for query in ("mutation { createGist(input: {}) { gist { id } } }",
                  "mutation { deleteRepository(input: {repositoryId: \"R_kgDOwidgets\"}) "
                  "{ clientMutationId } }",
                  "query A { viewer { login } } mutation B { createIssue(input: "
                  "{repositoryId: \"R_kgDOevil\"}) { issue { id } } }"):
        status, fields, _ = graphql(rig, query)
        assert_refused(rig, status, fields)


def test_graphql_body_limits_and_100_continue(rig: Rig) -> None:
    # Expect: 100-continue: the proxy answers it (it needs the body first).
    status, _, body = graphql(rig, GH_PR_CREATE,
                              {"input": {"repositoryId": "R_kgDOwidgets", "body": "x" * 5000}},
                              "Expect: 100-continue")
    assert status == 200, body
    big = {"input": {"repositoryId": "R_kgDOwidgets", "body": "x" * (1 << 20)}}
    status, fields, body = graphql(rig, GH_PR_CREATE, big)
    assert_refused(rig, status, fields)
    assert "over" in body
    status, fields, _ = curl(rig, "POST", "/graphql", b"not json")
    assert_refused(rig, status, fields)


def test_without_repos_writes_go_as_today(proxy: ProxyProc, world: World) -> None:
    require("curl")
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "15", "-x", proxy.http, "--cacert",
         str(proxy.egress_dir / "ca.pem"), "-X", "POST", "--data-binary", "{}",  # type: ignore[operator]
         "https://api.github.com/gists"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    token = world.token_file.read_text().strip()
    assert json.loads(out.stdout)["authorization"] == [f"Bearer {token}"]


@pytest.mark.parametrize("value", ["acme", "acme/widgets/x", "acme/..", ",", "a b/c"])
def test_a_bad_list_is_a_usage_error(value: str) -> None:
    out = subprocess.run(["egress-proxy", "--listen", "127.0.0.1:0", f"--repos={value}"],
                         capture_output=True, text=True, check=False, timeout=30)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "--repos" in out.stderr
