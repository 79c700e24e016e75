"""What git's answers mean: the repository it located, the key it would sign with.

Pure: :mod:`.gitfacts` asks git (one process a question, on the host) and
hands the bytes here; the config (:func:`.config.from_mapping`) decides the
workdir and the git directories it grants from :class:`Located`.
"""

from __future__ import annotations

import os

from libbroker.named_tuple import NamedTuple
from libbroker.paths import under

GIT_TIMEOUT = 5.0  # how long a question to git may take (a config including a FIFO)
# gpg.format values signing in a session serves: gpg-shim speaks gpg's protocol only.
SIGN_FORMATS = ("", "openpgp")
# What git strips from both ends of a name or email (ident.c, strbuf_addstr_without_crud).
_CRUD = ".,:;<>\"\\'"


class Located(NamedTuple):
    """Where git says the repository containing a directory is (absolute, clean paths)."""

    top: str  # the working tree's top level
    git_dir: str  # its git directory (a linked worktree's own, a submodule's in modules/)
    common_dir: str  # the common git directory (the main repository's .git for a worktree)


class Signing(NamedTuple):
    """The key git would sign with in the workdir, and where that came from."""

    key: str  # what git passes to ``gpg -bsau``; "" when none can be enabled
    origin: str  # e.g. "user.signingkey (local, /r/.git/config)"; "" when no key
    problem: str = ""  # why no key is enabled though git would sign (gpg.format)


def parse_located(out: bytes) -> Located | None:
    """``rev-parse``'s three lines; None for a bare repository (no top level) or garbage."""
    lines = out.decode("utf-8", "surrogateescape").split("\n")
    if len(lines) != 4 or lines[3] != "":
        return None  # a bare repository prints no top level: two lines
    paths = [os.path.normpath(p) for p in lines[:3]]
    if not all(os.path.isabs(p) for p in paths):
        return None
    return Located(*paths)


def default_workdir(cwd: str, home: str, repo: Located | None) -> tuple[str, str]:
    """The workdir when none is named, and why: the top level of the repository holding ``cwd``.

    Started in a repository's subdirectory, the session grants the whole
    repository (git inside needs its ``.git``) and the command starts where
    the person stands.  A repository holding the home directory (a dotfiles
    repository at ~, or one at /) is never granted because of that: the
    workdir is then ``cwd`` itself, as outside any repository.
    """
    cwd = os.path.normpath(cwd)
    if repo is None or not under(cwd, repo.top):
        return cwd, "the current directory (no git repository holds it)"
    if under(home, repo.top):
        return cwd, (f"the current directory: its repository {repo.top} holds the home "
                     "directory, which is never granted (--workdir=DIR to choose)")
    if repo.top == cwd:
        return cwd, "the current directory, a repository's top level"
    return repo.top, (f"the top level of the repository holding the current directory "
                      f"({os.path.relpath(cwd, repo.top)}, where the command starts)")


def outside_git_dirs(repo: Located | None, workdir: str, home: str) -> tuple[str, ...]:
    """The workdir repository's git directories outside the workdir (outermost only).

    A linked worktree's own git dir and its common dir (the main repository's
    ``.git``), a submodule's (in its superproject's ``.git/modules``): git
    inside writes objects, refs and the index there, or commits fail.
    ValueError for one at / or holding the home directory: never granted.
    """
    if repo is None or repo.top != workdir:
        return ()
    out: list[str] = []
    for path in sorted({repo.common_dir, repo.git_dir}, key=len):
        if under(path, workdir) or any(under(path, d) for d in out):
            continue
        if under(home, path):
            raise ValueError(f"the git directory {path} of {workdir} holds the home "
                             "directory, which is never granted (--workdir=DIR elsewhere)")
        out.append(path)
    return tuple(out)


def _without_crud(text: str) -> str:
    return text.strip("".join(chr(c) for c in range(33)) + _CRUD)


def parse_signing(status: int, out: bytes, workdir: str) -> Signing:
    """The key from ``git config -z --show-scope --show-origin --get-regexp`` output.

    git uses each key's last value.  Without ``user.signingkey`` git signs as
    the committer, ``Name <email>`` (``committer.*`` over ``user.*``, crud
    stripped as git strips it).  Status 1 is git's "nothing matched".
    """
    if status == -1:
        return Signing("", "", f"git did not answer within {GIT_TIMEOUT:g} s reading its "
                               f"configuration in {workdir}: run `git -C {workdir} config --list`")
    if status not in (0, 1):
        return Signing("", "", "git cannot read its configuration here (git config exits "
                               f"{status}): run `git -C {workdir} config --list` to see why")
    values: dict[str, tuple[str, str]] = {}
    fields = out.decode("utf-8", "surrogateescape").split("\0")
    for i in range(0, len(fields) - 2, 3):
        scope, origin, entry = fields[i : i + 3]
        key, _, value = entry.partition("\n")
        where = origin.removeprefix("file:")
        if where and not where.startswith("/") and origin.startswith("file:"):
            where = os.path.normpath(os.path.join(workdir, where))
        values[key] = (value, f"{scope}, {where}" if where else scope)
    fmt, fmt_where = values.get("gpg.format", ("", ""))
    if fmt.lower() not in SIGN_FORMATS:
        return Signing("", "", f"gpg.format is {fmt} ({fmt_where}): sessions sign with "
                               "OpenPGP keys only (through gpg-shim), so signing inside will fail; "
                               "git config gpg.format openpgp, or commit with --no-gpg-sign")
    if "user.signingkey" in values:
        key, where = values["user.signingkey"]
        return Signing(key.strip(), f"user.signingkey ({where})" if key.strip() else "")
    name = _without_crud(values.get("committer.name", values.get("user.name", ("", "")))[0])
    email = _without_crud(values.get("committer.email", values.get("user.email", ("", "")))[0])
    if name and email:
        return Signing(f"{name} <{email}>", "the committer's name and email "
                                            "(no user.signingkey: git signs as the committer)")
    return Signing("", "")
