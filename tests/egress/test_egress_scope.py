"""libegress.scope: --repos decisions on request lines and GraphQL bodies (pure)."""

from __future__ import annotations

import json
import posixpath
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libegress.scope import (
    REPOSITORY,
    SUBJECT,
    ScopeError,
    Tie,
    decide,
    graphql_ties,
    parse_repos,
    tied,
)

REPOS = parse_repos("Acme/Widgets,acme/tools.git")
API = "api.github.com"
JSON_TYPE = [(b"Content-Type", b"application/json; charset=utf-8")]


def action(host: str, method: str, target: str, headers: Any = ()) -> str:
    return decide(REPOS, host, method.encode(), target.encode(), list(headers)).action


# --- the list ---------------------------------------------------------------

def test_parse_repos() -> None:
    assert frozenset({"acme/widgets", "acme/tools"}) == REPOS
    for bad in ("acme", "acme/", "/x", "a/b/c", "ac me/x", "acme/..", "-acme/x", "acme/x%2f",
                "", " , "):
        with pytest.raises(ValueError):
            parse_repos(bad)


# --- git ----------------------------------------------------------------------

@pytest.mark.parametrize("method, target, expected", [
    ("GET", "/acme/widgets.git/info/refs?service=git-receive-pack", "pass"),
    ("GET", "/ACME/Widgets/info/refs?service=git-receive-pack", "pass"),
    ("POST", "/acme/widgets.git/git-receive-pack", "pass"),
    ("POST", "/acme/tools/git-receive-pack", "pass"),
    ("GET", "/acme/evil.git/info/refs?service=git-receive-pack", "refuse"),
    ("POST", "/acme/evil.git/git-receive-pack", "refuse"),
    ("POST", "/someone/else.git/git-receive-pack", "refuse"),
    # fetch and clone of any repository
    ("GET", "/someone/else.git/info/refs?service=git-upload-pack", "pass"),
    ("POST", "/someone/else.git/git-upload-pack", "pass"),
    ("GET", "/someone/else/raw/main/README", "pass"),
    # tricks
    ("POST", "/acme/evil/../widgets/git-receive-pack", "refuse"),
    ("POST", "/acme/widgets/../../acme/evil/git-receive-pack", "refuse"),
    ("POST", "/acme%2Fevil/x/git-receive-pack", "refuse"),
    ("POST", "//acme/widgets/git-receive-pack", "refuse"),
    ("POST", "/acme\\widgets/x/git-receive-pack", "refuse"),
    ("POST", "/acme/widgets/git-%72eceive-pack", "pass"),  # decoded once: the same endpoint
    ("POST", "/acme/evil/git-%72eceive-pack", "refuse"),
    ("POST", "/acme/evil/git-%2572eceive-pack", "refuse"),
    ("GET", "/acme/evil/info/refs?service=git-%72eceive-pack", "refuse"),
    ("GET", "/acme/widgets/info/refs?service=git-receive-pack&service=x", "refuse"),
    ("GET", "/acme/widgets/info/refs/x?service=git-receive-pack", "refuse"),
    ("POST", "/acme/widgets/git-receive-pack?x=1", "refuse"),
    # other writes only under a listed repository
    ("POST", "/acme/widgets.git/info/lfs/objects/batch", "pass"),
    ("POST", "/acme/evil.git/info/lfs/objects/batch", "refuse"),
    ("POST", "/session", "refuse"),
])
def test_git(method: str, target: str, expected: str) -> None:
    assert action("github.com", method, target) == expected


# --- REST ---------------------------------------------------------------------

@pytest.mark.parametrize("method, target, expected", [
    ("POST", "/repos/acme/widgets/issues", "pass"),
    ("PATCH", "/repos/ACME/WIDGETS/pulls/1", "pass"),
    ("DELETE", "/repos/acme/widgets", "refuse"),
    ("PUT", "/repos/acme/widgets/contents/README.md", "pass"),
    ("POST", "/repos/acme/widgets/", "refuse"),
    ("POST", "/repos/acme/evil/issues", "refuse"),
    ("POST", "/gists", "refuse"),
    ("PATCH", "/user", "refuse"),
    ("POST", "/orgs/acme/repos", "refuse"),
    ("POST", "/user/repos", "refuse"),
    ("PUT", "/user/starred/acme/widgets", "refuse"),
    ("POST", "/repositories/123/issues", "refuse"),
    ("POST", "/repos/acme/widgets.git/issues", "refuse"),
    ("POST", "/repos/acme/widgets/forks", "refuse"),
    ("POST", "/repos/acme/widgets/Generate", "refuse"),
    ("POST", "/repos/acme/widgets/transfer/", "refuse"),
    ("GET", "/repos/acme/widgets/forks", "pass"),
    ("POST", "/repos/acme/widgets/forks.json", "refuse"),
    ("POST", "/repos/acme/widgets/issues.json", "pass"),
    ("GET", "/graphql", "pass"),
    # tricks
    ("POST", "/repos/acme%2Fwidgets/issues", "refuse"),
    ("POST", "/repos/acme%2fwidgets/issues", "refuse"),
    ("POST", "/repos/acme/widgets%2F..%2F..%2Fevil/issues", "refuse"),
    ("POST", "/repos/acme/widgets/../../acme/evil/issues", "refuse"),
    ("POST", "/repos/acme/widgets/%2e%2e/%2e%2e/acme/evil", "refuse"),
    ("POST", "/repos/acme/evil/../widgets/issues", "refuse"),
    ("POST", "/repos//acme/widgets/issues", "refuse"),
    ("POST", "//repos/acme/widgets/issues", "refuse"),
    ("POST", "/repos/acme\\widgets/issues", "refuse"),
    ("POST", "/repos/acme/widgets%5C..%5Cevil", "refuse"),
    ("POST", "/repos/acme/%77idgets/issues", "pass"),  # one decoding: widgets
    ("POST", "/repos/acme/%2577idgets/issues", "refuse"),
    ("POST", "/repos/acme/wid gets/issues", "refuse"),
    ("POST", "/repos/acme/widgets%00/issues", "refuse"),
    ("POST", "/repos/acme/w%zzidgets/issues", "refuse"),
    ("POST", "/repos/acme/\u212aidgets/issues", "refuse"),
    ("POST", "/repos/acme/./widgets/issues", "refuse"),
    # reads pass, whatever repository
    ("GET", "/repos/someone/else/issues", "pass"),
    ("HEAD", "/gists", "pass"),
    ("GET", "/graphql?query=mutation%7Bx%7D", "refuse"),
    # GraphQL
    ("POST", "/graphql", "graphql"),
    ("POST", "/graphql/", "graphql"),
    ("POST", "/graphql?x=1", "refuse"),
    ("PUT", "/graphql", "refuse"),
    ("OPTIONS", "/repos/acme/evil", "refuse"),
])
def test_rest(method: str, target: str, expected: str) -> None:
    assert action(API, method, target, JSON_TYPE) == expected


# Under a listed repository, writes that give access outliving the session
# (people, keys, hooks, settings, secrets, protection, Actions) are refused:
# the allowed resources are a list, everything else is not on it.
ADMIN = [
    ("PATCH", "/repos/acme/widgets"),  # settings, visibility, default branch
    ("DELETE", "/repos/acme/widgets"),
    ("PUT", "/repos/acme/widgets/collaborators/mallory"),
    ("DELETE", "/repos/acme/widgets/collaborators/alice"),
    ("PATCH", "/repos/acme/widgets/invitations/1"),
    ("POST", "/repos/acme/widgets/keys"),  # deploy keys
    ("POST", "/repos/acme/widgets/hooks"),
    ("PATCH", "/repos/acme/widgets/hooks/1/config"),
    ("PUT", "/repos/acme/widgets/actions/secrets/TOKEN"),
    ("POST", "/repos/acme/widgets/actions/variables"),
    ("PUT", "/repos/acme/widgets/actions/permissions"),
    ("PUT", "/repos/acme/widgets/actions/permissions/workflow"),
    ("POST", "/repos/acme/widgets/actions/runners/registration-token"),
    ("PUT", "/repos/acme/widgets/branches/main/protection"),
    ("DELETE", "/repos/acme/widgets/branches/main/protection"),
    ("POST", "/repos/acme/widgets/rulesets"),
    ("PUT", "/repos/acme/widgets/environments/prod"),
    ("PUT", "/repos/acme/widgets/dependabot/secrets/X"),
    ("PUT", "/repos/acme/widgets/codespaces/secrets/X"),
    ("PUT", "/repos/acme/widgets/topics"),
    ("PUT", "/repos/acme/widgets/vulnerability-alerts"),
    ("POST", "/repos/acme/widgets/dispatches"),
    ("POST", "/repos/acme/widgets/pages"),
    ("POST", "/repos/acme/widgets/forks"),
    ("POST", "/repos/acme/widgets/generate"),
    ("POST", "/repos/acme/widgets/transfer"),
    ("POST", "/repos/acme/widgets/autolinks"),
    ("PUT", "/repos/acme/widgets/interaction-limits"),
    ("POST", "/repos/acme/widgets/commits/abc/statuses"),
]
TRICKS = {
    "as-is": lambda p: p,
    "case": lambda p: p.replace("/widgets", "/WIDGETS").upper().replace("/REPOS/", "/repos/"),
    "format suffix": lambda p: p + ".json",
    "trailing slash": lambda p: p + "/",
    "encoded name": lambda p: p.replace("acme/widgets", "acme/%77idgets"),
}


@pytest.mark.parametrize("method, target", ADMIN)
@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_rest_admin_writes_refused(method: str, target: str, trick: str) -> None:
    tricked = TRICKS[trick](target)
    assert action(API, method, tricked, JSON_TYPE) == "refuse", tricked


@pytest.mark.parametrize("method, target", [
    ("PUT", "/repos/acme/widgets/contents/src/a.py"),
    ("DELETE", "/repos/acme/widgets/contents/src/a.py"),
    ("POST", "/repos/acme/widgets/git/blobs"),
    ("POST", "/repos/acme/widgets/git/trees"),
    ("POST", "/repos/acme/widgets/git/commits"),
    ("PATCH", "/repos/acme/widgets/git/refs/heads/topic"),
    ("POST", "/repos/acme/widgets/issues"),
    ("POST", "/repos/acme/widgets/issues/3/comments"),
    ("PATCH", "/repos/acme/widgets/issues/comments/9"),
    ("POST", "/repos/acme/widgets/issues/3/labels"),
    ("POST", "/repos/acme/widgets/pulls"),
    ("PUT", "/repos/acme/widgets/pulls/3/merge"),
    ("POST", "/repos/acme/widgets/pulls/3/reviews"),
    ("POST", "/repos/acme/widgets/pulls/3/requested_reviewers"),
    ("DELETE", "/repos/acme/widgets/comments/4"),
    ("POST", "/repos/acme/widgets/commits/abc/comments"),
    ("POST", "/repos/acme/widgets/labels"),
    ("POST", "/repos/acme/widgets/releases"),
    ("POST", "/repos/acme/widgets/releases/7/assets?name=a.tgz"),
    ("PATCH", "/repos/Acme/Widgets/Issues/3"),
])
def test_rest_content_writes_pass(method: str, target: str) -> None:
    host = "uploads.github.com" if "assets" in target else API
    assert action(host, method, target, JSON_TYPE) == "pass"


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("headers, expected", [
    ([(b"Content-Length", b"12")], "refuse"),
    ([(b"Transfer-Encoding", b"chunked")], "refuse"),
    ([(b"Content-Length", b"0")], "pass"),
    ([], "pass"),
])
def test_reads_with_a_body_refused(method: str, headers: Any, expected: str) -> None:
    for target in ("/graphql", "/repos/acme/widgets"):
        assert action(API, method, target, headers) == expected


@pytest.mark.parametrize("headers, expected", [
    ([], "graphql"),
    ([(b"Content-Type", b"application/json")], "graphql"),
    ([(b"content-type", b"Application/JSON;charset=utf-8")], "graphql"),
    ([(b"Content-Type", b"application/graphql")], "refuse"),
    ([(b"Content-Type", b"application/x-www-form-urlencoded")], "refuse"),
    ([(b"Content-Type", b"application/json"), (b"Content-Type", b"text/plain")], "refuse"),
    ([(b"Content-Type", b"application/json"), (b"Content-Encoding", b"gzip")], "refuse"),
])
def test_graphql_headers(headers: list[tuple[bytes, bytes]], expected: str) -> None:
    assert action(API, "POST", "/graphql", headers) == expected


# --- path spellings: no lenient reading of a passed path names another repository ---

_PIECES = ["repos", "acme", "ACME", "widgets", "Widgets", "evil", "issues", "..", ".", "",
           "%2F", "%2f", "%2e%2e", "%2E", "%252F", "%5C", "\\", "%77idgets", "%00", ";",
           "%", "%zz", "a%2Fb", "widgets.git", "%20"]


def lenient_readings(path: str) -> list[list[str]]:
    """Ways a forgiving server might read ``path``: decoded 0-2 times, dots resolved,
    backslashes as slashes, repeated slashes merged."""
    out: list[list[str]] = []
    text = path
    for _ in range(3):
        for variant in (text, text.replace("\\", "/")):
            norm = posixpath.normpath("/" + variant.lstrip("/"))
            out.append([s for s in norm.split("/") if s])
        text = unquote(text)
    return out


@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=7),
       st.sampled_from(["POST", "PATCH", "PUT", "DELETE"]))
def test_a_passed_write_names_a_listed_repository_however_read(parts: list[str],
                                                              method: str) -> None:
    path = "/" + "/".join(parts)
    if decide(REPOS, API, method.encode(), path.encode(), []).action != "pass":
        return
    for segments in lenient_readings(path):
        assert segments[:1] == ["repos"], path
        assert f"{segments[1].lower()}/{segments[2].lower()}" in REPOS, path


@given(st.lists(st.sampled_from([*_PIECES, "git-receive-pack", "info", "refs"]),
                min_size=1, max_size=6))
def test_a_passed_push_names_a_listed_repository_however_read(parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    if decide(REPOS, "github.com", b"POST", path.encode(), []).action != "pass":
        return
    if "receive-pack" not in unquote(unquote(path)).lower():
        return
    for segments in lenient_readings(path):
        name = segments[1].lower().removesuffix(".git")
        assert f"{segments[0].lower()}/{name}" in REPOS, path


@given(st.sampled_from(["acme/widgets", "acme/tools"]), st.randoms())
def test_any_case_of_a_listed_repository_passes(repo: str, rnd: Any) -> None:
    spelled = "".join(c.upper() if rnd.random() < 0.5 else c for c in repo)
    assert action(API, "POST", f"/repos/{spelled}/issues") == "pass"
    assert action("github.com", "POST", f"/{spelled}.git/git-receive-pack") == "pass"


# --- GraphQL bodies -------------------------------------------------------------

def body(query: str, variables: Any = None, **extra: Any) -> bytes:
    data: dict[str, Any] = {"query": query, **extra}
    if variables is not None:
        data["variables"] = variables
    return json.dumps(data).encode()


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
GH_PR_REVIEWERS = """
    mutation PullRequestCreateRequestReviews($input: RequestReviewsInput!) {
        requestReviews(input: $input) { clientMutationId }
    }"""


def test_gh_pr_create() -> None:
    ties = graphql_ties(body(GH_PR_CREATE, {"input": {
        "repositoryId": "R_kgDOwidgets", "baseRefName": "main", "headRefName": "feature",
        "title": "t", "body": "b", "draft": False, "maintainerCanModify": True}}))
    assert ties == (Tie("createPullRequest", REPOSITORY, "R_kgDOwidgets"),)


def test_gh_issue_create_and_comment_and_reviewers() -> None:
    assert graphql_ties(body(GH_ISSUE_CREATE, {"input": {"repositoryId": "R_1", "title": "t",
                                                         "body": "b"}})) == (
        Tie("createIssue", REPOSITORY, "R_1"),)
    assert graphql_ties(body(GH_COMMENT, {"input": {"body": "hi", "subjectId": "I_1"}})) == (
        Tie("addComment", SUBJECT, "I_1"),)
    assert graphql_ties(body(GH_PR_REVIEWERS, {"input": {
        "pullRequestId": "PR_1", "userIds": ["U_1"], "union": True}})) == (
        Tie("requestReviews", SUBJECT, "PR_1"),)


def test_reads_have_no_ties() -> None:
    assert graphql_ties(body("query RepositoryInfo($owner: String!, $name: String!) "
                             "{ repository(owner: $owner, name: $name) { id } }",
                             {"owner": "a", "name": "b"})) == ()
    assert graphql_ties(body("{ viewer { login } }", operationName=None)) == ()


def test_inline_input_aliases_and_several_mutations() -> None:
    ties = graphql_ties(body(
        'mutation { a: createIssue(input: {repositoryId: "R_1", title: "x"}) { issue { id } }'
        ' b: addComment(input: {subjectId: $s, body: "y"}) { __typename } __typename }',
        {"s": "PR_9"}))
    assert ties == (Tie("createIssue", REPOSITORY, "R_1"), Tie("addComment", SUBJECT, "PR_9"))


def test_every_mutation_counts_not_only_the_selected_operation() -> None:
    ties = graphql_ties(body("query A { viewer { login } } "
                             "mutation B { createIssue(input: {repositoryId: \"R_x\"}) { a } }",
                             operationName="A"))
    assert ties == (Tie("createIssue", REPOSITORY, "R_x"),)


@pytest.mark.parametrize("raw", [
    b"not json",
    b"[]",
    b'[{"query": "{ a }"}]',  # batches
    b'{"query": "{ a }", "query": "mutation { deleteRepository }"}',
    b'{"query": "{ a }", "extensions": {}}',
    b'{"query": 1}',
    b'{"query": "{ a }", "variables": []}',
    b'{"query": "{ a }", "operationName": 3}',
    b'{"query": "{ a }", "variables": {"x": NaN}}',
    b'\xef\xbb\xbf{"query": "{ a }"}',
    b'{"query": "\\u00ff{ a }"}',
    b"\xff",
])
def test_bodies_refused(raw: bytes) -> None:
    with pytest.raises(ScopeError):
        graphql_ties(raw)


@pytest.mark.parametrize("query, variables", [
    ("mutation { deleteRepository(input: {repositoryId: \"R_1\"}) { a } }", None),
    ("mutation { createRepository(input: {name: \"x\"}) { a } }", None),
    ("mutation { createGist(input: {}) { a } }", None),
    ("mutation { followUser(input: {userId: \"U_1\"}) { a } }", None),
    ("subscription { a }", None),
    ("mutation { ...F } fragment F on Mutation { createIssue(input: {repositoryId: \"R\"}) "
     "{ a } }", None),
    ("mutation { ... on Mutation { createIssue(input: {repositoryId: \"R\"}) { a } } }", None),
    ("mutation { createIssue(input: {repositoryId: \"R\"}) @skip(if: false) { a } }", None),
    ("mutation @x { createIssue(input: {repositoryId: \"R\"}) { a } }", None),
    ("mutation { createIssue(input: $i) { a } }", None),  # the variable not given
    ("mutation { createIssue(input: $i) { a } }", {"i": "R_1"}),
    ("mutation { createIssue(input: {title: \"no id\"}) { a } }", None),
    ("mutation { createIssue(input: {repositoryId: 5}) { a } }", None),
    ("mutation { createIssue(input: {repositoryId: \"\"\"R_1\"\"\"}) { a } }", None),
    ("mutation { createIssue(input: {repositoryId: \"R\"}, extra: 1) { a } }", None),
    ("mutation { createIssue(input: {repositoryId: \"R\", projectIds: [\"P\"]}) { a } }", None),
    ("mutation { updatePullRequest(input: $i) { a } }",
     {"i": {"pullRequestId": "PR_1", "projectIds": ["P"]}}),
    ("mutation # hidden?\r{ createIssue(input: {repositoryId: \"R\"}) { a } }", None),
    ("query { a } mutation {", None),
    ("mutation { " + " ".join(f'm{i}: closeIssue(input: {{issueId: "I"}}) {{ a }}'
                              for i in range(9)) + " }", None),
])
def test_mutations_refused(query: str, variables: Any) -> None:
    if "hidden" in query:
        # the comment ends at \r: the mutation is read and tied, not hidden
        assert graphql_ties(body(query, variables)) == (Tie("createIssue", REPOSITORY, "R"),)
        return
    with pytest.raises(ScopeError):
        graphql_ties(body(query, variables))


def test_tied() -> None:
    ids = {"acme/widgets": "R_w", "acme/tools": "R_t"}
    assert tied(Tie("createIssue", REPOSITORY, "R_w"), REPOS, ids, None)
    assert not tied(Tie("createIssue", REPOSITORY, "R_other"), REPOS, ids, None)
    assert not tied(Tie("createIssue", REPOSITORY, "R_w"), REPOS, {}, None)
    assert tied(Tie("addComment", SUBJECT, "I_1"), REPOS, {}, "ACME/Widgets")
    assert not tied(Tie("addComment", SUBJECT, "I_1"), REPOS, {}, "acme/evil")
    assert not tied(Tie("addComment", SUBJECT, "I_1"), REPOS, {}, None)
    assert not tied(Tie("addComment", SUBJECT, "I_1"), REPOS, {}, "acme/widgets/x")
