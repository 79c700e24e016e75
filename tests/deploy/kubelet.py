"""What the kubelet does to a container's environment, for the manifests' tests.

Only the part the manifests rely on: the Services' variables (enableServiceLinks),
then ``env`` in order, ``secretKeyRef`` values from a Secret, ``$(NAME)``
expanded from the names defined before it (an unknown one stays as written,
``$$`` is a literal ``$``), as in Kubernetes' ``expansion.MappingFuncFor``.
"""

from __future__ import annotations

from typing import Any


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(NAME) expansion: names defined so far; $$ is a literal $."""
    out, i = "", 0
    while i < len(value):
        if value.startswith("$$", i):
            out, i = out + "$", i + 2
        elif value.startswith("$(", i) and ")" in value[i:]:
            end = value.index(")", i)
            name = value[i + 2:end]
            out += env.get(name, value[i:end + 1])  # an unknown name stays as written
            i = end + 1
        else:
            out, i = out + value[i], i + 1
    return out


def pod_env(container: dict[str, Any], secrets: dict[str, dict[str, str]],
            services: dict[str, str]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: the Services' variables,
    then ``env`` in order, secretKeyRef from ``secrets`` (name -> key -> value)."""
    env = dict(services)
    for item in container.get("env", []):
        if "valueFrom" in item:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            env[item["name"]] = expand(item.get("value", ""), env)
    return env
