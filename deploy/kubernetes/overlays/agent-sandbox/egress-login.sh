#!/bin/sh
# egress-login.sh COMMAND [ARG...]: in a warm pool's pod, wait until the pod is
# claimed, then run COMMAND with the claim's proxy credential in its proxy
# variables (docs/kubernetes.md, "A SandboxClaim from a warm pool").
#
# The pod proves itself with the token the kubelet projected for it (audience
# egress-gateway, bound to this pod) to the gateway's credential endpoint.
# 200: CLAIM:PASSWORD.  404: not claimed yet, asked again every 2 s.  Anything
# else ends here with status 1 and one line: without a credential every request
# would get 407 anyway, so the agent never starts half-configured.
set -eu
token_file=${EGRESS_TOKEN_FILE:-/var/run/egress-token/token}
host=${EGRESS_GATEWAY_SERVICE_HOST:?no EGRESS_GATEWAY_SERVICE_HOST (the egress-gateway Service must exist before the pod)}
url="http://$host:${EGRESS_GATEWAY_SERVICE_PORT_CREDENTIAL}/v1/credential"
body=$(mktemp)
trap 'rm -f "$body"' EXIT
while :; do
    # The token goes on stdin (printf is the shell's own): never in an argv.
    code=$(printf 'Authorization: Bearer %s\n' "$(cat "$token_file")" |
        curl -sS --noproxy '*' --max-time 10 -o "$body" -w '%{http_code}' -H @- "$url") ||
        code=000
    case $code in
        200) break ;;
        404|000|503) sleep "${EGRESS_LOGIN_EVERY:-2}" ;;
        *) echo "egress-login: the credential endpoint answered $code: $(head -c 200 "$body")" >&2
           exit 1 ;;
    esac
done
cred=$(head -n 1 "$body")
proxy="http://$cred@$host:${EGRESS_GATEWAY_SERVICE_PORT_HTTP}"
export HTTPS_PROXY="$proxy" https_proxy="$proxy" HTTP_PROXY="$proxy" http_proxy="$proxy"
export NO_PROXY="" no_proxy=""
exec "$@"
