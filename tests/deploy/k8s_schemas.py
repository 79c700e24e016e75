"""Validation of rendered Kubernetes objects, offline.

Built-in kinds go to ``kubernetes-validate`` (its schemas ship inside the wheel,
nothing is downloaded), strict: an unknown field is an error, as the API
server's strict field validation makes it.  The agent-sandbox kinds go to the
CRDs' own OpenAPI schemas vendored under deploy/kubernetes/schemas/, tightened
the same way at load time (an object schema with ``properties`` refuses other
keys unless it says ``x-kubernetes-preserve-unknown-fields``).  A kind known to
neither is an error, never a silent pass.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
SCHEMAS = DEPLOY / "schemas"
CRD_GROUPS = ("agents.x-k8s.io", "extensions.agents.x-k8s.io")
# The oldest and the newest Kubernetes the bundled schemas cover that we claim.
K8S_VERSIONS = ("1.32.0", "1.37.0")


class Invalid(Exception):
    """An object that the cluster would refuse."""


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def crd_schema(group: str, version: str, kind: str) -> dict[str, Any]:
    path = SCHEMAS / f"{group}_{version}_{kind}.json"
    if not path.is_file():
        raise Invalid(f"no vendored schema for {group}/{version} {kind}")
    schema: dict[str, Any] = _strict(json.loads(path.read_text()))
    jsonschema.Draft4Validator.check_schema(schema)
    return schema


def validate(obj: dict[str, Any], k8s_version: str = K8S_VERSIONS[-1]) -> None:
    """Raise Invalid (with the path of the first error) unless ``obj`` is valid."""
    api = obj.get("apiVersion", "")
    group, _, version = api.rpartition("/")
    kind = obj.get("kind", "")
    if group in CRD_GROUPS:
        schema = crd_schema(group, version, kind)
        errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(obj),
                        key=lambda e: list(e.absolute_path))
        if errors:
            e = errors[0]
            raise Invalid(f"{kind}: {'.'.join(map(str, e.absolute_path))}: {e.message}")
        name = obj.get("metadata", {}).get("name")
        if not isinstance(name, str) or not name:
            raise Invalid(f"{kind}: metadata.name missing")
        return
    try:
        kubernetes_validate.validate(copy.deepcopy(obj), k8s_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(map(str, exc.path))
        raise Invalid(f"{kind}: {path}: {exc.message}") from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise Invalid(f"{kind}: no schema: {exc}") from None
