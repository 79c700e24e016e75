"""gpg's command line as git writes it, and gpg's status lines: pure functions.

git runs its ``gpg.program`` as ``--status-fd=2 -bsau KEY`` to sign and with
``--verify SIGFILE -`` to verify.  :func:`parse_args` reads those (and the
equivalent spellings other callers use) into a :class:`SignCall` or a
:class:`VerifyCall`; :class:`StatusRouter` puts gpg's status lines on the fd
git named.  No I/O and nothing beyond the standard library: gpg-shim imports
this on every call, verification included.
"""

from __future__ import annotations

from libbroker.errors import UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from collections.abc import Iterable

STATUS_PREFIX = b"[GNUPG:] "
# Options that are harmless in a signing call and carry no meaning for the
# broker (it always runs ``gpg --status-fd=2 -bsau KEY``).
_IGNORED_FLAGS = frozenset({"--batch", "--no-tty", "--yes"})
_VALUE_OPTIONS = frozenset({"--status-fd", "--local-user", "--keyid-format"})
_SIGN_FLAGS = frozenset({"--detach-sign", "--sign", "--armor"})
_SIGN_WORDS = frozenset({"--sign", "--detach-sign", "--clearsign", "--clear-sign"})


class SignCall:
    """git asks for a detached armored signature by ``key``; status lines go to ``status_fd``."""

    # A plain class, not a NamedTuple: typing.NamedTuple costs start-up time
    # on every signature and every verification git asks for.
    __slots__ = ("key", "status_fd")

    def __init__(self, key: str, status_fd: int | None) -> None:
        self.key = key
        self.status_fd = status_fd

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SignCall) and (self.key, self.status_fd) == (
            other.key,
            other.status_fd,
        )

    def __hash__(self) -> int:
        return hash((self.key, self.status_fd))

    def __repr__(self) -> str:
        return f"SignCall(key={self.key!r}, status_fd={self.status_fd!r})"


class VerifyCall:
    """Anything with ``--verify``: the local gpg runs it with these arguments."""

    __slots__ = ("args",)

    def __init__(self, args: tuple[str, ...]) -> None:
        self.args = args

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyCall) and self.args == other.args

    def __hash__(self) -> int:
        return hash(self.args)

    def __repr__(self) -> str:
        return f"VerifyCall(args={self.args!r})"


# --- parsing git's command lines ---------------------------------------------


def parse_args(args: list[str]) -> SignCall | VerifyCall:
    """Classify and check gpg-style arguments as git passes them.

    Signing accepts the forms git uses and their equivalents: ``-bsau KEY``,
    ``-b -s -a -u KEY``, ``-uKEY``, ``--local-user=KEY``, ``--detach-sign
    --armor``, ``--status-fd=N`` or ``--status-fd N``.  The result must be a
    detached, armored signature by exactly one key, since that is the only
    thing the broker makes; anything else is a UsageError naming the problem.
    """
    if "--verify" in args:
        return VerifyCall(tuple(args))
    flags: set[str] = set()
    keys: list[str] = []
    status_fd: int | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in _VALUE_OPTIONS:
                if not eq:
                    if i >= len(args):
                        raise UsageError(f"option {name} needs a value")
                    value = args[i]
                    i += 1
                if name == "--status-fd":
                    status_fd = _fd_number(value)
                elif name == "--local-user":
                    keys.append(value)
                continue  # --keyid-format only shapes output gpg prints for verification
            if name in _SIGN_WORDS - _SIGN_FLAGS:
                raise UsageError(f"{name} is not supported: git signs with -bsau KEY")
            if name not in _SIGN_FLAGS and name not in _IGNORED_FLAGS:
                raise UsageError(f"unsupported option {name}")
            if eq:
                raise UsageError(f"option {name} takes no value")
            if name in _SIGN_FLAGS:
                flags.add(name[2])  # d, s, a
        elif arg.startswith("-") and arg != "-":
            i = _short_cluster(arg, args, i, flags, keys)
        else:
            raise UsageError(f"unexpected argument {arg!r}: the payload is read from stdin")
    if not flags & {"b", "d", "s"}:
        raise UsageError("nothing to do: gpg-shim signs (-bsau KEY) or verifies (--verify)")
    if not flags & {"b", "d"}:
        raise UsageError("only detached signatures (-b) are supported")
    if "a" not in flags:
        raise UsageError("only armored signatures (-a) are supported")
    if len(keys) != 1 or not keys[0]:
        raise UsageError("name exactly one signing key with -u KEY")
    return SignCall(keys[0], status_fd)


def _short_cluster(arg: str, args: list[str], i: int, flags: set[str], keys: list[str]) -> int:
    """Read ``-bsau`` style flags; ``u`` takes the rest of the cluster or the next argument."""
    for pos in range(1, len(arg)):
        letter = arg[pos]
        if letter in "bsa":
            flags.add(letter)
        elif letter == "u":
            rest = arg[pos + 1 :]
            if rest:
                keys.append(rest)
                return i
            if i >= len(args):
                raise UsageError("option -u needs a key")
            keys.append(args[i])
            return i + 1
        else:
            raise UsageError(f"unsupported option -{letter}")
    return i


def _fd_number(value: str) -> int:
    if not value.isdigit() or len(value) > 9:
        raise UsageError(f"--status-fd {value!r} is not a file descriptor number")
    return int(value)


class StatusRouter:
    """Splits the server's stderr (gpg's messages and status lines) by line.

    The broker runs ``gpg --status-fd=2``, so status lines and human messages
    arrive as one stream.  git always asks for ``--status-fd=2`` and then both
    belong on fd 2 as they are; for any other status fd, lines starting with
    ``[GNUPG:] `` go there and the rest to stderr, as gpg itself would do.
    """

    def __init__(self, status_fd: int | None) -> None:
        self.status_fd = status_fd
        self._partial = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The (fd, bytes) writes ``data`` completes, in order."""
        if self.status_fd == 2:
            return [(2, data)] if data else []
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return self._route(line + b"\n" for line in lines)

    def flush(self) -> list[tuple[int, bytes]]:
        """Writes for a last line without its newline."""
        partial, self._partial = self._partial, b""
        return self._route([partial] if partial else [])

    def _route(self, lines: Iterable[bytes]) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for line in lines:
            status = self.status_fd is not None and line.startswith(STATUS_PREFIX)
            fd = self.status_fd if status else 2
            assert fd is not None
            if out and out[-1][0] == fd:
                out[-1] = (fd, out[-1][1] + line)
            else:
                out.append((fd, line))
        return out
