"""``agent-sandbox doctor``: can a session run here, and if not, what to do.

One line per finding: ``ok``, ``warn`` (a session runs, a feature is missing)
or ``FAIL`` (no session can run), each not-ok line with its fix.  By default
the ok findings of a kind (the executables, the native helpers, the agents,
...) share one line and the host-run list is counted, not listed, so the
whole answer fits a screen (about 15 lines); ``--verbose`` gives every
finding its line and lists the host-run files.  A fix is what to do; a
command in it is between backticks and is run as shown, in the user's own
shell (tests/launcher/test_doctor_fixes.py runs them).  Exit 0 only
when no check failed.  The token command is run to see that it prints
something; what it prints is never shown or kept.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from libbroker.launcher.config import Config
from libbroker.launcher.config_file import resolve_sign_key
from libbroker.launcher.doctor_agents import check_agents
from libbroker.launcher.doctor_check import FAIL, OK, TABLE, WARN, Check
from libbroker.sandbox import backends
from libbroker.sandbox.kinds import AUTO

if TYPE_CHECKING:
    pass

_MIN_GIT = (2, 31)  # GIT_CONFIG_COUNT/KEY/VALUE


def _run(argv: list[str], timeout: float = 10) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, (done.stderr or done.stdout).strip()


def check_backend(kind: str) -> list[Check]:
    """The chosen backend must work; under auto, one of them (each backend's diagnose)."""
    if kind != AUTO:
        return [Check(*backends.of(kind).diagnose())]
    each = backends.each()
    found = [Check(*backend.diagnose()) for backend in each]
    if found[0].level != OK:
        # auto picks the first whenever it is installed; only its absence falls back.
        if each[0].unavailable() is None or found[1].level != OK:
            return found
        return [found[0]._replace(level=WARN), found[1]]
    return [found[0], found[1]._replace(level=OK if found[1].level == OK else WARN)]


def check_terminal() -> Check:
    """Whether the one seccomp filter exists here: every sandbox needs it."""
    from libbroker.sandbox import seccomp

    if seccomp.program() is None:
        return Check(
            FAIL,
            f"seccomp: no filter for {os.uname().machine}: no sandbox starts without it "
            "(TIOCSTI, the keyring, and under Landlock every socket but TCP)",
            "use x86_64 or aarch64",
        )
    return Check(OK, "terminal: TIOCSTI and TIOCLINUX refused in the sandbox (seccomp)")


def check_executables() -> list[Check]:
    from libbroker.launcher.install import scripts_dir

    out = []
    for name, needed in (
        ("egress-proxy", True),
        ("broker-server", True),
        ("broker-client", False),
        ("gpg-shim", False),
        ("policy-hook", False),
        ("kubeconfig-proxify", False),
    ):
        path = os.path.join(scripts_dir(), name)
        if os.access(path, os.X_OK) or shutil.which(name):
            out.append(Check(OK, f"{name}: installed", group="executables installed", short=name))
        else:
            out.append(Check(FAIL if needed else WARN, f"{name}: not found", _reinstall()))
    return out


def _reinstall() -> str:
    """The command that installs the project's executables again, into this Python."""
    from libbroker.launcher.boot import project_dir
    from libbroker.shellquote import command

    project = project_dir()
    if os.path.isfile(os.path.join(project, "pyproject.toml")):  # a source checkout
        argv = [sys.executable, "-m", "pip", "install", "-e", project]
    else:
        argv = [sys.executable, "-m", "pip", "install", "--force-reinstall", "agent-sandbox"]
    return f"`{command(*argv)}`"


def check_native() -> list[Check]:
    """The C helpers: optional, each with a Python fallback that is slower or bigger."""
    from libbroker.native import SOURCES, built

    purpose = {  # what each is, and what is lost without it
        "gpg-shim": ("gpg-shim's signing fast path", "~20 ms more per signature"),
        "reaper": ("the Landlock broker's small reaper", "~2 MiB more per command"),
        "forwarder": ("bwrap's small forwarder", "~15 ms more CPU per session"),
    }
    out = []
    for name in SOURCES:
        what, loss = purpose[name]
        if built(name) is not None:
            out.append(Check(OK, f"native {name}: built, {what}", group="native helpers built",
                             short=name))
        else:
            from libbroker.shellquote import command

            out.append(
                Check(
                    WARN,
                    f"native {name}: not built or older than its source: {what} (without: {loss})",
                    f"`{command(sys.executable, '-m', 'libbroker.native')}` (it needs a C "
                    "compiler: `apt-get install gcc`)",
                )
            )
    return out


def check_git() -> Check:
    if not shutil.which("git"):
        return Check(WARN, "git: not installed", "`apt-get install git`")
    code, out = _run(["git", "--version"])
    m = re.search(r"(\d+)\.(\d+)", out)
    if code != 0 or not m:
        return Check(WARN, f"git: cannot tell its version ({out})", "reinstall git")
    version = (int(m.group(1)), int(m.group(2)))
    if version < _MIN_GIT:
        return Check(
            WARN,
            f"git {m.group(0)}: too old for GIT_CONFIG_COUNT (signing via gpg-shim)",
            "git >= 2.31",
        )
    return Check(OK, f"git {m.group(0)}")


def check_signing(cfg: Config) -> Check:
    if cfg.sign_problem:
        return Check(WARN, f"signing: {cfg.sign_problem}")  # the fix is in its text
    if not cfg.sign_key:
        return Check(
            WARN,
            f"signing: no sign key (no user.signingkey, user.name or user.email for git in "
            f"{cfg.workdir}, config sign_key empty)",
            "git config user.signingkey KEYID (in the repository or --global), "
            "or sign_key in the config",
        )
    key = f"{cfg.sign_key} from {cfg.sign_from}" if cfg.sign_from else cfg.sign_key
    if not shutil.which("gpg"):
        return Check(WARN, f"signing: key {key}, but gpg is not installed", "apt-get install gnupg")
    code, _ = _run(["gpg", "--batch", "--list-secret-keys", cfg.sign_key])
    if code != 0:
        return Check(
            WARN,
            f"signing: gpg has no secret key {key}",
            "gpg --import your key, or fix user.signingkey / sign_key",
        )
    return Check(OK, f"signing: gpg holds the secret key {key}")


def check_token(cfg: Config) -> Check:
    if not cfg.token_command:
        return Check(
            WARN,
            "token: no token command (gh not installed): GitHub is reached without a login",
            "install gh and run gh auth login, or set token_command",
        )
    try:
        done = subprocess.run(
            shlex.split(cfg.token_command), capture_output=True, timeout=15, check=False
        )
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return Check(
            WARN, "token: the token command timed out", f"run `{cfg.token_command}` by hand"
        )
    ok = done.returncode == 0 and done.stdout.strip()
    del done  # the token is not kept
    if not ok:
        return Check(
            WARN,
            "token: the token command failed or printed nothing",
            f"run `{cfg.token_command}` by hand (gh auth login?)",
        )
    return Check(OK, "token: the token command prints a token")


def check_workdir(cfg: Config) -> Check:
    if not os.path.isdir(cfg.workdir):
        return Check(
            FAIL,
            f"workdir {cfg.workdir}: not a directory",
            "--workdir=DIR or workdir in the config",
        )
    why = f": {cfg.workdir_why}" if cfg.workdir_why else ""
    also = f"; also granted, its git dirs: {', '.join(cfg.git_dirs)}" if cfg.git_dirs else ""
    return Check(OK, f"workdir {cfg.workdir}{why}{also}")


def check_hostrun(cfg: Config) -> list[Check]:
    """The host-run list in effect (libpolicy.hostrun + hostrun_add - hostrun_allow)."""
    from libbroker.launcher.config import hostrun_table

    table = hostrun_table(cfg)
    head = Check(
        OK,
        f"host-run files: {len(table.entries)} kinds held in {cfg.workdir} at every depth "
        "(swept back to their state at the start when every session ends; "
        "doctor --verbose lists them)",
    )
    from libbroker.launcher.hostrun_gate import describe

    gate, what, fix = describe()
    live = Check(OK, what) if gate else Check(WARN, what, fix)
    return [head, *(Check(OK, "  " + line, group=TABLE) for line in table.lines()), live,
            *_live_leftovers(cfg)]


def _live_leftovers(cfg: Config) -> list[Check]:
    """A repository's config a dead session left as a link (hostrun_gitconfig), the live
    gate's binds of one that died with its janitor (hostrun_binds): repaired."""
    from libbroker.launcher import hostrun_binds, runtime_dir
    from libbroker.launcher.hostrun_gitconfig import repair
    from libbroker.launcher.hostrun_sweep import state_dir

    try:
        lines = repair(state_dir(cfg.home))
    except OSError as exc:
        return [Check(WARN, f"git configs left by a session that died: {exc}",
                      "look at ~/.local/state/agent-sandbox/live (each has its saved original)")]
    try:
        lines += hostrun_binds.repair(runtime_dir.session_dirs())
    except OSError as exc:
        return [Check(WARN, f"mounts left by a session that died: {exc}",
                      "umount -l the paths in $XDG_RUNTIME_DIR/agent-sandbox/*/binds.json")]
    return [Check(WARN, line.removeprefix("agent-sandbox: ") + " (repaired now)") for line in lines]


def check_limits(cfg: Config) -> Check:
    """Which mechanism holds the session's limits, with a fix where a stronger one could."""
    from libbroker.sandbox import cgroups, limits

    mech = cgroups.mechanism()
    what = f"limits: {limits.summary(cfg.limits)}; through {mech.describe()}"
    try:
        cgroups.remove(cgroups.create(cfg.limits, "doctor", mech))
    except OSError as exc:
        return Check(
            FAIL,
            f"{what}: cannot make a group ({exc.strerror or exc})",
            'limits = {tasks = "off", memory = "off"} in the config, or fix its permissions',
        )
    if mech.kind == "rlimit":
        return Check(
            WARN,
            what + " (memory counted per process; no report of which limit was hit)",
            "run under a delegated cgroup v2 subtree: "
            "systemd-run --user --scope -p Delegate=yes agent-sandbox run ...",
        )
    return Check(OK, what)


# What egress-proxy takes as a secret's value: printable ASCII, no spaces.
_VALUE = re.compile(r"^[\x21-\x7e]{1,4096}$")


def check_secrets(cfg: Config) -> list[Check]:
    """Each [[secret]]'s command, run once: did it print a value?  Never what it printed.

    Neither the output nor the command line is shown (a command can hold its
    value inline); a secret is named by its table's place and host.
    """
    out: list[Check] = []
    for index, secret in enumerate(cfg.secrets, 1):
        name = f"secret {index} ({secret.host})"
        fix = f"run the command of [[secret]] {index} by hand; it must print the value"
        try:
            done = subprocess.run(shlex.split(secret.command), capture_output=True, timeout=15,
                                  check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            out.append(Check(WARN, f"{name}: the command did not end within 15 s", fix))
            continue
        except (OSError, ValueError):
            out.append(Check(WARN, f"{name}: the command cannot be run", fix))
            continue
        lines = done.stdout.decode("ascii", "replace").splitlines()
        printed = bool(lines) and bool(_VALUE.match(lines[0].strip()))
        code = done.returncode
        del done, lines  # the value is not kept
        if code != 0:
            out.append(Check(WARN, f"{name}: the command failed (exit {code}); requests to "
                             f"{secret.host} go without the value", fix))
        elif not printed:
            out.append(Check(WARN, f"{name}: the command printed no usable value (one line of "
                             "printable ASCII without spaces)", fix))
        else:
            out.append(Check(OK, f"{name}: the command prints a value; egress-proxy sets "
                             f"{secret.header} for {secret.host}", group="secrets print a value",
                             short=f"#{index} {secret.host}"))
    return out


def checks(cfg: Config) -> list[Callable[[], list[Check]]]:
    return [
        lambda: [check_workdir(cfg)],
        lambda: check_backend(cfg.sandbox),
        lambda: [check_terminal()],
        lambda: [check_limits(cfg)],
        check_executables,
        check_native,
        lambda: [check_git()],
        lambda: [check_signing(cfg)],
        lambda: [check_token(cfg)],
        lambda: check_secrets(cfg),
        lambda: check_agents(cfg),
        lambda: check_hostrun(cfg),
    ]


def layout(found: list[Check], *, verbose: bool = False) -> list[str]:
    """The lines doctor prints: every finding with ``verbose``; else each group's ok
    findings on one line (a single one as itself), the rest each on its own, no TABLE."""
    if verbose:
        return [c.line() for c in found]
    out: list[str] = []
    for group, members in itertools.groupby(found, key=lambda c: c.group):
        run = list(members)
        if group == TABLE:
            continue
        oks = [c for c in run if c.level == OK]
        if not group or len(oks) < 2:
            out += [c.line() for c in run]
            continue
        out.append(Check(OK, f"{group}: {', '.join(c.short or c.what for c in oks)}").line())
        out += [c.line() for c in run if c.level != OK]
    return out


def main(cfg: Config, *, verbose: bool = False) -> int:
    cfg = resolve_sign_key(cfg)
    found = [finding for check in checks(cfg) for finding in check()]
    failed = any(c.level == FAIL for c in found)
    for line in layout(found, verbose=verbose):
        sys.stdout.write(line + "\n")
    sys.stdout.write("a session can run here\n" if not failed else "no session can run here yet\n")
    return 1 if failed else 0
