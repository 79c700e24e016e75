"""Shared command-line shell: docopt parsing and error-to-exit-code mapping.

Every console script's ``main`` goes through :func:`run`, so that the contract
of DESIGN.md 2.3 holds everywhere: ``-h``/``--version`` exit 0, a usage error
exits 2 with the usage on stderr, and no traceback ever reaches a user.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from libbroker.errors import AgentSandboxError

VERSION = "0.1.0"

Args = dict[str, Any]


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
        message = str(exc).strip()
        sys.stderr.write(message + "\n")
        raise SystemExit(2) from None


def run(body: Callable[[], int]) -> None:
    """Run ``body`` and exit with its status, mapping errors to messages.

    ``prog`` for messages is the basename of argv[0] (the console script).
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
    raise SystemExit(status)
