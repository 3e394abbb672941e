"""Shared fixtures of the probe tests: small handmade packages, written as wheels, read as locked sources."""

from __future__ import annotations

import textwrap
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from rlstack.probes.wheels import LocalWheel, RemoteWheel, SourceSet
from rlstack.stacks.locks import LockedPackage

# (folder, {package: {member: source}}, {package: version}) -> the packages' sources and their lock entries
Handmade = Callable[
    [Path, Mapping[str, Mapping[str, str]], Mapping[str, str]], tuple[SourceSet, dict[str, LockedPackage]]
]


def _handmade(
    tmp: Path, packages: Mapping[str, Mapping[str, str]], versions: Mapping[str, str]
) -> tuple[SourceSet, dict[str, LockedPackage]]:
    wheels: dict[str, Path | RemoteWheel | LocalWheel] = {}
    for name, files in packages.items():
        (tmp / name).mkdir(parents=True, exist_ok=True)
        path = tmp / name / f"{name}-1.0-py3-none-any.whl"
        wheels[name] = path
        with zipfile.ZipFile(path, "w") as z:
            for member, text in files.items():
                z.writestr(member, textwrap.dedent(text))
    locked = {n: LockedPackage(n, versions.get(n, "1.0"), frozenset()) for n in packages}
    return SourceSet(wheels), locked


@pytest.fixture
def handmade() -> Handmade:
    """Writes each package's files (dedented) into a wheel under the folder, and returns the wheels as a
    SourceSet with a lock entry per package (version 1.0 unless `versions` names one)."""
    return _handmade
