"""Scripts that start one of our executables without site-packages.

The per-call executables (gpg-shim, broker-client) need only the standard
library and this project, yet a console script pays for ``site`` and every
``.pth`` file of the environment (an editable install's finder, injected
hooks): tens of milliseconds per call.  :func:`start_script` writes the
alternative: ``python -I -S`` with the project's root as the only addition
to ``sys.path``.  The launcher puts such scripts where the sandbox looks for
the executables; git runs one as its ``gpg.program``.
"""

from __future__ import annotations

import shlex

SHEBANG_MAX = 128
"""Bytes of a ``#!`` line every Linux reads whole (BINPRM_BUF_SIZE before 5.1)."""


def start_script(python: str, root: str, module: str, what: str) -> str:
    """The text of an executable script running ``module.main()`` under ``python -I -S``.

    ``root`` is the directory holding ``libbroker`` and ``bin``; ``what``
    names the program in the script's comment.  Where the kernel can take it
    the script is Python itself behind a ``#!PYTHON -IS`` line (no shell
    started first); a ``python`` path with white space, or too long for a
    ``#!`` line, gets a ``/bin/sh`` script that execs it.  Either way
    ``sys.argv[0]`` is the script's own path.
    """
    if not module.replace(".", "").replace("_", "").isalnum():
        raise ValueError(f"not a module name: {module!r}")
    # !a (ascii()) is a Python string literal of any path, in plain ASCII.
    setup = f"import sys; sys.path.insert(0, {root!a}); "
    start = f"from {module} import main; main()"
    comment = f"# {what} (agent-sandbox), started without site-packages.\n"
    shebang = f"#!{python} -IS\n"
    # One argument after the interpreter, on a line the kernel reads whole.
    fits = len(shebang.encode()) < SHEBANG_MAX and not any(c.isspace() for c in python)
    if python.startswith("/") and fits:
        return shebang + comment + setup + start + "\n"
    code = setup + "sys.argv[:2] = sys.argv[1:2]; " + start  # argv[0]: "$0", the script
    return (
        "#!/bin/sh\n"
        + comment
        + f'exec {shlex.quote(python)} -I -S -c {shlex.quote(code)} "$0" "$@"\n'
    )
