"""How the launcher starts our own Python programs: argv for a boot without site.

Light on purpose (``os`` and ``sys`` only): ``agent-sandbox run`` computes the
servers' argv before it has imported anything else (:mod:`.prestart`).

Our programs start without the site module: it processes every .pth file of
the installation, which costs each process tens of ms of CPU while they
compete for the cores at session start.  ``sys.path`` gets exactly what site
would add for our code and dependencies; if the imports fail anyway, the
program is run again with site.

A child started with ``die_with`` arranges itself to be signalled when the
launcher dies (``PR_SET_PDEATHSIG``), first thing, then checks that the
launcher is still its parent (the race where it died before the prctl).  The
launcher spawns with ``posix_spawn`` (no code of ours runs between fork and
exec), so the child has to do it.
"""

from __future__ import annotations

import os
import sys

_BOOT = """import sys
sys.path[:0] = {paths!r}
sys.argv[0] = {name!r}
try:
    from {module} import main
except ImportError:
    import os
    os.execv({fallback[0]!r}, [*{fallback!r}, *sys.argv[1:]])
raise SystemExit(main())
"""

# The servers' boot: import what the server needs first (interpreter start
# and imports are most of a server's start), then read the arguments from
# stdin, so the launcher can start both servers before it has parsed its own
# command line and config.  The arguments come NUL-terminated, then a
# newline; end of file before that means the launcher gave up: exit quietly.
_BOOT_DEFERRED = """import sys
sys.path[:0] = {paths!r}
sys.argv[0] = {name!r}
import os
for warm in {warm!r}:
    try:
        __import__(warm)
    except ImportError:
        pass
try:
    from {module} import main
except ImportError:
    main = None
data = b""
while not data.endswith(b"\\n"):
    chunk = os.read(0, 65536)
    if not chunk:
        os._exit(0)
    data += chunk
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
sys.argv[1:] = [os.fsdecode(a) for a in data[:-1].split(b"\\0")[:-1]]
if main is None:
    os.execv({fallback[0]!r}, [*{fallback!r}, *sys.argv[1:]])
raise SystemExit(main())
"""

# PR_SET_PDEATHSIG through _ctypes itself: ctypes/__init__ costs a server
# several ms of start-up, this ~1 ms; ctypes is the fallback.  A launcher that
# is already gone (we were reparented) ends us at once; so does a refused prctl.
_DIE_WITH = """def _die_with_launcher(sig, launcher):
    import os
    try:
        import _ctypes
        class Int(_ctypes._SimpleCData):
            _type_ = "i"
        class Fn(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = Int
        class Libc:
            _handle = _ctypes.dlopen(None, 0)
        prctl = Fn(("prctl", Libc()))
    except Exception:
        import ctypes
        prctl = ctypes.CDLL(None).prctl
    if prctl(1, sig, 0, 0, 0) != 0:
        os.write(2, b"cannot arrange to end with the launcher (prctl)\\n")
        os._exit(1)
    if os.getppid() != launcher:
        os._exit(0)
_die_with_launcher({sig}, {launcher})
del _die_with_launcher
"""

SIGTERM = 15  # signal.SIGTERM on Linux, without importing signal
SIGKILL = 9


def encode_args(args: list[str]) -> bytes:
    """Arguments as the deferred boot reads them from stdin."""
    return b"".join(os.fsencode(a) + b"\0" for a in args) + b"\n"


def project_dir() -> str:
    """The directory libbroker (and bin, libegress, libpolicy) is imported from."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_paths() -> list[str]:
    """The project, then the site-packages directories site would add."""
    import site  # already imported by the console script's interpreter

    paths = [project_dir()]
    for p in site.getsitepackages():
        if p not in paths and os.path.isdir(p):
            paths.append(p)
    return paths


def with_site(name: str, module: str) -> list[str]:
    """argv that runs ``module``'s main with site, as its console script would."""
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import main; sys.exit(main())"
    return [sys.executable, "-c", code]


def die_with(sig: int | None) -> str:
    """Boot code that makes the process get ``sig`` when this process (its spawner) dies."""
    return "" if sig is None else _DIE_WITH.format(sig=int(sig), launcher=os.getpid())


def python_argv(
    name: str, module: str, fallback: list[str] | None = None, *, die_with_sig: int | None = None
) -> list[str]:
    """argv that runs our console script ``name`` (``module``'s main) without site.

    ``fallback`` (default: the same with site) is exec'd if the imports fail.
    ``die_with_sig``: the child gets it when the process calling this dies
    (which must therefore be the one that spawns it).
    """
    python = os.path.realpath(sys.executable)
    fallback = fallback or with_site(name, module)
    boot = _BOOT.format(paths=import_paths(), name=name, module=module, fallback=fallback)
    return [python, "-I", "-S", "-c", die_with(die_with_sig) + boot]


def deferred_python_argv(
    name: str, module: str, warm: tuple[str, ...], *, die_with_sig: int | None = SIGTERM
) -> list[str]:
    """Like :func:`python_argv`, but the arguments come later on stdin (:func:`encode_args`).

    The process imports ``warm`` (missing modules skipped: the program
    reports them itself) and ``module`` while it waits.  By default it gets
    SIGTERM when the process calling this dies; before its arguments, end of
    file on stdin ends it too.
    """
    python = os.path.realpath(sys.executable)
    boot = _BOOT_DEFERRED.format(
        paths=import_paths(),
        name=name,
        module=module,
        warm=warm,
        fallback=with_site(name, module),
    )
    return [python, "-I", "-S", "-c", die_with(die_with_sig) + boot]
