"""The project's one error hierarchy.

Every error a user can meet is a subclass of :class:`AgentSandboxError` and is
declared here, once, with a one-line docstring.  The command-line shells
(:mod:`libbroker.cli`) turn these into a one-line message on stderr and the
class's ``exit_code``; anything else escaping a ``main`` is a bug, reported
as such without a traceback.

This module imports nothing but the standard library on purpose: the
per-call executables (broker-client, policy-hook, gpg-shim) import it.
"""

from __future__ import annotations


class AgentSandboxError(Exception):
    """Base of every error this project reports to a user."""

    exit_code: int = 1


class UsageError(AgentSandboxError):
    """The command line or a configuration value is not acceptable."""

    exit_code = 2


class ConfigError(AgentSandboxError):
    """A configuration, profile or policy file is missing or invalid."""


# --- broker -----------------------------------------------------------------


class ProtocolError(AgentSandboxError):
    """A peer sent bytes that do not follow the broker wire format."""


class RequestRefused(AgentSandboxError):
    """A well-formed request that policy refuses (bad field, cwd outside workdir, ...)."""


class BrokerUnavailable(AgentSandboxError):
    """The broker socket could not be reached."""

    exit_code = 125


class SandboxUnavailable(AgentSandboxError):
    """No sandbox backend works on this machine, or the chosen one does not."""


class SpawnError(AgentSandboxError):
    """A command could not be started inside its sandbox."""


class BuildError(AgentSandboxError):
    """A native helper could not be compiled (no C compiler, or it failed)."""


class SocketInUse(AgentSandboxError):
    """A live server already listens on the socket path; it is not stolen."""


# --- policy -----------------------------------------------------------------


class PolicyError(ConfigError):
    """The file-tool policy is invalid or unreadable."""


class HookInputError(AgentSandboxError):
    """The PreToolUse input on stdin is unusable."""

    exit_code = 2


# --- egress -----------------------------------------------------------------


class EgressError(AgentSandboxError):
    """The egress proxy could not be set up as asked."""


class TokenError(EgressError):
    """The token command failed, timed out, or printed no token."""


class KubeconfigError(AgentSandboxError):
    """A kubeconfig cannot be parsed or proxified."""


# --- launcher ---------------------------------------------------------------


class LaunchError(AgentSandboxError):
    """A session could not be started (a child failed to come up, ...)."""
