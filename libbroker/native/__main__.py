"""``python3 -m libbroker.native``: build the native helpers (``just setup`` runs it)."""

from libbroker.native import main

main()
