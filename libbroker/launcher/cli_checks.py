"""Command lines docopt can only call "usage": said plainly instead (exit 2).

docopt matches a command line against the usage patterns as a whole, so
``agent-sandbox run`` with no command comes out as ``unknown or repeated
argument: run``, and ``report --propose --json`` as a usage error that does
not say which word is wrong.  These checks run before docopt and name what is
missing or which words do not go together; anything else is left to docopt.
Pure: argv in, UsageError out.
"""

from __future__ import annotations

from collections.abc import Sequence

from libbroker.errors import UsageError
from libbroker.launcher.prestart import _VALUED, _words

_RUN_FLAGS = frozenset({*_VALUED, "--learn"})
RUN_USAGE = "agent-sandbox run [OPTIONS] -- CMD [ARG...]"


def command_marked(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--`` before run's command when it was left out.

    ``agent-sandbox run claude --version`` printed agent-sandbox's own version
    (docopt took ``--version`` as ours), and ``run --agent=codex bash -c 'echo
    hi'`` was a usage error (``-c``): every word from the command's first on is
    the command's, as after ``--``.  The command is the first word after
    ``run`` that is not one of run's options (or a valued option's value).
    """
    argv = list(argv)
    words = _words(argv)
    plain = [w for opt, w in words if not opt]
    if plain[:1] != ["run"] or len(plain) < 2:
        return argv  # no command word before any "--" (or not run): as typed
    i, seen_run = 0, False
    while i < len(argv) and argv[i] != "--":
        word = argv[i]
        name, eq, _ = word.partition("=")
        if word.startswith("-"):
            i += 2 if name in _VALUED and not eq else 1
            continue
        if seen_run:
            return [*argv[:i], "--", *argv[i:]]
        seen_run = word == "run"
        i += 1
    return argv


def before_docopt(argv: Sequence[str]) -> None:
    """UsageError for ``run`` without a command and for ``report --propose --json``."""
    words = _words(list(argv))
    if any(opt in ("-h", "--help", "--version") for opt, _ in words):
        return
    plain = [w for opt, w in words if not opt]
    options = {opt for opt, _ in words if opt}
    if plain[:1] == ["run"] and len(plain) == 1 and options <= _RUN_FLAGS:
        rest = list(argv[list(argv).index("--") + 1 :]) if "--" in argv else []
        if not rest:
            raise UsageError(f"run: no command given: {RUN_USAGE}")
    if plain[:1] == ["report"] and {"--propose", "--json"} <= options:
        raise UsageError(
            "report: --propose prints lines to paste into the config, not JSON; "
            "report --json gives the session's summary as JSON"
        )


def check_command(cmd: Sequence[str]) -> None:
    """The command ``run`` was given: its first word names a program."""
    if not cmd or not cmd[0]:
        raise UsageError(f"run: the command is an empty word (''): {RUN_USAGE}")
    if "\0" in cmd[0]:
        raise UsageError("run: the command holds a NUL byte")
