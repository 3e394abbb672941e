"""An image on a host without Docker: exported here, assembled from its manifest and parts, run in a private
mount namespace with a read-only root, tmpfs, a volume and the image's user (rlstack.scripts.rootfs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlstack import stacks
from rlstack.host import rootfs
from rlstack.scripts import rootfs as runner

SRC = Path(__file__).resolve().parents[3] / "src"


def _namespaces_work() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and \
        subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="needs root and mount namespaces (unshare -m)")
def test_export_assemble_run_round_trip(base_image: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = rootfs.export(stacks.load_stack("cpu"), base_image, out, preset=0)
    assert summary["parts"] >= 1 and summary["files"] > 1000
    root = tmp_path / "root"
    report = runner.assemble(runner.load_manifest(out / runner.MANIFEST), out, root, [])
    assert report["entries"] == summary["entries"]
    assert (root / "etc" / "os-release").is_file()
    spec = {"image": base_image, "user": "1000:1000", "workdir": "/", "entrypoint": [],
            "env": {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, "read_only_root": True,
            "tmpfs": [{"path": "/tmp", "options": "rw,nosuid,nodev,mode=1777"}],
            "volumes": [{"name": "runs", "target": "/mnt", "read_only": False}], "gpus": False}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    script = "id -u; touch /rootfs-write 2>/dev/null && echo root-writable; touch /tmp/t && echo tmp-ok; " \
             "echo kept > /mnt/file; ls /usr/local/nvidia 2>/dev/null || echo no-driver"
    proc = subprocess.run(
        [sys.executable, "-m", "rlstack.scripts.rootfs", "run", "--root", str(root), "--spec",
         str(tmp_path / "spec.json"), "--volumes", str(tmp_path / "vol"), "--", "sh", "-c", script],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1000", "tmp-ok", "no-driver"]
    assert (tmp_path / "vol" / "runs" / "file").read_text() == "kept\n"
    assert not (root / "tmp" / "t").exists()  # tmpfs: gone with the namespace


def test_an_export_over_earlier_ones_carries_only_what_they_lack(base_image: str, tmp_path: Path) -> None:
    """--previous: contents an export the host holds already has stay out of the parts, and the tree assembles
    from the parts of both."""
    first = tmp_path / "first"
    rootfs.export(stacks.load_stack("cpu"), base_image, first, preset=0)
    again = tmp_path / "again"
    summary = rootfs.export(stacks.load_stack("cpu"), base_image, again, preset=0, previous=[first])
    assert summary["files"] > 1000 and summary["shipped_bytes"] == 0
    manifest = runner.load_manifest(again / runner.MANIFEST)
    with pytest.raises(runner.RootfsError):  # its own parts alone cannot make the tree
        runner.assemble(manifest, again, tmp_path / "alone", [])
    report = runner.assemble(manifest, [again, first], tmp_path / "root", [])
    assert report["entries"] == summary["entries"] and (tmp_path / "root" / "etc" / "os-release").is_file()


@pytest.mark.skipif(not _namespaces_work(), reason="needs root and mount namespaces (unshare -m)")
def test_a_tampered_tree_is_refused(base_image: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rootfs.export(stacks.load_stack("cpu"), base_image, out, preset=0)
    manifest = runner.load_manifest(out / runner.MANIFEST)
    victim = next(e for e in manifest["entries"] if e[0] == "f" and e[5] > 0)
    victim[6] = "0" * 64  # the manifest now says another content: assembly must notice
    with pytest.raises(runner.RootfsError):
        runner.assemble(manifest, out, tmp_path / "root", [])
