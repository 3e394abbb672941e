"""Package names and versions compared the way installers compare them. Standard library at import time: the
native installer (rlstack.scripts.native_install) uses these on a GPU host before anything else is installed.

This is the one home of the PEP 503 normaliser and of the reader of installed versions (the probes record an
environment with it, the payload asks it which unsloth_zoo runs). scripts/image_checks.py keeps a copy of both,
because it runs by path inside the image build before rlstack (and this module) is installed.
"""

from __future__ import annotations

import re


def normalize(name: str) -> str:
    """PEP 503 name: 'Unsloth_Zoo' and 'unsloth-zoo' are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    """The normalized package name of a requirement line ('unsloth_zoo[x]==1 ; python_version>"3"' ->
    'unsloth-zoo'), parsed by packaging as installers parse it.

    packaging is imported here, not at the top: the native installer imports this module on a bare GPU host
    and never calls this function. Raises packaging.requirements.InvalidRequirement for a line that is not a
    requirement (an option such as '--index-url', a typo)."""
    from packaging.requirements import Requirement

    return normalize(Requirement(line).name)


def public_version(version: str) -> str:
    """The version without its local label: PyPI's torch 2.11.0 is the build other indexes call 2.11.0+cu130."""
    return version.split("+", 1)[0]


def installed_versions() -> dict[str, str]:
    """{normalized name: version} of the distributions this interpreter would import; where a name is on
    sys.path twice (an overlay in PYTHONPATH over site-packages), the first one wins, as it does for import."""
    import importlib.metadata as md

    out: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            out.setdefault(normalize(name), dist.version)
    return out
