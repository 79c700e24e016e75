"""deploy/kubernetes renders with kustomize and every object would be accepted.

`kubectl kustomize` renders the base and the agent-sandbox overlay; every
object is validated offline (k8s_schemas: kubernetes-validate for built-in
kinds, the vendored agent-sandbox CRD schemas for theirs), and broken objects
are shown refused.  The policies are checked to fit each other: sandbox pods
reach the gateway's pods on its ports and nothing else, DNS included.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schemas import DEPLOY, K8S_VERSIONS, SCHEMAS, Invalid, crd_schema, validate
from kubelet import pod_env

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl not installed (just setup-dev installs it); "
                            "the render cannot be checked")
TARGETS = ("base", "overlays/agent-sandbox")


def render(target: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / target)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return render("overlays/agent-sandbox")


def by_kind(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [obj] = [o for o in objs if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    return obj


SANDBOX_EXAMPLE = "examples/sandbox-with-credential.yaml"


@needs_kubectl
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_validates(target: str, version: str) -> None:
    objs = render(target)
    assert objs
    for obj in objs:
        validate(obj, version)


@needs_kubectl
def test_the_overlay_holds_the_gateway_and_the_agent_sandbox_objects(
        overlay: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in overlay)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment",
                     "Namespace", "NetworkPolicy", "NetworkPolicy", "Role", "RoleBinding",
                     "SandboxTemplate", "SandboxWarmPool", "Service", "ServiceAccount"]
    cluster_wide = ("Namespace", "ClusterRole", "ClusterRoleBinding")
    assert {o["metadata"].get("namespace") for o in overlay
            if o["kind"] not in cluster_wide} == {"agent-sandboxes"}
    pod = by_kind(overlay, "Deployment")["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"]} == {"localhost/agent-sandbox:0.1.0"}


@needs_kubectl
def test_only_the_controller_container_holds_an_api_token(
        overlay: list[dict[str, Any]]) -> None:
    pod = by_kind(overlay, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert by_kind(overlay, "ServiceAccount")["automountServiceAccountToken"] is False
    token_volumes = {v["name"] for v in pod["volumes"] if "projected" in v}
    holders = {c["name"] for c in pod["containers"]
               for m in c["volumeMounts"] if m["name"] in token_volumes}
    assert holders == {"claims-controller"}
    rules = by_kind(overlay, "Role")["rules"]
    assert {(r["apiGroups"][0], r["resources"][0], v) for r in rules for v in r["verbs"]} == {
        ("extensions.agents.x-k8s.io", "sandboxclaims", "get"),
        ("extensions.agents.x-k8s.io", "sandboxclaims", "list"),
        ("agents.x-k8s.io", "sandboxes", "list"),
        ("", "secrets", "list"), ("", "secrets", "create")}
    # Cluster-wide: only TokenReview (a warm pod's token), bound to this account only.
    [rule] = by_kind(overlay, "ClusterRole")["rules"]
    assert rule == {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
                    "verbs": ["create"]}
    binding = by_kind(overlay, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == by_kind(overlay, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "egress-gateway",
                                    "namespace": "agent-sandboxes"}]


@needs_kubectl
def test_a_warm_pods_only_token_is_for_the_gateway(overlay: list[dict[str, Any]]) -> None:
    """The template's pod holds a token the kubelet projects for the credential endpoint
    (audience egress-gateway, short-lived), never one the API server takes, and starts its
    agent through the overlay's egress-login.sh (the ConfigMap, executable, read-only)."""
    pod = by_kind(overlay, "SandboxTemplate")["spec"]["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    tokens = [src["serviceAccountToken"] for v in pod["volumes"] if "projected" in v
              for src in v["projected"]["sources"] if "serviceAccountToken" in src]
    assert tokens == [{"audience": "egress-gateway", "path": "token",
                       "expirationSeconds": 600}]
    [script] = [v for v in pod["volumes"] if "configMap" in v]
    assert script["configMap"] == {"name": "egress-login", "defaultMode": 0o555}
    config_map = by_kind(overlay, "ConfigMap", "egress-login")
    assert config_map["data"]["egress-login.sh"] == (
        DEPLOY / "overlays" / "agent-sandbox" / "egress-login.sh").read_text()
    [agent] = pod["containers"]
    assert all(m.get("readOnly") for m in agent["volumeMounts"])
    service = by_kind(overlay, "Service")
    assert {"name": "credential", "port": 8080, "targetPort": "credential",
            "protocol": "TCP"} in service["spec"]["ports"]
    controller = next(c for c in by_kind(overlay, "Deployment")["spec"]["template"]["spec"][
        "containers"] if c["name"] == "claims-controller")
    assert "--credential-listen=0.0.0.0:8080" in controller["command"]


def test_the_examples_validate() -> None:
    for path in sorted((DEPLOY / "examples").glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            validate(obj)


@needs_kubectl
def test_sandbox_pods_reach_only_the_gateway(overlay: list[dict[str, Any]]) -> None:
    template = by_kind(overlay, "SandboxTemplate")["spec"]
    gateway_pod = by_kind(overlay, "Deployment")["spec"]["template"]
    service = by_kind(overlay, "Service")
    assert template["networkPolicyManagement"] == "Managed"
    proxy_ports = {p["port"] for p in service["spec"]["ports"]}
    rules = template["networkPolicy"]["egress"]
    assert rules, "an empty egress list would be no rule at all"
    for rule in rules:
        # Every peer is the gateway's pods (no ipBlock, no namespaceSelector),
        # every port one of its proxy ports: no DNS, nothing else.
        assert rule["to"] and all(set(peer) == {"podSelector"} for peer in rule["to"])
        for peer in rule["to"]:
            wanted = peer["podSelector"]["matchLabels"].items()
            assert wanted <= gateway_pod["metadata"]["labels"].items()
        assert {(p["protocol"], p["port"]) for p in rule["ports"]} <= {
            ("TCP", port) for port in proxy_ports}
    assert template["networkPolicy"]["ingress"] == []
    # ... and the gateway lets exactly those pods in.
    policy = by_kind(overlay, "NetworkPolicy", "egress-gateway")["spec"]
    [allowed_in] = policy["ingress"]
    [peer] = allowed_in["from"]
    assert peer["podSelector"]["matchLabels"].items() <= (
        template["podTemplate"]["metadata"]["labels"].items())
    assert template["podTemplate"]["spec"]["automountServiceAccountToken"] is False
    # Every egress client pod, a Sandbox's made without a template too, is held
    # the same way by the namespace's own policy.
    clients = by_kind(overlay, "NetworkPolicy", "egress-clients")["spec"]
    assert clients["podSelector"]["matchLabels"] == peer["podSelector"]["matchLabels"]
    assert clients["policyTypes"] == ["Ingress", "Egress"] and clients["ingress"] == []
    assert clients["egress"] == rules


def test_a_direct_sandbox_takes_its_credential_from_its_own_secret() -> None:
    sandbox = _source(SANDBOX_EXAMPLE)
    validate(sandbox)
    name = sandbox["metadata"]["name"]
    assert sandbox["metadata"]["labels"]["egress.agent-sandbox/credential"] == "true"
    pod = sandbox["spec"]["podTemplate"]
    assert pod["metadata"]["labels"]["agent-sandbox/egress-client"] == "true"
    # The pod template is a valid core Pod too (strict, both Kubernetes versions).
    for version in K8S_VERSIONS:
        validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                  "spec": pod["spec"]}, version)
    [agent] = pod["spec"]["containers"]
    # Every reference to a Secret is this Sandbox's credential, mounted read-only.
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in agent["env"] if "valueFrom" in e}
    vols = {v["name"]: v["secret"]["secretName"] for v in pod["spec"]["volumes"]}
    assert refs == set(vols.values()) == {f"egress-cred-{name}"}
    assert [m["readOnly"] for m in agent["volumeMounts"] if m["name"] in vols] == [True]
    # The proxy variables, expanded as the kubelet would with the controller's Secret.
    env = pod_env(agent, {f"egress-cred-{name}": {"user": name, "password": "p-4_Z"}},
                  {"EGRESS_GATEWAY_SERVICE_HOST": "10.0.0.7",
                   "EGRESS_GATEWAY_SERVICE_PORT_HTTP": "3128"})
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        assert env[var] == f"http://{name}:p-4_Z@10.0.0.7:3128", var
    assert env["NO_PROXY"] == ""


def test_the_vendored_schemas_are_noted_with_their_upstream_commit() -> None:
    note = (SCHEMAS / "UPSTREAM").read_text()
    assert "commit: 2fd412d55ecae90861a101a5424a75473de97c36" in note
    assert sorted(p.name for p in SCHEMAS.glob("*.json")) == [
        "agents.x-k8s.io_v1beta1_Sandbox.json",
        "extensions.agents.x-k8s.io_v1beta1_SandboxClaim.json",
        "extensions.agents.x-k8s.io_v1beta1_SandboxTemplate.json",
        "extensions.agents.x-k8s.io_v1beta1_SandboxWarmPool.json",
    ]
    for path in SCHEMAS.glob("*.json"):
        group, version, kind = path.stem.split("_")
        assert crd_schema(group, version, kind)["type"] == "object"


def _source(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((DEPLOY / name).read_text())
    return obj


def _broken() -> list[tuple[str, dict[str, Any], str]]:
    cases: list[tuple[str, dict[str, Any], str]] = []
    dep = _source("base/gateway-deployment.yaml")
    bad = copy.deepcopy(dep)
    bad["spec"]["replicas"] = "one"
    cases.append(("replicas not an integer", bad, "replicas"))
    bad = copy.deepcopy(dep)
    container = bad["spec"]["template"]["spec"]["containers"][0]
    container["comand"] = container.pop("command")
    cases.append(("misspelt field", bad, "comand"))
    bad = copy.deepcopy(dep)
    del bad["spec"]["selector"]
    cases.append(("required field missing", bad, "selector"))
    tpl = _source("overlays/agent-sandbox/sandboxtemplate.yaml")
    bad = copy.deepcopy(tpl)
    bad["spec"]["networkPolicy"]["egres"] = bad["spec"]["networkPolicy"].pop("egress")
    cases.append(("CRD: misspelt field", bad, "egres"))
    bad = copy.deepcopy(tpl)
    bad["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = [{"containerPort": "x"}]
    cases.append(("CRD: wrong type deep in the pod template", bad, "containerPort"))
    bad = copy.deepcopy(tpl)
    bad["spec"]["networkPolicyManagement"] = "Sometimes"
    cases.append(("CRD: value not in its enum", bad, "Sometimes"))
    pool = _source("overlays/agent-sandbox/sandboxwarmpool.yaml")
    bad = copy.deepcopy(pool)
    del bad["spec"]["sandboxTemplateRef"]
    cases.append(("CRD: required field missing", bad, "sandboxTemplateRef"))
    bad = copy.deepcopy(pool)
    bad["apiVersion"] = "extensions.agents.x-k8s.io/v9"
    cases.append(("CRD version not vendored", bad, "no vendored schema"))
    bad = copy.deepcopy(pool)
    bad["apiVersion"], bad["kind"] = "example.com/v1", "Widget"
    cases.append(("unknown kind", bad, "Widget"))
    sandbox = _source(SANDBOX_EXAMPLE)
    bad = copy.deepcopy(sandbox)
    env = bad["spec"]["podTemplate"]["spec"]["containers"][0]["env"]
    env[0]["valueFrom"]["secretRef"] = env[0]["valueFrom"].pop("secretKeyRef")
    cases.append(("CRD: misspelt secretKeyRef in a Sandbox's pod", bad, "secretRef"))
    bad = copy.deepcopy(sandbox)
    bad["spec"]["podTemplate"]["spec"]["volumes"][0]["secret"]["defaultMode"] = "0440"
    cases.append(("CRD: a Secret volume's mode as a string", bad, "defaultMode"))
    return cases


@pytest.mark.parametrize(("what", "obj", "said"), _broken(), ids=lambda c: c
                         if isinstance(c, str) and " " in c else "")
def test_a_broken_object_is_refused(what: str, obj: dict[str, Any], said: str) -> None:
    with pytest.raises(Invalid) as caught:
        validate(obj)
    assert said in str(caught.value), str(caught.value)


@pytest.mark.parametrize("name", ["base/gateway-deployment.yaml",
                                  "overlays/agent-sandbox/sandboxtemplate.yaml",
                                  "overlays/agent-sandbox/sandboxwarmpool.yaml",
                                  SANDBOX_EXAMPLE])
def test_the_unbroken_sources_pass(name: str) -> None:
    validate(_source(name))


def test_kustomize_files_list_only_existing_resources() -> None:
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        for res in yaml.safe_load(kfile.read_text()).get("resources", []):
            assert (kfile.parent / res).exists(), f"{kfile}: {res}"


def test_no_secret_value_is_committed() -> None:
    for path in DEPLOY.rglob("*.yaml"):
        for obj in yaml.safe_load_all(path.read_text()):
            if path.parent.name != "schemas" and obj:
                assert obj.get("kind") != "Secret", f"{path}: create Secrets out of band"
    assert Path(DEPLOY / "examples" / "egress-gateway-secrets.json").is_file()


@needs_kubectl
def test_every_pod_meets_the_restricted_pod_security_profile(
        overlay: list[dict[str, Any]]) -> None:
    # The namespace enforces "restricted": a pod that misses one of these is refused
    # at admission, which no offline schema check would show.
    assert by_kind(overlay, "Namespace")["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"
    pods = [by_kind(overlay, "Deployment")["spec"]["template"]["spec"],
            by_kind(overlay, "SandboxTemplate")["spec"]["podTemplate"]["spec"],
            _source(SANDBOX_EXAMPLE)["spec"]["podTemplate"]["spec"]]
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostNetwork" not in pod and "hostPID" not in pod
        for c in pod["containers"] + pod.get("initContainers", []):
            ctx = c["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, c["name"]
            assert ctx["capabilities"]["drop"] == ["ALL"], c["name"]
            assert "add" not in ctx["capabilities"] and not ctx.get("privileged"), c["name"]
        allowed = {"emptyDir", "secret", "configMap", "projected", "downwardAPI",
                   "persistentVolumeClaim", "ephemeral", "csi"}
        for volume in pod.get("volumes", []):
            assert set(volume) - {"name"} <= allowed, volume
