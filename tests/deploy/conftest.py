"""tests/deploy: the Kubernetes manifests and the gateway image's entry command."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from gateway_pod import gateway, upstream  # noqa: F401 - the fixtures, for every test here
