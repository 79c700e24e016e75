"""Git config: which keys make git run a command, and a config without them.

Pure: the caller parses the file (``git config --list --null``) and passes
``(key, value)`` pairs; nothing here looks at a file or starts a process.
Kept apart from :mod:`libpolicy.hostrun`, which policy-hook imports on every
file-tool call and which must stay light.
"""

from __future__ import annotations

# Keys (lower case; a "*" is one subsection) that make git run a command.
# Names ending in these words run one too, whatever the section.
_RUNS_EXACT = frozenset({
    "core.hookspath", "core.fsmonitor", "core.sshcommand", "core.pager", "core.editor",
    "core.askpass", "core.gitproxy", "core.alternaterefscommand", "core.worktree",
    "sequence.editor", "diff.external", "credential.helper", "gpg.program",
    "uploadpack.packobjectshook", "web.browser", "interactive.difffilter", "ssh.variant",
    "protocol.allow", "diff.*.textconv", "diff.*.command", "merge.*.driver",
    "credential.*.helper", "gpg.*.program", "remote.*.uploadpack", "remote.*.receivepack",
    "remote.*.vcs", "remote.*.proxy", "url.*.insteadof", "url.*.pushinsteadof",
    "submodule.*.update", "protocol.*.allow", "core.fsmonitorhookversion",
})
_RUNS_SECTIONS = frozenset({"filter", "include", "includeif", "pager", "sendemail", "guitool",
                            "instaweb", "difftool", "mergetool", "browser", "man", "trailer"})
_RUNS_SUFFIXES = ("cmd", "command", "program", "editor", "pager", "helper", "hook", "hookspath",
                  "textconv", "driver", "path")


def runs_commands(keys: list[str]) -> list[str]:
    """The config keys (``section[.sub].name``, as git lists them) that make git run a command."""
    out = []
    for key in keys:
        low = key.lower()
        section, _, rest = low.partition(".")
        sub, _, name = rest.rpartition(".")
        generic = f"{section}.*.{name}" if sub else low
        if (low in _RUNS_EXACT or generic in _RUNS_EXACT or section in _RUNS_SECTIONS
                or name.endswith(_RUNS_SUFFIXES)):
            out.append(key)
    return out


def alias_runs(key: str, value: str) -> bool:
    return key.lower().startswith("alias.") and value.lstrip().startswith("!")


def sanitized_pairs(pairs: list[tuple[str, str]] | None) -> tuple[bytes, list[str]] | None:
    """The config (as parsed ``pairs``) without its command-running keys, and those keys.

    None when it has none.  ``pairs`` None (git could not parse the file)
    counts as all command-running: nothing of it is kept.
    """
    if pairs is None:
        return b"", ["(not parseable by git)"]
    bad = set(runs_commands([k for k, _ in pairs]))
    bad |= {k for k, v in pairs if alias_runs(k, v)}
    if not bad:
        return None
    sections: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for key, value in pairs:
        if key in bad:
            continue
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        sections.setdefault((section, sub), []).append((name, value))
    text = []
    for (section, sub), items in sections.items():
        quoted = sub.replace("\\", "\\\\").replace('"', '\\"')
        text.append(f'[{section} "{quoted}"]' if sub else f"[{section}]")
        for name, value in items:
            escaped = (value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                       .replace("\t", "\\t"))
            text.append(f'\t{name} = "{escaped}"')
    return ("\n".join(text) + "\n").encode(), sorted(bad)
