"""Where the project's data lives. The repo root is found, not assumed, so the CLI works from any folder
and inside images (where the project is installed at /opt/rlstack/src)."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path


@cache
def project_root() -> Path:
    """The folder holding images/ and recipes/: $RLSTACK_ROOT, else the nearest parent of cwd or of this
    file that has both."""
    env = os.environ.get("RLSTACK_ROOT")
    if env:
        return Path(env).resolve()
    for start in (Path.cwd(), Path(__file__).resolve()):
        for candidate in (start, *start.parents):
            if (candidate / "images").is_dir() and (candidate / "pyproject.toml").is_file():
                return candidate
    return Path(__file__).resolve().parents[3]


def images_dir() -> Path:
    return project_root() / "images"


def recipes_dir() -> Path:
    return project_root() / "recipes"


PATH_MAP_ENV = "RLSTACK_PATH_MAP"


def shown(path: Path | str) -> str:
    """A path as the user can open it. Inside a container the host passes $RLSTACK_PATH_MAP (JSON:
    container folder -> host folder, for the mounts it made), so messages and results name the file the user
    has, not /mnt/inputs/0-recipe.toml; elsewhere the path is unchanged."""
    text = str(path)
    try:
        mapping = json.loads(os.environ.get(PATH_MAP_ENV) or "{}")
    except ValueError:
        return text
    for inner in sorted(mapping, key=len, reverse=True):
        if text == inner or text.startswith(inner.rstrip("/") + "/"):
            return str(mapping[inner]) + text[len(inner.rstrip("/")):]
    return text
