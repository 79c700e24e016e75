"""The broker's conversation and, later, its I/O shells (LAYOUT.md: ``broker/``)."""
