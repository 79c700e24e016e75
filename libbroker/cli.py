"""Shared command-line shell: docopt parsing and error-to-exit-code mapping.

Every console script's ``main`` goes through :func:`run`, so that the contract
of docs/DESIGN.md 2.3 holds everywhere: ``-h``/``--version`` exit 0, a usage error
exits 2 with the usage on stderr, and no traceback ever reaches a user.
"""

from __future__ import annotations

import sys

from libbroker.errors import AgentSandboxError

# typing.TYPE_CHECKING without importing typing or collections.abc: gpg-shim
# and broker-client import this module on every call (start-up time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Args = dict[str, Any]
else:
    Args = dict

VERSION = "0.1.0"


def parse(doc: str, argv: list[str] | None = None, *, options_first: bool = False) -> Args:
    """Parse ``argv`` against the docopt usage ``doc``.

    docopt-ng exits 1 on a usage error; the contract says 2 with the usage on
    stderr, so the exit is caught and re-raised with the right code.
    """
    # Imported here so a --help costs nothing extra and tests can stub argv.
    import docopt

    try:
        return dict(
            docopt.docopt(doc, argv=argv, version=VERSION, options_first=options_first)
        )
    except docopt.DocoptExit as exc:
        # SystemExit from --help/--version carries code None/str printed to stdout
        # by docopt itself; a DocoptExit is always a usage error.
        sys.stderr.write(_usage_message(str(exc).strip()) + "\n")
        raise SystemExit(2) from None


def _usage_message(message: str) -> str:
    """docopt's message with its internal repr of leftover arguments made readable.

    docopt-ng reports an unknown option as ``Warning: found unmatched (duplicate?)
    arguments [Option(None, '--bogus', 0, True)]``; a user should read
    ``unknown or repeated argument: --bogus`` above the usage instead.
    """
    import re

    head, sep, rest = message.partition("\n")
    if not head.startswith("Warning: found unmatched"):
        return message
    names = re.findall(r"'([^']*)'", head)
    shown = ", ".join(names) if names else "?"
    prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "agent-sandbox"
    return f"{prog}: unknown or repeated argument: {shown}{sep}{rest}"


def run(body: Callable[[], int], *, skip_teardown: bool = False) -> None:
    """Run ``body`` and exit with its status, mapping errors to messages.

    ``prog`` for messages is the basename of argv[0] (the console script).
    ``skip_teardown`` ends the process with ``_exit`` once stdout and stderr
    are flushed, sparing the interpreter's clean-up of modules and objects:
    for a program that holds nothing else to flush and is started once per
    call (gpg-shim, run by git for every signature), that clean-up is pure
    start-to-finish time.
    """
    prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "agent-sandbox"
    try:
        status = body()
    except AgentSandboxError as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        status = exc.exit_code
    except KeyboardInterrupt:
        status = 130
    except BrokenPipeError:
        # Downstream closed (``| head``): the shell rule for SIGPIPE.
        status = 141
    except SystemExit:
        raise
    except Exception as exc:  # the last line of defence against tracebacks
        sys.stderr.write(f"{prog}: internal error: {type(exc).__name__}: {exc}\n")
        status = 70
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):
        status = status or 141
    if skip_teardown:
        import posix  # built in and loaded at start-up: os without os's import

        try:  # noqa: SIM105 - contextlib.suppress costs an import on every call
            sys.stderr.flush()
        except (ValueError, OSError):
            pass
        posix._exit(status)
    raise SystemExit(status)
