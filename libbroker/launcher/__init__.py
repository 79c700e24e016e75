"""The launcher: one sandboxed agent session (``agent-sandbox run``).

It composes the other executables (egress-proxy, broker-server,
kubeconfig-proxify) through subprocesses and pipes only, and runs the agent's
command in a bwrap or Landlock sandbox whose only way out is the proxy.

Modules: :mod:`.config` (TOML), :mod:`.runtime` (the session directory),
:mod:`.supervise` (children: start, listening lines, ordered stop, janitor),
:mod:`.agent_sandbox` (bwrap argv, Landlock spec, environment),
:mod:`.forwarder` (in-sandbox, stdlib only), :mod:`.relay` (host side),
:mod:`.session` (``run``), :mod:`.doctor`, :mod:`.settings`.
"""
