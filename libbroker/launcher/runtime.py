"""The names of what lives in a session's runtime directory (pure: :mod:`.runtime_dir` makes it).

One directory per session, mode 0700, under ``$XDG_RUNTIME_DIR/agent-sandbox``
when the user has a runtime directory (tmpfs, per-user, cleared at logout) or a
private ``mkdtemp`` otherwise; never inside the workdir when it can be helped
(a session run from /tmp gets one in /var/tmp: the host-run guard would take
its files for the agent's).  The sandbox sees it read-only at the same path:
the broker socket, the relay sockets and the egress directory must be
reachable from inside, nothing in it may be changed from inside.

Beside it, ``<root>.host`` (0700 too) holds what only the host may read:
egress-proxy's ``--secrets`` file (which commands print which secret).  No
sandbox is given that directory, on either backend, so nothing inside can
read it, while the runtime directory itself is readable there.
"""

from __future__ import annotations

import os

from libbroker.named_tuple import NamedTuple


class Runtime(NamedTuple):
    """Paths of one session's runtime directory."""

    root: str

    @property
    def broker_socket(self) -> str:
        return os.path.join(self.root, "broker.sock")

    @property
    def egress_dir(self) -> str:
        return os.path.join(self.root, "egress")

    @property
    def policy(self) -> str:
        return os.path.join(self.root, "policy.json")

    @property
    def host_only(self) -> str:
        """The session's directory the sandbox is never given (beside the runtime dir)."""
        return self.root + ".host"

    @property
    def secrets(self) -> str:
        """egress-proxy's --secrets file (0600), host-only: commands and headers, never a value."""
        return os.path.join(self.host_only, "secrets.json")

    @property
    def profile(self) -> str:
        return os.path.join(self.root, "profile.json")

    @property
    def kubeconfig(self) -> str:
        return os.path.join(self.root, "kubeconfig")

    @property
    def gpg_program(self) -> str:
        """git's gpg.program in the session: gpg-shim's native fast path, else the script."""
        return os.path.join(self.root, "gpg-shim")

    @property
    def ca_bundle(self) -> str:
        return os.path.join(self.egress_dir, "bundle.pem")

    @property
    def gh_config(self) -> str:
        return os.path.join(self.egress_dir, "gh")
