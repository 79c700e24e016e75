"""Commits signed on the host, asked for from the sandbox (gpg-shim's Python side).

- :mod:`.args`: git's gpg command line, parsed (pure);
- :mod:`.shim`: the ``sign`` request through the broker, gpg's output routed back;
- :mod:`.local`: what is not signing (``--verify``) goes to the local gpg.

The C fast path (libbroker/native/gpg_shim.c) handles git's one signing
form itself and hands everything else to :mod:`.shim`.
"""
