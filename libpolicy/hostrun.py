"""Host-run files: what in a workdir runs later on the host, unasked, as the user.

One list, as data.  git runs a repository's hooks and takes commands from its
config; Claude Code, Gemini CLI and Codex start the hooks and MCP servers their
project files name; editors run tasks from ``.vscode/`` and ``.idea/``; direnv
and shells source ``.envrc`` and rc files.  A sandboxed session can write its
workdir, so these are the files through which it could plant something that
runs after it has ended.  Three consumers use this one list:

- policy-hook denies the file tools' writes to every entry (:func:`match`),
- the launcher's guard (``libbroker.launcher.hostrun_guard``) fingerprints
  every entry at session start and restores it at the end,
- the bwrap backend holds the existing entries read-only during the session.

Entries apply at every depth: a nested repository or a project in a
subdirectory runs its files as soon as the person works there.

- ``git`` entries are relative to a git directory (``.git``, and every
  ``.git/modules/**`` and ``.git/worktrees/*`` inside it);
- ``tree`` entries match a path's tail at any depth;
- ``home`` entries only relative to the home directory (the agents' own config
  there: Claude Code starts ``~/.claude.json``'s MCP servers and plugins).

A trailing ``/`` marks a directory: it and everything beneath it.  A
component may start with ``*`` (a suffix: ``*.code-workspace`` is every name
ending in ``.code-workspace``, that name itself included); no other glob.

Pure: strings in, entries out; no file is looked at.  The hook imports this on
every file-tool call, so it imports nothing.
"""

from __future__ import annotations


class Entry:
    """One kind of host-run file (a plain class: typing costs the hook ms to import).

    - ``rule``: the id named in denials, sweep lines and ``hostrun_allow``;
    - ``pattern``: components joined by "/"; a trailing "/" marks a directory;
    - ``kind``: "git" (inside every git dir), "tree" (any depth), "home";
    - ``reason``: one line, what runs it.
    """

    __slots__ = ("is_dir", "kind", "parts", "pattern", "reason", "rule", "suffix")

    def __init__(self, rule: str, pattern: str, kind: str, reason: str) -> None:
        self.rule = rule
        self.pattern = pattern
        self.kind = kind
        self.reason = reason
        self.is_dir = pattern.endswith("/")
        self.parts = tuple(pattern.rstrip("/").split("/"))
        # the last component's suffix when it is a glob ("*.code-workspace"), else ""
        self.suffix = self.parts[-1][1:] if self.parts[-1].startswith("*") else ""

    def matches(self, tail: tuple[str, ...] | list[str]) -> bool:
        """Whether the path components ``tail`` are this entry (or lie in it, a directory)."""
        want = self.parts
        n = len(want)
        if len(tail) < n or (len(tail) > n and not self.is_dir):
            return False
        for i in range(n):
            part = want[i]
            if part != tail[i] and not (part[:1] == "*" and tail[i].endswith(part[1:])):
                return False
        return True

    def __repr__(self) -> str:
        return f"Entry({self.rule!r}, {self.pattern!r}, {self.kind!r})"


_GIT_WHY = "git on the host runs"
ENTRIES: tuple[Entry, ...] = (
    # --- git, inside every git directory (and its modules/ and worktrees/) ---
    Entry("git-hooks", "hooks/", "git", f"{_GIT_WHY} these at commit, merge, checkout and push"),
    Entry("git-config", "config", "git",
          f"{_GIT_WHY} the commands it names (core.hooksPath, core.fsmonitor, "
          "core.pager, filters, ! aliases, credential helpers, includes)"),
    Entry("git-config-worktree", "config.worktree", "git",
          "git reads it like config when extensions.worktreeConfig is set"),
    Entry("git-commondir", "commondir", "git",
          "git takes hooks and config from the directory it names"),
    # --- the repository itself ---
    Entry("git-dir", ".git", "tree",
          "the repository: renamed, replaced or turned into a 'gitdir:' file, "
          "git would take hooks and config from somewhere else"),
    Entry("gitmodules", ".gitmodules", "tree",
          "git clones and updates the submodules it names"),
    # --- the agents' project files ---
    Entry("claude-settings", ".claude/settings.json", "tree",
          "Claude Code runs the hooks and loads the MCP servers it lists"),
    Entry("claude-settings-local", ".claude/settings.local.json", "tree",
          "Claude Code runs the hooks and loads the MCP servers it lists"),
    Entry("claude-commands", ".claude/commands/", "tree",
          "Claude Code's slash commands, which may run shell commands"),
    Entry("claude-agents", ".claude/agents/", "tree",
          "Claude Code's subagents, with their own tools and prompts"),
    Entry("mcp", ".mcp.json", "tree", "Claude Code starts the MCP servers it lists"),
    Entry("gemini-settings", ".gemini/settings.json", "tree",
          "Gemini CLI starts the MCP servers and tools it lists"),
    Entry("codex-config", ".codex/config.toml", "tree",
          "Codex starts the MCP servers and commands it lists"),
    Entry("gemini-commands", ".gemini/commands/", "tree",
          "Gemini CLI's custom commands, whose !{...} run shell commands"),
    Entry("cursor-mcp", ".cursor/mcp.json", "tree", "Cursor starts the MCP servers it lists"),
    # --- editors ---
    Entry("vscode", ".vscode/", "tree",
          "VS Code runs its tasks and launch configurations, and extensions read it"),
    Entry("idea", ".idea/", "tree", "JetBrains IDEs run its run configurations and tools"),
    Entry("devcontainer", ".devcontainer/", "tree",
          "VS Code and the devcontainer CLI run its initializeCommand on the host"),
    Entry("devcontainer-json", ".devcontainer.json", "tree",
          "VS Code and the devcontainer CLI run its initializeCommand on the host"),
    Entry("code-workspace", "*.code-workspace", "tree",
          "VS Code runs its tasks (runOn folderOpen) and applies its settings when opened"),
    Entry("zed", ".zed/", "tree", "Zed runs its tasks and the language servers it names"),
    Entry("exrc", ".exrc", "tree", "vim and neovim source it with 'exrc' set"),
    Entry("nvimrc", ".nvimrc", "tree", "neovim sources it with 'exrc' set"),
    Entry("nvim-lua", ".nvim.lua", "tree", "neovim sources it with 'exrc' set"),
    # --- git hook managers: the hook installed in .git/hooks runs what these name ---
    Entry("pre-commit-config", ".pre-commit-config.yaml", "tree",
          "pre-commit's git hook runs the hooks it names, at the host's git commit"),
    Entry("lefthook", "lefthook.yml", "tree",
          "lefthook's git hook runs the commands it names, at the host's git commit"),
    Entry("lefthook-dot", ".lefthook.yml", "tree",
          "lefthook's git hook runs the commands it names, at the host's git commit"),
    # --- shell and environment ---
    Entry("envrc", ".envrc", "tree", "direnv runs it when a shell enters the directory"),
    Entry("bashrc", ".bashrc", "tree", "bash runs it at start"),
    Entry("bash-profile", ".bash_profile", "tree", "bash runs it at a login start"),
    Entry("zshrc", ".zshrc", "tree", "zsh runs it at start"),
    Entry("zprofile", ".zprofile", "tree", "zsh runs it at a login start"),
    Entry("profile", ".profile", "tree", "sh and bash run it at a login start"),
    Entry("ripgreprc", ".ripgreprc", "tree", "ripgrep takes options from it (--pre runs commands)"),
    Entry("gitconfig", ".gitconfig", "tree",
          f"{_GIT_WHY} the commands it names when it is someone's global config"),
    # --- the agents' config in home ---
    Entry("claude-json", ".claude.json", "home", "Claude Code starts the MCP servers it lists"),
    Entry("claude-plugins", ".claude/plugins/", "home",
          "Claude Code loads plugins' hooks, commands and MCP servers"),
)

RULES = frozenset(e.rule for e in ENTRIES)
# The git directories inside a git directory that are git directories themselves.
NESTED_GIT = ("modules", "worktrees")


class HostRunError(ValueError):
    """A user's addition or opt-out that cannot be used; the message says why."""


def check_pattern(value: str, key: str) -> str:
    """``value`` as a relative pattern: clean components, no ``..``, optional trailing ``/``."""
    body = value[:-1] if value.endswith("/") else value
    parts = body.split("/")
    if not body or value.startswith("/") or "\x00" in value or any(
        p in ("", ".", "..", "*") or "*" in p[1:] or "?" in p or "[" in p for p in parts
    ):
        raise HostRunError(
            f"{key} entry {value!r} must be a relative path of plain names "
            "(no leading '/', no '.' or '..'; a trailing '/' marks a directory; "
            "a name may start with '*' for a suffix, as in '*.code-workspace')"
        )
    return value


class Table:
    """The list in effect: the built-in entries, the user's additions, minus opt-outs.

    ``add``: patterns matched like the ``tree`` entries (``.husky/``,
    ``*.just``).  ``allow``: a rule id or a built-in pattern turns that entry off
    everywhere; any other relative path turns off matches at or beneath that
    one place (relative to ``root``, the workdir).
    """

    def __init__(self, add: tuple[str, ...] = (), allow: tuple[str, ...] = (),
                 root: str = "") -> None:
        self.add = tuple(check_pattern(a, "hostrun_add") for a in add)
        self.allow = tuple(check_pattern(a, "hostrun_allow") for a in allow)
        self.root = root.rstrip("/") if root != "/" else ""
        off = {a for a in self.allow if a in RULES}
        off |= {e.rule for e in ENTRIES if e.pattern in self.allow}
        self.entries = tuple(e for e in ENTRIES if e.rule not in off) + tuple(
            Entry("user:" + a, a, "tree", "named in hostrun_add") for a in self.add
        )
        patterns = {e.pattern for e in ENTRIES}
        self.allowed_paths = tuple(
            a.rstrip("/") for a in self.allow if a not in RULES and a not in patterns
        )
        self.git = tuple(e for e in self.entries if e.kind == "git")
        self.tree = tuple(e for e in self.entries if e.kind == "tree")
        self.home = tuple(e for e in self.entries if e.kind == "home")
        # A name that can start a tree entry: the walkers test every name against it,
        # and against the suffixes of the entries whose first component is a glob.
        self.first_names = frozenset(e.parts[0] for e in self.tree if e.parts[0][:1] != "*")
        self.first_suffixes = tuple(e.parts[0][1:] for e in self.tree if e.parts[0][:1] == "*")

    def to_dict(self) -> dict[str, object]:
        return {"add": list(self.add), "allow": list(self.allow), "root": self.root}

    @classmethod
    def from_dict(cls, data: object) -> Table:
        if not isinstance(data, dict) or set(data) - {"add", "allow", "root"}:
            raise HostRunError("hostrun must be an object of 'add', 'allow' and 'root'")
        add, allow, root = data.get("add", []), data.get("allow", []), data.get("root", "")
        for key, value in (("add", add), ("allow", allow)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise HostRunError(f"hostrun {key!r} must be a list of strings")
        if not isinstance(root, str) or (root and not root.startswith("/")):
            raise HostRunError("hostrun 'root' must be an absolute path")
        return cls(tuple(add), tuple(allow), root)

    def _opted_out(self, rel: str) -> bool:
        return any(rel == a or rel.startswith(a + "/") for a in self.allowed_paths)

    def match(self, relpath: str) -> Entry | None:
        """The entry ``relpath`` (relative to the workdir, any depth) is, or lies in; else None."""
        parts = [p for p in relpath.split("/") if p not in ("", ".")]
        if not parts or self._opted_out("/".join(parts)):
            return None
        for i, name in enumerate(parts):
            if name == ".git":
                found = self._in_git_dir(parts[i + 1 :])
                if found is not None:
                    return found
            if name in self.first_names or (
                    self.first_suffixes and name.endswith(self.first_suffixes)):
                tail = parts[i:]
                for entry in self.tree:
                    if entry.matches(tail):
                        return entry
        return None

    def _in_git_dir(self, rest: list[str]) -> Entry | None:
        """The git entry of a path inside a ``.git`` directory (``rest``: what follows it)."""
        if not rest:
            return next((e for e in self.tree if e.rule == "git-dir"), None)
        # modules/<name...>/ and worktrees/<name>/ are git directories too, and a
        # module's name may hold '/': a git entry may start at any later depth.
        starts = range(len(rest)) if rest[0] in NESTED_GIT else range(1)
        for start in starts:
            tail = rest[start:]
            for entry in self.git:
                if entry.matches(tail):
                    return entry
        return None

    def match_home(self, relpath: str) -> Entry | None:
        """The home entry ``relpath`` (relative to home) is, or lies in; else None."""
        parts = tuple(p for p in relpath.split("/") if p not in ("", "."))
        for entry in self.home:
            if entry.matches(parts):
                return entry
        return None

    def lines(self) -> list[str]:
        """The list in effect, one line per entry, for ``doctor``."""
        where = {"git": "in every git dir", "tree": "at any depth", "home": "in home"}
        out = [f"{e.pattern:<28} {e.rule:<22} {where[e.kind]}: {e.reason}" for e in self.entries]
        out += [f"{a:<28} {'(allowed)':<22} hostrun_allow: not held here" for a in self.allow]
        return out


DEFAULT = Table()


def match(relpath: str, table: Table = DEFAULT) -> Entry | None:
    """The entry ``relpath`` (relative to the workdir, at any depth) is, or lies in; else None."""
    return table.match(relpath)


def match_path(path: str, home: str, table: Table = DEFAULT) -> Entry | None:
    """The entry the clean absolute ``path`` is, or lies in: the file tools' view.

    Relative to the table's root (the workdir) when beneath it; else the whole
    path counts at any depth (a repository anywhere runs its hooks), and the
    home entries relative to ``home``.
    """
    root = table.root
    if root and (path == root or path.startswith(root + "/")):
        return table.match(path[len(root) + 1 :])
    found = table.match(path.lstrip("/"))
    if found is None and home not in ("", "/") and path.startswith(home + "/"):
        found = table.match_home(path[len(home) + 1 :])
    return found


def gitlink_verdict(target: str | None, git_dirs: frozenset[str] | set[str]) -> str | None:
    """Why a ``gitdir:`` (a ``.git`` file) or ``commondir`` target may not stay; None: it may.

    ``target``: where the kernel resolved it (links followed), relative to the
    workdir ("" for the workdir itself); None when it resolved outside the
    workdir or not at all.  ``git_dirs``: the git directories the walk found
    and guards (workdir-relative).  Only a target that is one of them may stay:
    git would take hooks and config from anything else unguarded.
    """
    if target is None:
        return "it points outside the workdir, or nowhere"
    target = target.strip("/")
    if target in git_dirs:
        return None
    inside = [g for g in git_dirs if target.startswith(g + "/") or g == ""]
    if inside:
        return f"it points inside the git directory {max(inside, key=len) or '.'}, not at one"
    return "it points at a directory that is not a guarded git directory"
