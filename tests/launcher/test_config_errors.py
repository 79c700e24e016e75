"""Every bad value, from a flag, the config file or a default: one exact line, exit 2.

Through the real ``agent-sandbox`` executable (these fail before any sandbox
or server gets its arguments, so each row takes a fraction of a second).  The
line names where the value came from: the flag, ``FILE line N: KEY``, the
``[[secret]] #N (HOST)`` table counted from 1, or the default.  Nothing that
egress-proxy would refuse at start gets past the launcher's check, so none of
these name a runtime path or count from 0.  The good cases still start.

Placeholders in the expected lines: {cfg} the row's config file, {home} the
test's HOME, {work} the launcher's cwd, {xdg} its XDG_CONFIG_HOME.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest
import trustme

from libbroker.launcher import config
from libbroker.sandbox.limits import NAMES as LIMIT_NAMES
from libpolicy import hostrun

KEYS = ", ".join(sorted(config._KEYS))  # the message lists every key, as the code knows them
RULES = ", ".join(sorted(hostrun.RULES))
LIMITS = ", ".join(LIMIT_NAMES)
USAGE = "agent-sandbox run [OPTIONS] -- CMD [ARG...]"
SECRET = '[[secret]]\nhost = "api.example.com"\nheader = "x-api-key"\ncommand = "echo k"\n'
MARK = f"as-config-errors-{uuid.uuid4().hex}"


class Row(NamedTuple):
    args: tuple[str, ...]  # after agent-sandbox; "--config={cfg}" when config is set
    config: str | bytes | None  # the file's text, or None for no --config
    line: str  # the exact stderr, after "agent-sandbox: "
    cwd: str = "{work}"


def _file(config: str, line: str, *args: str) -> Row:
    return Row(("run", "--config={cfg}", *args, "--", "true"), config, line)


ROWS: dict[str, Row] = {
    # --- flags -----------------------------------------------------------------
    "sandbox-flag": Row(("run", "--sandbox=landlock", "--", "true"), None,
                        "--sandbox: must be one of auto, bwrap, nono, not 'landlock'"),
    "limit-size": Row(("run", "--limit", "memory=1X", "--", "true"), None,
                      "--limit: memory must be a size such as 512M or 8G, not '1X'"),
    "limit-tasks": Row(("run", "--limit=tasks=4", "--", "true"), None,
                       "--limit: tasks must be a whole number of at least 8, not '4'"),
    "limit-unknown": Row(("run", "--limit=procs=1", "--", "true"), None,
                         f"--limit: unknown limit 'procs' (known: {LIMITS})"),
    "limit-no-value": Row(("run", "--limit=memory", "--", "true"), None,
                          "--limit: 'memory': expected NAME=VALUE, e.g. memory=4G"),
    "workdir-root": Row(("run", "--workdir=/", "--", "true"), None,
                        "--workdir: / contains the home directory {home}; name a project "
                        "directory"),
    "workdir-home": Row(("run", "--workdir={home}", "--", "true"), None,
                        "--workdir: {home} contains the home directory {home}; name a project "
                        "directory"),
    "workdir-missing": Row(("run", "--workdir=/nonexistent/w", "--", "true"), None,
                           "--workdir: /nonexistent/w is not a directory"),
    "agent-unknown": Row(("run", "--agent=nobody", "--", "true"), None,
                         "--agent: unknown agent 'nobody' (known: claude, codex, gemini, or "
                         "none)"),
    "run-no-command": Row(("run",), None, f"run: no command given: {USAGE}"),
    "run-options-no-command": Row(("run", "--learn", "--sandbox=nono", "--"), None,
                                  f"run: no command given: {USAGE}"),
    "run-empty-command": Row(("run", "--", ""), None,
                             f"run: the command is an empty word (''): {USAGE}"),
    "config-missing": Row(("run", "--config=/nonexistent/c.toml", "--", "true"), None,
                          "--config: /nonexistent/c.toml does not exist"),
    "config-directory": Row(("run", "--config={work}", "--", "true"), None,
                            "--config: {work} cannot be read: Is a directory"),
    "report-propose-json": Row(("report", "--propose", "--json"), None,
                               "report: --propose prints lines to paste into the config, not "
                               "JSON; report --json gives the session's summary as JSON"),
    "flag-over-file": _file('sandbox = "nono"\n',
                            "--sandbox: must be one of auto, bwrap, nono, not 'vm'",
                            "--sandbox=vm"),
    "limit-flag-over-file": _file('limits = {memory = "1G"}\n',
                                  "--limit: memory must be a size such as 512M or 8G, not 'x'",
                                  "--limit=memory=x"),
    # --- the config file ---------------------------------------------------------
    "toml-syntax": _file('sandbox = "nono"\nhostrun_add = [".husky/"]; hostrun_allow = []\n',
                         "{cfg} line 2, column 26: not valid TOML: Expected newline or end of "
                         "document after a statement"),
    "toml-not-utf8": _file(b'# \xe2\x9c\x93 ok\nsandbox = "\xff"\n',
                           "{cfg} line 2, column 12: not UTF-8 (byte 0xff); TOML files are "
                           "UTF-8"),
    "unknown-key": _file('\n# a typo\ndomain = ["pypi.org"]\n',
                         f"{{cfg}} line 3: unknown key 'domain' (known: {KEYS})"),
    "sandbox": _file('sandbox = "landlock"\n',
                     "{cfg} line 1: sandbox: must be one of auto, bwrap, nono, not 'landlock'"),
    "domains-star": _file('domains = [\n  "github.com",\n  "*",\n]\n',
                          "{cfg} line 1: domains: a wildcard may only lead a pattern: '*'"),
    "domains-comma": _file('domains = ["a.com, b.com"]\n',
                           "{cfg} line 1: domains: entry 'a.com, b.com' holds a comma: one host "
                           "per entry"),
    "domains-port": _file('domains = ["example.com:99999"]\n',
                          "{cfg} line 1: domains: invalid port in 'example.com:99999'"),
    "domains-idn": _file('domains = ["bücher.example"]\n',
                         "{cfg} line 1: domains: entry 'bücher.example': write the name as "
                         "xn--bcher-kva.example"),
    "domains-type": _file('domains = "github.com"\n',
                          "{cfg} line 1: domains: must be a list of strings"),
    "domains-empty-entry": _file('domains = [" "]\n',
                                 "{cfg} line 1: domains: must be a list of non-empty strings"),
    "inject": _file('inject = ["git hub.com"]\n',
                    "{cfg} line 1: inject: entry 'git hub.com' is not a host name"),
    "token-every-zero": _file("token_every = 0\n",
                              "{cfg} line 1: token_every: must be at least 1 second (and under "
                              "10**7)"),
    "token-every-type": _file('token_every = "5"\n',
                              "{cfg} line 1: token_every: must be an integer"),
    "token-command-quote": _file("token_command = \"cat 'unclosed\"\n",
                                 "{cfg} line 1: token_command: cannot be split like a shell "
                                 "line: No closing quotation"),
    "start-timeout": _file("start_timeout = 0\n",
                           "{cfg} line 1: start_timeout: must be in (0, 300] seconds"),
    "resolve": _file('resolve = ["github.com"]\n',
                     "{cfg} line 1: resolve: entry 'github.com' must be HOST:IP or HOST:IP:PORT "
                     "(an IPv6 address in brackets)"),
    "resolve-ip": _file('resolve = ["github.com:300.1.1.1"]\n',
                        "{cfg} line 1: resolve: entry 'github.com:300.1.1.1' must be HOST:IP or "
                        "HOST:IP:PORT (an IPv6 address in brackets)"),
    "allow-cidr": _file('allow_cidr = ["10.0.0.0/33"]\n',
                        "{cfg} line 1: allow_cidr: entry '10.0.0.0/33' is not a CIDR range"),
    "repos": _file('repos = ["acme"]\n',
                   "{cfg} line 1: repos: entry 'acme' is not OWNER/NAME"),
    "env-forbidden": _file('env = ["GITHUB_TOKEN"]\n',
                           "{cfg} line 1: env: entry 'GITHUB_TOKEN' may not be passed into a "
                           "session"),
    "env-name": _file('env = ["1BAD"]\n',
                      "{cfg} line 1: env: entry '1BAD' is not a variable name"),
    "read-relative": _file('read = ["notes"]\n',
                           "{cfg} line 1: read: path 'notes' must be absolute or start with ~/"),
    "upstream-ca-missing": _file('upstream_ca = "/nonexistent/ca.pem"\n',
                                 "{cfg} line 1: upstream_ca: no such file /nonexistent/ca.pem"),
    "upstream-ca-not-pem": _file('upstream_ca = "{cfg}"\n',
                                 "{cfg} line 1: upstream_ca: {cfg} holds no PEM certificate "
                                 "egress-proxy can load"),
    "kubeconfig": _file('kubeconfig = "/nonexistent/kube"\n',
                        "{cfg} line 1: kubeconfig: /nonexistent/kube is not a file"),
    "hostrun-allow": _file('hostrun_allow = ["nonsense"]\n',
                           "{cfg} line 1: hostrun_allow: entry 'nonsense' turns nothing off: "
                           f"give a rule id ({RULES}), one of their patterns, or the workdir "
                           "path of a host-run file (sub/.envrc)"),
    "hostrun-add": _file('hostrun_add = ["/etc/x"]\n',
                         "{cfg} line 1: hostrun_add: entry '/etc/x' must be a relative path of "
                         "plain names (no leading '/', no '.' or '..'; a trailing '/' marks a "
                         "directory; a name may start with '*' for a suffix, as in "
                         "'*.code-workspace')"),
    "deny-under-landlock": _file('deny = ["/usr/share"]\n',
                                 "{cfg} line 1: deny: /usr/share is inside the granted /usr, and "
                                 "Landlock (--sandbox=nono) cannot deny part of a grant; use "
                                 "--sandbox=bwrap", "--sandbox=nono"),
    "protect-git": _file('protect_git = "yes"\n',
                         "{cfg} line 1: protect_git: must be true or false"),
    "workdir-file-root": _file('workdir = "/"\n',
                               "{cfg} line 1: workdir: / contains the home directory {home}; "
                               "name a project directory"),
    "workdir-file-missing": _file('workdir = "nope"\n',
                                  "{cfg} line 1: workdir: {work}/nope is not a directory"),
    "limits-table": _file('[limits]\ntasks = 4096\nmemory = "1X"\n',
                          "{cfg} line 3: limits.memory: must be a size such as 512M or 8G, "
                          "not '1X'"),
    "limits-unknown": _file("limits = {procs = 1}\n",
                            f"{{cfg}} line 1: limits.procs: unknown limit 'procs' (known: "
                            f"{LIMITS})"),
    "agents-key": _file('sandbox = "auto"\n\n[agents.mine]\nbogus = 1\n',
                        "{cfg} line 3: agents.mine: unknown key 'bogus'"),
    "agents-domains": _file('[agents.mine]\ncommands = ["aider"]\ndomains = ["*"]\n',
                            "{cfg} line 1: agents.mine.domains: a wildcard may only lead a "
                            "pattern: '*'"),
    "agent-file": _file('agent = "aider"\n',
                        "{cfg} line 1: agent: unknown agent 'aider' (known: claude, codex, gemini, "
                        "or none)"),
    "agent-write-back": _file('agent_write_back = ["nobody:key"]\n',
                              "{cfg} line 1: agent_write_back: entry 'nobody:key' must be "
                              "AGENT:KEY (agents: claude, codex, gemini)"),
    # --- [[secret]] tables: egress-proxy's own entry check, counted from 1 --------------
    "secret-header-host": _file(SECRET + '\n[[secret]]\nhost = "api.anthropic.com"\n'
                                'header = "Host"\ncommand = "echo k"\n',
                                "{cfg} line 6: [[secret]] #2 (api.anthropic.com): 'header' "
                                "'Host' is a field the proxy may not set"),
    "secret-header-token": _file(SECRET.replace("x-api-key", "x key"),
                                 "{cfg} line 1: [[secret]] #1 (api.example.com): 'header' is "
                                 "not a valid header name: 'x key'"),
    "secret-no-command": _file('[[secret]]\nhost = "api.example.com"\nheader = "x-k"\n',
                               "{cfg} line 1: [[secret]] #1 (api.example.com): missing key "
                               "'command'"),
    "secret-inject-host": _file(SECRET.replace("api.example.com", "github.com"),
                                "{cfg} line 1: [[secret]] #1 (github.com): host github.com is "
                                "an inject host (the GitHub token's)"),
    "secret-address": _file(SECRET.replace("api.example.com", "127.0.0.1"),
                            "{cfg} line 1: [[secret]] #1 (127.0.0.1): 'host' must be a DNS "
                            "name, not an address: '127.0.0.1'"),
    "secret-wildcard": _file(SECRET.replace("api.example.com", "*.example.com"),
                             "{cfg} line 1: [[secret]] #1 (*.example.com): 'host' is not a "
                             "valid host name: '*.example.com'"),
    "secret-format": _file(SECRET + 'format = "Bearer"\n',
                           "{cfg} line 1: [[secret]] #1 (api.example.com): 'format' must "
                           "contain {{}} exactly once"),
    "secret-every": _file(SECRET + "every = 0\n",
                          "{cfg} line 1: [[secret]] #1 (api.example.com): 'every' must be a "
                          "positive number of seconds"),
    "secret-every-fraction": _file(SECRET + "every = 1.5\n",
                                   "{cfg} line 1: [[secret]] #1 (api.example.com): 'every' must "
                                   "be a whole number of seconds"),
    "secret-env": _file(SECRET + 'env = "GH_TOKEN"\n',
                        "{cfg} line 1: [[secret]] #1 (api.example.com): 'env' 'GH_TOKEN' may "
                        "not be passed into a session"),
    "secret-unknown-key": _file(SECRET + 'colour = "red"\n',
                                "{cfg} line 1: [[secret]] #1 (api.example.com): unknown key "
                                "'colour' (known: command, env, every, format, header, host)"),
    "secret-duplicate": _file(SECRET + "\n" + SECRET.replace("api.example", "API.example"),
                              "{cfg} line 6: [[secret]] #2 (API.example.com): host "
                              "api.example.com has a [[secret]] already"),
    "secret-not-tables": _file('secret = "x"\n',
                               "{cfg} line 1: secret: must be [[secret]] tables"),
    # --- defaults ------------------------------------------------------------------
    "default-workdir-home": Row(("run", "--", "true"), None,
                                "workdir (default: the current directory): {home} contains the "
                                "home directory {home}; name a project directory", cwd="{home}"),
    "default-workdir-root": Row(("run", "--", "true"), None,
                                "workdir (default: the current directory): / contains the home "
                                "directory {home}; name a project directory", cwd="/"),
    "default-file-bad-value": Row(("run", "--", "true"), 'sandbox = "landlock"\n',
                                  "{xdg}/agent-sandbox/config.toml line 1: sandbox: must be one "
                                  "of auto, bwrap, nono, not 'landlock'"),
    "default-file-bad-toml": Row(("doctor",), "sandbox =\n",
                                 "{xdg}/agent-sandbox/config.toml line 1, column 10: not valid "
                                 "TOML: Invalid value"),
    "default-file-directory": Row(("render-settings",), "",
                                  "{xdg}/agent-sandbox/config.toml (the default config file): "
                                  "cannot be read: Is a directory"),
}


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("config-errors")
    for name in ("home", "work", "xdg"):
        (root / name).mkdir()
    return {name: str(root / name) for name in ("home", "work", "xdg")} | {"root": str(root)}


def _env(place: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "AGENT_SANDBOX", "ANTHROPIC", "OPENAI", "GEMINI"))}
    env.update(HOME=place["home"], XDG_CONFIG_HOME=place["xdg"], AS_TEST_MARK=MARK)
    return env


def _run(place: dict[str, str], name: str, row: Row) -> tuple[subprocess.CompletedProcess[str],
                                                              dict[str, str]]:
    cfg = Path(place["root"]) / f"{name}.toml"
    where = {**place, "cfg": str(cfg)}
    default = Path(place["xdg"]) / "agent-sandbox" / "config.toml"
    if default.is_dir():
        default.rmdir()
    default.unlink(missing_ok=True)
    if row.config is not None:
        body = (row.config if isinstance(row.config, bytes)
                else row.config.replace("{cfg}", str(cfg)).encode())
        if "--config={cfg}" in row.args:
            cfg.write_bytes(body)
        elif row.config == "":
            default.mkdir(parents=True)
        else:
            default.parent.mkdir(parents=True, exist_ok=True)
            default.write_bytes(body)
    argv = ["agent-sandbox", *(a.format(**where) for a in row.args)]
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(place),
                          cwd=row.cwd.format(**where), timeout=60, check=False,
                          stdin=subprocess.DEVNULL)
    return done, where


def test_the_table_has_forty_rows_or_more() -> None:
    assert len(ROWS) >= 40


@pytest.mark.parametrize("name", list(ROWS))
def test_a_bad_value_is_one_line_naming_its_origin(place: dict[str, str], name: str) -> None:
    row = ROWS[name]
    done, where = _run(place, name, row)
    want = "agent-sandbox: " + row.line.format(**where) + "\n"
    assert (done.returncode, done.stderr, done.stdout) == (2, want, "")


def test_no_row_left_a_process_behind() -> None:
    """The servers run's prestart spawned are ended when the config is refused."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if MARK.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(pid)
        except OSError:
            continue
    assert found == []


def test_the_good_cases_still_start(place: dict[str, str]) -> None:
    """Every key the table refuses, given a good value, starts a session (bwrap and Landlock)."""
    ca = trustme.CA()
    pem = Path(place["root"]) / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    (Path(place["work"]) / "sub").mkdir(exist_ok=True)
    good = f"""
sandbox = "bwrap"
domains = ["github.com", "*.pypi.org", "example.com:8443", "[2001:db8::1]:443", "Docs.Example"]
inject = ["github.com", "api.github.com"]
token_every = 60
token_command = "echo tok"
start_timeout = 60
resolve = ["github.com:127.0.0.1", "h.test:[::1]:443"]
allow_cidr = ["10.0.0.0/8"]
repos = ["acme/widgets"]
env = ["LANG"]
read = ["~/.gitconfig"]
upstream_ca = "{pem}"
hostrun_allow = ["vscode", ".envrc", "sub/.envrc"]
hostrun_add = [".husky/"]
protect_git = true
record = false
agent_write_back = ["claude:mcpServers"]

[limits]
tasks = 4096
memory = "2G"

[agents.mine]
commands = ["aider"]

[[secret]]
host = "api.example.com"
header = "x-api-key"
format = "{{}}"
command = "echo k"
every = 300
env = "EXAMPLE_KEY"
"""
    cfg = Path(place["root"]) / "good.toml"
    cfg.write_text(good)
    for sandbox in ("bwrap", "nono"):
        done = subprocess.run(
            ["agent-sandbox", "run", f"--config={cfg}", f"--sandbox={sandbox}",
             "--limit=tasks=2048", "--", "sh", "-c", 'echo "$EXAMPLE_KEY"'],
            capture_output=True, text=True, env=_env(place), cwd=place["work"], timeout=120,
            check=False, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "agent-sandbox-placeholder\n"


@pytest.mark.parametrize(("argv", "marked"), [
    (["run", "claude", "--version"], ["run", "--", "claude", "--version"]),
    (["run", "--agent=codex", "bash", "-c", "echo hi"],
     ["run", "--agent=codex", "--", "bash", "-c", "echo hi"]),
    (["run", "--sandbox", "nono", "--limit", "mem=1G", "codex", "-s", "read-only"],
     ["run", "--sandbox", "nono", "--limit", "mem=1G", "--", "codex", "-s", "read-only"]),
    (["run", "--", "claude", "--version"], ["run", "--", "claude", "--version"]),
    (["run", "--learn", "--", "x", "--", "y"], ["run", "--learn", "--", "x", "--", "y"]),
    (["run"], ["run"]),
    (["run", "--version"], ["run", "--version"]),
    (["report", "--last"], ["report", "--last"]),
])
def test_run_s_command_is_everything_from_its_first_word(argv: list[str],
                                                         marked: list[str]) -> None:
    """Without ``--``, the command's own flags are its own, never run's."""
    from libbroker.launcher.cli_checks import command_marked

    assert command_marked(argv) == marked
