"""The launcher: one sandboxed agent session (``agent-sandbox run``).

It composes the other executables (egress-proxy, broker-server,
kubeconfig-proxify) through subprocesses and pipes only, and runs the agent's
command in a bwrap or Landlock sandbox whose only way out is the proxy.

Modules:

- :mod:`.config`: the TOML config over built-in defaults;
- :mod:`.runtime`: the session's private runtime directory;
- :mod:`.plan`: what a session starts, as data (argv, broker profile, policy);
- :mod:`.agent_sandbox`: the session's :class:`~libbroker.sandbox.shape.Shape`
  (the sandbox itself is :mod:`libbroker.sandbox`'s, shared with the broker), env;
- :mod:`.door`: the broker's door into a Landlock session (no unix sockets there);
- :mod:`.supervise`: children (pdeathsig, pidfds, ordered stop) and the janitor;
- :mod:`.child`: posix_spawn, pipes and pidfds (light: the servers' spawn uses it);
- :mod:`.boot`: argv for our own Python programs without site, the deferred
  boot and its PR_SET_PDEATHSIG (light, like :mod:`.child`);
- :mod:`.prestart`: the servers' early start, before the launcher parses;
- :mod:`.session`: ``run`` itself; :mod:`.trace`: ``AGENT_SANDBOX_TRACE=1``;
- :mod:`libbroker.sandbox.bridge`: the proxy's ports bridged into bwrap's
  network namespace (the broker's commands use it too);
- :mod:`.session_box`: the backend's part of each of the session's steps
  (bwrap: bwrap and the forwarder; Landlock: the helper
  :mod:`libbroker.sandbox.landlock_helper` and the broker's door);
- :mod:`.doctor`, :mod:`.settings`: ``doctor`` and ``render-settings``.
"""
