"""The Landlock session's helper, driven through its pipes as the launcher drives it.

Its three parts come on one pipe (libbroker.sandbox.parts): the first makes the
command's process (in its group), the second its mount namespace, the third,
the spec, is read by that process itself at go.  Nothing of the command runs
before the spec, a spec whose namespaces are not the prepared ones never runs,
and an end of file where a part was due ends it all with 125.  Real processes,
real Landlock (skipped where the kernel has none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from libbroker.errors import SandboxUnavailable
from libbroker.sandbox import landlock
from libbroker.sandbox.parts import LIMIT, frame
from libbroker.sandbox.shape import SYSTEM_READ, Shape

try:
    landlock.require()
except SandboxUnavailable as exc:
    pytest.skip(f"no Landlock here: {exc}", allow_module_level=True)

ROOT = str(Path(__file__).resolve().parents[2])


# The helper where the kernel refuses user namespaces (pidns.unshare_pids says so).
NO_USERNS = ("import sys; from libbroker.sandbox import landlock_helper, pidns; "
             "pidns.unshare_pids = lambda: False; sys.exit(landlock_helper.main(sys.argv[1:]))")


def _start(userns: bool = True) -> tuple[subprocess.Popen[bytes], int, int]:
    """The helper, spawned as the launcher spawns it; the write ends of its two pipes."""
    pipes = [os.pipe() for _ in range(2)]
    reads = [r for r, _ in pipes]
    how = ["-m", "libbroker.sandbox.landlock_helper"] if userns else ["-c", NO_USERNS]
    proc = subprocess.Popen(
        [sys.executable, *how, *map(str, reads)],
        pass_fds=reads, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": ROOT},
    )  # fmt: skip
    for r in reads:
        os.close(r)
    return proc, pipes[0][1], pipes[1][1]


def _shape(work: Path) -> Shape:
    python = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    return Shape(read=(*SYSTEM_READ, python, ROOT), write=(str(work),), cwd=str(work),
                 env={"PATH": "/usr/bin:/bin"}, tcp_connect=(9,))


def _parts(shape: Shape, spec: Shape | None, marker: Path, count: int) -> bytes:
    """The first ``count`` parts: the start, the namespaces (``shape``'s), the spec."""
    whole = [
        {"new_session": shape.new_session},
        {"shape": shape.early().to_json()},
        {"shape": (spec or shape).to_json(), "argv": ["sh", "-c", f"echo ran > {marker}"]},
    ]
    return b"".join(frame(json.dumps(p).encode()) for p in whole[:count])


@pytest.mark.timeout(60)
def test_the_three_parts_run_the_command_and_nothing_runs_without_a_matching_spec(
    tmp_path: Path,
) -> None:
    """One helper per way: the three parts (it runs, 0); end of file after none, one and
    two of them; a spec whose namespaces differ (the session flag, a hold); a length
    over the limit.  Each but the first exits 125 with nothing of the command run."""
    shape = _shape(tmp_path)
    cases: dict[str, tuple[Shape | None, int | bytes, bool]] = {
        "runs": (None, 3, True),
        "nothing": (None, 0, True),
        "first only": (None, 1, True),
        "no spec": (None, 2, True),
        "other session": (shape._replace(new_session=False), 3, True),
        "other holds": (shape._replace(protect=(str(tmp_path),)), 3, True),
        "too long": (None, (LIMIT + 1).to_bytes(4, "big"), True),
        # No user namespace: the command's process reads the second part itself; it runs,
        # but never with holds (they would be the host's own paths).
        "runs without userns": (None, 3, False),
        "holds without userns": (None, 3, False),
    }
    started = {}
    held = shape._replace(protect=(str(tmp_path),))
    for name, (spec, count, userns) in cases.items():
        proc, spec_w, life_w = _start(userns)
        marker = tmp_path / name.replace(" ", "-")
        start = held if name.startswith("holds") else shape
        data = count if isinstance(count, bytes) else _parts(start, spec, marker, count)
        os.write(spec_w, data)
        os.close(spec_w)
        started[name] = (proc, life_w, marker)
    for name, (proc, life_w, marker) in started.items():
        _, err = proc.communicate(timeout=30)
        os.close(life_w)
        if name.startswith("runs"):
            assert proc.returncode == 0, err
            assert marker.read_text() == "ran\n"
            continue
        assert proc.returncode == 125, (name, err)
        assert not marker.exists(), name
        if name.startswith("other"):
            assert b"the spec's namespaces are not the ones prepared" in err, err
        if name.startswith("holds"):
            assert b"the kernel refuses the mount namespace" in err, err
