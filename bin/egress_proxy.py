"""The sandbox's egress proxy: allow list, address rules, token and secret injection.

Usage:
  egress-proxy (--listen=HOST:PORT | --listen-fd=N) [--socks=HOST:PORT | --socks-fd=N]
               [--allow=PATTERNS]
               [--inject=HOSTS] [--egress-dir=DIR] [--token-command=CMD]
               [--token-every=SECONDS] [--token-timeout=SECONDS] [--secrets=FILE]
               [--repos=REPOS]
               [--resolve=HOST:IP]... [--allow-cidr=CIDR]...
               [--upstream-ca=FILE] [--log=FILE] [--log-allowed] [--record=FILE] [--learn]
               [--idle-timeout=SECONDS] [--connect-timeout=SECONDS] [--max-conns=N]
               [--control=PATH]
  egress-proxy -h | --help
  egress-proxy --version

Serves HTTP CONNECT and absolute-form plain HTTP on --listen (and SOCKS5 on
--socks).  Only hosts on the allow list are reached, only at public addresses
(resolved once, checked, then dialled).  The inject hosts are never a raw
tunnel: TLS is terminated with a leaf from an in-memory CA constrained to
those hosts, and the token from --token-command is set as the Authorization
header.  Each --secrets host is an inject host too, and gets its own header
from its own command.  Prints `listening http://HOST:PORT` (and `listening socks5://...`)
once serving; SIGTERM or SIGINT ends it with status 0.

Options:
  --listen=HOST:PORT         HTTP proxy address (IP literal; port 0 picks one).
  --socks=HOST:PORT          Also serve SOCKS5 (CONNECT) at this address.
  --listen-fd=N              Serve HTTP on descriptor N instead: a TCP socket that
                             already listens, handed over by whoever started the
                             proxy (socket activation, docs/fast-start.md); a
                             connection made before the proxy serves waits in its
                             backlog.  With every listener handed over, the
                             `listening` lines are printed once the egress dir is
                             written, before the first-token wait.
  --socks-fd=N               The same for SOCKS5.
  --allow=PATTERNS           Comma-separated hosts: example.com, *.example.com,
                             host:port (without a port: 80 and 443).
  --inject=HOSTS             Hosts that get the token [default: github.com,api.github.com].
  --egress-dir=DIR           Write ca.pem, bundle.pem and gh/ here.
  --token-command=CMD        Command printing the token (split like a shell
                             line, run without one).
  --token-every=SECONDS      Renew the token this often [default: 300].
  --token-timeout=SECONDS    Kill a run of the token command (its whole process
                             group) after this long [default: 30].  `listening`
                             waits at most 5 s for the first token; a slower
                             one arrives while the proxy serves.
  --secrets=FILE             JSON list of {"host", "header", "command", "format"
                             (default "Bearer {}"), "every" (default 300)}: each
                             host becomes an inject host and gets that header,
                             its value from the command (run like
                             --token-command, under --token-timeout).
  --repos=REPOS              Comma-separated OWNER/NAME: the token still goes
                             with every read, but a write only when it is tied
                             to one of these (push, REST under /repos/OWNER/NAME,
                             GraphQL mutations whose node is in one); any other
                             write is refused: 403 blocked-by-scope.
  --resolve=HOST:IP          Pin HOST to IP (trusted; HOST:IP:PORT also redirects
                             the port, IPv6 as [ADDR]:PORT).
  --allow-cidr=CIDR          Allow addresses in this range despite the address rules.
  --upstream-ca=FILE         Verify inject hosts' upstream TLS with these roots
                             instead of the system's.
  --log=FILE                 Append log lines here instead of stderr.
  --log-allowed              Also log one line per allowed connection: host, port,
                             peer pid and mode (raw CONNECT tunnel, socks tunnel,
                             intercept for an inject host, http for plain HTTP).
                             Never a header or the token.  Default: refusals and
                             failures only.
  --record=FILE              Append one JSON line per decision here: a refusal, a
                             tunnel when it ends, a request to an inject host or
                             over plain HTTP (host, port, kind, verdict, reason,
                             body bytes each way, duration; method, path without
                             its query, status).  Never a header, body or token.
                             agent-sandbox points it at a pipe it reads.
  --learn                    Pass every host and port the allow list would refuse
                             (the inject hosts' rules and the address rules still
                             hold); --record marks those events "learn".
  --idle-timeout=SECONDS     Close a connection idle this long [default: 120].
  --connect-timeout=SECONDS  Give up resolving/connecting upstream [default: 10].
  --max-conns=N              Concurrent client connections [default: 1024].
  --control=PATH             Gateway mode (docs/gateway.md): serve many sandboxes
                             ("tenants"), each added and removed at run time over
                             this unix socket (0600, this uid only) with its own
                             policy and credential; every client must send it
                             (Proxy-Authorization: Basic, or SOCKS5
                             username/password) and is refused (407) without.
                             A tenant's own options (allow list, inject hosts,
                             secrets, repos, resolve pins, address ranges,
                             record, egress dir, token command, learn) come in
                             its add request, not on this command line.
  -h --help                  Show this help.
  --version                  Show the version.

Exit status: 0 after SIGTERM/SIGINT; 1 cannot start (bind, egress dir); 2 usage.
"""

from __future__ import annotations

import sys

from libbroker.cli import Args, parse, run

# The usage's options as docopt gives them when absent: a valued one's default,
# or None, [] for a repeatable one, False for a flag (a test checks these
# against docopt).
_VALUED: dict[str, str | None] = {
    "--listen": None, "--listen-fd": None, "--socks": None, "--socks-fd": None,
    "--allow": None, "--inject": "github.com,api.github.com", "--egress-dir": None,
    "--token-command": None, "--token-every": "300", "--token-timeout": "30",
    "--secrets": None, "--repos": None, "--upstream-ca": None, "--log": None,
    "--record": None, "--idle-timeout": "120", "--connect-timeout": "10",
    "--max-conns": "1024", "--control": None,
}  # fmt: skip
_REPEATED = ("--resolve", "--allow-cidr")
_FLAGS = ("--log-allowed", "--learn", "--help", "--version")


def quick_args(argv: list[str]) -> Args | None:
    """docopt's answer for a command line of ``--OPTION=VALUE`` words and flags, else None.

    agent-sandbox starts egress-proxy with such a line at every session, and
    docopt's import and parse cost the proxy ~10 ms of CPU on the way to its
    ``listening`` line, which the session waits for.  Anything else (an
    option without ``=``, an empty value, a repeat, an abbreviation, -h,
    --version, a listener missing or given twice) is left to docopt, errors
    included.
    """
    args: dict[str, object] = {**_VALUED, **{r: [] for r in _REPEATED},
                               **dict.fromkeys(_FLAGS, False)}
    given: set[str] = set()
    for word in argv:
        name, eq, value = word.partition("=")
        if name in _FLAGS[:2] and not eq and name not in given:
            args[name] = True
        elif name in _REPEATED and value:
            args[name].append(value)  # type: ignore[attr-defined]
        elif name in _VALUED and value and name not in given:
            args[name] = value
        else:
            return None
        given.add(name)
    # exactly one HTTP listener; at most one SOCKS5 listener
    if ("--listen" in given) == ("--listen-fd" in given) or {"--socks", "--socks-fd"} <= given:
        return None
    return args


def _main(args: Args) -> int:
    # Imported after parsing so --help stays cheap.
    from libegress import app

    options = app.options_from_args(args)
    if options.control is not None:
        from libegress.gateway import serve_gateway
        from libegress.startup_gc import settle

        settle()  # the collector on, whoever turned it off (libegress.startup_gc)
        return serve_gateway(options)
    return app.serve(options)


def main() -> None:
    # Once _main returns the proxy holds nothing to flush or end: its loop has
    # ended every connection, token run and child, its log and record are
    # closed.  The interpreter's teardown of its modules would be CPU on the
    # session's end path (the launcher waits for the proxy to exit).
    run(lambda: _main(quick_args(sys.argv[1:]) or parse(__doc__ or "")), skip_teardown=True)


if __name__ == "__main__":
    main()
