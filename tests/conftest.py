"""Shared fixtures: a throwaway stack tree for bad-input tests, so real stack files are never edited."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def stack_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of images/ + pyproject.toml under tmp_path, with RLSTACK_ROOT pointing at it."""
    shutil.copytree(ROOT / "images", tmp_path / "images", ignore=shutil.ignore_patterns("Dockerfile*"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    monkeypatch.setenv("RLSTACK_ROOT", str(tmp_path))
    from rlstack.core import paths

    paths.project_root.cache_clear()
    yield tmp_path
    paths.project_root.cache_clear()


@pytest.fixture(autouse=True)
def _own_settings_file(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's invoke.yaml (machine settings) must not change what the tests see."""
    monkeypatch.setenv("RLSTACK_SETTINGS_FILE", str(tmp_path_factory.mktemp("settings") / "invoke.yaml"))
