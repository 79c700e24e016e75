"""The one sandbox, for brokered commands and for the agent's session alike.

Mechanism only: callers bring the policy as a :class:`~.shape.Shape` (the
broker from its ``--profile``, the launcher from its config) and get the same
sandbox for it on either backend.

- :mod:`.shape`: what a sandbox grants, as data;
- :mod:`.bwrap`: bubblewrap's argv for a shape (pure), and the host facts it needs;
- :mod:`.landlock`: the Landlock ruleset for a shape (pure), and its system calls;
- :mod:`.seccomp`: the one seccomp filter (TIOCSTI, keyring, io_uring, sockets);
- :mod:`.enter`: the one hardening sequence before exec under Landlock;
- :mod:`.bridge`: the one bridge carrying the proxy's port(s) into bwrap's netns;
- :mod:`.forwarder`: the session's first process inside bwrap: go byte, signals;
- :mod:`.reaper`: nothing a command starts outlives it (Landlock has no PID namespace);
- :mod:`.exec`: exec with the shell's 126/127;
- :mod:`.kinds`: the backends there are, and what ``auto`` means;
- :mod:`.backend`, :mod:`.backends`: the Backend protocol, one object per
  mechanism (:mod:`.bwrap_backend`, :mod:`.landlock_backend`) that broker and
  launcher ask instead of testing its name;
- :mod:`.landlock_helper`: the Landlock session's helper: it forks the command,
  which runs :func:`.enter.enter` and execs, and stays as its reaper.
"""
