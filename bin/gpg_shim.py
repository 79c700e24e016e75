"""git's gpg.program in the sandbox: sign through the broker, verify locally.

Usage:
  gpg-shim [--status-fd=FD] -bsau KEY
  gpg-shim [--keyid-format=FORMAT] [--status-fd=FD] --verify SIGFILE [DATAFILE]
  gpg-shim -h | --help
  gpg-shim --version

Signing (git commit -S, git tag -s) sends the payload on stdin to the broker
named by AGENT_SANDBOX_BROKER_SOCKET, whose host-side gpg signs with the
person's key; the armored signature goes to stdout and gpg's status lines to
the status fd.  The split forms other callers use (-b -s -a -u KEY, -uKEY,
--local-user=KEY, --status-fd N) are accepted too.  Anything with --verify
runs the local gpg with the same arguments (public keys only).

Exit status: gpg's own; 1 the broker refused; 2 usage error; 125 the broker
is unreachable.
"""

from __future__ import annotations

import sys

from libbroker.cli import VERSION, run
from libbroker.errors import UsageError
from libbroker.signing.args import SignCall, parse_args


def _main(argv: list[str]) -> int:
    # docopt cannot express gpg's option grammar (a cluster ending in an
    # option with a value, as in -bsau KEY), so libbroker.signing.args parses it.
    if argv in (["-h"], ["--help"]):
        sys.stdout.write(__doc__ or "")
        return 0
    if argv == ["--version"]:
        sys.stdout.write(f"gpg-shim {VERSION}\n")
        return 0
    try:
        call = parse_args(argv)
    except UsageError as exc:
        usage = (__doc__ or "").split("\n\n")[1]
        sys.stderr.write(f"gpg-shim: {exc}\n{usage}\n")
        return 2
    if isinstance(call, SignCall):
        # Imported here so that verification (once per commit in
        # `git log --show-signature`) never loads the broker's wire modules.
        from libbroker.errors import AgentSandboxError
        from libbroker.signing.shim import sign, tell_git

        try:
            return sign(call)
        except AgentSandboxError as exc:  # its one line reaches git's stderr too
            tell_git(f"gpg-shim: {exc}\n")
            raise
    from libbroker.signing.local import exec_local_gpg

    exec_local_gpg(call.args)
    return 127  # not reached: exec replaced this process


def main() -> None:
    # Everything gpg-shim writes is either flushed by run or written with
    # os.write: nothing is lost by skipping the interpreter's teardown.
    run(lambda: _main(sys.argv[1:]), skip_teardown=True)


if __name__ == "__main__":
    main()
