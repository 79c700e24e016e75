"""Git config: which keys a session may leave behind, and a merge that keeps only those.

A repository's config names commands git runs on the host (``core.fsmonitor``
at every ``git status``, ``core.hooksPath``, filters, pagers, ``!`` aliases,
``include.path`` pulling in another file ...), and git keeps adding such keys.
So the rule is an allow list: a key survives a session only if it is listed
below as one git reads as data and that cannot make it run anything.  Every
other key, an unknown one included, counts as one that runs commands.

An alias is judged by its value: ``!cmd`` runs a shell, a first word such as
``-c core.fsmonitor=..`` or ``--exec-path=..`` configures git itself, and
subcommands such as ``rebase -x`` or ``fetch --upload-pack`` run what they
are given.  So an alias is kept only when it starts one of a few subcommands
that take no command to run, with no ``--output`` (which writes a file).

Pure: bytes in, bytes out (:mod:`libpolicy.gitconfig_parse` reads a file the
way git does); nothing here opens a file or starts a process.  Kept apart
from :mod:`libpolicy.hostrun`, which policy-hook imports on every call.
"""

from __future__ import annotations

import posixpath

from libpolicy.gitconfig_parse import Item, Parsed, parse, render_header, render_item

UNPARSEABLE = "(not parseable by git)"  # the "key" reported for a file that does not parse
TOO_BIG = "(bigger than 1 MiB)"  # ... and for one too big to read in bounded time (~1 s)
MAX_CONFIG = 1 << 20

# Every key in these sections is data: names, colours, advice switches.
_SAFE_SECTIONS = frozenset({"user", "color", "advice"})
# "section.name", or "section.*.name" for any one subsection.  Each is checked
# against git-config(1) of git 2.39: a value git reads as data (a name, URL,
# refspec, boolean, enum), never a command, a program, a hook, a file to read
# config or templates from, nor a switch that weakens git's own protections.
_SAFE_KEYS = frozenset({
    # git init / clone
    "core.repositoryformatversion", "core.filemode", "core.bare", "core.logallrefupdates",
    "core.ignorecase", "core.precomposeunicode", "core.symlinks", "core.autocrlf", "core.eol",
    "core.safecrlf", "core.quotepath", "core.checkstat", "core.trustctime", "core.abbrev",
    "core.commentchar", "core.untrackedcache", "core.sparsecheckout", "core.sparsecheckoutcone",
    "extensions.objectformat", "extensions.worktreeconfig", "extensions.partialclone",
    "extensions.preciousobjects", "init.defaultbranch",
    # git remote add / set-url, git fetch; gh's "gh-resolved" marks the default remote
    "remote.pushdefault", "remote.*.url", "remote.*.pushurl", "remote.*.fetch", "remote.*.push",
    "remote.*.mirror", "remote.*.tagopt", "remote.*.prune", "remote.*.prunetags",
    "remote.*.skipdefaultupdate", "remote.*.skipfetchall", "remote.*.promisor",
    "remote.*.partialclonefilter", "remote.*.gh-resolved",
    # git branch, git push -u, git checkout --track
    "branch.autosetupmerge", "branch.autosetuprebase", "branch.sort", "branch.*.remote",
    "branch.*.merge", "branch.*.rebase", "branch.*.pushremote", "branch.*.description",
    "push.default", "push.autosetupremote", "push.followtags", "pull.rebase", "pull.ff",
    "fetch.prune", "fetch.prunetags", "rebase.autosquash", "rebase.autostash",
    "commit.gpgsign", "tag.gpgsign",
    # git submodule init / add (submodule.*.update may be "!command": not listed)
    "submodule.*.url", "submodule.*.active", "submodule.*.branch",
})  # fmt: skip
# Subcommands an alias may start: none takes a command to run or a config to set.
_ALIAS_COMMANDS = frozenset({
    "status", "log", "show", "diff", "shortlog", "blame", "describe", "whatchanged",
    "ls-files", "branch", "checkout", "switch", "commit", "add",
})  # fmt: skip


def _split_key(key: str) -> tuple[str, str | None, str]:
    """``section``, ``subsection`` (None when absent) and ``name``, as git's parse_config_key."""
    section, _, rest = key.partition(".")
    sub, dot, name = rest.rpartition(".")
    return section.lower(), (sub if dot else None), name.lower()


def split_cmdline(value: str) -> list[str] | None:
    """Words as git's ``split_cmdline`` makes them (quotes, backslashes); None: unclosed quote."""
    words: list[str] = []
    word: list[str] = []
    quote = ""
    started = False
    chars = iter(value)
    for c in chars:
        if not quote and c in " \t\n\r":
            if started:
                words.append("".join(word))
                word, started = [], False
            continue
        started = True
        if not quote and c in "'\"":
            quote = c
        elif c == quote:
            quote = ""
        elif c == "\\" and quote != "'":
            word.append(next(chars, ""))
        else:
            word.append(c)
    if quote:
        return None
    if started:
        words.append("".join(word))
    return words


def alias_harmless(value: str | None) -> bool:
    """Whether an alias's value only starts a subcommand that runs nothing it is given."""
    if value is None or value.lstrip().startswith("!"):
        return False
    words = split_cmdline(value)
    if not words or words[0] not in _ALIAS_COMMANDS:
        return False  # also "-c ..", "--exec-path=..", another alias
    return not any(w.startswith("--ou") for w in words)  # --output= (abbreviations too)


def key_runs(key: str, value: bytes | str | None = None) -> bool:
    """Whether ``key`` (``section[.sub].name`` as git lists it) may make git run something.

    True for every key not on the allow list, whatever its case or form.
    An alias is judged by ``value`` (None: no value, which git refuses).
    """
    section, sub, name = _split_key(key)
    if section == "alias":
        text = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
        return not alias_harmless(text)
    if section in _SAFE_SECTIONS:
        return False
    return (f"{section}.*.{name}" if sub is not None else f"{section}.{name}") not in _SAFE_KEYS


def runs_commands(keys: list[str]) -> list[str]:
    """The keys of ``keys`` not on the allow list (aliases pass here: see :func:`key_runs`)."""
    return [k for k in keys if _split_key(k)[0] != "alias" and key_runs(k)]


def alias_runs(key: str, value: str) -> bool:
    return _split_key(key)[0] == "alias" and not alias_harmless(value)


def sanitized_pairs(pairs: list[tuple[str, str]] | None) -> tuple[bytes, list[str]] | None:
    """The config (as ``(key, value)`` pairs git listed) with only allowed keys, and the others.

    None when every key is allowed; ``pairs`` None (git could not parse the
    file) counts as all command-running: nothing of it is kept.
    """
    if pairs is None:
        return b"", [UNPARSEABLE]
    bad = sorted({k for k, v in pairs if key_runs(k, v)})
    if not bad:
        return None
    out = bytearray()
    prefix = None
    for key, value in pairs:
        if key in bad:
            continue
        here, _, name = key.rpartition(".")
        if here != prefix:
            out += render_header(here)
            prefix = here
        out += render_item(name, value.encode("utf-8", "surrogateescape"))
    return bytes(out), bad


def values(parsed: Parsed) -> dict[str, list[bytes | None]]:
    """Every key's values in file order (git's last one wins; some keys take them all)."""
    out: dict[str, list[bytes | None]] = {}
    for item in parsed.items:
        out.setdefault(item.key, []).append(item.value)
    return out


def sanitized_config(data: bytes) -> tuple[bytes, list[str]] | None:
    """``data`` with only allowed keys (comments dropped), and the others; None: all allowed."""
    merged, dropped = merge_config(b"", data)
    return None if not dropped else (merged, dropped)


def merge_config(original: bytes, session: bytes) -> tuple[bytes, list[str]]:
    """The user's config with the session's changes to allowed keys; and the other changed keys.

    Every key the session set, changed or removed (a removed section too) is
    compared by its values; allowed ones take the session's values, every
    other one keeps the original's and is named in ``dropped``.  The
    original's bytes are edited in place: what no change touches stays byte
    for byte, comments included.  A session config that does not parse is
    dropped whole; an original that does not parse is kept whole; so is
    either over :data:`MAX_CONFIG` (:data:`TOO_BIG` is then the one key named).
    """
    if session == original:
        return original, []
    if len(session) > MAX_CONFIG or len(original) > MAX_CONFIG:
        return original, [TOO_BIG]
    old, new = parse(original), parse(session)
    if old is None or new is None:
        return original, [UNPARSEABLE]
    was, now = values(old), values(new)
    changed = [k for k in dict.fromkeys([*was, *now]) if was.get(k, []) != now.get(k, [])]
    apply = [k for k in changed if _may_change(k, now.get(k, []))]
    applied = set(apply)
    dropped = sorted(k for k in changed if k not in applied)
    merged = _Editor(original, old).apply(apply, now)
    want = {k: v for k, v in was.items() if k not in applied}
    want.update({k: now[k] for k in apply if k in now})
    check = parse(merged)
    if check is None or values(check) != want:  # a bug here must not cost the user a key
        return original, sorted(changed)
    return merged, dropped


def _may_change(key: str, new_values: list[bytes | None]) -> bool:
    """Whether the session may give ``key`` these values (none: remove it)."""
    if _split_key(key)[0] == "alias":
        return all(not key_runs(key, v) for v in new_values)
    return not key_runs(key)


class _Editor:
    """Edits to the original's bytes: entries deleted, new ones inserted beside their kin."""

    def __init__(self, data: bytes, parsed: Parsed) -> None:
        self.data = data
        self.parsed = parsed
        self.cuts: list[tuple[int, int]] = []
        self.inserts: dict[int, list[bytes]] = {}
        self.filled: set[int] = set()  # blocks that get a new entry
        # Indexes, so that a file of many keys costs linear time, not quadratic.
        self.by_key: dict[str, list[Item]] = {}
        self.count = [0] * len(parsed.blocks)  # entries under each header
        self.last_end: dict[int, int] = {}  # each header's last entry's end
        for item in parsed.items:
            self.by_key.setdefault(item.key, []).append(item)
            self.count[item.block] += 1
            self.last_end[item.block] = item.end
        self.last_block = {b.prefix: n for n, b in enumerate(parsed.blocks)}

    def apply(self, keys: list[str], now: dict[str, list[bytes | None]]) -> bytes:
        left = list(self.count)
        appended: dict[str, list[bytes]] = {}
        for key in keys:
            prefix, _, name = key.rpartition(".")
            lines = [render_item(name, v) for v in now.get(key, [])]
            mine = self.by_key.get(key, [])
            for item in mine:
                self.cuts.append(self._line_span(item))
                left[item.block] -= 1
            if mine and lines:
                self._insert(self.cuts[-len(mine)][0], lines)
                self.filled.add(mine[0].block)
            elif lines:
                found = self._after_block(prefix)
                if found is None:
                    appended.setdefault(prefix, []).extend(lines)
                else:
                    self._insert(found[0], lines)
                    self.filled.add(found[1])
        for index, had in enumerate(self.count):
            if had and not left[index] and index not in self.filled:
                self.cuts.append(self._header_span(index))
        tail = b"".join(render_header(p) + b"".join(lines) for p, lines in appended.items())
        return self._render(tail)

    def _insert(self, at: int, lines: list[bytes]) -> None:
        if lines:
            self.inserts.setdefault(at, []).extend(lines)

    def _after_block(self, prefix: str) -> tuple[int, int] | None:
        """Where a new key goes under the last ``[prefix]`` header (after its last entry),
        and that header's index; None when there is no such header."""
        last = self.last_block.get(prefix)
        if last is None:
            return None
        if last in self.last_end:
            return self.last_end[last], last
        end = self.data.find(b"\n", self.parsed.blocks[last].end)
        return (len(self.data) if end < 0 else end + 1), last

    def _line_span(self, item: Item) -> tuple[int, int]:
        """An entry's bytes, with the indentation before it when it starts its line."""
        start = item.start
        while start > 0 and self.data[start - 1] in b" \t":
            start -= 1
        return (start if start == 0 or self.data[start - 1] in b"\r\n" else item.start), item.end

    def _header_span(self, index: int) -> tuple[int, int]:
        """A header's bytes, through its line's end when nothing else follows it there."""
        block = self.parsed.blocks[index]
        end = block.end
        while end < len(self.data) and self.data[end] in b" \t\r":
            end += 1
        if end >= len(self.data) or self.data[end] in b"\n":
            end = min(end + 1, len(self.data))
        else:
            end = block.end
        return self._line_span(Item("", None, block.start, end, index))

    def _render(self, tail: bytes) -> bytes:
        out = bytearray()
        pos = 0
        points = sorted({*self.inserts, *(s for s, _ in self.cuts)})
        cuts = dict(self.cuts)
        for at in points:
            out += self.data[pos:at] if at >= pos else b""
            pos = max(pos, at)
            lines = self.inserts.get(at, [])
            if lines and out and not out.endswith(b"\n"):
                out += b"\n"
            out += b"".join(lines)
            if at in cuts:
                pos = max(pos, cuts[at])
        out += self.data[pos:]
        if tail and out and not out.endswith(b"\n"):
            out += b"\n"
        return bytes(out + tail)


def config_targets(config: bytes, config_dir: str, worktree: str | None = None
                   ) -> list[str] | None:
    """The paths ``config`` makes git read config from or run hooks from; None: not parseable.

    ``include.path`` and ``includeIf.<cond>.path`` (whatever the condition):
    a relative path is relative to ``config_dir``, the directory of the file
    holding it, as git takes it.  ``core.hooksPath``: relative to where git
    runs hooks, the ``worktree``'s top, or ``config_dir`` for a bare
    repository (``worktree`` None).  ``~/`` and ``%(prefix)/`` paths are
    returned as written; the caller resolves them (and follows links).
    A file over :data:`MAX_CONFIG` counts as not parseable.
    """
    parsed = parse(config) if len(config) <= MAX_CONFIG else None
    if parsed is None:
        return None
    out: dict[str, None] = {}
    for item in parsed.items:
        section, sub, name = _split_key(item.key)
        if not item.value or name not in ("path", "hookspath"):
            continue
        if (section, name) == ("core", "hookspath") and sub is None:
            base = worktree if worktree is not None else config_dir
        elif (section == "include" and sub is None) or (section == "includeif" and sub):
            base = config_dir
        else:
            continue
        path = item.value.decode("utf-8", "surrogateescape")
        if not path.startswith(("/", "~", "%(prefix)/")):
            path = posixpath.join(base, path)
        out[path] = None
    return list(out)
