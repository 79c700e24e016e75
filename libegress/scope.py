"""``--repos``: the GitHub token's writes held to named repositories (pure).

With ``--repos=OWNER/NAME,...`` the token still goes with every read (a clone
or an API GET of any repository the token can read), but a request that would
write goes only when it can be tied to a listed repository; anything else is
refused with 403 and ``X-Proxy-Error: blocked-by-scope``.

- git (github.com and any other token host but the API's): a push
  (``info/refs?service=git-receive-pack`` and ``POST .../git-receive-pack``)
  only to ``/OWNER/NAME(.git)/`` of a listed repository; fetch and clone
  (upload-pack) of any; other writes (LFS batch, say) only under a listed
  repository's path.
- REST (``api.*`` and ``uploads.*``): methods other than GET and HEAD only
  under ``/repos/OWNER/NAME/<resource>`` of a listed repository, where the
  resource is one of :data:`WRITABLE` (its content and the conversation
  around it).  Everything else there is refused: the repository itself
  (settings, visibility, deletion), collaborators, keys, hooks, secrets and
  variables, protection, Actions, forks and transfers each give access that
  outlives the session, and an endpoint not named is refused, not guessed
  at.  A format suffix (``forks.json``) is judged as the endpoint it names.
  GraphQL over GET is refused (only POST is inspected), and so is a GET or
  HEAD carrying a body on these hosts (nothing there needs one).
- GraphQL (``POST /graphql``): :func:`decide` answers ``graphql``; the shell
  buffers the body (at most :data:`MAX_GRAPHQL_BODY`) and :func:`graphql_ties`
  reads it.  Queries pass.  Every mutation in the document (not only the
  selected operation: no guess about which one the server runs) must be a
  field of :data:`MUTATIONS`, whose ``input`` names the node it writes to: a
  repository id, compared with the listed repositories' ids, or an issue or
  pull request id, whose repository is looked up.  Those lookups are the
  shell's; :func:`tied` judges their answers.

A path is judged after one percent-decoding; ``..`` and ``.`` segments,
encoded slashes, backslashes and ``%25`` (which a second decoding would turn
into something else), double slashes and malformed escapes are refused on
any request this module has to judge.  Owners and names compare
case-insensitively, as GitHub's do, after a check that they are spelled as
GitHub spells them (ASCII letters, digits, ``-`` ``_`` ``.``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

# The GraphQL reader (libegress.graphql) loads at the first GraphQL write to
# judge, in graphql_ties: a proxy without --repos, or whose token only reads,
# never needs it, and its import (a dozen dataclasses, the lexer's regexes)
# was ~5 ms of every egress-proxy start's CPU.

BLOCKED = "blocked-by-scope"
READS = frozenset({b"GET", b"HEAD"})
MAX_GRAPHQL_BODY = 1 << 20
MAX_MUTATIONS = 8
MAX_ID = 256
# The resources a write may touch under a listed repository (an allow list):
# files and git data, issues, pull requests, comments, labels, releases.
WRITABLE = frozenset({"contents", "git", "issues", "pulls", "comments", "labels", "releases"})

_OWNER = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ENCODED_BAD = re.compile(r"%(?:2[fF]|5[cC]|25|00)")
_JSON_TYPES = ("application/json", "application/graphql+json")
_FORMAT = re.compile(r"\.[A-Za-z0-9]+$")  # GitHub routes ``forks.json`` as ``forks``


class ScopeError(ValueError):
    """A request the scope refuses; the message says why (never a header value)."""


@dataclass(frozen=True)
class Decision:
    """What the shell does with a request: ``pass``, ``refuse`` or ``graphql`` (read its body)."""

    action: str
    reason: str = ""


PASS = Decision("pass")
GRAPHQL = Decision("graphql")


@dataclass(frozen=True)
class Rule:
    """A mutation --repos can tie: the ``input`` key naming its node, and what that node is."""

    key: str
    kind: str  # "repository" (a repository's node id) or "subject" (an issue's or a PR's)


REPOSITORY = "repository"
SUBJECT = "subject"

# What gh pr create / gh issue create / gh pr comment send (createPullRequest,
# createIssue, addComment; gh pr create's follow-ups updatePullRequest and
# requestReviews), and the few edits of issues and pull requests beside them.
MUTATIONS: dict[str, Rule] = {
    "createPullRequest": Rule("repositoryId", REPOSITORY),
    "createIssue": Rule("repositoryId", REPOSITORY),
    "addComment": Rule("subjectId", SUBJECT),
    "updatePullRequest": Rule("pullRequestId", SUBJECT),
    "requestReviews": Rule("pullRequestId", SUBJECT),
    "markPullRequestReadyForReview": Rule("pullRequestId", SUBJECT),
    "closePullRequest": Rule("pullRequestId", SUBJECT),
    "reopenPullRequest": Rule("pullRequestId", SUBJECT),
    "mergePullRequest": Rule("pullRequestId", SUBJECT),
    "updateIssue": Rule("id", SUBJECT),
    "closeIssue": Rule("issueId", SUBJECT),
    "reopenIssue": Rule("issueId", SUBJECT),
    "addLabelsToLabelable": Rule("labelableId", SUBJECT),
}


@dataclass(frozen=True)
class Tie:
    """A mutation's claim to write to one node: the shell checks the node's repository."""

    mutation: str
    kind: str
    node_id: str


@dataclass
class Scope:
    """The listed repositories, the hosts they hold the token to, and the lookups' cache.

    The cache is the shell's (:mod:`libegress.scope_guard`): the listed
    repositories' node ids by host, and subjects' repositories by (host, id).
    """

    repos: frozenset[str]
    hosts: frozenset[str]
    repo_ids: dict[str, tuple[dict[str, str], float]] = field(default_factory=dict)
    nodes: dict[tuple[str, str], tuple[str | None, float]] = field(default_factory=dict)

    def applies(self, host: str) -> bool:
        """Whether ``host`` is one of the token's (the scope holds only those)."""
        return host in self.hosts


# ---------------------------------------------------------------------------
# The list

def repo_key(owner: str, name: str) -> str | None:
    """``owner/name`` lower-cased if both are spelled as GitHub spells them, else None."""
    if not _OWNER.fullmatch(owner) or not _NAME.fullmatch(name) or name in (".", ".."):
        return None
    return f"{owner.lower()}/{name.lower()}"


def parse_repos(text: str) -> frozenset[str]:
    """The ``--repos`` list (comma-separated OWNER/NAME) as keys; ValueError naming a bad one."""
    out: set[str] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        owner, sep, name = item.partition("/")
        if name.lower().endswith(".git"):
            name = name[:-4]
        key = repo_key(owner, name) if sep else None
        if key is None:
            raise ValueError(f"--repos: {item!r} is not OWNER/NAME")
        out.add(key)
    if not out:
        raise ValueError("--repos: no repository named")
    return frozenset(out)


# ---------------------------------------------------------------------------
# Request lines

def clean_path(raw: str) -> list[str]:
    """The path's segments after one decoding; ScopeError for a trick."""
    if not raw.startswith("/"):
        raise ScopeError("the path is not absolute")
    if any(not "!" <= c <= "~" for c in raw):
        raise ScopeError("a space or non-ASCII byte in the path")
    if "\\" in raw or "//" in raw:
        raise ScopeError("a backslash or double slash in the path")
    if _BAD_ESCAPE.search(raw) or _ENCODED_BAD.search(raw):
        raise ScopeError("an encoded slash, backslash, percent or NUL, or a bad escape, "
                         "in the path")
    try:
        decoded = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise ScopeError("the decoded path is not UTF-8") from None
    if any(not " " < c <= "~" for c in decoded) or "//" in decoded:
        raise ScopeError("the decoded path holds a control, space, non-ASCII or double slash")
    segments = decoded.split("/")[1:]
    if any(s in (".", "..") for s in segments):
        raise ScopeError("a '.' or '..' segment in the path")
    if segments and segments[-1] == "":
        segments.pop()  # one trailing slash
    return segments


def split_target(target: bytes) -> tuple[str, str | None]:
    """Path and query (None when there is no '?') of an origin-form target."""
    text = target.decode("ascii", "replace")
    path, sep, query = text.partition("?")
    return path, (query if sep else None)


def _listed(repos: frozenset[str], owner: str, name: str, *, git: bool) -> bool:
    if git and name.lower().endswith(".git"):
        name = name[:-4]
    key = repo_key(owner, name)
    return key is not None and key in repos


def query_values(query: str, name: str) -> list[str]:
    """Every value of parameter ``name`` in ``query`` (decoded once)."""
    out: list[str] = []
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if unquote(key.replace("+", " ")) == name:
            out.append(unquote(value.replace("+", " ")))
    return out


def decide(repos: frozenset[str], host: str, method: bytes, target: bytes,
           headers: list[tuple[bytes, bytes]]) -> Decision:
    """Whether a token host's request passes, is refused, or needs its GraphQL body read."""
    try:
        if host.startswith(("api.", "uploads.")):
            return _decide_api(repos, method, target, headers)
        return _decide_git(repos, method, target)
    except ScopeError as exc:
        return Decision("refuse", str(exc))


def _decide_git(repos: frozenset[str], method: bytes, target: bytes) -> Decision:
    path, query = split_target(target)
    lowered = target.lower()
    push = b"receive-pack" in lowered or b"receive-pack" in unquote(
        target.decode("ascii", "replace")).lower().encode()
    if method in READS and not push:
        return PASS
    segments = clean_path(path)
    if push:
        services = query_values(query, "service") if query is not None else []
        discovery = (method in READS and len(segments) == 4 and segments[2:] == ["info", "refs"]
                     and query is not None and services == ["git-receive-pack"]
                     and query.count("&") == 0)
        upload = (method == b"POST" and len(segments) == 3
                  and segments[2] == "git-receive-pack" and query is None)
        if not (discovery or upload):
            raise ScopeError("a receive-pack request of an unknown shape")
        if not _listed(repos, segments[0], segments[1], git=True):
            raise ScopeError(f"push to {segments[0]}/{segments[1]}, not a listed repository")
        return PASS
    if (method == b"POST" and len(segments) == 3 and segments[2] == "git-upload-pack"
            and repo_key(segments[0], segments[1].removesuffix(".git")) is not None):
        return PASS  # fetch and clone: any repository the token can read
    if len(segments) >= 2 and _listed(repos, segments[0], segments[1], git=True):
        return PASS
    raise ScopeError(f"{method.decode('ascii', 'replace')} outside the listed repositories")


def _decide_api(repos: frozenset[str], method: bytes, target: bytes,
                headers: list[tuple[bytes, bytes]]) -> Decision:
    path, query = split_target(target)
    if method in READS:
        if b"graphql" in target.lower() and query is not None:
            raise ScopeError("GraphQL over GET (only POST is inspected)")
        if _has_body(headers):
            raise ScopeError(f"{method.decode()} with a body (GraphQL over GET is not inspected)")
        return PASS
    segments = clean_path(path)
    if segments == ["graphql"] and method == b"POST":
        if query is not None:
            raise ScopeError("a query string on POST /graphql")
        _graphql_headers(headers)
        return GRAPHQL
    if (len(segments) >= 3 and segments[0] == "repos"
            and _listed(repos, segments[1], segments[2], git=False)):
        resource = _resource(segments[3:])
        if resource not in WRITABLE:
            what = resource or "the repository itself"
            raise ScopeError(f"{method.decode('ascii', 'replace')} on {what}: not a write "
                             "--repos allows (contents, git, issues, pulls, comments, labels, "
                             "releases)")
        return PASS
    raise ScopeError(f"{method.decode('ascii', 'replace')} outside /repos/OWNER/NAME "
                     "of the listed repositories")


def _resource(rest: list[str]) -> str:
    """The endpoint a write under ``/repos/OWNER/NAME`` names ("" for the repository itself).

    A commit comment (``commits/SHA/comments``) is a comment; a format
    suffix is dropped, as GitHub's router drops it.
    """
    if not rest:
        return ""
    first = _FORMAT.sub("", rest[0]).lower()
    if first == "commits" and len(rest) == 3 and _FORMAT.sub("", rest[2]).lower() == "comments":
        return "comments"
    return first


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        low = name.lower()
        if low == b"transfer-encoding" or (low == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _graphql_headers(headers: list[tuple[bytes, bytes]]) -> None:
    types = [v for n, v in headers if n.lower() == b"content-type"]
    if len(types) > 1:
        raise ScopeError("more than one Content-Type on POST /graphql")
    if types:
        media = types[0].split(b";", 1)[0].strip().lower().decode("ascii", "replace")
        if media not in _JSON_TYPES:
            raise ScopeError("POST /graphql whose body is not JSON")
    for name, value in headers:
        if name.lower() == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            raise ScopeError("an encoded POST /graphql body")


# ---------------------------------------------------------------------------
# GraphQL bodies

def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ScopeError(f"the JSON key {key!r} twice in the GraphQL body")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ScopeError(f"{name} in the GraphQL body")


def read_body(body: bytes) -> tuple[str, dict[str, Any]]:
    """The query text and variables of a GraphQL POST body; ScopeError when refused."""
    if len(body) > MAX_GRAPHQL_BODY:
        raise ScopeError(f"a GraphQL body over {MAX_GRAPHQL_BODY} bytes")
    try:
        data = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates,
                          parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, ScopeError):
            raise
        raise ScopeError("the GraphQL body is not JSON") from None
    if not isinstance(data, dict):
        raise ScopeError("the GraphQL body is not one JSON object (batches are refused)")
    unknown = sorted(k for k in data if k not in ("query", "variables", "operationName"))
    if unknown:
        raise ScopeError(f"the GraphQL body has the key {unknown[0]!r}")
    query, variables = data.get("query"), data.get("variables")
    if not isinstance(query, str):
        raise ScopeError("the GraphQL body has no query string")
    if variables is None:
        variables = {}
    if not isinstance(variables, dict):
        raise ScopeError("the GraphQL variables are not an object")
    if not isinstance(data.get("operationName", ""), str | None):
        raise ScopeError("the GraphQL operationName is not a string")
    return query, variables


def graphql_ties(body: bytes) -> tuple[Tie, ...]:
    """What each mutation in the body writes to; () for a read.  ScopeError when refused."""
    query, variables = read_body(body)
    from libegress.graphql import GraphQLError, parse

    try:
        document = parse(query)
    except GraphQLError as exc:
        raise ScopeError(f"a GraphQL document this proxy does not read: {exc}") from None
    ties: list[Tie] = []
    for op in document.operations:
        if op.kind == "query":
            continue
        if op.kind != "mutation":
            raise ScopeError(f"a GraphQL {op.kind}")
        if op.directives:
            raise ScopeError("a directive on a mutation")
        for selection in op.selections:
            tie = _mutation_tie(selection, variables)
            if tie is not None:
                ties.append(tie)
    if len(ties) > MAX_MUTATIONS:
        raise ScopeError(f"more than {MAX_MUTATIONS} mutations in one request")
    return tuple(ties)


def _mutation_tie(selection: object, variables: Mapping[str, Any]) -> Tie | None:
    from libegress.graphql import Field  # loaded by graphql_ties, the only caller

    if not isinstance(selection, Field) or selection.directives:
        raise ScopeError("a fragment or directive at a mutation's top level")
    if selection.name == "__typename" and not selection.arguments:
        return None
    rule = MUTATIONS.get(selection.name)
    if rule is None:
        raise ScopeError(f"mutation {selection.name} is not one --repos can tie to a repository")
    if set(selection.arguments) != {"input"}:
        raise ScopeError(f"mutation {selection.name} with arguments other than input")
    fields = _resolve(selection.arguments["input"], variables)
    if not isinstance(fields, Mapping):
        raise ScopeError(f"mutation {selection.name}'s input is not an object")
    for key in fields:
        if "project" in key.lower():
            # A project lies outside the repository: no tie to check.
            raise ScopeError(f"mutation {selection.name} with {key}")
    node = _resolve(fields.get(rule.key), variables)
    if not isinstance(node, str) or not 0 < len(node) <= MAX_ID:
        raise ScopeError(f"mutation {selection.name} without a string {rule.key}")
    return Tie(selection.name, rule.kind, node)


def _resolve(value: Any, variables: Mapping[str, Any]) -> Any:
    from libegress.graphql import Variable  # loaded by graphql_ties, _mutation_tie's caller

    if isinstance(value, Variable):
        if value.name not in variables:
            raise ScopeError(f"the variable ${value.name} is not given")
        return variables[value.name]
    return value


def tied(tie: Tie, repos: frozenset[str], repo_ids: Mapping[str, str],
         node_repo: str | None) -> bool:
    """Whether ``tie`` writes to a listed repository.

    ``repo_ids`` are the listed repositories' node ids (key: owner/name);
    ``node_repo`` is the ``nameWithOwner`` of a subject's repository, as
    looked up (None: not an issue or pull request, or the lookup failed).
    """
    if tie.kind == REPOSITORY:
        return tie.node_id in repo_ids.values()
    if node_repo is None:
        return False
    owner, _, name = node_repo.partition("/")
    key = repo_key(owner, name)
    return key is not None and key in repos
