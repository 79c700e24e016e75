"""The host-run guard's sweep of a moved repository: ``mv .git .git-away`` undone.

``mv .git .git-away && cp -r .git-away .git`` leaves a copy where the
repository was: the copy (with whatever the session did in it) is moved
aside, the original (found by its inode anywhere in the workdir) moved back,
and its entries checked again.  A ``.git`` that is simply gone stays gone.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from libbroker.launcher.hostrun_fs import parent_of
from libbroker.launcher.hostrun_walk import Walk
from libbroker.shellquote import quote

if TYPE_CHECKING:
    from libbroker.launcher.hostrun_sweep import Sweeper


def put_back_renamed_git(sweeper: Sweeper, root: int) -> None:
    snap = sweeper.snap
    displaced: dict[int, str | None] = {}
    for rel, ino in snap.repos.items():
        if not rel.endswith(".git"):
            continue
        try:  # where it still is (the usual case): one lstat, not an open per level
            if os.stat(rel, dir_fd=root, follow_symlinks=False).st_ino == ino:
                continue
        except OSError:
            pass
        with parent_of(root, rel) as (pfd, name):
            if pfd < 0:
                continue
            try:
                now = os.stat(name, dir_fd=pfd, follow_symlinks=False).st_ino
            except FileNotFoundError:
                now = 0
            if now != ino:
                displaced[ino] = rel
    if not displaced:
        return
    walk = Walk(snap.table, fix=True)  # every directory, by inode
    walk.run(root)
    for where, found in walk.dirs.items():
        back = displaced.pop(found[0], None)
        if back is not None and where != back:
            _move_back(sweeper, root, back, where)


def _move_back(sweeper: Sweeper, root: int, rel: str, where: str) -> None:
    path = os.path.join(sweeper.snap.workdir, rel)
    with parent_of(root, rel) as (dfd, dname):
        if dfd < 0:
            return
        if sweeper.exists(dfd, dname):
            kind = sweeper._kind(dfd, dname)
            q = sweeper.move_aside(dfd, dname, rel)
            sweeper.say(rel, "git-dir", f"{kind} took the repository's place in the "
                        f"session; moved to {quote(q)}")
        with parent_of(root, where) as (sfd, sname):
            if sfd < 0:
                return
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
    sweeper.say(rel, "git-dir", f"the repository was moved to {quote(where)} in the session; "
                f"moved back to {quote(path)}")
    # Its entries were checked where they stood: check them again.
    for entry_rel, (rule, recorded) in sweeper.snap.entries.items():
        if entry_rel.startswith(rel + "/"):
            sweeper.check(root, entry_rel, rule, recorded)
