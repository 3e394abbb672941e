"""Package names and versions compared the way installers compare them. Standard library only: the native
installer (rlstack.host.native) uses these on a GPU host before anything else is installed."""

from __future__ import annotations

import re


def normalize(name: str) -> str:
    """PEP 503 name: 'Unsloth_Zoo' and 'unsloth-zoo' are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public_version(version: str) -> str:
    """The version without its local label: PyPI's torch 2.11.0 is the build other indexes call 2.11.0+cu130."""
    return version.split("+", 1)[0]
