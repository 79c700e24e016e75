"""Which home paths a config's ``read``/``write`` grant may not cover (pure).

A session's home is a private one; the real home is hidden.  A grant in the
config reopens part of it, and some parts must stay shut, because what the
session leaves there runs on the host later, or because what is there is a
credential:

- ``write`` may not cover a place the host runs from or reads commands out of:
  an agent's real config (an MCP server or hook planted in ``~/.codex`` runs
  at the person's next plain ``codex``), shell start files, git's and ssh's
  config, editors' config, ``~/.local/bin``, autostart and systemd units,
  package managers' config, agent-sandbox's own config and state;
- ``read`` may not cover a credential: the agents' login files (their config
  directories hold them), ssh and gpg keys, gh's, cloud CLIs' and docker's
  logins, ``.netrc``, git's credential store.

"Covers" means the grant is the path, a directory above it, or a path inside
it.  The person may accept one grant anyway by naming it in
``unsafe_grants``; the refusal says so.  The caller resolves links on the
host (a grant of a link to home covers home) and passes both spellings.
"""

from __future__ import annotations

from libbroker.named_tuple import NamedTuple


class Shut(NamedTuple):
    """A home path (relative to home) a grant may not cover, and why."""

    rel: str
    what: str  # what it is, for the message
    why: str  # what happens if the session may write (or read) it


_AGENT_RUNS = "a hook or MCP server planted there runs at its next start on the host"
_SHELL = "a line planted there runs in your next shell"
_RUNS = "what the session plants there runs on the host later"

# Places whose content the host runs (refused for write).
WRITE_SHUT: tuple[Shut, ...] = (
    Shut(".claude", "Claude Code's config directory", _AGENT_RUNS),
    Shut(".claude.json", "Claude Code's settings file", _AGENT_RUNS),
    Shut(".codex", "Codex's config directory", _AGENT_RUNS),
    Shut(".gemini", "Gemini CLI's config directory", _AGENT_RUNS),
    Shut(".bashrc", "a shell start file", _SHELL),
    Shut(".bash_profile", "a shell start file", _SHELL),
    Shut(".bash_login", "a shell start file", _SHELL),
    Shut(".bash_logout", "a shell start file", _SHELL),
    Shut(".profile", "a shell start file", _SHELL),
    Shut(".zshrc", "a shell start file", _SHELL),
    Shut(".zshenv", "a shell start file", _SHELL),
    Shut(".zprofile", "a shell start file", _SHELL),
    Shut(".zlogin", "a shell start file", _SHELL),
    Shut(".config/fish", "a shell's config", _SHELL),
    Shut(".inputrc", "readline's config", _SHELL),
    Shut(".gitconfig", "git's global config", "a hook path, alias or fsmonitor planted there "
         "runs at your next git command"),
    Shut(".config/git", "git's global config", "a hook path, alias or fsmonitor planted there "
         "runs at your next git command"),
    Shut(".ssh", "ssh's keys and config", "a ProxyCommand or key planted there is used by "
         "your next ssh"),
    Shut(".gnupg", "gpg's keys and config", _RUNS),
    Shut(".config/gh", "gh's login and config", "an alias planted there runs at your next gh"),
    Shut(".local/bin", "a directory on your PATH", "a program planted there shadows a command"),
    Shut("bin", "a directory on your PATH", "a program planted there shadows a command"),
    Shut(".config/autostart", "desktop autostart entries", _RUNS),
    Shut(".config/systemd", "your systemd user units", _RUNS),
    Shut(".config/environment.d", "your session's environment", _RUNS),
    Shut(".pam_environment", "your session's environment", _RUNS),
    Shut(".vimrc", "vim's config", "a command planted there runs in your next vim"),
    Shut(".vim", "vim's config", "a command planted there runs in your next vim"),
    Shut(".config/nvim", "neovim's config", "a command planted there runs in your next nvim"),
    Shut(".emacs", "emacs' config", _RUNS),
    Shut(".emacs.d", "emacs' config", _RUNS),
    Shut(".config/Code", "VS Code's user settings and tasks", _RUNS),
    Shut(".vscode", "VS Code's extensions", _RUNS),
    Shut(".npmrc", "npm's config", "a script-shell or registry planted there is used by your "
         "next npm"),
    Shut(".config/pip", "pip's config", "an index planted there feeds your next pip install"),
    Shut(".cargo", "cargo's config and binaries", _RUNS),
    Shut(".config/agent-sandbox", "agent-sandbox's own config", "the next session would run "
         "under the policy the session wrote"),
    Shut(".local/state/agent-sandbox", "agent-sandbox's quarantine", "the originals the guard "
         "saved could be changed"),
)

_CREDENTIAL = "it holds a credential the sandbox must never see"

# Places that hold credentials (refused for read as well as write).
READ_SHUT: tuple[Shut, ...] = (
    Shut(".claude", "Claude Code's config directory (its login)", _CREDENTIAL),
    Shut(".claude.json", "Claude Code's settings file (its account)", _CREDENTIAL),
    Shut(".codex", "Codex's config directory (its login, auth.json)", _CREDENTIAL),
    Shut(".gemini", "Gemini CLI's config directory (its login, oauth_creds.json)", _CREDENTIAL),
    Shut(".ssh", "ssh's keys", _CREDENTIAL),
    Shut(".gnupg", "gpg's keys", _CREDENTIAL),
    Shut(".config/gh", "gh's login", _CREDENTIAL),
    Shut(".netrc", "a .netrc", _CREDENTIAL),
    Shut(".git-credentials", "git's credential store", _CREDENTIAL),
    Shut(".aws", "the AWS CLI's credentials", _CREDENTIAL),
    Shut(".config/gcloud", "the gcloud CLI's credentials", _CREDENTIAL),
    Shut(".azure", "the Azure CLI's credentials", _CREDENTIAL),
    Shut(".docker", "docker's logins", _CREDENTIAL),
    Shut(".kube", "kubectl's credentials (use kubeconfig = ... instead)", _CREDENTIAL),
)


def _contains(outer: str, inner: str) -> bool:
    """Whether ``inner`` is ``outer`` or lies below it (absolute, normalised paths)."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _covers(grant: str, path: str) -> bool:
    """Whether a grant of ``grant`` reaches ``path``: the same, above it, or inside it."""
    return _contains(grant, path) or _contains(path, grant)


def refusal(kind: str, grant: str, spellings: tuple[str, ...], home: str,
            shut_paths: dict[str, tuple[str, ...]]) -> str | None:
    """Why granting ``grant`` (``kind``: "read" or "write") is refused, or None.

    ``spellings`` are the grant's absolute paths (as written, and with links
    resolved); ``shut_paths`` maps each :class:`Shut` ``rel`` to its absolute
    spellings (under ``home``, and with links resolved).  A home directory
    itself (or ``/``) covers everything and is refused with its own reason.
    """
    table = WRITE_SHUT if kind == "write" else READ_SHUT
    for spelling in spellings:
        if _contains(spelling, home):
            return (f"{grant} holds your whole home directory, every credential and start "
                    "file in it")
    for shut in table:
        for spelling in spellings:
            for path in shut_paths.get(shut.rel, (f"{home}/{shut.rel}",)):
                if _covers(spelling, path):
                    named = "" if grant == f"~/{shut.rel}" else f" (~/{shut.rel})"
                    return f"{grant} covers {shut.what}{named}: {shut.why}"
    return None


def every_rel() -> tuple[str, ...]:
    """Every home path either table names (for the caller to resolve once)."""
    return tuple(dict.fromkeys(s.rel for s in (*WRITE_SHUT, *READ_SHUT)))
