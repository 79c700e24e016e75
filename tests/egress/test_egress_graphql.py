"""libegress.graphql: the strict reader --repos tells GraphQL reads from writes with."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libegress.graphql import (
    MAX_DEPTH,
    Field,
    FragmentSpread,
    GraphQLError,
    InlineFragment,
    Variable,
    parse,
    tokens,
)


def kinds(source: str) -> list[str]:
    return [op.kind for op in parse(source).operations]


def test_gh_pr_create_as_gh_sends_it() -> None:
    doc = parse("""
        mutation PullRequestCreate($input: CreatePullRequestInput!) {
            createPullRequest(input: $input) {
                pullRequest {
                    id
                    url
                }
            }
        }""")
    (op,) = doc.operations
    assert (op.kind, op.name, op.variables) == ("mutation", "PullRequestCreate", ("input",))
    (field,) = op.selections
    assert isinstance(field, Field)
    assert field.name == "createPullRequest"
    assert field.arguments == {"input": Variable("input")}


def test_shurcool_compact_form() -> None:
    doc = parse("mutation CommentCreate($input:AddCommentInput!)"
                "{addComment(input: $input){commentEdge{node{url}}}}")
    field = doc.operations[0].selections[0]
    assert isinstance(field, Field) and field.name == "addComment"


def test_shorthand_query_and_named_query() -> None:
    assert kinds("{ viewer { login } }") == ["query"]
    assert kinds("query Q($a: Int = 3) @x { a: viewer { login } }") == ["query"]


def test_several_operations_and_fragments() -> None:
    doc = parse("""
        query A { ...F }
        fragment F on Query { viewer { login } }
        mutation B { createIssue(input: {repositoryId: "R_1", title: "t"}) { issue { id } } }
    """)
    assert [op.kind for op in doc.operations] == ["query", "mutation"]
    assert set(doc.fragments) == {"F"}
    first = doc.operations[0].selections[0]
    assert isinstance(first, FragmentSpread)
    field = doc.operations[1].selections[0]
    assert isinstance(field, Field)
    assert field.arguments["input"] == {"repositoryId": "R_1", "title": "t"}


def test_inline_fragments_and_aliases() -> None:
    doc = parse("mutation { x: addComment(input: $i) { ... on AddCommentPayload { a } "
                "... @include(if: true) { b } } }")
    field = doc.operations[0].selections[0]
    assert isinstance(field, Field) and (field.alias, field.name) == ("x", "addComment")
    assert all(isinstance(s, InlineFragment) for s in field.selections)


@pytest.mark.parametrize("source, expected", [
    # A comment ends at \n, \r\n or \r: what follows is read, not hidden.
    ("query { a } # note\rmutation { b(input: {}) { c } }", ["query", "mutation"]),
    ("query { a } # note\r\nmutation { b }", ["query", "mutation"]),
    ("query { a } # mutation { b }", ["query"]),
    # Commas are ignored, strings hold what looks like syntax.
    (',,query,{,a(x: "mutation { b }"),},', ["query"]),
    ('query { a(x: """mutation { b } \\""" still""") }', ["query"]),
    ('query { a(x: "\\u{1F600}\\u0041") }', ["query"]),
])
def test_lexing_matches_the_spec(source: str, expected: list[str]) -> None:
    assert kinds(source) == expected


@pytest.mark.parametrize("source", [
    "",
    "# only a comment",
    "\ufeffquery { a }",  # a BOM: refused, not ignored
    "query { a } \u2028 mutation { b }",
    "query { a(x: \"unterminated) }",
    "query { a(x: \"line\nbreak\") }",
    "query { a(x: \"\\q\") }",
    "query { a(x: \"\\uD800\") }",
    "query { a(x: 01) }",
    "query { a(x: 1.) }",
    "query { a(x: 1, x: 2) }",
    "query { a(x: {k: 1, k: 2}) }",
    "query { }",
    "query { a } extra",
    "type Query { a: Int }",
    "schema { query: Query }",
    "query { a } .. { b }",
    "fragment on on Query { a }",
    "query ($a: Int, $a: Int) { b }",
    "query { a \x00 }",
    "query { a(x: $v) { b } ",
])
def test_refused(source: str) -> None:
    with pytest.raises(GraphQLError):
        parse(source)


def test_depth_is_bounded() -> None:
    deep = "query " + "{ a " * (MAX_DEPTH + 5) + "}" * (MAX_DEPTH + 5)
    with pytest.raises(GraphQLError):
        parse(deep)
    nested_value = "query { a(x: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + ") }"
    with pytest.raises(GraphQLError):
        parse(nested_value)


def test_no_recursion_error_on_any_nesting() -> None:
    with pytest.raises(GraphQLError):
        parse("{" * 100_000)


@given(st.text(max_size=200))
def test_any_text_is_a_document_or_a_refusal(text: str) -> None:
    with contextlib.suppress(GraphQLError):
        parse(text)


@given(st.lists(st.sampled_from(["{", "}", "(", ")", "a", "b:", "$v", "...", "on", "T",
                                 "mutation", "query", "\"s\"", "#c\n", "\r", ",", "@d",
                                 "[", "]", "1", "fragment", "F"]), max_size=40))
def test_token_soup_is_a_document_or_a_refusal(parts: list[str]) -> None:
    source = " ".join(parts)
    try:
        doc = parse(source)
    except GraphQLError:
        return
    # Whatever parses: a mutation keyword token at definition level is seen.
    assert doc.operations


def test_tokens_of_a_spread() -> None:
    assert [t.text for t in tokens("...F")] == ["...", "F"]
