"""Native helpers, compiled from the C source beside this file.

- ``gpg_shim.c``: gpg-shim's signing fast path (its header says what it does
  and what it hands to the Python gpg-shim).  git runs its ``gpg.program``
  once per signature and waits for it, and a Python start is most of that
  wait; the C program has none.
- ``reaper.c``: :func:`libbroker.sandbox.reaper.supervise` as a small program, which
  the broker's per-command reaper execs so that it does not live on as a
  copy of the whole server (its header says why that matters).
- ``forwarder.c``: :mod:`libbroker.sandbox.forwarder` as a small program, the
  first process of a bwrap session: no interpreter to start (~15 ms of CPU)
  between bwrap's exec and the go byte.

Each is optional.  ``just setup`` builds them (``python3 -m libbroker.native``)
where a C compiler is installed; without one, or when a build is older than
its source, the Python code does the same work: git gets the Python
gpg-shim (started without site), about 20 ms slower per signature, and the
reaper stays the forked Python process, about 2 MiB more per command; bwrap
runs forwarder.py (``python -I -S``), ~15 ms more CPU per session.
"""

from __future__ import annotations

import os
import sys

from libbroker.errors import BuildError
from libbroker.native.start_script import start_script

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = {"gpg-shim": "gpg_shim.c", "reaper": "reaper.c", "forwarder": "forwarder.c"}
"""Each native program, by the name ``just setup`` builds it under beside its source."""

# Warnings are errors; the usual hardening of a Debian build (fortified libc
# calls, stack protector, PIE, full RELRO).
CFLAGS = (
    "-std=c11", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wconversion", "-Werror",
    "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong", "-fPIE", "-pie",
    "-Wl,-z,relro,-z,now",
)


def built(name: str, path: str | None = None) -> str | None:
    """The compiled program ``name``, if it exists and is not older than its source.

    A stale build would do whatever its source did then (speak an older wire
    format, say): it is ignored, and the Python code used, until ``just
    setup`` rebuilds it.
    """
    path = path or os.path.join(HERE, name)
    try:
        program = os.stat(path)
        source = os.stat(os.path.join(HERE, SOURCES[name]))
    except OSError:
        return None
    if not os.access(path, os.X_OK) or program.st_mtime < source.st_mtime:
        return None
    return path


FULL_SHIM = os.path.join("python", "gpg-shim")
"""Where the fast path finds the Python gpg-shim: relative to its own directory (gpg_shim.c)."""


def install_gpg_program(path: str, python: str, root: str, native: str | None) -> None:
    """Make ``path`` a gpg.program for git: the fast path when ``native``, else the script.

    With ``native`` (a built fast path), ``path`` is a link to it and the
    Python gpg-shim it hands over to is written to ``python/gpg-shim``
    beside ``path``; without, ``path`` is that Python gpg-shim itself (a
    ``python -I -S`` script for ``python``, importing this project from
    ``root``).  Nothing existing is replaced: every name is created anew
    (``O_EXCL``, a fresh directory), so a planted file or link is an error.
    """
    script = path
    if native is not None:
        script = os.path.join(os.path.dirname(path), FULL_SHIM)
        os.mkdir(os.path.dirname(script), 0o700)
    fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
    with os.fdopen(fd, "w") as fh:
        fh.write(program_script(python, root))
    if native is not None:
        os.symlink(native, path)


def build(name: str, out: str | None = None, cc: str | None = None) -> str:
    """Compile ``name`` to ``out`` (atomically: a rename); BuildError on failure."""
    # Here, not at the top: the launcher imports this module for built() alone.
    import shlex
    import subprocess
    import tempfile

    out = out or os.path.join(HERE, name)
    source = os.path.join(HERE, SOURCES[name])
    compiler = shlex.split(cc or os.environ.get("CC") or "cc")
    directory = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=directory)
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                [*compiler, *CFLAGS, "-o", tmp, source],
                capture_output=True, text=True, check=False,
            )
        except OSError as exc:
            raise BuildError(f"cannot run the C compiler {compiler[0]}: {exc.strerror}") from None
        if done.returncode != 0:
            raise BuildError(f"{compiler[0]} failed on {source}:\n{done.stderr.strip()}")
        os.chmod(tmp, 0o755)  # noqa: S103 - a program for every user, as any in /usr/bin
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def main() -> None:
    """``python3 -m libbroker.native``: build every native program, say where."""
    for name in SOURCES:
        try:
            path = build(name)
        except BuildError as exc:
            sys.stderr.write(f"libbroker.native: {exc}\n")
            sys.exit(1)
        sys.stdout.write(f"built {path}\n")


def program_script(python: str, root: str) -> str:
    """A ``gpg.program`` for git that starts gpg-shim without site-packages.

    git runs ``gpg.program`` by path, once per signature and once per commit
    verified, so start-up is most of gpg-shim's cost: see
    :func:`libbroker.native.start_script.start_script`.  ``sys.argv[0]`` is the
    script's path, so the shim still recognises itself on PATH when looking
    for the local gpg.
    """
    return start_script(python, root, "bin.gpg_shim", "git's gpg.program: gpg-shim")
