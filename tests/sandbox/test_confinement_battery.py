"""The confinement battery (issues 11 and 18): every cell refuses every canary.

Cells: (brokered command, agent session) x (bwrap, nono = Landlock) x (root,
ordinary user), each run through the real executables (``agent-sandbox run``;
``broker-server`` + ``broker-client``).  Per cell, :func:`battery.run_cell`
plants fresh canaries on the host, each with its own secret (loopback UDP/TCP
listeners on 127.0.0.1 and ::1, unix stream/datagram sockets in the test HOME
and in /tmp, an abstract unix socket, a key in the user's keyring, a file in
/dev/shm, another process of the same user with a secret in its argv and
environment, ~/.ssh/id_rsa, secrets in the launcher's or server's
environment), runs ``probe.py`` once inside, and checks on the host what
arrived.  Each (cell, check) is one test id, e.g.
``test_refused[root-session-nono-udp_v4]``; the cell's probe runs once.

Three kinds of outcome besides a plain pass:

- ``BEING_FIXED``: holes measured on the code before the one-sandbox change
  (xfail, not strict).  Remove an entry when its fix lands; the test then
  holds the line.
- documented exceptions (:func:`documented_exception`): refusals the kernel
  cannot give in that cell; the test xfails *only when reached*, with the
  reason, so the table stays honest and a cell that does refuse passes.
- controls (``test_still_works``): what must keep working in a cell
  (writing the workdir, socketpair, NETLINK_ROUTE and broker-client in a
  session), so that a probe that fails everything cannot pass.
"""

from __future__ import annotations

import pytest
from battery import (
    CHECKS,
    CONTROLS,
    Cell,
    CellResult,
    cannot_run,
    pid_namespace_possible,
    run_cell,
    the_user,
)

pytestmark = pytest.mark.timeout(180)

CELLS = [
    Cell(who, path, backend)
    for who in ("root", "user")
    for path in ("session", "broker")
    for backend in ("bwrap", "nono")
]

# Before the one sandbox (issues 11/18), 41 of these tests failed: the
# Landlock session reached UDP, host unix sockets, sock_diag, the keyring,
# /dev/shm, raw sockets, other processes' argv and (as root) environ, and
# kept every capability; the root bwrap session kept its capabilities; the
# Landlock brokered command reached the keyring and other processes' argv.
# None is left; a hole found later goes here, with its issue, until fixed.
BEING_FIXED: dict[str, dict[str, str]] = {}
"""Cell -> check -> reason: a hole still open, xfail until its fix lands."""


def documented_exception(cell: Cell, check: str) -> str:
    """Why ``check`` may be reached in ``cell`` by design ('' when it may not)."""
    if cell.backend != "nono":
        return ""
    if check == "proc_argv" and not pid_namespace_possible(cell.who):
        return (
            "documented exception: other processes' command lines are visible under "
            "Landlock, as no PID namespace is possible without privilege on this machine"
        )
    if check == "cap_bounding" and cell.who == "user":
        return (
            "documented exception: an unprivileged process cannot empty its bounding set "
            "(PR_CAPBSET_DROP needs CAP_SETPCAP) outside a user namespace; with "
            "no_new_privs it can never gain a capability from it"
        )
    return ""


def being_fixed(cell: Cell, check: str) -> pytest.MarkDecorator | None:
    """The xfail mark of a hole measured before the fix (None: must hold today)."""
    reason = BEING_FIXED.get(str(cell), {}).get(check)
    return pytest.mark.xfail(strict=False, reason=reason) if reason else None


# Every test takes the cell through the same list, so that pytest groups each
# cell's tests together and runs the cell's probe once (module scope).
each_cell = pytest.mark.parametrize("cell_result", CELLS, indirect=True, ids=str, scope="module")


@pytest.mark.parametrize("check", CHECKS)
@each_cell
def test_refused(cell_result: CellResult, check: str, request: pytest.FixtureRequest) -> None:
    if mark := being_fixed(cell_result.cell, check):
        request.applymarker(mark)
    if why := cell_result.skipped.get(check):
        pytest.skip(why)
    verdict = cell_result.verdicts[check]
    if verdict.reached and (why := documented_exception(cell_result.cell, check)):
        pytest.xfail(f"{why} [{verdict.detail}]")
    assert not verdict.reached, f"{cell_result.cell}: {check} reached: {verdict.detail}"


@pytest.mark.parametrize("control", CONTROLS)
@each_cell
def test_still_works(cell_result: CellResult, control: str) -> None:
    """broker_client: ``broker-client -- true`` from inside the session, in the same
    run as the refusals (so the way to the broker survives the socket rules), as
    root and as an ordinary user.  NETLINK_ROUTE: node and getifaddrs need it."""
    if control in ("netlink_route", "broker_client") and cell_result.cell.path != "session":
        pytest.skip("checked in sessions only")
    worked = cell_result.works[control]
    assert worked.reached, f"{cell_result.cell}: {control} broken: {worked.detail}"


@each_cell
def test_unix_sockets_among_own_processes(cell_result: CellResult) -> None:
    """A unix socket bound and connected in the cell's own $TMPDIR (tmux, a test
    server): kept where the kernel allows it, a documented limit under Landlock."""
    worked = cell_result.works["own_unix_socket"]
    if not worked.reached and cell_result.cell.backend == "nono":
        pytest.xfail(
            "documented limit: under Landlock, socket(AF_UNIX) is refused, as ABI 6 "
            f"cannot filter a pathname connect [{worked.detail}]"
        )
    assert worked.reached, worked.detail


@pytest.mark.parametrize("who", ["root", "user"])
def test_every_canary_is_live_without_a_sandbox(who: str) -> None:
    """The same probe with no sandbox reaches every canary (but what only root can
    do, as a user): a refusal in a cell is the sandbox's, not a dead canary's."""
    cell = Cell(who, "host", "none")
    if why := cannot_run(cell):
        pytest.skip(why)
    result = run_cell(cell, the_user() if who == "user" else None)
    inherent = {"raw_icmp", "capabilities"} if who == "user" else set()
    missed = {
        check: v.detail
        for check, v in result.verdicts.items()
        if not v.reached and check not in inherent and check not in result.skipped
    }
    assert missed == {}
