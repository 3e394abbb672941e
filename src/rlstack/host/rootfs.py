"""An image for a GPU host without Docker: its root filesystem as a manifest plus xz parts, and the spec of how
`invoke train` runs it (rlstack.scripts.rootfs assembles and runs both there).

What travels is the image's own tree, `docker export` of a container made from it: every entry (folders,
links, modes, owners) in the manifest and every file's sha256. File contents go into the parts, except the
large files of wheels the GPU host already has installed at the same version whose wheel does not depend on the
Python version (py3-none, abi3): those are copied from the host there, after their sha256 is checked against the
image's, so a host with the same CUDA libraries does not receive them again. Nothing else of the host is used.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import subprocess
import tarfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlstack.core.errors import DockerError
from rlstack.core.pkgnames import normalize
from rlstack.host import containers, engine
from rlstack.host.native import XzParts, read_host_packages
from rlstack.scripts.rootfs import MANIFEST
from rlstack.stacks.model import Stack

HOST_MIN_BYTES = 1 << 20  # smaller files travel: cheap, and fewer host lookups
SPEC = "rootfs-spec.json"  # how the image runs there (run_spec)
PART_BYTES = 55 << 20  # under the GPU lender's 64 MiB a call, with room for a working tree of ~8 MB
# Lists every distribution of the image with its wheel tags and files (run inside the image, its own Python).
LIST_DISTS = """
import importlib.metadata as md, json, sys
out = []
for d in md.distributions():
    wheel = d.read_text("WHEEL") or ""
    out.append({"name": d.metadata["Name"], "version": d.version, "site": str(d.locate_file("")),
                "tags": [l.split(":", 1)[1].strip() for l in wheel.splitlines() if l.startswith("Tag:")],
                "files": [str(f) for f in d.files or []]})
json.dump(out, sys.stdout)
"""


def python_independent(tags: list[str]) -> bool:
    """A wheel whose files are the same for every CPython 3: py3-none-* / py2.py3-none-* or the stable ABI."""
    return bool(tags) and all(t.split("-")[1] in ("none", "abi3") and t.split("-")[0].startswith(("py", "cp"))
                              for t in tags)


def host_supplied(dists: list[dict[str, Any]], host: dict[str, str]) -> dict[str, str]:
    """{path in the image: path under the host's site-packages} for files the host has at the same version of a
    Python-independent wheel (metadata, bytecode and scripts always travel: they differ between installs)."""
    out: dict[str, str] = {}
    for d in dists:
        if host.get(normalize(d["name"] or "")) != d["version"] or not python_independent(d["tags"]):
            continue
        for rel in d["files"]:
            if rel.startswith("..") or ".dist-info/" in rel or rel.endswith(".pyc"):
                continue
            out[f"{d['site'].rstrip('/')}/{rel}".lstrip("/")] = rel
    return out


def image_config(tag: str) -> dict[str, Any]:
    proc = subprocess.run([engine.client(), "image", "inspect", tag], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DockerError(f"{tag}: not an image here ({proc.stderr.strip()})", "invoke build --stack <stack> first")
    data = json.loads(proc.stdout)[0]
    return {"id": data["Id"], **data["Config"]}


def image_dists(tag: str) -> list[dict[str, Any]]:
    proc = subprocess.run([engine.client(), "run", "--rm", "--network", "none", "--entrypoint", "python3", tag,
                           "-I", "-c", LIST_DISTS], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DockerError(f"listing {tag}'s packages failed: {proc.stderr.strip()[-500:]}")
    dists: list[dict[str, Any]] = json.loads(proc.stdout)
    return dists


def export(stack: Stack, tag: str, out: Path, *, host_packages: Path | None = None, preset: int = 1,
           part_bytes: int = PART_BYTES, manifest_only: bool = False, previous: Sequence[Path] = ()
           ) -> dict[str, Any]:
    """Write out/MANIFEST, out/parts.json, out/part-NNN and out/rootfs-spec.json (run_spec) for `tag`, an image
    of `stack`; returns the summary. manifest_only: the
    manifest alone (seconds, not minutes: nothing is compressed), for a first look at what a host can supply.
    previous: earlier exports whose parts the host already holds (this stack's before a rebuild, or another
    stack's carried in the same lease): contents in any of them stay out of these parts (a rebuilt image whose lock
    did not change then carries only rlstack's own files; two stacks share their Debian base and common wheels)."""
    out.mkdir(parents=True, exist_ok=True)
    config = image_config(tag)
    supplied = host_supplied(image_dists(tag), read_host_packages(host_packages)) if host_packages else {}
    # a container is needed to export its tree; it never starts (the entrypoint only has to be set)
    cid = subprocess.run([engine.client(), "create", "--entrypoint", "true", tag], capture_output=True, text=True,
                         check=True).stdout.strip()
    entries: list[list[Any]] = []
    shipped: set[str] = set()
    for earlier in previous:
        with gzip.open(earlier / MANIFEST, "rt", encoding="utf-8") as f:
            shipped |= {e[6] for e in json.load(f)["entries"] if e[0] == "f"}
    t0 = time.monotonic()
    stats = {"files": 0, "bytes": 0, "host_files": 0, "host_bytes": 0, "shipped_bytes": 0}
    try:
        proc = subprocess.Popen([engine.client(), "export", cid], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        sink: Any = _Discard() if manifest_only else XzParts(out, part_bytes, preset=preset)
        with sink, tarfile.open(fileobj=sink, mode="w|") as blobs, \
                tarfile.open(fileobj=proc.stdout, mode="r|") as image:
            for m in image:
                entry = _entry(m, image, blobs, supplied, shipped, stats)
                if entry is not None:
                    entries.append(entry)
        if proc.wait() != 0:
            raise DockerError(f"docker export {cid} failed (exit {proc.returncode})")
    finally:
        subprocess.run([engine.client(), "rm", cid], capture_output=True)
    manifest = {"format": 1, "image": tag, "image_id": config["id"], "config": config, "entries": entries,
                "previous": [str(p) for p in previous]}
    with gzip.open(out / MANIFEST, "wt", encoding="utf-8") as f:
        json.dump(manifest, f)
    index = {"format": "xz", "image": tag, "tar_size": sink.size, "tar_sha256": sink.sha256, "parts": sink.parts}
    (out / "parts.json").write_text(json.dumps(index, indent=1) + "\n")
    summary = {**stats, "entries": len(entries), "parts": len(sink.parts),
               "carried_bytes": sum(p["size"] for p in sink.parts), "seconds": round(time.monotonic() - t0, 1)}
    (out / "export.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / SPEC).write_text(json.dumps(run_spec(stack, tag, config), indent=1) + "\n")
    return summary


class _Discard:
    """XzParts' interface, keeping nothing: the manifest-only export."""

    size, sha256, parts = 0, "", []  # type: ignore[var-annotated]

    def write(self, data: bytes) -> int:
        return len(data)

    def __enter__(self) -> _Discard:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _entry(m: tarfile.TarInfo, image: tarfile.TarFile, blobs: tarfile.TarFile, supplied: dict[str, str],
           shipped: set[str], stats: dict[str, int]) -> list[Any] | None:
    """The manifest row of one member; a file's content goes into `blobs` (once per content) unless the host
    supplies it."""
    path = "/" + m.name.lstrip("./")
    if m.isdir():
        return ["d", path, m.mode, m.uid, m.gid, 0, "", ""]
    if m.issym():
        return ["l", path, m.mode, m.uid, m.gid, 0, "", m.linkname]
    if m.islnk():
        return ["L", path, m.mode, m.uid, m.gid, 0, "", "/" + m.linkname.lstrip("./")]
    if not m.isfile():
        return None  # device nodes and fifos: the runner makes /dev itself
    f = image.extractfile(m)
    assert f is not None
    data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    stats["files"] += 1
    stats["bytes"] += m.size
    rel = supplied.get(path.lstrip("/"))
    if rel is not None and m.size >= HOST_MIN_BYTES:
        stats["host_files"] += 1
        stats["host_bytes"] += m.size
        return ["h", path, m.mode, m.uid, m.gid, m.size, digest, rel]
    if digest not in shipped:
        shipped.add(digest)
        info = tarfile.TarInfo(digest)
        info.size, info.mode = len(data), 0o644
        blobs.addfile(info, io.BytesIO(data))
        stats["shipped_bytes"] += m.size
    return ["f", path, m.mode, m.uid, m.gid, m.size, digest, ""]


def repartition(folder: Path, part_bytes: int) -> int:
    """Cut an export's xz parts again into parts of at most part_bytes, at xz stream edges (a part is whole
    streams: XzParts), rewriting parts.json; for a call whose working tree leaves less room than planned.
    The joined stream, and so tar_sha256, is unchanged. Returns the number of parts."""
    index = json.loads((folder / "parts.json").read_text())
    streams: list[tuple[bytes, int]] = []  # (compressed stream, its raw size)
    for part in index["parts"]:
        data = (folder / part["name"]).read_bytes()
        while data:
            dec = lzma.LZMADecompressor(lzma.FORMAT_XZ)
            raw = len(dec.decompress(data))
            used = len(data) - len(dec.unused_data)
            streams.append((data[:used], raw))
            data = dec.unused_data
        (folder / part["name"]).unlink()
    parts: list[dict[str, Any]] = []
    buf, raw_size = bytearray(), 0
    for comp, raw in [*streams, (b"", -1)]:
        if buf and (raw < 0 or len(buf) + len(comp) > part_bytes):
            name = f"part-{len(parts):03d}"
            (folder / name).write_bytes(buf)
            parts.append({"name": name, "sha256": hashlib.sha256(buf).hexdigest(), "size": len(buf),
                          "raw_size": raw_size})
            buf, raw_size = bytearray(), 0
        if raw >= 0:
            buf += comp
            raw_size += raw
    index["parts"] = parts
    (folder / "parts.json").write_text(json.dumps(index, indent=1) + "\n")
    return len(parts)


def run_spec(stack: Stack, tag: str, config: dict[str, Any]) -> dict[str, Any]:
    """How `invoke train` runs the image (rlstack.host.containers.spec_for), as the GPU host's runner reads it:
    the image's own environment, user and working folder, the read-only root, the tmpfs and the volumes."""
    spec = containers.spec_for(stack, tag, [])
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    env.update(dict(spec.env))
    tmpfs = []
    if spec.read_only_root:
        tmpfs = [{"path": "/tmp", "options": "rw,exec,nosuid,nodev,mode=1777"},
                 {"path": containers.USER_HOME, "options": "rw,exec,nosuid,nodev,uid=1000,gid=1000,mode=0700"}]
    vols = spec.volumes or containers.Volumes()
    mounts = ((vols.adapters, containers.ADAPTERS_MOUNT), (vols.hf_cache, containers.HF_CACHE_MOUNT),
              (vols.runs, containers.RUNS_MOUNT), (vols.kernel_cache, containers.KERNEL_CACHE_MOUNT))
    volumes = [{"name": name, "target": target, "read_only": False} for name, target in mounts]
    return {"image": tag, "user": config.get("User") or "0:0", "workdir": config.get("WorkingDir") or "/",
            "entrypoint": list(config.get("Entrypoint") or []), "env": env, "read_only_root": spec.read_only_root,
            "tmpfs": tmpfs, "volumes": volumes, "shm_size": spec.shm_size, "gpus": asdict(spec)["gpus"]}
