"""The agent's command line as a session runs it: its own sandbox flags translated.

People type ``codex -s workspace-write``, ``codex --full-auto`` or ``gemini -s``
out of habit.  Their intent (work in the workspace without a prompt per
command) is what a session gives, but the agents' own sandboxes cannot nest
inside ours (Codex's bwrap/Landlock helper, Gemini CLI's docker/podman), so
each is translated, said in one line, and never refused:

- ``codex -s workspace-write``, ``codex --full-auto`` and ``codex
  --approve-for-me`` run with ``-s danger-full-access``; the approval mode
  stays as given (``--full-auto`` and ``--approve-for-me`` meant ``-a
  on-request``, which they get in the interactive CLI, the one place ``-a``
  exists; ``--approve-for-me`` keeps its reviewer,
  ``approvals_reviewer="auto_review"``).  ``--dangerously-bypass-approvals-and-sandbox`` is not
  used: it would also drop the approvals the person asked for;
- ``codex -s read-only`` runs with ``-s danger-full-access`` in a session
  whose workdir is read-only (:attr:`Argv.read_only`);
- ``gemini -s`` / ``--sandbox`` (also ``-ys``, ``--sandbox=true``) is dropped:
  the flag sets ``GEMINI_SANDBOX=true`` over the profile's ``false``; the
  approval flags (``-y``, ``--approval-mode``) stay.

Only the agent's own command is touched: ``--agent=codex -- bash -c 'echo hi'``
runs ``bash -c 'echo hi'`` as typed (the profile still applies: its config
copy, hosts and settings).  Pure: no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from libbroker.named_tuple import NamedTuple

FULL = "danger-full-access"
# Codex's top-level options that take a value (the first other word is the
# subcommand or the prompt).
_CODEX_VALUED = frozenset(
    {"-c", "--config", "-m", "--model", "-p", "--profile", "-s", "--sandbox", "-a",
     "--ask-for-approval", "-i", "--image", "-C", "--cd", "--add-dir", "--enable", "--disable",
     "--remote", "--remote-auth-token-env", "--local-provider"}
)
_CODEX_SANDBOX_ARG = ("-s", "--sandbox")
# Codex 0.171's --approve-for-me (alias --not-so-yolo): approval_policy on-request,
# approvals_reviewer auto_review and sandbox_mode workspace-write, which nests.
_AUTO_REVIEW = ("--approve-for-me", "--not-so-yolo")


class Argv(NamedTuple):
    """The command as the session runs it, the line that says what changed, and the workdir."""

    argv: list[str]
    note: str = ""  # one line for stderr, "" when nothing was translated
    read_only: bool = False  # the workdir is read-only in this session


class Agent(Protocol):
    """What this module needs of an agent's profile (:class:`.agents.Profile`, whose
    classes call this module's translations: no import back)."""

    @property
    def commands(self) -> tuple[str, ...]: ...

    def session_argv(self, cmd: list[str]) -> Argv: ...


def is_agent(profile: Agent, cmd: Sequence[str]) -> bool:
    """``cmd`` runs the agent itself (not a shell or another tool under its profile)."""
    return bool(cmd) and os.path.basename(cmd[0]) in profile.commands


def session_argv(profile: Agent | None, cmd: list[str]) -> Argv:
    """``cmd`` with the agent's own sandbox flags translated (see the module doc)."""
    if profile is None or not is_agent(profile, cmd):
        return Argv(cmd)
    return profile.session_argv(cmd)


_GEMINI_BOOLEAN_SHORT = frozenset("dsylhv")  # its short flags that take no value


def gemini(cmd: list[str]) -> Argv:
    """Gemini CLI: -s/--sandbox dropped (the flag wins over GEMINI_SANDBOX=false)."""
    opts = _options(cmd[1:])
    out: list[str] = []
    asked = ""
    i = 0
    while i < len(opts):
        arg = opts[i]
        group = arg[1:] if arg[:1] == "-" and arg[1:2] != "-" else ""
        if arg in ("-s", "--sandbox") or arg.startswith("--sandbox="):
            # A boolean flag takes a following true/false as its value.
            value = opts[i + 1: i + 2] if "=" not in arg else [arg.split("=", 1)[1]]
            if value != ["false"]:  # --sandbox=false asks for what it gets: nothing to say
                asked = asked or arg
            i += 2 if "=" not in arg and value in (["true"], ["false"]) else 1
            continue
        if len(group) > 1 and "s" in group and set(group) <= _GEMINI_BOOLEAN_SHORT:
            asked = asked or arg  # -ys: -y stays
            out.append("-" + group.replace("s", ""))
        else:
            out.append(arg)
        i += 1
    argv = [cmd[0], *out, *cmd[1 + len(opts):]]
    if not asked:
        return Argv(argv)
    note = (f"gemini {asked}: Gemini CLI's own sandbox (docker/podman) cannot nest in "
            "agent-sandbox's; it runs without it (the flag dropped), approvals as given")
    return Argv(argv, note)


def _options(args: Sequence[str]) -> list[str]:
    """The words before ``--`` (after it, every word is an argument)."""
    return list(args[: args.index("--")] if "--" in args else args)


def _sandbox_value(args: list[str], i: int) -> tuple[str, int]:
    """(the -s/--sandbox value at ``args[i]``, how many words it takes), or ("", 0)."""
    arg = args[i]
    if arg in _CODEX_SANDBOX_ARG:
        return (args[i + 1], 2) if i + 1 < len(args) else ("", 0)
    if arg.startswith("--sandbox="):
        return arg.split("=", 1)[1], 1
    if arg.startswith("-s") and not arg.startswith("--") and len(arg) > 2:
        return arg[2:].removeprefix("="), 1
    return "", 0


def codex(cmd: list[str]) -> Argv:
    """Codex: -s and --full-auto as in the module doc; sandbox_mode pinned by a -c."""
    opts = _options(cmd[1:])
    rest = cmd[1 + len(opts):]
    out: list[str] = []
    asked: list[str] = []
    read_only = full_auto = False
    i = 0
    while i < len(opts):
        value, used = _sandbox_value(opts, i)
        if used and value in ("workspace-write", "read-only"):
            asked.append(f"-s {value}")
            read_only = read_only or value == "read-only"
            out += ["-s", FULL]
            i += used
            continue
        if opts[i] in ("--full-auto", *_AUTO_REVIEW):
            asked.append(opts[i])
            full_auto = True
            out += ["-s", FULL]
            if opts[i] in _AUTO_REVIEW:  # its reviewer kept; the sandbox it forces is not
                out[:0] = ["-c", 'approvals_reviewer="auto_review"']
        else:
            out.append(opts[i])
        i += 1
    approval = ""
    if full_auto and _interactive(opts) and not _has_approval(opts):
        out = ["-a", "on-request", *out]
        approval = " -a on-request"
    # A -c beats config.toml: a sandbox_mode there cannot make Codex nest its own.
    argv = [cmd[0], "-c", f'sandbox_mode="{FULL}"', *out, *rest]
    if not asked:
        return Argv(argv)
    approvals = ("approvals on request, as it meant" if approval else "approvals as given")
    note = (f"codex {' '.join(dict.fromkeys(asked))}: Codex's own sandbox cannot nest in "
            f"agent-sandbox's; it runs as -s {FULL}{approval}, {approvals}")
    if read_only:
        note += ", in a session whose workdir is read-only"
    return Argv(argv, note, read_only)


def _has_approval(opts: Sequence[str]) -> bool:
    return any(a in ("-a", "--ask-for-approval") or a.startswith(("--ask-for-approval=", "-a="))
               for a in opts)


def _interactive(opts: Sequence[str]) -> bool:
    """No subcommand before the first word that is no option: the interactive CLI.

    ``-a`` exists there only (``codex exec`` has none: it never asks).
    """
    i = 0
    while i < len(opts):
        arg = opts[i]
        if arg in _CODEX_VALUED:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg not in _CODEX_SUBCOMMANDS
    return True


_CODEX_SUBCOMMANDS = frozenset(
    {"exec", "e", "review", "login", "logout", "mcp", "plugin", "app-server", "remote-control",
     "completion", "update", "doctor", "sandbox", "debug", "apply", "a", "resume", "queue",
     "archive", "delete", "migrate-rollouts", "migrate-nfs-db", "unarchive", "fork", "cloud",
     "exec-server", "features", "help", "agents"}
)
