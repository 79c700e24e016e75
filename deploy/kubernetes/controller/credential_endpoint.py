"""egress-gateway's credential endpoint: a warm pool's pod asks for its claim's credential.

Started by ``claims_controller.py --credential-listen=HOST:PORT`` (a thread of
the controller container, which holds the API token).  A warm pool's pods exist
before their claims and share one pod template, so no template can name a
claim's Secret; the pod asks when its agent starts (``egress-login.sh``), and
proves which pod it is with a token the kubelet minted for that pod: a
projected service-account token with audience ``egress-gateway`` (the API
server refuses it: it opens no API), bound to the pod's name and uid.

    GET /v1/credential        Authorization: Bearer TOKEN

1. A TokenReview (audience ``egress-gateway``) says whether the token is valid:
   signed, unexpired, its pod still there with that uid (the API server checks
   a bound token's object).  Its user must be a service account of this
   namespace, and its extra fields must name the pod.
2. The bound SandboxClaim whose Sandbox runs that pod (the Sandbox's
   ``agents.x-k8s.io/pod-name`` annotation, set when it adopts a warm pod, else
   the Sandbox's own name: agent-sandbox's ``resolvePodName``).
3. The claim's password from Secret ``egress-cred-CLAIM`` (the loop mints it).

Replies, in text: 200 ``CLAIM:PASSWORD``; 404 not claimed yet (ask again);
401 a token refused; 503 the API not reached.  Each refusal is one log line
naming the pod when known, never the token or the password.  Plain HTTP on the
pod network, like the proxy's own credential on 3128.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from claims_controller import (
    CLAIMS,
    CRED_LABEL,
    SANDBOXES,
    SECRETS,
    Api,
    claim_of,
    say,
    stored_passwords,
)

AUDIENCE = "egress-gateway"
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
POD_ANNOTATION = "agents.x-k8s.io/pod-name"
MAX_TOKEN = 8192


# -- the pure part -------------------------------------------------------------------------

def pod_of_review(review: dict[str, Any], namespace: str) -> str | None:
    """The pod a TokenReview's answer names, when the token is good for us; else None."""
    status = review.get("status") or {}
    if status.get("authenticated") is not True or AUDIENCE not in (status.get("audiences") or []):
        return None
    user = status.get("user") or {}
    if not str(user.get("username", "")).startswith(f"system:serviceaccount:{namespace}:"):
        return None  # another namespace's pod: not one of ours
    extra = user.get("extra") or {}
    names, uids = extra.get(POD_NAME) or [], extra.get(POD_UID) or []
    if len(names) != 1 or len(uids) != 1 or not names[0]:
        return None  # a token not bound to a pod
    return str(names[0])


def pod_name(sandbox: dict[str, Any]) -> str:
    """The pod a Sandbox runs: the adopted warm pod's name, else its own (resolvePodName)."""
    meta = sandbox.get("metadata") or {}
    adopted = (meta.get("annotations") or {}).get(POD_ANNOTATION)
    return adopted if isinstance(adopted, str) and adopted else str(meta.get("name", ""))


def claim_for_pod(claims: list[dict[str, Any]], sandboxes: list[dict[str, Any]],
                  pod: str) -> str | None:
    """The one bound claim whose Sandbox runs ``pod``; None when none (or, never, two)."""
    runs = {str((s.get("metadata") or {}).get("name", "")): pod_name(s) for s in sandboxes}
    found = [c.name for c, obj in ((claim_of(o), o) for o in claims) if c.bound
             and runs.get(str(((obj.get("status") or {}).get("sandbox") or {}).get("name")))
             == pod]
    return found[0] if len(found) == 1 else None


# -- the I/O shell -------------------------------------------------------------------------

def answer(api: Api, token: str) -> tuple[int, str, str]:
    """(status, body, log line) for a request with ``token``."""
    if not token or len(token) > MAX_TOKEN:
        return 401, "no token\n", "credential refused: no bearer token"
    try:
        review = api.call("POST", REVIEWS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": [AUDIENCE]}})
        pod = pod_of_review(review, api.namespace)
        if pod is None:
            return 401, "token refused\n", "credential refused: a token not of a pod here"
        claim = claim_for_pod(api.call("GET", CLAIMS).get("items", []),
                              api.call("GET", SANDBOXES).get("items", []), pod)
        if claim is None:
            return 404, "not claimed yet\n", ""
        selector = urllib.parse.quote(f"{CRED_LABEL}=true")
        password = stored_passwords(api.call("GET", SECRETS + f"?labelSelector={selector}")
                                    ).get(claim)
    except (OSError, ValueError) as exc:  # HTTPError, URLError, a reply not JSON
        return 503, "the API was not reached\n", f"credential: {type(exc).__name__}"
    if password is None:
        return 404, "not claimed yet\n", ""  # the loop mints it within a round
    return 200, f"{claim}:{password}\n", f"credential given to pod {pod} (claim {claim})"


def serve(api: Api, listen: str) -> ThreadingHTTPServer:
    """The endpoint on ``listen`` (HOST:PORT) in a daemon thread; the server."""
    host, _, port = listen.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/v1/credential":
                self._send(404, "no such path\n")
                return
            auth = self.headers.get("Authorization", "")
            code, body, line = answer(api, auth[7:] if auth.startswith("Bearer ") else "")
            if line:
                say(line)
            self._send(code, body)

        def _send(self, code: int, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass  # one line per refusal or grant is said above; no request line

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET

    server = Server((host.strip("[]"), int(port)), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    say(f"credential endpoint on {host}:{server.server_address[1]}")
    return server
