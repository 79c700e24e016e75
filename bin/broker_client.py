"""Run a command through the broker, from inside the sandbox.

Usage:
  broker-client [-n] [--socket=PATH] [-C DIR] -- CMD [ARG...]
  broker-client -h | --help
  broker-client --version

The command runs on the host side in its own fresh sandbox, in the same
directory (or DIR), with the broker's environment policy.  Its stdout and
stderr come back separately, its exit status becomes ours.

Options:
  -n             Do not read stdin (the command gets /dev/null).
  --socket=PATH  The broker socket [default: $AGENT_SANDBOX_BROKER_SOCKET].
  -C DIR         Run the command in DIR instead of the current directory.
  -h --help      Show this help.
  --version      Show the version.

Exit status: the command's own (128+N when signal N killed it); 125 the
broker is unreachable or refused the request; 126 not executable; 127 not
found; 141 our stdout was closed (the command is then ended); 2 usage error.
SIGINT, SIGTERM and SIGHUP are forwarded to the command.
"""

from __future__ import annotations

import os
import sys

from libbroker.cli import run
from libbroker.errors import RequestRefused, UsageError

REFUSED = 125


def _parse(argv: list[str]) -> tuple[bool, str | None, str | None, list[str]]:
    """A hand parser (docopt costs a few ms on every call): no_stdin, socket, dir, command."""
    no_stdin, socket, directory = False, None, None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-h", "--help"):
            sys.stdout.write(__doc__ or "")
            raise SystemExit(0)
        if arg == "--version":
            from libbroker.cli import VERSION

            sys.stdout.write(VERSION + "\n")
            raise SystemExit(0)
        if arg == "-n":
            no_stdin = True
        elif arg.startswith("--socket="):
            socket = arg.split("=", 1)[1]
        elif arg in ("--socket", "-C"):
            if i + 1 >= len(argv):
                _usage(f"{arg} needs a value")
            i += 1
            if arg == "-C":
                directory = argv[i]
            else:
                socket = argv[i]
        elif arg.startswith("-C"):
            directory = arg[2:]
        elif arg.startswith("-"):
            _usage(f"unknown option {arg}")
        else:
            break  # the command starts here (the -- is customary, not required)
        i += 1
    command = argv[i:]
    if not command:
        _usage("no command given")
    return no_stdin, socket, directory, command


def _usage(problem: str) -> None:
    doc = __doc__ or ""
    usage = doc[doc.index("Usage:") : doc.index("\n\n", doc.index("Usage:"))]
    sys.stderr.write(f"broker-client: {problem}\n{usage}\n")
    raise SystemExit(2)


def _main() -> int:
    from libbroker.broker.client import call
    from libbroker.wire import Request

    no_stdin, socket, directory, command = _parse(sys.argv[1:])
    try:
        cwd = os.path.abspath(directory) if directory is not None else os.getcwd()
    except OSError as exc:
        raise UsageError(f"cannot tell the current directory: {exc.strerror}") from None
    request = Request(argv=tuple(command), cwd=cwd, with_stdin=not no_stdin)
    try:
        return call(request, path=socket)
    except RequestRefused as exc:
        sys.stderr.write(f"broker-client: the broker refused the request: {exc}\n")
        return REFUSED


def main() -> None:
    # Output goes out with os.write and splice, help and version through
    # sys.stdout, which run flushes: nothing is lost by skipping the
    # interpreter's teardown, which every call would pay.
    run(_main, skip_teardown=True)


if __name__ == "__main__":
    main()
