"""The Landlock session's helper, driven through its three pipes as the launcher drives it.

Its first part (PREP_FD) makes the command's namespaces and process, which
waits; the spec (SPEC_FD) is read by that process itself at go.  Nothing of
the command runs before the spec, a spec whose namespaces are not the
prepared ones never runs, and an end of file where a part was due ends it all
with 125.  Real processes, real Landlock (skipped where the kernel has none).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from libbroker.errors import SandboxUnavailable
from libbroker.sandbox import landlock
from libbroker.sandbox.shape import SYSTEM_READ, Shape

try:
    landlock.require()
except SandboxUnavailable as exc:
    pytest.skip(f"no Landlock here: {exc}", allow_module_level=True)

ROOT = str(Path(__file__).resolve().parents[2])


def _start() -> tuple[subprocess.Popen[bytes], int, int, int]:
    """The helper, spawned as the launcher spawns it; the write ends of its three pipes."""
    pipes = [os.pipe() for _ in range(3)]
    reads = [r for r, _ in pipes]
    proc = subprocess.Popen(
        [sys.executable, "-m", "libbroker.sandbox.landlock_helper", *map(str, reads)],
        pass_fds=reads, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": ROOT},
    )  # fmt: skip
    for r in reads:
        os.close(r)
    return proc, pipes[0][1], pipes[1][1], pipes[2][1]


def _send(fd: int, text: str) -> None:
    os.write(fd, text.encode())
    os.close(fd)


def _shape(work: Path) -> Shape:
    python = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    return Shape(read=(*SYSTEM_READ, python, ROOT), write=(str(work),), cwd=str(work),
                 env={"PATH": "/usr/bin:/bin"}, tcp_connect=(9,))


def _spec(shape: Shape, marker: Path) -> str:
    import json

    return json.dumps({"shape": shape.to_json(), "argv": ["sh", "-c", f"echo ran > {marker}"]})


def _prep(shape: Shape) -> str:
    import json

    return json.dumps({"shape": shape.early().to_json()})


@pytest.mark.timeout(60)
def test_the_two_parts_run_the_command_and_nothing_runs_without_a_matching_spec(
    tmp_path: Path,
) -> None:
    """One helper per way: prep then the spec (it runs, 0); prep then end of file; prep
    then a spec whose namespaces differ (a session flag, a hold); end of file first.
    Each but the first exits 125 with nothing of the command run."""
    shape = _shape(tmp_path)
    cases = {
        "runs": (_prep(shape), shape),
        "no spec": (_prep(shape), None),
        "other session": (_prep(shape), replace(shape, new_session=False)),
        "other holds": (_prep(shape), replace(shape, protect=(str(tmp_path),))),
        "no prep": (None, None),
    }
    started = {}
    for name, (prep, spec) in cases.items():
        proc, prep_w, spec_w, life_w = _start()
        if prep is not None:
            _send(prep_w, prep)
        else:
            os.close(prep_w)
        marker = tmp_path / name.replace(" ", "-")
        if spec is not None:
            _send(spec_w, _spec(spec, marker))
        else:
            os.close(spec_w)
        started[name] = (proc, life_w, marker)
    for name, (proc, life_w, marker) in started.items():
        _, err = proc.communicate(timeout=30)
        os.close(life_w)
        if name == "runs":
            assert proc.returncode == 0, err
            assert marker.read_text() == "ran\n"
            continue
        assert proc.returncode == 125, (name, err)
        assert not marker.exists(), name
        if name.startswith("other"):
            assert b"the spec's namespaces are not the ones prepared" in err, err
