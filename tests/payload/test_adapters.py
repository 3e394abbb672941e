"""The adapter store: atomic writes, manifest verification, listing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.payload import adapters
from rlstack.payload.adapters import (
    AdapterError,
    BaseModelMismatchError,
    IntegrityError,
    ManifestError,
    scan,
    verify,
    write_adapter,
)


def _fill(d: Path) -> None:
    (d / "adapter_model.safetensors").write_bytes(b"\x00weights" * 100)
    (d / "adapter_config.json").write_text('{"r": 8}')
    (d / "tok").mkdir()
    (d / "tok" / "tokenizer.json").write_text("{}")


def _write(root: Path, name: str = "a1", **kw: object) -> Path:
    write_adapter(root, name, _fill, base_model="tiny/base", recipe={"lr": 1e-4}, metrics={"reward": 1.0},
                  stack="cpu", lock_hash="abc", **kw)  # type: ignore[arg-type]
    return root / name


def test_write_then_verify(tmp_path: Path) -> None:
    d = _write(tmp_path)
    m = verify(d, expected_base_model="tiny/base")
    assert m.name == "a1" and m.stack == "cpu" and m.lock_hash == "abc"
    assert set(m.files) == {"adapter_model.safetensors", "adapter_config.json", "tok/tokenizer.json"}
    assert m.recipe == {"lr": 1e-4} and m.metrics == {"reward": 1.0}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_failed_fill_leaves_nothing(tmp_path: Path) -> None:
    def boom(d: Path) -> None:
        (d / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_adapter(tmp_path, "a1", boom, base_model="b", stack="s", lock_hash=None)
    assert list(tmp_path.iterdir()) == []


def test_existing_name_refused_unless_overwrite(tmp_path: Path) -> None:
    _write(tmp_path)
    with pytest.raises(AdapterError, match="already exists"):
        _write(tmp_path)
    _write(tmp_path, overwrite=True)
    verify(tmp_path / "a1")
    assert [p.name for p in tmp_path.iterdir()] == ["a1"]


def test_bad_name(tmp_path: Path) -> None:
    from rlstack.core.names import InvalidNameError

    for name in ("../evil", "a/b", "", "x" * 129, "sp ace"):
        with pytest.raises(InvalidNameError, match="adapter name"):
            _write(tmp_path, name=name)
    assert list(tmp_path.iterdir()) == []


def test_a_file_symlinked_out_of_the_store_is_tampering(tmp_path: Path) -> None:
    """The link's target has the recorded bytes, so the hash check alone passed it."""
    d = _write(tmp_path / "store")
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((d / "adapter_model.safetensors").read_bytes())
    (d / "adapter_model.safetensors").unlink()
    (d / "adapter_model.safetensors").symlink_to(outside)
    with pytest.raises(IntegrityError, match="symlink.*adapter_model.safetensors") as exc:
        verify(d)
    assert exc.value.exit_code == 6


def test_a_symlinked_adapter_folder_is_tampering(tmp_path: Path) -> None:
    real = _write(tmp_path / "elsewhere")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "a1").symlink_to(real, target_is_directory=True)
    with pytest.raises(IntegrityError, match="adapter folder is a symlink"):
        verify(tmp_path / "store" / "a1")
    [entry] = scan(tmp_path / "store", check_files=True)
    assert not entry.ok and "symlink" in str(entry.problem)


def test_a_symlinked_sub_folder_is_tampering(tmp_path: Path) -> None:
    d = _write(tmp_path / "store")
    other = tmp_path / "tok-elsewhere"
    (d / "tok").rename(other)
    (d / "tok").symlink_to(other, target_is_directory=True)
    with pytest.raises(IntegrityError, match="symlink.*tok"):
        verify(d)


@pytest.mark.parametrize("bad", ["../outside.bin", "/etc/hostname", "tok/../adapter_config.json", "./x", "a//b",
                                 "manifest.json"])
def test_manifest_paths_outside_the_folder_are_tampering_not_missing(tmp_path: Path, bad: str) -> None:
    d = _write(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["files"][bad] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IntegrityError, match="not plain files inside the adapter folder") as exc:
        verify(d)
    assert "missing" not in exc.value.message


def test_binary_manifest_is_a_clear_error(tmp_path: Path) -> None:
    d = _write(tmp_path)
    (d / "manifest.json").write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(ManifestError, match="not valid JSON"):
        verify(d)


def test_tampered_file_named(tmp_path: Path) -> None:
    d = _write(tmp_path)
    (d / "adapter_config.json").write_text('{"r": 64}')
    with pytest.raises(IntegrityError, match="adapter_config.json"):
        verify(d)


def test_truncated_file_named(tmp_path: Path) -> None:
    d = _write(tmp_path)
    p = d / "adapter_model.safetensors"
    p.write_bytes(p.read_bytes()[:10])
    with pytest.raises(IntegrityError, match="adapter_model.safetensors"):
        verify(d)


def test_missing_file_named(tmp_path: Path) -> None:
    d = _write(tmp_path)
    (d / "tok" / "tokenizer.json").unlink()
    with pytest.raises(IntegrityError, match="missing: tok/tokenizer.json"):
        verify(d)


def test_extra_file_named(tmp_path: Path) -> None:
    d = _write(tmp_path)
    (d / "sneaky.py").write_text("print(1)")
    with pytest.raises(IntegrityError, match="sneaky.py"):
        verify(d)


def test_wrong_base_model(tmp_path: Path) -> None:
    d = _write(tmp_path)
    with pytest.raises(BaseModelMismatchError, match="tiny/base"):
        verify(d, expected_base_model="unsloth/Qwen3-4B")


def test_missing_manifest(tmp_path: Path) -> None:
    d = _write(tmp_path)
    (d / "manifest.json").unlink()
    with pytest.raises(ManifestError, match=r"no manifest\.json"):
        verify(d)


@pytest.mark.parametrize(
    ("content", "match"),
    [("{not json", "not valid JSON"), ('{"name": "a1"}', "base_model"), ("[]", "malformed")],
)
def test_malformed_manifest(tmp_path: Path, content: str, match: str) -> None:
    d = _write(tmp_path)
    (d / "manifest.json").write_text(content)
    with pytest.raises(ManifestError, match=match):
        verify(d)


def test_manifest_unknown_field_refused(tmp_path: Path) -> None:
    d = _write(tmp_path)
    data = json.loads((d / "manifest.json").read_text())
    data["surprise"] = 1
    (d / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="surprise"):
        verify(d)


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="no such adapter"):
        verify(tmp_path / "nope")


def test_scan_shows_broken_adapters_and_skips_temporary_folders(tmp_path: Path) -> None:
    _write(tmp_path, name="b")
    _write(tmp_path, name="a")
    (tmp_path / ".tmp-c-1234").mkdir()
    (tmp_path / "broken").mkdir()
    entries = scan(tmp_path)
    assert [(e.folder.name, e.ok) for e in entries] == [("a", True), ("b", True), ("broken", False)]
    assert "no manifest.json" in (entries[2].problem or "")
    assert scan(tmp_path / "absent") == []


def test_verify_checks_every_adapter_and_reports_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlstack.payload import commands

    for name in ("a", "b", "c"):
        _write(tmp_path, name=name)
    (tmp_path / "a" / "adapter_model.safetensors").write_bytes(b"tampered")
    (tmp_path / "c" / "manifest.json").write_text("{")
    assert commands.adapters(root=tmp_path, verify=True) == IntegrityError.exit_code
    out, err = capsys.readouterr()
    lines = {ln.split()[0]: ln for ln in out.splitlines()[2:]}
    assert "BAD" in lines["a"] and "sha256" in lines["a"]
    assert "ok, hashes checked" in lines["b"]
    assert "BAD" in lines["c"] and "not valid JSON" in lines["c"]
    assert "3 adapter(s)" in err and "2 bad" in err and "sha256 checked" in err
    (tmp_path / "a").rename(tmp_path / "a-moved")  # the store is read by folder, not by manifest name
    import shutil

    shutil.rmtree(tmp_path / "c")
    assert commands.adapters(root=tmp_path, verify=True) == IntegrityError.exit_code
    (tmp_path / "a-moved" / "adapter_model.safetensors").unlink()
    _write(tmp_path / "fresh", name="x")
    assert commands.adapters(root=tmp_path / "fresh", verify=True) == 0
    assert "0 bad (every file's sha256 checked" in capsys.readouterr().err


def test_default_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path))
    assert adapters.default_root() == tmp_path
    monkeypatch.delenv("RLSTACK_ADAPTERS")
    expected = Path("/adapters") if Path("/adapters").is_dir() else Path("runs") / "adapters"
    assert adapters.default_root() == expected


def test_find_adapter_by_name_and_path(tmp_path: Path) -> None:
    d = _write(tmp_path)
    assert adapters.find_adapter("a1", root=tmp_path) == tmp_path / "a1"
    assert adapters.find_adapter(str(d)) == d
    with pytest.raises(AdapterError, match="not found"):
        adapters.find_adapter("zzz", root=tmp_path)


@pytest.mark.parametrize("spec", ["a" * 300, "my adapter", "-rf", "módel"])
def test_find_adapter_checks_a_name_before_it_becomes_a_path(tmp_path: Path, spec: str) -> None:
    """A name past the file system's limit was an OSError traceback from is_dir (`eval --adapter aaa...`)."""
    from rlstack.core.names import InvalidNameError

    with pytest.raises(InvalidNameError, match="--adapter"):
        adapters.find_adapter(spec, root=tmp_path)


def test_find_adapter_path_past_the_name_limit_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="not found"):
        adapters.find_adapter(str(tmp_path / ("b" * 300) / "x"), root=tmp_path)


def test_lock_hash_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSTACK_LOCK_HASH", "deadbeef")
    assert adapters.resolve_lock_hash() == "deadbeef"
