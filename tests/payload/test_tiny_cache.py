"""The tiny model's cache is checked before reuse, as the embedded model's is (no model is built here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.core.fileio import tree_hashes
from rlstack.payload import tiny
from rlstack.payload.recipes import TinySpec


def _cached(root: Path, spec: TinySpec) -> Path:
    folder = root / tiny.model_id(spec)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 64}')
    (folder / "model.safetensors").write_bytes(b"\x00weights" * 50)
    (folder / "tokenizer.json").write_text("{}")
    stamp = {"spec": spec.model_dump(mode="json"), "files": tree_hashes(folder, skip=tiny.STAMP)}
    (folder / tiny.STAMP).write_text(json.dumps(stamp))
    return folder


def test_an_intact_cache_is_reused(tmp_path: Path) -> None:
    spec = TinySpec()
    folder = _cached(tmp_path, spec)
    assert tiny.ensure(spec, tmp_path) == folder  # no build: the folder is what was recorded


@pytest.mark.parametrize("change", ["flip", "truncate", "extra", "missing", "symlink"])
def test_a_changed_cache_is_refused(tmp_path: Path, change: str) -> None:
    spec = TinySpec()
    folder = _cached(tmp_path, spec)
    weights = folder / "model.safetensors"
    if change == "flip":
        data = bytearray(weights.read_bytes())
        data[3] ^= 1
        weights.write_bytes(bytes(data))
    elif change == "truncate":
        weights.write_bytes(weights.read_bytes()[:10])
    elif change == "extra":
        (folder / "evil.py").write_text("x")
    elif change == "missing":
        (folder / "tokenizer.json").unlink()
    else:
        outside = tmp_path / "w"
        outside.write_bytes(weights.read_bytes())
        weights.unlink()
        weights.symlink_to(outside)
    with pytest.raises(tiny.TinyModelError, match="not the one built here") as exc:
        tiny.ensure(spec, tmp_path)
    assert f"delete {folder}" in str(exc.value.hint)


def test_a_folder_from_before_the_record_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Older caches stamped only the spec: they carry no hashes to check, so the (deterministic) build runs."""
    spec = TinySpec()
    folder = _cached(tmp_path, spec)
    (folder / tiny.STAMP).write_text(json.dumps(spec.model_dump(mode="json")))
    assert tiny.check_cached(spec, folder) is False
