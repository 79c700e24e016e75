"""Vendor the agent-sandbox CRDs' OpenAPI schemas (one JSON file per kind and version).

Usage: python vendor_crds.py CRD.yaml... (from a checkout of
kubernetes-sigs/agent-sandbox, its k8s/crds/ directory); record the checkout's
``git describe --tags`` and commit in UPSTREAM beside this file.  The schemas are
copied verbatim (``openAPIV3Schema`` of each served, not deprecated version); tests/deploy tightens
them at load time (unknown fields refused, as the API server's strict field
validation does), so the files stay comparable with upstream.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def main(paths: list[str]) -> None:
    for path in paths:
        crd = yaml.safe_load(Path(path).read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if not version.get("served") or version.get("deprecated"):
                continue
            out = HERE / f"{group}_{version['name']}_{kind}.json"
            schema = version["schema"]["openAPIV3Schema"]
            out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            print(out.name)


if __name__ == "__main__":
    main(sys.argv[1:])
