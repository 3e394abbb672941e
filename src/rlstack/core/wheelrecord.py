"""A wheel's RECORD (PEP 376/427): one parser and one digest encoding for both sides that check wheel members
against it (the host's native staging rewrites every member; the probes read a few by HTTP range)."""

from __future__ import annotations

import base64
import csv
import io


def b64_digest(digest: bytes) -> str:
    """A hash digest as RECORD writes it: urlsafe base64 without padding."""
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def parse(text: str) -> dict[str, tuple[str, str]]:
    """{member path: (hash algorithm, digest)} from RECORD's CSV text; ("", "") where a row gives no hash
    (RECORD itself, signatures). CSV, not a split on commas: a path may be quoted."""
    rows: dict[str, tuple[str, str]] = {}
    for row in csv.reader(io.StringIO(text)):
        if row and row[0]:
            algo, _, digest = (row[1] if len(row) > 1 else "").partition("=")
            rows[row[0]] = (algo, digest)
    return rows
