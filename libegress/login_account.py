"""Whose login it is: the account of a held login and of a new one (pure).

A login made inside a session (a code exchanged at the agent's token
endpoint, :mod:`libegress.token_endpoint`) is kept in the person's own login
file on the host.  A process inside could complete an authorization flow of
its own, for an account of its choosing; kept as it came, that login would
replace the person's, and the next run of the agent on the host would work
as that account.  So the keeper compares the two accounts first, with what
each agent records:

- Claude Code: the token answer's ``account`` (``uuid``, ``email_address``);
  the host's login file holds no account, Claude Code's global config does
  (``~/.claude.json``, ``oauthAccount``: ``accountUuid``, ``emailAddress``);
- Codex: the id token's claims (``https://api.openai.com/auth``:
  ``chatgpt_account_id``, ``chatgpt_user_id``; ``sub``, ``email``) and the
  file's ``account_id``;
- Gemini CLI: the id token's ``sub`` and ``email`` (the file keeps the id
  token), else the active account Gemini CLI records beside it
  (``google_accounts.json``, ``active``).

:func:`same_account` says True (every field both sides name agrees, and at
least one does), False (one differs) or None (nothing to compare: the
keeper refuses that too, unless the person opted in with
``unsafe_login_switch``).  Ids are compared exactly, e-mail addresses
without case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from libegress.oauth_login import CLAUDE, CODEX, Kind, jwt_claims

Account = dict[str, str]
_OPENAI = "https://api.openai.com/auth"


def _pick(source: Mapping[str, Any], **names: str) -> Account:
    """``{field: source[key]}`` for each ``field=key`` whose value is a non-empty string."""
    out: Account = {}
    for field, key in names.items():
        value = source.get(key)
        if isinstance(value, str) and value.strip():
            out[field] = value.strip().lower() if field == "email" else value.strip()
    return out


def _claims(token: object) -> Account:
    claims = jwt_claims(token) if isinstance(token, str) else None
    if claims is None:
        return {}
    auth = claims.get(_OPENAI)
    return {**_pick(claims, sub="sub", email="email"),
            **(_pick(auth, account="chatgpt_account_id", user="chatgpt_user_id")
               if isinstance(auth, Mapping) else {})}


def held_account(kind: Kind, data: object, beside: object = None) -> Account:
    """The account of the login file's JSON ``data``; ``beside``: the file the agent
    records its account in (Claude Code's ``.claude.json``, Gemini CLI's
    ``google_accounts.json``), as JSON, or None."""
    data = data if isinstance(data, Mapping) else {}
    beside = beside if isinstance(beside, Mapping) else {}
    if kind is CLAUDE:
        account = beside.get("oauthAccount")
        return _pick(account, account="accountUuid", email="emailAddress") \
            if isinstance(account, Mapping) else {}
    if kind is CODEX:
        tokens = data.get("tokens")
        tokens = tokens if isinstance(tokens, Mapping) else {}
        return {**_claims(tokens.get("id_token")), **_pick(tokens, account="account_id")}
    found = _claims(data.get("id_token"))
    return found or _pick(beside, email="active")


def new_account(kind: Kind, got: Mapping[str, Any]) -> Account:
    """The account of a token endpoint's answer to a code exchange."""
    if kind is CLAUDE:
        account = got.get("account")
        return _pick(account, account="uuid", email="email_address") \
            if isinstance(account, Mapping) else {}
    return _claims(got.get("id_token"))


def same_account(held: Account, new: Account) -> bool | None:
    """True: the same account; False: another; None: nothing the two both name."""
    common = [f for f in held if f in new]
    if not common:
        return None
    return all(held[f] == new[f] for f in common)
