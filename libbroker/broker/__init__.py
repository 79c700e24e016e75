"""The command broker: its conversation and the I/O shells around it.

- :mod:`.exchange`: the conversation as a state machine (pure);
- :mod:`.profile`: the ``--profile`` JSON, what every brokered command may do (pure);
- :mod:`.server`, :mod:`.connection`: the listening socket and one pump per client;
- :mod:`.client`, :mod:`.dial`: broker-client's side (per-call: imports budgeted);
- :mod:`.executor`, :mod:`.bwrap_executor`, :mod:`.landlock_executor`: a
  command started in :mod:`libbroker.sandbox`'s sandbox, one per request;
- :mod:`.ops`, :mod:`.audit`, :mod:`.pipes`: the ops, the audit log, pipe helpers.
"""
