"""gpg-shim's pure parts: reading git's gpg command lines, routing status lines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.errors import UsageError
from libbroker.signing.args import STATUS_PREFIX, SignCall, StatusRouter, VerifyCall, parse_args

KEY = "ABCDEF0123456789"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--status-fd=2", "-bsau", KEY], SignCall(KEY, 2)),  # what git runs
        (["--status-fd", "2", "-bsau", KEY], SignCall(KEY, 2)),
        (["-b", "-s", "-a", "-u", KEY, "--status-fd=3"], SignCall(KEY, 3)),
        (["-bsa", "-u" + KEY], SignCall(KEY, None)),
        (["-bsau" + KEY], SignCall(KEY, None)),
        (["--detach-sign", "--armor", "--local-user", KEY], SignCall(KEY, None)),
        (["--detach-sign", "--sign", "--armor", f"--local-user={KEY}"], SignCall(KEY, None)),
        (["-ba", "-u", KEY], SignCall(KEY, None)),  # -b implies signing
        (["--batch", "--no-tty", "--keyid-format=long", "-bsau", KEY], SignCall(KEY, None)),
        # git falls back to the committer identity when no signing key is set.
        (["--status-fd=2", "-bsau", "Test <t@example.test>"],
         SignCall("Test <t@example.test>", 2)),
        (["-bsau", "-weird-but-a-key"], SignCall("-weird-but-a-key", None)),
    ],
)
def test_signing_forms(argv: list[str], expected: SignCall) -> None:
    assert parse_args(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["--keyid-format=long", "--status-fd=1", "--verify", "/tmp/.git_vtag_x", "-"],
        ["--status-fd=1", "--verify", "sig.asc"],
        ["--verify", "-bsau"],  # verification wins: nothing is signed
    ],
)
def test_verification_is_handed_on_untouched(argv: list[str]) -> None:
    assert parse_args(argv) == VerifyCall(tuple(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "nothing to do"),
        (["--armor"], "nothing to do"),
        (["-sau", KEY], "only detached"),
        (["-bsu", KEY], "only armored"),
        (["-bsa"], "exactly one signing key"),
        (["-bsau", KEY, "-u", "OTHER"], "exactly one signing key"),
        (["-bsau"], "-u needs a key"),
        (["-bsau", ""], "exactly one signing key"),
        (["--status-fd"], "needs a value"),
        (["--status-fd=x", "-bsau", KEY], "not a file descriptor number"),
        (["--status-fd=-1", "-bsau", KEY], "not a file descriptor number"),
        (["--status-fd=99999999999", "-bsau", KEY], "not a file descriptor number"),
        (["-bsau", KEY, "file.txt"], "unexpected argument"),
        (["-bsau", KEY, "-"], "unexpected argument"),
        (["--clearsign", "-u", KEY], "not supported"),
        (["-bsau", KEY, "--homedir", "/tmp/x"], "unsupported option --homedir"),
        (["-bsau", KEY, "--passphrase=x"], "unsupported option --passphrase"),
        (["-bsex", "-u", KEY], "unsupported option -e"),
        (["--armor=yes", "-bsu", KEY], "takes no value"),
    ],
)
def test_anything_else_is_a_usage_error(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args(argv)


def _deliver(router: StatusRouter, chunks: list[bytes]) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for chunk in chunks:
        for fd, data in router.feed(chunk):
            out[fd] = out.get(fd, b"") + data
    for fd, data in router.flush():
        out[fd] = out.get(fd, b"") + data
    return out


GPG_STDERR = (
    b"[GNUPG:] KEY_CONSIDERED 0123 2\n"
    b"gpg: using \"ABCDEF\" as default secret key for signing\n"
    b"[GNUPG:] BEGIN_SIGNING H10\n"
    b"[GNUPG:] SIG_CREATED D 22 10 00 1700000000 0123\n"
)


def test_status_fd_2_passes_everything_through_unchanged() -> None:
    assert _deliver(StatusRouter(2), [GPG_STDERR[:7], GPG_STDERR[7:]]) == {2: GPG_STDERR}


def test_other_status_fd_gets_the_status_lines_only() -> None:
    out = _deliver(StatusRouter(5), [GPG_STDERR])
    assert out[5] == b"".join(
        line + b"\n" for line in GPG_STDERR.split(b"\n") if line.startswith(STATUS_PREFIX))
    assert out[2] == b'gpg: using "ABCDEF" as default secret key for signing\n'


def test_without_status_fd_everything_is_stderr() -> None:
    assert _deliver(StatusRouter(None), [GPG_STDERR]) == {2: GPG_STDERR}


lines = st.lists(
    st.one_of(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
              st.binary(max_size=30).map(lambda b: STATUS_PREFIX + b.replace(b"\n", b""))),
    max_size=8,
)


@given(lines, st.booleans(), st.lists(st.integers(0, 400), max_size=6), st.sampled_from([1, 4]))
def test_routing_loses_nothing_whatever_the_chunking(
    body: list[bytes], trailing_newline: bool, cuts: list[int], fd: int
) -> None:
    data = b"\n".join(body) + (b"\n" if trailing_newline and body else b"")
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    out = _deliver(StatusRouter(fd), chunks)
    every = [line + b"\n" for line in data.split(b"\n")]
    every[-1] = every[-1][:-1]
    assert out.get(fd, b"") == b"".join(x for x in every if x.startswith(STATUS_PREFIX))
    assert out.get(2, b"") == b"".join(x for x in every if not x.startswith(STATUS_PREFIX))
