"""egress-gateway's claims controller: one gateway tenant per bound SandboxClaim
(and per Sandbox labelled egress.agent-sandbox/credential=true).

Usage:
  claims_controller.py [--once] [--every=SECONDS] [--credential-listen=HOST:PORT]
  claims_controller.py -h | --help

--credential-listen serves a warm pool's pods their claim's credential
(credential_endpoint.py) for as long as the loop runs.

Runs as a second container of the gateway pod (the control socket is a unix
socket of the pod's uid; nothing outside the pod can reach it).  Every
--every seconds it lists the namespace's SandboxClaims and its credential
Secrets (label agent-sandbox/egress-cred=true), asks the gateway for its
tenants, and makes them agree:

- a bound claim (``status.sandbox.name`` set) without a tenant gets one, named
  after the claim, with the password from its Secret or, the first time, a
  fresh one (256 random bits) written into Secret ``egress-cred-CLAIM`` (owned
  by the claim, so it goes with it) *before* the gateway accepts it;
- a Sandbox labelled ``egress.agent-sandbox/credential=true`` (made directly,
  not from a claim) gets the same, its Secret owned by the Sandbox: its pod
  template mounts Secret ``egress-cred-SANDBOX`` and builds HTTPS_PROXY from
  it, so the pod starts once the credential exists (a warm pool's pods exist
  before any claim, so a claim's credential cannot reach its pod that way);
  a name that is both a bound claim and such a Sandbox goes to the claim;
- a tenant without a bound claim or labelled Sandbox is removed (its
  connections end).

A gateway restart forgets its tenants; the next round re-adds them from the
Secrets, same passwords.  The policy: allow list from the claim's annotation
``egress.agent-sandbox/allow``, else $EGRESS_ALLOW (default: nothing);
$EGRESS_SECRETS names a --secrets file for every tenant; records go to the
proxy's stdout.  Polling, not a watch: a few requests per round, and nothing
to resume after a dropped stream.  Exit 2 on a usage error, 1 when the API
or the gateway cannot be reached with --once.

After its first round that reached the API and the gateway it creates
``synced`` beside the control socket: the pod's readiness waits for it, so a
started or restarted replica takes no connection before it holds the tenants
(each replica's controller fills its own gateway from the same claims and
Secrets; the Secrets hold the passwords).

Environment: CONTROL (default /run/egress/control.sock), KUBERNETES_SERVICE_HOST
and _PORT, TOKEN_DIR (default /var/run/secrets/kubernetes.io/serviceaccount:
token, ca.crt, namespace), EGRESS_ALLOW, EGRESS_SECRETS.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docopt import docopt

from libegress.control import control_request

CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxclaims"
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxes"
SECRETS = "/api/v1/namespaces/{ns}/secrets"
CRED_LABEL = "agent-sandbox/egress-cred"
SANDBOX_LABEL = "egress.agent-sandbox/credential"  # on a Sandbox: mint it a credential
ALLOW_ANNOTATION = "egress.agent-sandbox/allow"
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# -- the pure part: what to do, from what is -------------------------------------------

@dataclass(frozen=True)
class Claim:
    """A SandboxClaim, or a labelled Sandbox (``kind``): what owns a credential."""

    name: str
    uid: str
    bound: bool
    allow: str | None
    kind: str = "SandboxClaim"

    @property
    def word(self) -> str:
        return "sandbox" if self.kind == "Sandbox" else "claim"

    @property
    def api_version(self) -> str:
        group = "agents.x-k8s.io" if self.kind == "Sandbox" else "extensions.agents.x-k8s.io"
        return f"{group}/v1beta1"


@dataclass
class Plan:
    add: list[tuple[Claim, str | None]] = field(default_factory=list)  # None: mint one
    remove: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # claim names no tenant can have


def plan(claims: list[Claim], passwords: dict[str, str], tenants: set[str]) -> Plan:
    """Tenants to add (with a stored password, or None to mint) and to remove."""
    out = Plan()
    wanted: set[str] = set()
    # Claims first: a Sandbox named as a bound claim gets nothing (one name, one tenant).
    for claim in sorted(claims, key=lambda c: c.kind != "SandboxClaim"):
        if not claim.bound:
            continue
        if not TENANT_NAME.fullmatch(claim.name) or claim.name in wanted:
            out.skipped.append(claim.name)
            continue
        wanted.add(claim.name)
        if claim.name not in tenants:
            out.add.append((claim, passwords.get(claim.name)))
    out.remove = sorted(tenants - wanted)
    return out


def claim_of(obj: dict[str, Any]) -> Claim:
    meta = obj.get("metadata", {})
    sandbox = (obj.get("status") or {}).get("sandbox") or {}
    allow = (meta.get("annotations") or {}).get(ALLOW_ANNOTATION)
    return Claim(str(meta["name"]), str(meta["uid"]), bool(sandbox.get("name")),
                 allow if isinstance(allow, str) else None)


def sandbox_of(obj: dict[str, Any]) -> Claim:
    """A labelled Sandbox: it exists, so it is "bound" to itself."""
    meta = obj.get("metadata", {})
    allow = (meta.get("annotations") or {}).get(ALLOW_ANNOTATION)
    return Claim(str(meta["name"]), str(meta["uid"]), True,
                 allow if isinstance(allow, str) else None, kind="Sandbox")


def stored_passwords(secret_list: dict[str, Any]) -> dict[str, str]:
    """Claim name -> password, from the credential Secrets."""
    out = {}
    for item in secret_list.get("items", []):
        data = item.get("data") or {}
        try:
            user = base64.b64decode(data["user"]).decode()
            out[user] = base64.b64decode(data["password"]).decode()
        except (KeyError, ValueError):
            continue  # not one of ours in shape: left alone
    return out


def cred_secret(claim: Claim, password: str) -> dict[str, Any]:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {
            "name": f"egress-cred-{claim.name}", "labels": {CRED_LABEL: "true"},
            "ownerReferences": [{"apiVersion": claim.api_version, "kind": claim.kind,
                                 "name": claim.name, "uid": claim.uid}],
        },
        "data": {"user": b64(claim.name), "password": b64(password)},
    }


# -- the I/O shell ------------------------------------------------------------------------

class Api:
    """The API server, with the pod's service account (token re-read each call: it rotates)."""

    def __init__(self, token_dir: Path) -> None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise SystemExit("claims_controller: KUBERNETES_SERVICE_HOST is not set")
        self.base = f"https://{host if ':' not in host else f'[{host}]'}:{port}"
        self.token_file = token_dir / "token"
        self.namespace = (token_dir / "namespace").read_text().strip()
        self.tls = ssl.create_default_context(cafile=str(token_dir / "ca.crt"))

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        # self.base is always https://HOST:PORT (built above), never another scheme.
        request = urllib.request.Request(self.base + path.format(ns=self.namespace),  # noqa: S310
                                         data=data, method=method)
        request.add_header("Authorization", "Bearer " + self.token_file.read_text().strip())
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, context=self.tls, timeout=10) as reply:  # noqa: S310
            return json.loads(reply.read() or b"{}")


def say(message: str) -> None:
    print(f"claims-controller: {message}", file=sys.stderr, flush=True)


def gateway(control: str, frame: dict[str, Any]) -> dict[str, Any]:
    reply = control_request(control, frame)
    if not reply.get("ok"):
        raise RuntimeError(f"gateway refused {frame['op']}: {reply.get('error')}")
    return reply


def policy(claim: Claim) -> dict[str, Any]:
    out: dict[str, Any] = {"allow": claim.allow if claim.allow is not None
                           else os.environ.get("EGRESS_ALLOW", ""),
                           "record": "/dev/stdout"}
    if os.environ.get("EGRESS_SECRETS"):
        out["secrets"] = os.environ["EGRESS_SECRETS"]
    return out


def one_round(api: Api, control: str) -> None:
    claims = [claim_of(o) for o in api.call("GET", CLAIMS).get("items", [])]
    labelled = urllib.parse.quote(f"{SANDBOX_LABEL}=true")
    claims += [sandbox_of(o) for o in
               api.call("GET", SANDBOXES + f"?labelSelector={labelled}").get("items", [])]
    selector = urllib.parse.quote(f"{CRED_LABEL}=true")
    passwords = stored_passwords(api.call("GET", SECRETS + f"?labelSelector={selector}"))
    tenants = {t["tenant"] for t in gateway(control, {"op": "list"})["tenants"]}
    todo = plan(claims, passwords, tenants)
    for name in todo.skipped:
        say(f"claim {name}: name too long, not a tenant name, or both a claim and a "
            "Sandbox; no credential")
    for claim, password in todo.add:
        # One claim's failure (a Secret of that name not ours, a policy the gateway
        # refuses) is logged and retried next round; it never holds up the others.
        try:
            if password is None:
                password = secrets.token_urlsafe(32)
                api.call("POST", SECRETS, cred_secret(claim, password))  # stored before it works
            gateway(control, {"op": "add", "tenant": claim.name, "password": password,
                              "policy": policy(claim)})
            say(f"{claim.word} {claim.name}: tenant added")
        except (OSError, RuntimeError) as exc:  # HTTPError and URLError are OSErrors
            say(f"{claim.word} {claim.name}: {type(exc).__name__}: {exc}")
    for name in todo.remove:
        gateway(control, {"op": "remove", "tenant": name})
        say(f"tenant {name} removed: its claim or Sandbox is gone or unbound")


def main(argv: list[str] | None = None) -> int:
    args = docopt(__doc__, argv=argv)
    try:
        every = float(args["--every"] or 2.0)
        if not 0.1 <= every <= 3600:
            raise ValueError
    except ValueError:
        print("claims_controller: --every must be 0.1 to 3600 seconds", file=sys.stderr)
        return 2
    listen = args["--credential-listen"]
    if listen is not None and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[0-9.]+):\d{1,5}", listen):
        print("claims_controller: --credential-listen must be HOST:PORT (an address)",
              file=sys.stderr)
        return 2
    token_dir = Path(os.environ.get("TOKEN_DIR", "/var/run/secrets/kubernetes.io/serviceaccount"))
    api = Api(token_dir)
    if listen is not None:
        from credential_endpoint import serve  # beside this script

        try:
            serve(api, listen)
        except (OSError, OverflowError) as exc:
            print(f"claims_controller: --credential-listen {listen}: {exc}", file=sys.stderr)
            return 2
    control = os.environ.get("CONTROL", "/run/egress/control.sock")
    synced = Path(control).parent / "synced"
    while True:
        try:
            one_round(api, control)
            synced.touch(mode=0o600)  # the readiness probe's file: every tenant is in
        except (OSError, urllib.error.URLError, RuntimeError, ValueError) as exc:
            say(f"round failed: {type(exc).__name__}: {exc}")
            if args["--once"]:
                return 1
        if args["--once"]:
            return 0
        time.sleep(every)


if __name__ == "__main__":
    sys.exit(main())
