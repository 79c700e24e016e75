"""Agent profiles, as data: what each coding agent needs from a session.

One table (:data:`PROFILES`, plus ``[agents.NAME]`` tables in the config)
says, for every agent the launcher knows:

- which of the user's config dirs and files it needs, and where their
  private copy lives inside the session's agent home (:mod:`.agent_home`),
  with the variable that points the agent at that copy;
- which config keys make the agent run commands on the host (hooks, MCP
  servers, ``notify``, status lines, key helpers, plugins): never written
  back from a session unless the user opts a key in;
- what does come back: logins, transcripts, history, sessions;
- its API and login hosts (added to the session's allow list), the variable
  that holds its key and the header that carries it;
- how it runs inside our sandbox without nesting its own.

Each known agent is a small class (:class:`ClaudeCode`, :class:`Codex`,
:class:`Gemini`) whose hooks say what it does differently: the name it gives
the workdir's entry, its sandbox flags translated, its settings rewritten for
the session, Claude Code's managed settings; a :class:`Profile` of a config's
table has none of them.

Pure: no I/O.  The profile is picked from the command's basename
(``agent-sandbox run -- codex``) unless ``--agent=NAME`` says otherwise.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from libbroker.errors import ConfigError, UsageError
from libbroker.launcher import agent_argv
from libbroker.launcher.agent_argv import Argv
from libbroker.launcher.agent_settings import claude_settings, codex_config, gemini_settings
from libbroker.named_tuple import NamedTuple

WHOLE, APPEND, JSON = "whole", "append", "json"


class Entry(NamedTuple):
    """One of the user's config paths and where its copy lives in the agent home."""

    host: str  # "~/.claude": ~ is the user's home
    copy: str  # relative to the agent home
    is_dir: bool


class Rule(NamedTuple):
    """What comes back from the session's copy: a pattern and how.

    ``pattern`` is relative to the agent home, ``/``-separated, with
    fnmatch segments and ``**`` for any depth.  ``whole``: a new or changed
    regular file replaces the host's; ``append``: bytes added after the
    copied length are appended to the host's file (history logs); ``json``:
    only the ``keep`` keys (dotted, ``*`` segments) are taken from the
    session's object, everything else stays as the host has it.
    """

    pattern: str
    mode: str
    keep: tuple[str, ...] = ()


class SettingsEdit(NamedTuple):
    """How a session rewrites the copy of an agent's settings file (never written back)."""

    rel: str  # the file, relative to the agent home
    json: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None  # a JSON object's edit
    text: Callable[[str], str] | None = None  # else the text's ("" when the file is absent)


class Profile(NamedTuple):
    """An agent's table; its methods are the hooks an agent class overrides."""

    name: str
    commands: tuple[str, ...]  # basenames that pick this profile
    entries: tuple[Entry, ...]
    home_env: tuple[tuple[str, str], ...]  # (variable, path relative to the agent home)
    rules: tuple[Rule, ...]
    command_keys: tuple[str, ...]  # "file:key" that run commands on the host
    domains: tuple[str, ...]
    key_env: tuple[str, ...]  # variables that carry an API key
    skip: tuple[str, ...] = ()  # patterns not copied in (bulky, or regenerated)
    per_workdir: tuple[str, ...] = ()  # dirs copied in only for the workdir's entry
    env: tuple[tuple[str, str], ...] = ()  # fixed variables for a session
    sandbox_note: str = ""

    def workdir_key(self, workdir: str, host_projects: Mapping[str, Any]) -> str:
        """The name the agent gives the workdir's entry in its per-project dirs ("": none)."""
        return ""

    def session_argv(self, cmd: list[str]) -> Argv:
        """``cmd`` (the agent itself) with its own sandbox flags translated."""
        return Argv(cmd)

    def session_settings(self, claude_session: Mapping[str, Any] | None) -> SettingsEdit | None:
        """How the session rewrites the agent's settings so it works inside our sandbox."""
        return None

    def reads_managed_settings(self) -> bool:
        """Whether a machine-wide managed settings file rules the agent (Claude Code's)."""
        return False


class ClaudeCode(Profile):
    """Claude Code: per-project dirs named after the path; managed settings over the user's."""

    __slots__ = ()

    def workdir_key(self, workdir: str, host_projects: Mapping[str, Any]) -> str:
        return re.sub(r"[^A-Za-z0-9]", "-", workdir)

    def session_settings(self, claude_session: Mapping[str, Any] | None) -> SettingsEdit | None:
        if claude_session is None:
            return None
        return SettingsEdit("claude/settings.json",
                            json=functools.partial(claude_settings, session=claude_session))

    def reads_managed_settings(self) -> bool:
        return True


class Codex(Profile):
    """Codex: its sandbox flags translated, ``sandbox_mode`` pinned in its config.toml."""

    __slots__ = ()

    def session_argv(self, cmd: list[str]) -> Argv:
        return agent_argv.codex(cmd)

    def session_settings(self, claude_session: Mapping[str, Any] | None) -> SettingsEdit | None:
        # config.toml never comes back: no writer of TOML needed.
        return SettingsEdit("codex/config.toml", text=codex_config)


class Gemini(Profile):
    """Gemini CLI: per-project dirs as its projects.json names them; its sandbox off."""

    __slots__ = ()

    def workdir_key(self, workdir: str, host_projects: Mapping[str, Any]) -> str:
        found = host_projects.get(workdir)
        return found if isinstance(found, str) else ""

    def session_argv(self, cmd: list[str]) -> Argv:
        return agent_argv.gemini(cmd)

    def session_settings(self, claude_session: Mapping[str, Any] | None) -> SettingsEdit | None:
        return SettingsEdit("home/.gemini/settings.json", json=gemini_settings)


# Claude Code: CLAUDE_CONFIG_DIR moves ~/.claude, and ~/.claude.json with it
# (to $CLAUDE_CONFIG_DIR/.claude.json), so one variable covers both.
CLAUDE = ClaudeCode(
    name="claude",
    commands=("claude",),
    entries=(
        Entry("~/.claude", "claude", True),
        Entry("~/.claude.json", "claude/.claude.json", False),
    ),
    home_env=(("CLAUDE_CONFIG_DIR", "claude"),),
    rules=(
        Rule("claude/.credentials.json", WHOLE),
        Rule("claude/history.jsonl", APPEND),
        Rule("claude/projects/**", WHOLE),
        Rule("claude/todos/**", WHOLE),
        # Login and usage state only.  projects.<dir> also holds local MCP
        # servers, allowed tools and the trust and .mcp.json approvals:
        # none of those come back.
        Rule(
            "claude/.claude.json",
            JSON,
            (
                "oauthAccount",
                "userID",
                "hasCompletedOnboarding",
                "lastOnboardingVersion",
                "numStartups",
                "firstStartTime",
                "tipsHistory",
                "projects.*.lastSessionId",
            ),
        ),
        Rule("claude/settings.json", JSON),  # settings: only what the user opts in
    ),
    command_keys=(
        ".claude.json:mcpServers",
        ".claude.json:projects.*.mcpServers",
        ".claude.json:projects.*.enabledMcpjsonServers",
        ".claude.json:projects.*.enableAllProjectMcpServers",
        ".claude.json:projects.*.hasTrustDialogAccepted",
        ".claude.json:projects.*.allowedTools",
        "settings.json:hooks",
        "settings.json:statusLine",
        "settings.json:apiKeyHelper",
        "settings.json:awsAuthRefresh",
        "settings.json:awsCredentialExport",
        "settings.json:otelHeadersHelper",
        "settings.json:permissions",
        "settings.json:env",
        "settings.json:enabledPlugins",
        "settings.json:extraKnownMarketplaces",
        "settings.json:enableAllProjectMcpServers",
        "settings.json:fileSuggestion",
        "plugins/",
        "commands/",
        "agents/",
        "shell-snapshots/",
    ),
    domains=("api.anthropic.com", "platform.claude.com", "console.anthropic.com"),
    key_env=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"),
    skip=(
        "claude/shell-snapshots",
        "claude/debug",
        "claude/statsig",
        "claude/telemetry",
        "claude/file-history",
        "claude/backups",
        "claude/todos",
    ),
    per_workdir=("claude/projects",),
    sandbox_note="its own sandbox (sandbox.enabled) is off in the session's settings",
)

CODEX = Codex(
    name="codex",
    commands=("codex",),
    entries=(Entry("~/.codex", "codex", True),),
    home_env=(("CODEX_HOME", "codex"),),
    rules=(
        Rule("codex/auth.json", WHOLE),
        Rule("codex/history.jsonl", APPEND),
        Rule("codex/sessions/**", WHOLE),
        Rule("codex/archived_sessions/**", WHOLE),
    ),
    # config.toml is never written back (so no TOML writer is needed):
    # all of these live there.
    command_keys=(
        "config.toml:mcp_servers",
        "config.toml:notify",
        "config.toml:profiles",
        "config.toml:model_providers",
        "config.toml:shell_environment_policy",
        "config.toml:sandbox_mode",
        "config.toml:approval_policy",
        "config.toml:projects",
        "rules/",
        "skills/",
        "shell_snapshots/",
    ),
    domains=("api.openai.com", "auth.openai.com", "chatgpt.com"),
    key_env=("OPENAI_API_KEY", "CODEX_API_KEY"),
    # tmp/ (arg0 links to its own binary), log/: left out by rule (agent_copy).
    skip=("codex/logs_*.sqlite*", "codex/shell_snapshots"),
    sandbox_note="runs with sandbox_mode=danger-full-access (no nested bwrap/Landlock)",
)

GEMINI = Gemini(
    name="gemini",
    commands=("gemini",),
    entries=(Entry("~/.gemini", "home/.gemini", True),),
    # GEMINI_CLI_HOME stands in for the home directory: the CLI reads
    # $GEMINI_CLI_HOME/.gemini.
    home_env=(("GEMINI_CLI_HOME", "home"),),
    rules=(
        Rule("home/.gemini/oauth_creds.json", WHOLE),
        Rule("home/.gemini/google_accounts.json", WHOLE),
        Rule("home/.gemini/tmp/*/chats/**", WHOLE),
        Rule("home/.gemini/tmp/*/logs.json", WHOLE),
        Rule("home/.gemini/projects.json", JSON, ("projects",)),
        Rule("home/.gemini/settings.json", JSON),  # settings: only what the user opts in
    ),
    command_keys=(
        "settings.json:mcpServers",
        "settings.json:hooks",
        "settings.json:tools.discoveryCommand",
        "settings.json:tools.callCommand",
        "settings.json:tools.sandbox",
        "settings.json:security",
        "settings.json:advanced.bugCommand",
        "trustedFolders.json",
        "extensions/",
        "commands/",
        "history/ (checkpoint git repositories)",
    ),
    domains=(
        "generativelanguage.googleapis.com",
        "oauth2.googleapis.com",
        "cloudcode-pa.googleapis.com",
        "www.googleapis.com",
    ),
    key_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    skip=("home/.gemini/history",),
    per_workdir=("home/.gemini/tmp",),
    # Its whole-process sandbox (docker/podman/sandbox-exec) is off whatever
    # the settings or -s say; tool sandboxing is off in the session's settings.
    env=(("GEMINI_SANDBOX", "false"),),
    sandbox_note="its own sandbox (GEMINI_SANDBOX, security.toolSandboxing) is off",
)

PROFILES: dict[str, Profile] = {p.name: p for p in (CLAUDE, CODEX, GEMINI)}
NONE = "none"  # --agent=none: no profile, even for a known command


def pick(cmd: Sequence[str], name: str, extra: Mapping[str, Profile]) -> Profile | None:
    """The profile for ``cmd``: ``name`` when given, else by the command's basename."""
    known = {**PROFILES, **extra}
    if name == NONE:
        return None
    if name:
        if name not in known:
            raise UsageError(f"--agent: unknown agent {name!r} (known: {', '.join(sorted(known))})")
        return known[name]
    base = os.path.basename(cmd[0]) if cmd else ""
    return next((p for p in known.values() if base in p.commands), None)


def match(pattern: str, rel: str) -> bool:
    """``rel`` (a relative path) against ``pattern`` (fnmatch segments, ``**``)."""
    from fnmatch import fnmatchcase

    want = pattern.split("/")
    have = rel.split("/")
    for i, seg in enumerate(want):
        if seg == "**":
            return len(have) > i
        if i >= len(have) or not fnmatchcase(have[i], seg):
            return False
    return len(have) == len(want)


def rule_for(profile: Profile, rel: str) -> Rule | None:
    """The write-back rule for ``rel`` in the agent home; None: it stays in the session."""
    if any(part in (".git", "..") for part in rel.split("/")):
        return None  # never a git repository's files (hooks, config)
    return next((r for r in profile.rules if match(r.pattern, rel)), None)


def host_path(profile: Profile, home: str, rel: str) -> str | None:
    """Where ``rel`` (in the agent home) lives on the host."""
    best: Entry | None = None
    for entry in profile.entries:
        if (rel == entry.copy or rel.startswith(entry.copy + "/")) and (
            best is None or len(entry.copy) > len(best.copy)
        ):
            best = entry
    if best is None:
        return None
    base = home + best.host[1:] if best.host.startswith("~") else best.host
    return base + rel[len(best.copy) :]


def opted_keys(profile: Profile, write_back: Sequence[str]) -> tuple[str, ...]:
    """The keys the config's ``agent_write_back`` opts in for this agent."""
    out = []
    for item in write_back:
        name, _, key = item.partition(":")
        if name == profile.name:
            out.append(key)
    return tuple(out)


def check_write_back(items: Sequence[str], extra: Mapping[str, Profile], source: str) -> None:
    known = {**PROFILES, **extra}
    for item in items:
        name, sep, key = item.partition(":")
        if not sep or not key or name not in known:
            raise ConfigError(
                f"{source}: entry {item!r} must be AGENT:KEY "
                f"(agents: {', '.join(sorted(known))})"
            )
        if not any(r.mode == JSON for r in known[name].rules):
            raise ConfigError(
                f"{source}: entry {item!r}: {name} keeps its settings in a file "
                "that is never written back"
            )


def rules_with(profile: Profile, opted: Sequence[str]) -> Profile:
    """``profile`` with the opted-in keys added to each of its JSON rules."""
    if not opted:
        return profile
    rules = tuple(
        r._replace(keep=(*r.keep, *opted)) if r.mode == JSON else r for r in profile.rules
    )
    return profile._replace(rules=rules)


def from_config(name: str, table: Mapping[str, Any], source: str) -> Profile:
    """A profile from a config's ``[agents.NAME]`` table.

    Keys: ``commands`` (basenames), ``config`` (the dirs and files it
    needs, ``~/`` paths), ``home_env`` (a variable pointed at the copy of the
    first config dir), ``domains``, ``write_back`` (patterns under those
    paths, as ``.mydir/sessions/**``, copied back whole), ``key_env``.
    """
    allowed = {"commands", "config", "home_env", "domains", "write_back", "key_env"}
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{source}: unknown key {key!r}")

    def strings(key: str) -> tuple[str, ...]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{source}: {key} must be a list of strings")
        return tuple(value)

    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name) or name in (*PROFILES, NONE):
        raise ConfigError(f"{source}: {name!r} is not a usable agent name")
    entries = []
    for path in strings("config"):
        if not path.startswith("~/") or ".." in path.split("/"):
            raise ConfigError(f"{source}: config path {path!r} must start with ~/")
        rel = path[2:].rstrip("/")
        entries.append(Entry("~/" + rel, rel, not path.endswith((".json", ".toml", ".yaml"))))
    home_env = table.get("home_env", "")
    if not isinstance(home_env, str) or (home_env and not entries):
        raise ConfigError(f"{source}: home_env needs a config dir to point at")
    rules = tuple(Rule(p.removeprefix("~/"), WHOLE) for p in strings("write_back"))
    return Profile(
        name=name,
        commands=strings("commands") or (name,),
        entries=tuple(entries),
        home_env=((home_env, entries[0].copy),) if home_env else (),
        rules=rules,
        command_keys=(),
        domains=strings("domains"),
        key_env=strings("key_env"),
    )
