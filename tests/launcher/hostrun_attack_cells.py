"""One real session per cell (backend x who), planting many attacks at once.

Helpers only (the tests are in test_hostrun_attack_sessions.py).  A :class:`Cell` is
a fresh base directory under /tmp (short: the session's sockets) holding the
person's home, a workdir whose path has a space, a canary directory outside
the workdir, and a runtime parent.  :func:`run_cell` builds every attack's
directory as the person, hands the tree to the ordinary user when the cell
is one, and runs ``agent-sandbox run`` once with the joined plant script
under an address-space limit (a guard that reads a 1 TiB file whole gets
MemoryError, not the machine's OOM killer).  :func:`end_cell` kills what a
timed-out session left and removes the tree without recursion.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hostrun_attack_plants import Attack, commits, git, plant_script, remove_tree

sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))
from as_user import OrdinaryUser, ordinary_user  # type: ignore[import-not-found]

ADDRESS_SPACE = 8 << 30
# Where a 1 TiB file is the person's: a guard that reads it whole stops sooner.
ADDRESS_SPACE_HUGE = 3 << 30


@dataclass
class Cell:
    backend: str
    who: str
    base: Path
    user: OrdinaryUser | None
    mark: str = field(default_factory=lambda: f"as-hra-{uuid.uuid4().hex}")
    status: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    mounts: list[Path] = field(default_factory=list)
    digests: dict[str, tuple[int, str]] = field(default_factory=dict)  # the originals
    ended_at: float = 0.0  # time.monotonic() when the launcher exited

    @property
    def home(self) -> Path:
        return self.base / "home"

    @property
    def work(self) -> Path:
        return self.base / "work dir"

    @property
    def canary(self) -> Path:
        return self.base / "canary"

    @property
    def state(self) -> Path:
        return self.home / ".local/state"

    @property
    def prefix(self) -> tuple[str, ...]:
        return tuple(self.user.argv([])) if self.user is not None else ()

    def planted(self) -> set[str]:
        return {line.split()[1] for line in self.stdout.splitlines()
                if line.startswith("PLANTED ")}

    def lines(self) -> list[str]:
        return [x for x in self.stderr.splitlines() if x.startswith("agent-sandbox: ")]

    def ran(self, prefix: str = "") -> list[str]:
        return sorted(p.name for p in self.canary.iterdir() if p.name.startswith(prefix))

    def host_git(self, attack: Attack) -> list[str]:
        """The person's git after the session, as listed by the attack; the canaries it wrote."""
        for where, argv in attack.host:
            if (self.work / attack.name / where).is_dir():  # (a plant cut short: gone)
                try:
                    git(self.work / attack.name / where, *argv, check=False,
                        prefix=self.prefix, timeout=20,
                        env={"PRE_COMMIT_HOME": str(self.base / "pre-commit")})
                except subprocess.TimeoutExpired:  # blocked on something the session left
                    (self.canary / f"{attack.name}-hang").touch()
        return self.ran(attack.name)


def cannot_run(backend: str, who: str) -> str:
    if os.geteuid() != 0:
        return "these cells build ordinary users and tmpfs mounts: they need a root test run"
    if backend == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap is not installed"
    if backend == "nono":
        with contextlib.suppress(OSError):
            if "landlock" not in Path("/sys/kernel/security/lsm").read_text():
                return "Landlock is not an enabled LSM on this kernel"
    if who == "user":
        user = the_user()
        if user.unavailable:
            return f"cannot run as an ordinary user here: {user.unavailable}"
        if backend == "bwrap" and not user.works(["bwrap", "--unshare-user", "--ro-bind",
                                                  "/", "/", "true"]):
            return "bwrap cannot create a user namespace as an ordinary user here"
    return ""


_USER: list[OrdinaryUser] = []


def the_user() -> OrdinaryUser:
    for _ in range(5):  # (its scan of /proc races with processes that end meanwhile)
        if not _USER:
            with contextlib.suppress(FileNotFoundError):
                _USER.append(ordinary_user())
    return _USER[0]


def new_cell(backend: str, who: str) -> Cell:
    base = Path(tempfile.mkdtemp(prefix="as-hra-", dir="/tmp"))
    cell = Cell(backend, who, base, the_user() if who == "user" else None)
    for d in (cell.home / ".config", cell.work, cell.canary, base / "rt", base / "work",
              base / "pre-commit"):
        d.mkdir(parents=True, exist_ok=True)
    (cell.home / ".config/token").write_text("tok\n")
    (base / "work/decoy").write_text("a path cut at the space would name this\n")
    (base / "rt").chmod(0o700)
    cell.canary.chmod(0o777)
    return cell


def tmpfs_state(cell: Cell) -> None:
    """The state dir (quarantine) on its own tmpfs: every move aside crosses filesystems."""
    cell.state.mkdir(parents=True, exist_ok=True)
    owner = f",uid={cell.user.uid},gid={cell.user.gid}" if cell.user else ""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=1g,mode=0700{owner}", "as-hra-state",
                    str(cell.state)], check=True)
    cell.mounts.append(cell.state)


def run_cell(cell: Cell, attacks: list[Attack], timeout: float = 120,
             before: Callable[[Cell], None] | None = None,
             address_space: int = ADDRESS_SPACE) -> Cell:
    _copy_tree(_template(attacks), cell.work)
    for a in attacks:
        for rel in (".vscode/big.bin", ".vscode/settings.json"):
            if (cell.work / a.name / rel).is_file():
                cell.digests[f"{a.name}/{rel}"] = content_digest(cell.work / a.name / rel)
    if cell.user is not None:
        cell.user.own(cell.base)
    if before is not None:
        before(cell)
    config = cell.base / "config.toml"
    config.write_text(f"workdir = {_toml(cell.work)}\n"
                      f"token_command = {_toml('cat ' + str(cell.home / '.config/token'))}\n"
                      "start_timeout = 60\n")
    script = f"C={shlex.quote(str(cell.canary))}\n" + plant_script(attacks)
    argv = ["prlimit", f"--as={address_space}", "--", "agent-sandbox", "run",
            f"--config={config}", f"--sandbox={cell.backend}", "--", "bash", "-c", script]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TZ")}
    env.update(HOME=str(cell.home), XDG_RUNTIME_DIR=str(cell.base / "rt"), AS_TEST_MARK=cell.mark)
    proc = subprocess.Popen([*cell.prefix, *argv], env=env, cwd=cell.work, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            errors="surrogateescape")
    try:
        cell.stdout, cell.stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        cell.timed_out = True
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        cell.stdout, cell.stderr = proc.communicate()
    cell.status = proc.returncode
    cell.ended_at = time.monotonic()
    return cell


_TEMPLATES: dict[tuple[str, ...], Path] = {}


def _template(attacks: list[Attack]) -> Path:
    """Every attack's directory as the person had it, built once per list (each cell
    copies it: git's own commands are most of a cell's set-up)."""
    key = tuple(a.name for a in attacks)
    if key not in _TEMPLATES:
        top = Path(tempfile.mkdtemp(prefix="as-hra-tpl-", dir="/tmp"))
        atexit.register(remove_tree, top)
        commits(top / "lib", 1)
        (top / "work").mkdir()
        for a in attacks:
            a.setup(top / "work" / a.name, top / "lib")
        _TEMPLATES[key] = top / "work"
    return _TEMPLATES[key]


def _copy_tree(src: Path, dst: Path) -> None:
    """``cp -a``: links as links, sparse files stay sparse, modes and times kept."""
    subprocess.run(["cp", "-a", "--sparse=always", f"{src}/.", str(dst)], check=True)


def _toml(value: object) -> str:
    import json

    return json.dumps(str(value))


def end_cell(cell: Cell) -> None:
    """Kill what the session left (its mark), unmount, remove the tree."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            if cell.mark.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
    for mount in cell.mounts:
        subprocess.run(["umount", "-l", str(mount)], check=False)
    remove_tree(cell.base)


def content_digest(path: Path) -> tuple[int, str]:
    """(size, digest of the bytes), reading only the data a sparse file holds."""
    block = 1 << 20
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        off, done = 0, -1
        while off < size:
            try:
                start = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            for blk in range(start // block * block, end, block):
                if blk <= done:
                    continue
                data = os.pread(fd, block, blk)
                if data.count(0) != len(data):
                    h.update(blk.to_bytes(8, "big") + data)
                done = blk
            off = end
    finally:
        os.close(fd)
    return size, h.hexdigest()


def recoverable(cell: Cell, place: Path, want: tuple[int, str]) -> str:
    """Where the person's original is, byte for byte: in place, or a copy in the state dir."""
    if place.is_file() and not place.is_symlink() and content_digest(place) == want:
        return "in place"
    for path in files_below(cell.state):
        with contextlib.suppress(OSError):
            if path.lstat().st_size == want[0] and content_digest(path) == want:
                return str(path)
    return ""


def files_below(top: Path) -> list[Path]:
    """Every regular file below ``top``, however deep (no recursion, no link followed)."""
    found, todo = [], [top]
    while todo:
        here = todo.pop()
        with contextlib.suppress(OSError):
            for entry in os.scandir(here):
                if entry.is_dir(follow_symlinks=False):
                    todo.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    found.append(Path(entry.path))
    return found
