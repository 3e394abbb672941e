"""Subcommands of the `rlstack` CLI, one module per feature."""
