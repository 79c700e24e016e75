"""Issue 24's attacks through real sessions, then the person's real git on the host.

Every cell is a backend (bwrap, Landlock as ``--sandbox=nono``) times who
runs it (root, an ordinary user: tests/sandbox/as_user.py).  One session per
cell plants every attack of a list, each in its own directory of a workdir
whose path holds a space (hostrun_attack_plants.py); then the host's git
does what the person would (``status`` at the top and in the subdirectory
concerned, ``commit``, ``rebase --continue``, ``cherry-pick --continue``,
the planted alias).  A planted command writes a canary outside the workdir:
none may appear, and every plant that went through must be named by one of
the guard's lines.  Three sessions per cell: the main list, the heavy files
(0 B to a 1 TiB sparse one), and one with the quarantine on a tmpfs (every
move aside a copy across filesystems, through 1100-deep directories).

Beyond the issue's list: FIFOs where git and the guard read, a process that
outlives the command and plants later, VS Code's dev container and workspace
files, and pre-commit's tracked config (when pre-commit is installed).  A
case that still succeeds on main is marked xfail (strict=False) in GAPS with
its reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostrun_attack_cells import (
    ADDRESS_SPACE,
    ADDRESS_SPACE_HUGE,
    Cell,
    cannot_run,
    end_cell,
    files_below,
    new_cell,
    recoverable,
    run_cell,
    tmpfs_state,
)
from hostrun_attack_plants import (
    HEAVY,
    HOSTILE_MADE,
    HOSTILE_NAMES,
    HUGE,
    MAIN,
    NAMES,
    PRE_COMMIT_CONFIG,
    SIZES,
    SPARSE,
    TMPFS,
    Attack,
    git,
    plant_script,
)
from test_hostrun_attacks import ALL_GIT, git_everywhere

CELLS = [pytest.param((b, w), id=f"{b}-{w}") for b in ("bwrap", "nono") for w in ("root", "user")]

# (attack, backend, who) -> why it is still open on main; "*" matches any.
GAPS: dict[tuple[str, str, str], str] = {}


def gap(request: pytest.FixtureRequest, cell: Cell, name: str) -> None:
    for key in ((name, cell.backend, cell.who), (name, cell.backend, "*"),
                (name, "*", cell.who), (name, "*", "*")):
        if key in GAPS:
            request.applymarker(pytest.mark.xfail(strict=False,
                                                  reason=f"issue 24 gap: {GAPS[key]}"))
            return


def _cell(request: pytest.FixtureRequest, attacks: list[Attack], tmpfs: bool = False,
          timeout: float = 120, address_space: int = ADDRESS_SPACE) -> Iterator[Cell]:
    backend, who = request.param
    if why := cannot_run(backend, who):
        pytest.skip(why)
    cell = new_cell(backend, who)
    try:
        run_cell(cell, attacks, timeout, before=tmpfs_state if tmpfs else None,
                 address_space=address_space)
        yield cell
    finally:
        end_cell(cell)


@pytest.fixture(scope="module", params=CELLS)
def main_cell(request: pytest.FixtureRequest) -> Iterator[Cell]:
    yield from _cell(request, MAIN)


@pytest.fixture(scope="module", params=CELLS)
def names_cell(request: pytest.FixtureRequest) -> Iterator[Cell]:
    yield from _cell(request, NAMES)


@pytest.fixture(scope="module", params=CELLS)
def heavy_cell(request: pytest.FixtureRequest) -> Iterator[Cell]:
    yield from _cell(request, HEAVY)


@pytest.fixture(scope="module", params=CELLS)
def huge_cell(request: pytest.FixtureRequest) -> Iterator[Cell]:
    yield from _cell(request, HUGE, timeout=180, address_space=ADDRESS_SPACE_HUGE)


@pytest.fixture(scope="module", params=CELLS)
def sparse_cell(request: pytest.FixtureRequest) -> Iterator[Cell]:
    yield from _cell(request, SPARSE, timeout=180, address_space=ADDRESS_SPACE_HUGE)


@pytest.fixture(scope="module", params=CELLS)
def tmpfs_cell(request: pytest.FixtureRequest) -> Iterator[Cell]:
    yield from _cell(request, TMPFS, tmpfs=True)


def _ended(cell: Cell, statuses: tuple[int, ...] = (0,)) -> None:
    assert not cell.timed_out, f"the session did not end in time:\n{cell.stderr[-3000:]}"
    assert cell.status in statuses, cell.stderr[-3000:]
    assert "Traceback" not in cell.stderr, cell.stderr[-3000:]
    failed = [x for x in cell.lines() if "failed" in x or "could not be checked" in x]
    assert failed == [], failed


def _late_alive() -> bool:
    """Whether a "late" plant's shell lives, any cell's (host's /proc sees every pid
    namespace): once none does, nothing is left to plant later (git and the hook come
    after its sleep, from it), so its check need not wait out the 4 s."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"TERM HUP INT; sleep 4; git init -q nr" in fh.read():
                    return True
        except OSError:  # not a process, or gone
            continue
    return False


def _named(cell: Cell, name: str) -> None:
    if name in cell.planted():
        assert any(f"{name}/" in x for x in cell.lines()), (name, cell.lines())


# --- the canaries are real ------------------------------------------------------------


def test_the_plants_run_when_nothing_guards(tmp_path: Path) -> None:
    """The same plants, straight on the host (no session, no sweep): git runs them all."""
    cell = Cell("none", "root", tmp_path, None)
    for d in (cell.work, cell.canary):
        d.mkdir(parents=True)
    from hostrun_attack_plants import commits

    commits(tmp_path / "lib", 1)
    attacks = [a for a in MAIN if a.host and (a.name != "precommit" or shutil.which("pre-commit"))]
    for a in attacks:
        a.setup(cell.work / a.name, tmp_path / "lib")
    script = f"C='{cell.canary}'\n" + plant_script(attacks)
    done = subprocess.run(["bash", "-c", script], cwd=cell.work, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    planted = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("PLANTED")}
    assert planted == {a.name for a in attacks}, done.stdout
    # "late" plants 4 s after its command ended: its hook made executable is its last step
    hook, deadline = cell.work / "late/nr/.git/hooks/pre-commit", time.monotonic() + 60
    while not os.access(hook, os.X_OK):
        assert time.monotonic() < deadline, "the late plant never planted"
        time.sleep(0.05)
    ran = {a.name: cell.host_git(a) for a in attacks}
    assert {name for name, canaries in ran.items() if not canaries} == set(), ran
    os.chmod(cell.work / "chmod/.git", 0o755)


# --- the main list: one session per cell ----------------------------------------------


@pytest.mark.timeout(300)
def test_the_main_session_ends_cleanly(main_cell: Cell, request: pytest.FixtureRequest) -> None:
    gap(request, main_cell, "main-ends")
    _ended(main_cell)


@pytest.mark.parametrize("name", [a.name for a in MAIN if a.host])
def test_no_plant_runs_on_the_host(main_cell: Cell, name: str,
                                   request: pytest.FixtureRequest) -> None:
    if name == "precommit" and shutil.which("pre-commit") is None:
        pytest.skip("pre-commit (https://pre-commit.com) is not installed")
    gap(request, main_cell, name)
    attack = next(a for a in MAIN if a.name == name)
    if name == "late":  # what outlived the session has had its time to plant, or is gone
        while time.monotonic() < main_cell.ended_at + 6 and _late_alive():
            time.sleep(0.05)
        assert not (main_cell.work / "late/nr").exists(), "a process outlived the session"
    assert main_cell.host_git(attack) == []
    if name != "late":
        _named(main_cell, name)


def test_a_new_task_next_to_5001_files_is_moved_aside(main_cell: Cell,
                                                      request: pytest.FixtureRequest) -> None:
    gap(request, main_cell, "vscode5k")
    assert not (main_cell.work / "vscode5k/.vscode/tasks.json").exists()
    _named(main_cell, "vscode5k")


@pytest.mark.parametrize("rel", [".devcontainer/devcontainer.json", ".devcontainer.json",
                                 "x.code-workspace"])
def test_editor_files_are_moved_aside(main_cell: Cell, rel: str,
                                      request: pytest.FixtureRequest) -> None:
    """Not on issue 24's list: a dev container's initializeCommand runs on the host when
    VS Code opens it, a workspace file's folderOpen task when it is opened."""
    gap(request, main_cell, rel)
    # (bwrap may refuse a host-run entry's creation outright: nothing to move then)
    assert not (main_cell.work / "devcontainer" / rel).exists()
    _named(main_cell, "devcontainer")


def test_a_changed_pre_commit_config_is_put_back(main_cell: Cell,
                                                 request: pytest.FixtureRequest) -> None:
    """Whether or not pre-commit is installed here: the session's version of the tracked
    config (committed with --no-verify inside) is not the worktree's afterwards, so the
    hook pre-commit installed runs the person's entries, not the session's."""
    gap(request, main_cell, "precommit-config")
    assert (main_cell.work / "precommit/.pre-commit-config.yaml").read_text() == \
        PRE_COMMIT_CONFIG
    _named(main_cell, "precommit")


def test_the_agents_work_stays_and_the_repositories_are_whole(
        main_cell: Cell, request: pytest.FixtureRequest) -> None:
    gap(request, main_cell, "existing-whole")
    top = main_cell.work / "existing"
    assert (top / "agent-work.txt").read_text() == "agent\n"
    log = git(top, "log", "--format=%s", prefix=main_cell.prefix).stdout.split()
    assert log[-2:] == ["module", "c1"], log  # the history is whole
    # the config key that runs commands is named, and chmod 0311 .git was undone
    assert any("existing/" in x and "core.fsmonitor" in x for x in main_cell.lines())
    assert stat.S_IMODE((main_cell.work / "chmod/.git").stat().st_mode) & 0o700 == 0o700
    for line in main_cell.lines():  # every printed command parses
        if "to apply the session's version: " in line:
            command = line.split("to apply the session's version: ", 1)[1]
            assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0, command
    # and the host's git from every directory of the repositories that were there
    for name in ("existing", "gitlink", "link", "rename"):
        assert git_everywhere(main_cell.work / name, main_cell.canary,
                              commands=ALL_GIT[:2]) == [], name


def test_the_persons_2mb_file_survives_an_edit_next_to_it(
        main_cell: Cell, request: pytest.FixtureRequest) -> None:
    gap(request, main_cell, "dataloss")
    _survives(main_cell, "dataloss", (".vscode/big.bin", ".vscode/settings.json"))


def _survives(cell: Cell, name: str, rels: tuple[str, ...]) -> None:
    assert not cell.timed_out, "the session did not end in time"
    for rel in rels:
        want = cell.digests[f"{name}/{rel}"]
        where = recoverable(cell, cell.work / name / rel, want)
        assert where, f"{name}/{rel}: the person's original ({want[0]} bytes) is gone"


# --- heavy files: the person's original of any size -----------------------------------


@pytest.mark.timeout(300)
def test_the_heavy_session_ends_cleanly(heavy_cell: Cell, request: pytest.FixtureRequest) -> None:
    gap(request, heavy_cell, "heavy-ends")
    _ended(heavy_cell)


@pytest.mark.parametrize("label", list(SIZES))
def test_a_guarded_file_of_any_size_is_recoverable(heavy_cell: Cell, label: str,
                                                   request: pytest.FixtureRequest) -> None:
    gap(request, heavy_cell, f"size-{label}")
    _survives(heavy_cell, f"size-{label}", (".vscode/big.bin",))


@pytest.mark.timeout(400)
def test_a_1tib_sparse_original_is_recoverable(huge_cell: Cell,
                                               request: pytest.FixtureRequest) -> None:
    """The person's 1 TiB sparse file: the session runs, changes it, the original comes back."""
    gap(request, huge_cell, "size-1t")
    # bwrap holds .vscode read-only: the change is refused.  An ordinary user's
    # Landlock session has rlimits for limits: its write past 1 TiB gets SIGXFSZ.
    _ended(huge_cell, statuses=(0, 128 + signal.SIGXFSZ))
    _survives(huge_cell, "size-1t", (".vscode/big.bin",))


@pytest.mark.timeout(400)
def test_a_new_1tib_sparse_file_is_not_read_whole(sparse_cell: Cell,
                                                  request: pytest.FixtureRequest) -> None:
    gap(request, sparse_cell, "sparse-new")
    _ended(sparse_cell)
    assert not (sparse_cell.work / "sparse-new/.vscode/tasks.json").exists()
    _named(sparse_cell, "sparse-new")


# --- the quarantine on another filesystem ---------------------------------------------


@pytest.mark.timeout(300)
def test_the_tmpfs_session_ends_cleanly(tmpfs_cell: Cell, request: pytest.FixtureRequest) -> None:
    gap(request, tmpfs_cell, "tmpfs-ends")
    _ended(tmpfs_cell)


@pytest.mark.parametrize("name", [a.name for a in TMPFS if a.host])
def test_deep_plants_moved_across_filesystems_never_run(
        tmpfs_cell: Cell, name: str, request: pytest.FixtureRequest) -> None:
    gap(request, tmpfs_cell, name)
    attack = next(a for a in TMPFS if a.name == name)
    assert tmpfs_cell.host_git(attack) == []
    _named(tmpfs_cell, name)


def test_a_deep_vscode_is_moved_across_filesystems(tmpfs_cell: Cell,
                                                   request: pytest.FixtureRequest) -> None:
    gap(request, tmpfs_cell, "deep-vscode")
    assert not (tmpfs_cell.work / "deep-vscode/.vscode/tasks.json").exists()
    _named(tmpfs_cell, "deep-vscode")


def test_the_persons_file_survives_across_filesystems(
        tmpfs_cell: Cell, request: pytest.FixtureRequest) -> None:
    gap(request, tmpfs_cell, "xfs-dataloss")
    _survives(tmpfs_cell, "xfs-dataloss", (".vscode/big.bin", ".vscode/settings.json"))


@pytest.mark.timeout(300)
def test_the_names_session_ends_cleanly(names_cell: Cell,
                                        request: pytest.FixtureRequest) -> None:
    gap(request, names_cell, "hostile-ends")
    _ended(names_cell)


def test_fifos_left_by_the_session_block_nothing(names_cell: Cell,
                                                 request: pytest.FixtureRequest) -> None:
    """The session ended (the guard did not block on a FIFO), and the person's git neither
    hangs nor runs anything afterwards."""
    gap(request, names_cell, "fifo")
    _ended(names_cell)
    assert names_cell.host_git(next(a for a in NAMES if a.name == "fifo")) == []
    _named(names_cell, "fifo")


def test_printed_lines_carry_no_control_bytes(names_cell: Cell,
                                              request: pytest.FixtureRequest) -> None:
    gap(request, names_cell, "hostile-shown")
    err = names_cell.stderr
    for byte in ("\x1b", "\r", "\x07", "\x9b", "\x9d"):
        assert byte not in err, (byte, [x for x in err.splitlines() if byte in x])
    assert not [x for x in err.splitlines() if x.startswith("FORGED")]
    # the name that is not UTF-8 is named, and the sweep did not fail after it
    assert any("hostile/" in x and "\\xff" in x for x in names_cell.lines()), names_cell.lines()


def test_every_printed_command_is_safe_to_paste(names_cell: Cell,
                                                request: pytest.FixtureRequest) -> None:
    """Last in the cell: pasting the lines applies the session's versions of hostile/."""
    gap(request, names_cell, "hostile-paste")
    commands = [x.split("to apply the session's version: ", 1)[1] for x in names_cell.lines()
                if "to apply the session's version: " in x and "hostile/" in x]
    assert len(commands) >= len(HOSTILE_NAMES) + len(HOSTILE_MADE), names_cell.lines()
    scratch = names_cell.base / "paste"
    (scratch / "dir").mkdir(parents=True)
    for command in commands:
        assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0, command
        done = subprocess.run(["bash", "-c", command], cwd=scratch, capture_output=True)
        assert done.returncode == 0, (command, done.stderr)
    pwned = [p for p in files_below(names_cell.base) if p.name == "PWNED"]
    assert pwned == []
    assert (names_cell.base / "work/decoy").exists()
    hostile = names_cell.work / "hostile"
    names = [n.encode() for n in HOSTILE_NAMES]
    names += [subprocess.run(["bash", "-c", f"printf '{f}'"], capture_output=True).stdout
              for f in HOSTILE_MADE]
    for n, name in enumerate(names):
        path = os.path.join(bytes(hostile), name, b".envrc")
        with open(path, "rb") as f:
            assert f.read() == f"export N={n}\n".encode(), name


def test_no_canary_at_all(main_cell: Cell) -> None:
    """After every host command of the main list: nothing ran, whatever its name (but the
    attacks still open, marked in GAPS)."""
    open_ = {name for name, b, w in GAPS if b in ("*", main_cell.backend)
             and w in ("*", main_cell.who)}
    for attack in MAIN:
        main_cell.host_git(attack)
    assert [c for c in main_cell.ran() if not c.startswith(tuple(open_))] == []
