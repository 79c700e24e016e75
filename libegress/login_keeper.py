"""The host side of an agent's OAuth login: print its access token, refreshed when due.

egress-proxy runs this as a ``[[secret]]`` command (libbroker.launcher.logins
makes the entry), every few seconds, on the host, never in the sandbox::

    python -m libegress.login_keeper KIND FILE [--resolve=HOST:IP:PORT]... [--ca=FILE]
                                     [--answer | --store] [--switch-ok]

It reads the person's own login file (``~/.claude/.credentials.json``,
``~/.codex/auth.json``, ``~/.gemini/oauth_creds.json``) under
an exclusive lock on its directory, and when the access token expires within
:data:`.oauth_login.MARGIN_MS` it refreshes it at the agent's token endpoint
and writes the rotated pair back: a temporary file in the same directory with
the file's own mode, fsync'd, renamed over it.  Then it prints the access
token (egress-proxy takes the first line).  ``--resolve`` and ``--ca`` are the
session's own upstream pins and CA (its config's ``resolve`` and
``upstream_ca``), so the refresh reaches what the proxy would.

egress-proxy also runs it when a process inside the session asks the
agent's token endpoint (:mod:`libegress.token_endpoint`), with one more word:

- ``--answer`` (a refresh with the session's placeholder): prints the token
  answer the session gets, placeholders only (Codex's claims read from the
  person's id token);
- ``--store`` (a ``/login`` inside: the token endpoint's answer on stdin):
  writes the new login to the person's file, as a refresh does (locked,
  atomic, its mode; 0600 for a new file, in a directory made 0700 if there
  is none: a first login), and prints the answer the session gets,
  placeholders only.  When the file already holds a login, the new one must
  be for the same account (:mod:`libegress.login_account`), else it prints
  ``{"refused": REASON}`` and the file stays as it was; ``--switch-ok`` (the
  config's ``unsafe_login_switch``) lets another account replace it.

A refusal prints one line on stderr (never a token) and exits 1; a refresh
that fails while the held token is still valid prints that token (the proxy
goes on; the next run tries again).  No login file (none yet: a session
that may make the first one inside) exits :data:`ABSENT` without a word.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time

from libegress import login_account, oauth_login, placeholders
from libegress.oauth_login import CLAUDE, GEMINI, Kind, LoginError, Tokens

MAX_FILE = 1 << 20
# ~/.claude.json keeps every project's history: several MiB is common.
MAX_BESIDE = 64 << 20
TIMEOUT = 20.0
ABSENT = oauth_login.ABSENT_STATUS  # no login file: nothing to hold yet, nothing said


def _read(path: str) -> tuple[str, int]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(MAX_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE:
        raise LoginError("the login file is larger than 1 MiB")
    try:
        return data.decode("utf-8"), st.st_mode & 0o7777
    except UnicodeDecodeError:
        raise LoginError("the login file is not UTF-8") from None


def _write(path: str, text: str, mode: int) -> None:
    """Replace ``path`` atomically with ``text``, keeping its mode."""
    parent = os.path.dirname(path) or "."
    tmp = os.path.join(parent, f".{os.path.basename(path)}.keeper-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dirfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def _post(url: str, body: bytes, ctype: str, pins: list[str],
          ca: str | None) -> tuple[int, bytes]:
    """POST ``body`` to ``url`` over verified TLS, honouring the session's pins.

    Its imports are here: the usual run (at every session's start, then every
    minute) reads the file and prints, or finds none; only a refresh posts.
    """
    import http.client
    import socket
    import ssl
    from urllib.parse import urlsplit

    from libegress.route import parse_pin

    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    address = host
    for text in pins:  # the session's resolve pins, as egress-proxy reads them
        pinned_host, pin = parse_pin(text)
        if pinned_host == host:
            address, port = str(pin.address), pin.port or port
    ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    conn = http.client.HTTPSConnection(host, port, timeout=TIMEOUT, context=ctx)
    raw = socket.create_connection((address, port), timeout=TIMEOUT)
    conn.sock = ctx.wrap_socket(raw, server_hostname=host)
    try:
        conn.request("POST", parts.path or "/", body=body,
                     headers={"Content-Type": ctype, "Accept": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read(MAX_FILE)
    except http.client.HTTPException as exc:  # one error kind for the caller (not OSError)
        raise LoginError(f"the token endpoint's answer was not understood "
                         f"({type(exc).__name__})") from None
    finally:
        conn.close()


def current_token(kind: Kind, path: str, pins: list[str], ca: str | None) -> str:
    """The access token to send now: the file's, refreshed and written back when due."""
    dirfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(dirfd, fcntl.LOCK_EX)  # one refresh at a time per directory
        text, mode = _read(path)
        data, tokens = oauth_login.parse(kind, text)
        now = int(time.time() * 1000)
        if not oauth_login.needs_refresh(tokens, now):
            return tokens.access
        try:
            status, answer = _post(kind.token_url, oauth_login.refresh_body(kind, tokens),
                                   oauth_login.content_type(kind), pins, ca)
            new_data, new = oauth_login.refreshed(kind, data, tokens, status, answer, now)
        except (LoginError, OSError) as exc:  # ssl.SSLError is an OSError
            return _still_valid(tokens, now, exc)
        _write(path, json.dumps(new_data, indent=2), mode)
        return new.access
    finally:
        os.close(dirfd)


def _held(kind: Kind, path: str) -> tuple[object, Tokens | None, int]:
    """The file's JSON, its login if usable, and its mode (a missing file: nothing, 0600)."""
    try:
        text, mode = _read(path)
    except FileNotFoundError:
        return {}, None, 0o600
    try:
        data, tokens = oauth_login.parse(kind, text)
    except LoginError:
        try:
            return json.loads(text), None, mode
        except (ValueError, RecursionError):
            return {}, None, mode
    return data, tokens, mode


def _beside(kind: Kind, path: str) -> object:
    """The JSON of the file the agent records its account in, or None."""
    parent = os.path.dirname(path) or "."
    if kind is CLAUDE:  # ~/.claude/.credentials.json: ~/.claude.json; CLAUDE_CONFIG_DIR: inside
        up = os.path.dirname(parent) if os.path.basename(parent) == ".claude" else parent
        where = os.path.join(up or ".", ".claude.json")
    elif kind is GEMINI:
        where = os.path.join(parent, "google_accounts.json")
    else:
        return None
    try:  # read only, to learn the account: a link (a dotfiles manager's) is followed
        with open(where, "rb") as fh:
            data = fh.read(MAX_BESIDE + 1)
        return None if len(data) > MAX_BESIDE else json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


def switch_refusal(kind: Kind, data: object, beside: object,
                   got: dict[str, object]) -> str | None:
    """Why a new login may not replace the held one (another account, or unknown)."""
    same = login_account.same_account(login_account.held_account(kind, data, beside),
                                      login_account.new_account(kind, got))
    if same:
        return None
    what = "another account than" if same is False else "an account that cannot be told from"
    return (f"{kind.name}'s new login is for {what} the one logged in on the host: not kept "
            "(unsafe_login_switch = true lets a login made inside replace it)")


def answer(kind: Kind, path: str, store: bytes | None, switch_ok: bool = False) -> str:
    """The session's token answer (placeholders); with ``store``, the new login written first."""
    if store is not None:  # a first login: the agent's directory may not be there yet
        os.makedirs(os.path.dirname(path) or ".", 0o700, exist_ok=True)
    dirfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(dirfd, fcntl.LOCK_EX)
        now = int(time.time() * 1000)
        data, held, mode = _held(kind, path)
        if store is None:
            if held is None or not isinstance(data, dict):
                raise LoginError(f"{kind.name}'s login file holds no login to answer for")
            return json.dumps(placeholders.masked(kind, placeholders.as_answer(kind, data), now))
        try:
            got = json.loads(store)
        except (ValueError, RecursionError, UnicodeDecodeError):
            raise LoginError("the token endpoint's answer is not JSON") from None
        if not isinstance(got, dict):
            raise LoginError("the token endpoint's answer is not an object")
        new_data, _ = oauth_login.stored(kind, data, held, got, now)  # a usable login?
        refusal = None if held is None or switch_ok else \
            switch_refusal(kind, data, _beside(kind, path), got)
        if refusal is not None:
            return json.dumps({"refused": refusal})
        _write(path, json.dumps(new_data, indent=2), mode)
        return json.dumps(placeholders.masked(kind, got, now))
    finally:
        os.close(dirfd)


def _still_valid(tokens: Tokens, now: int, exc: BaseException) -> str:
    why = exc if isinstance(exc, LoginError) else type(exc).__name__
    if tokens.expires_ms <= now:
        raise LoginError(f"the refresh failed ({why}) and the access token has expired")
    print(f"login-keeper: the refresh failed ({why}); the held token is still valid",
          file=sys.stderr)
    return tokens.access


def main(argv: list[str]) -> int:
    words = [a for a in argv if not a.startswith("--")]
    pins = [a.split("=", 1)[1] for a in argv if a.startswith("--resolve=")]
    cas = [a.split("=", 1)[1] for a in argv if a.startswith("--ca=")]
    modes = [a for a in argv if a in ("--answer", "--store")]
    switch_ok = "--switch-ok" in argv
    known = all(a in modes or a == "--switch-ok" or a.startswith(("--resolve=", "--ca="))
                for a in argv if a.startswith("--"))
    if len(words) != 2 or words[0] not in oauth_login.KINDS or len(modes) > 1 or not known:
        print(f"usage: python -m libegress.login_keeper {'|'.join(oauth_login.KINDS)} FILE "
              "[--resolve=PIN]... [--ca=FILE] [--answer | --store] [--switch-ok]",
              file=sys.stderr)
        return 2
    kind = oauth_login.KINDS[words[0]]
    try:
        if modes:
            store = sys.stdin.buffer.read(MAX_FILE + 1) if modes[0] == "--store" else None
            if store is not None and len(store) > MAX_FILE:
                raise LoginError("the token endpoint's answer is larger than 1 MiB")
            token = answer(kind, words[1], store, switch_ok)
        else:
            token = current_token(kind, words[1], pins, cas[-1] if cas else None)
    except FileNotFoundError:
        if modes:
            print(f"login-keeper: {kind.name}'s login file is not there", file=sys.stderr)
            return 1
        return ABSENT  # no login yet: nothing to send, nothing to say
    except (LoginError, OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(f"login-keeper: {why}", file=sys.stderr)
        return 1
    sys.stdout.write(token + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
