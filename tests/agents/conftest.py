"""The fixtures of agents_world.py (a module of its own: a ``conftest`` import
would find another directory's conftest when several test directories run)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from agents_world import apis, world

__all__ = ["apis", "world"]
