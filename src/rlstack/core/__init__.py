"""Shared by both sides: errors, paths, file and name helpers, tables, option declarations."""
