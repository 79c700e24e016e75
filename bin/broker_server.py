"""Run commands from the sandbox, each in its own fresh sandbox, over a unix socket.

Usage:
  broker-server (--socket=PATH | --socket-fd=N) --workdir=DIR [--sandbox=KIND] [--profile=FILE]
                [--env-allow=NAMES] [--sign-key=KEY]... [--audit=FILE]
  broker-server -h | --help
  broker-server --version

One command per connection (wire format: docs/DESIGN.md 2.2).  The socket is
created with mode 0600 (a stale one is replaced, a live one refused) and only
peers of the server's own uid are served.  Prints "listening unix:PATH" once
it accepts connections; SIGTERM or SIGINT ends every command, removes the
socket and exits 0.

Options:
  --socket=PATH      The unix socket to listen on.
  --socket-fd=N      Serve descriptor N instead: a unix socket already bound and
                     listening, handed over by whoever started the server (socket
                     activation, docs/fast-start.md; a connection made before the
                     server serves waits in its backlog).  It is not removed at the end.
  --workdir=DIR      The directory commands may write, and the only place they may run.
  --sandbox=KIND     nono (Landlock), bwrap, or auto (says what it picked) [default: auto].
  --profile=FILE     JSON profile: filesystem read/write/deny, network, environment.
  --env-allow=NAMES  Comma-separated variables passed from this server's environment
                     (overrides the profile's; default PATH,LANG,LC_ALL,TERM,HOME,USER,TZ).
  --sign-key=KEY     Enable op "sign" for exactly this gpg key (repeatable).
  --audit=FILE       Append one JSON line per request to FILE.  If a line cannot be
                     written, new requests are refused until one can (fail closed).
  -h --help          Show this help.
  --version          Show the version.

Exit status: 0 after SIGTERM/SIGINT; 1 cannot start (no working sandbox, bad
profile, socket in use); 2 usage error.
"""

from __future__ import annotations

from libbroker.cli import Args, parse, run


def _main(args: Args) -> int:
    from libbroker.broker.server import run_server
    from libbroker.errors import UsageError

    fd = args.get("--socket-fd")
    if fd is not None and (not fd.isdigit() or len(fd) > 7):
        raise UsageError(f"--socket-fd must be a descriptor number: {fd!r}")
    return run_server(
        socket_path=args["--socket"],
        socket_fd=int(fd) if fd is not None else -1,
        workdir=args["--workdir"],
        sandbox=args["--sandbox"],
        profile_path=args["--profile"],
        env_allow=args["--env-allow"],
        sign_keys=tuple(args["--sign-key"]),
        audit_path=args["--audit"],
    )


def main() -> None:
    run(lambda: _main(parse(__doc__ or "")))


if __name__ == "__main__":
    main()
