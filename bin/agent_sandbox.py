"""Run a command (a coding agent, a shell, a build) in a whole sandboxed session.

Usage:
  agent-sandbox run [--config=FILE] [--workdir=DIR] [--sandbox=KIND] [--agent=NAME]
                    [--limit=NAME=VALUE]... [--learn] [--] CMD...
  agent-sandbox doctor [--config=FILE] [--sandbox=KIND] [--verbose]
  agent-sandbox render-settings [--config=FILE]
  agent-sandbox report [--json] [--last | SESSION]
  agent-sandbox report --list [--json]
  agent-sandbox report --verify [SESSION]
  agent-sandbox report --propose [SESSION]
  agent-sandbox watch [SESSION]
  agent-sandbox serve [--socket=PATH]
  agent-sandbox gate-service [--socket=PATH] [--patience=SECONDS]
  agent-sandbox -h | --help
  agent-sandbox --version

run starts egress-proxy and broker-server, then runs CMD in the agent
sandbox: home hidden except the configured paths, the workdir writable, the
network only through the proxy (which sets the GitHub token itself: the
sandbox never holds it), git signing through the broker.  It exits with CMD's
status and leaves no process or socket behind.

doctor checks whether a session can run here: what is wrong, each with its fix,
and one line per kind of what is fine (--verbose: every check, and the
host-run files a session holds).
render-settings prints Claude Code's managed-settings drop-in for the config.

serve keeps the egress gateway resident for this user (docs/serve.md): run
registers each session with it over its socket (default
$XDG_RUNTIME_DIR/agent-sandbox/serve.sock, or AGENT_SANDBOX_SERVE; "off" for
none) instead of starting an egress-proxy of its own, and starts its own when
no service answers.  A run with no terminal on stdin, stdout or stderr (a
script's) is forked by the service's warm launcher, which has the launcher's
imports done already (AGENT_SANDBOX_WARM=off: it starts here).  Under systemd,
contrib/systemd/ has the socket and service units (socket activation).

gate-service (as root) gives ordinary users' sessions the live gate
(docs/hostrun-gate.md): run connects to it on its socket (default
/run/agent-sandbox/gate.sock, or AGENT_SANDBOX_GATE_SOCKET; "off" for none)
when it cannot gate by itself.  contrib/systemd/ has its system units.

Every session is recorded (events only, never a secret) in
$XDG_STATE_HOME/agent-sandbox/sessions/ (default ~/.local/state/...).  A
session in which something was refused ends with one line on stderr naming
how many and the command that shows them.  report summarizes a session (the
last one by default): hosts and ports, refusals and what to add to the
config, brokered commands, signatures.  watch follows the newest live
session's record in a second terminal (or SESSION's) until it ends; a
session with no end whose launcher is gone (killed) is named in one line and
skipped, or, named or watched, ends watch with status 1.

Options:
  --config=FILE    The TOML config (default: ~/.config/agent-sandbox/config.toml).
  --workdir=DIR    The writable project directory (default: the config's, else cwd).
  --sandbox=KIND   auto, bwrap or nono (Landlock) (default: the config's, else auto).
  --agent=NAME     The agent profile: claude, codex, gemini, one of the config's
                   [agents.NAME], or none (default: from CMD's name).
  --limit=NAME=VALUE  A resource limit over the config's (repeatable): tasks=4096,
                   memory=8G, tmp=2G (bwrap's /tmp), cpu=2 (cores), timeout=10m
                   (each brokered command), or NAME=off.
  --learn          Allow every public host (address and token rules still hold)
                   and record each one the allow list would have refused; then
                   `agent-sandbox report --propose` prints the domains line.
  --socket=PATH    serve, gate-service: the socket to listen on (default: as run
                   looks for it).
  --patience=SECONDS  gate-service: how long an open waits for the launcher's
                   answer before it is refused [default: 10].
  -v --verbose     doctor: every check on its own line, and the host-run list.
  --json           report: print JSON for scripts.
  --last           report: the most recent session (the default).
  --list           report: the recent sessions, newest first.
  --verify         report: check the record's hash chain (exit 1 if it was
                   cut or edited).
  --propose        report: the config's whole `domains = [...]` line: the
                   session's configured domains, then each host the allow list
                   refused (exact names; *.parent for 3 siblings; never
                   loopback), ready to paste over the config's own.
  -h --help        Show this help.
  --version        Show the version.

Exit status: run: CMD's own (128+N when signal N ended it); 1 the session could
not start or a server crashed; 2 usage or config error.  doctor: 0 when a
session can run, 1 otherwise.  report --verify: 1 when the record does not verify.
serve: 0 when stopped by SIGTERM or SIGINT, 1 when its gateway died.
gate-service: 0 when stopped by SIGTERM or SIGINT, 1 without CAP_SYS_ADMIN.
watch: 0 after the session's end, 1 when there is no live session or its
launcher went without ending it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys

from libbroker.cli import Args, parse, run

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (every run's start)

if TYPE_CHECKING:
    from collections.abc import Callable

    from libbroker.launcher.config import Config
    from libbroker.launcher.prestart import Servers


def _config(args: Args) -> Config:
    from libbroker.launcher import config_file

    return config_file.from_args(args, check_host=not args["doctor"])


def _main(args: Args, servers: Servers | None) -> int:
    if args["run"]:
        from libbroker.launcher import cli_checks, session

        cli_checks.check_command(list(args["CMD"]))
        cfg = _config(args)
        if args.get("--learn"):
            cfg = cfg._replace(learn=True)
        return session.run(cfg, list(args["CMD"]), cfg.sandbox, servers)
    if args["report"]:
        from libbroker.launcher import report

        return report.main(args)
    if args["watch"]:
        from libbroker.launcher import watch

        return watch.main(args)
    if args["serve"]:
        from libbroker.launcher import serve, serve_link

        return serve.main(args["--socket"] or serve_link.default_socket())
    if args["gate-service"]:
        from libbroker.launcher import gate_service

        return gate_service.main(args["--socket"] or gate_service.listen_path(),
                                 _seconds(args["--patience"]))
    if args["doctor"]:
        from libbroker.launcher import doctor

        return doctor.main(_config(args), verbose=bool(args.get("--verbose")))
    from libbroker.launcher import settings

    return settings.main(_config(args))


def _seconds(text: str) -> float:
    from libbroker.errors import UsageError

    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:
        raise UsageError(f"--patience={text}: a number of seconds, more than 0, at most 3600")
    return value


def _parse(servers: Servers | None) -> Args:
    if servers is not None:  # run's usual command line without docopt (start-up time)
        from libbroker.launcher import prestart

        quick = prestart.run_args(sys.argv[1:])
        if quick is not None:
            return quick
    from libbroker.launcher import cli_checks

    cli_checks.before_docopt(sys.argv[1:])  # what docopt would only call "usage"
    return parse(__doc__ or "", options_first=False)


def main() -> None:
    if "run" in sys.argv[1:]:
        # The cyclic collector is off until go (libbroker.launcher.session): the
        # start's imports set off ~25 collections, ~6 ms of CPU, for nearly no garbage.
        gc.disable()
        # A scripted run (no terminal) is handed to the resident service's
        # launcher zygote when one answers (docs/serve.md); None: run it here.
        from libbroker.launcher import warm_client

        code = warm_client.try_run(sys.argv[1:])
        if code is not None:
            os._exit(code)
    cold_main()


def cold_main(report: Callable[[int], None] | None = None) -> None:
    """The run in this process (``report``: told the exit code first; the warm child's)."""
    servers: Servers | None = None
    from libbroker.launcher.here import recover

    recover()  # a shell left on a session's detached bind: cd "$PWD" for it
    if "run" in sys.argv[1:]:
        # run's servers start first, before parsing: see libbroker.launcher.prestart.
        from libbroker.launcher import cli_checks, prestart

        sys.argv[1:] = cli_checks.command_marked(sys.argv[1:])  # "run claude --version"
        servers = prestart.try_start(sys.argv[1:])
    try:
        run(lambda: _main(_parse(servers), servers))
    except SystemExit as done:
        if servers is not None:
            prestart.discard(servers)  # when no session took them
        # By now every child is reaped and the runtime directory removed:
        # skip the interpreter's teardown (tens of ms on every session).
        code = done.code
        if not isinstance(code, int):
            if code is not None:
                sys.stderr.write(f"{code}\n")
            code = 0 if code is None else 1
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        if report is not None:
            report(code)
        os._exit(code)


if __name__ == "__main__":
    main()
