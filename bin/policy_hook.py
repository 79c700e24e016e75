"""policy-hook: hold Claude Code's file tools to the agent-sandbox policy.

Usage:
  policy-hook [--policy=FILE]
  policy-hook render [--policy=FILE]
  policy-hook check [--policy=FILE] (read|write) PATH...
  policy-hook -h | --help
  policy-hook --version

Without a command, reads Claude Code's PreToolUse hook input (JSON) on stdin and
checks every path a Read, Grep, Glob, Edit, MultiEdit, Write or NotebookEdit call
would touch: a denied call gets the deny document on stdout; an allowed call or
another tool gets no output; unusable input or policy exits 2 (blocking the call)
with the reason on stderr.

render  prints the Claude Code managed-settings drop-in for the policy
        (for /etc/claude-code/managed-settings.d/agent-sandbox.json).
check   prints each PATH's decision and the rule that made it; exits 1 if any
        is denied.  Relative paths are taken from the current directory.

Options:
  --policy=FILE  The policy JSON; default: $AGENT_SANDBOX_POLICY.
  -h --help      Show this help.
  --version      Show the version.
"""

from __future__ import annotations

import sys

from libpolicy.hook import run_hook

# Claude Code's hook input is one JSON document; anything bigger is not one.
_MAX_INPUT = 64 << 20


def _hook_option(argv: list[str]) -> tuple[bool, str | None]:
    """Whether ``argv`` is the hook form, and its --policy, without loading docopt."""
    if not argv:
        return True, None
    if len(argv) == 1 and argv[0].startswith("--policy=") and len(argv[0]) > 9:
        return True, argv[0][9:]
    if len(argv) == 2 and argv[0] == "--policy" and not argv[1].startswith("-"):
        return True, argv[1]
    return False, None


def _hook(option: str | None) -> None:
    """Hook mode: every failure exits 2, the one status that blocks the call."""
    try:
        data = sys.stdin.buffer.read(_MAX_INPUT + 1)
    except (OSError, ValueError, AttributeError, KeyboardInterrupt) as exc:
        status, out, err = 2, "", f"policy-hook: cannot read the hook input: {exc!r}\n"
    else:
        if len(data) > _MAX_INPUT:
            status, out, err = 2, "", "policy-hook: hook input is larger than 64 MiB\n"
        else:
            try:
                status, out, err = run_hook(option, data)
            except KeyboardInterrupt:
                status, out, err = 2, "", "policy-hook: interrupted\n"
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        status = 2
    try:  # noqa: SIM105 - contextlib costs ms at a -S start-up
        sys.stderr.write(err)
    except (OSError, ValueError, AttributeError):
        pass
    raise SystemExit(status)


def _command(args: dict[str, object]) -> int:
    import os

    from libpolicy.decide import readable, writable
    from libpolicy.hook import policy_path
    from libpolicy.model import Policy
    from libpolicy.render import render_json

    option = args["--policy"]
    path = policy_path(option if isinstance(option, str) else None, os.environ)
    policy = Policy.load(path)
    if args["render"]:
        sys.stdout.write(render_json(policy, os.path.abspath(path)))
        return 0
    access = "read" if args["read"] else "write"
    decide = readable if access == "read" else writable
    cwd = os.getcwd()
    status = 0
    paths = args["PATH"]
    assert isinstance(paths, list)
    for target in paths:
        ok, why = decide(policy, target, cwd)
        sys.stdout.write(f"{'allow' if ok else 'deny'} {access} {target}: {why}\n")
        status = status if ok else 1
    return status


def main() -> None:
    """Console entry point: hook mode without docopt (it runs on every file-tool call)."""
    is_hook, option = _hook_option(sys.argv[1:])
    if is_hook:
        _hook(option)
    from libbroker.cli import parse, run

    def body() -> int:
        args = parse(__doc__ or "")
        if not (args["render"] or args["check"]):
            _hook(args["--policy"] if isinstance(args["--policy"], str) else None)
        return _command(args)

    run(body)


if __name__ == "__main__":
    main()
