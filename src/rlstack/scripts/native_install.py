"""Install a stack's staged packages on a GPU host with no Docker and no network: the half of native staging that
runs there, before anything else is installed (standard library only, and the standard-library-only parts of
rlstack.core; tests/test_layout.py runs it with no site-packages to hold it to that).

`rlstack.host.native` stages on the machine with the locks and the network: it picks what the host lacks,
fetches those wheels with the lock's sha256 checked and cuts one tar into parts. Here every part and the whole
are checked, then the wheels are installed with `pip --target` into an overlay directory that goes first on
PYTHONPATH.

Run as `python -m rlstack.scripts.native_install install --parts DIR --target DIR` on the GPU host (with
PYTHONPATH=src of a checkout), or `... verify --parts DIR` to check the carried parts only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import sha256_file

PARTS_FILE = "parts.json"
MANIFEST = "manifest.json"
CHUNK = 1 << 22
FORMATS = ("tar", "xz")  # parts.json "format"; a parts.json without one is "tar" (written before xz existed)


class NativeError(RlstackError):
    exit_code = 9


def workers() -> int:
    """Cores this process may use (a container's or cgroup's share where the OS says, not the machine's).
    Threads, not processes, do the parallel work here: lzma, zlib and hashlib release the GIL on large buffers,
    so threads keep every core busy without pickling megabytes between processes or starting interpreters."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def verify_parts(parts_dir: Path, *, threads: int | None = None) -> dict[str, Any]:
    """parts.json and every part it names, checked (sha256 of the bytes carried, all parts at once); says which
    part is missing or damaged."""
    try:
        index = json.loads((parts_dir / PARTS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise NativeError(f"{parts_dir / PARTS_FILE}: unreadable ({exc})",
                          "carry parts.json with the parts (invoke native-stage writes it)") from None
    fmt = index.setdefault("format", "tar")
    if fmt not in FORMATS:
        raise NativeError(f"{parts_dir / PARTS_FILE}: format '{fmt}', this rlstack reads {', '.join(FORMATS)}",
                          "use the rlstack that staged the parts (its src/) on the GPU host")

    def check(part: dict[str, Any]) -> str | None:
        path = parts_dir / part["name"]
        if not path.is_file():
            return f"{part['name']} missing"
        if path.stat().st_size != part["size"] or sha256_file(path) != part["sha256"]:
            return f"{part['name']} damaged (size {path.stat().st_size}, expected {part['size']})"
        return None

    with ThreadPoolExecutor(threads or workers()) as pool:
        bad = [b for b in pool.map(check, index["parts"]) if b]
    if bad:
        raise NativeError(f"{parts_dir}: {len(bad)} of {len(index['parts'])} parts unusable: {'; '.join(bad)}",
                          "carry those parts again")
    return index


def _join(parts_dir: Path, index: dict[str, Any], tar_path: Path) -> str:
    """The plain format: the parts back to back are the tar. Returns its sha256."""
    h = hashlib.sha256()
    with tar_path.open("wb") as out:
        for part in index["parts"]:
            with (parts_dir / part["name"]).open("rb") as src:
                for chunk in iter(lambda s=src: s.read(CHUNK), b""):  # type: ignore[misc]
                    h.update(chunk)
                    out.write(chunk)
    return h.hexdigest()


def _unxz_part(path: Path, tar_path: Path, offset: int, raw_size: int) -> None:
    """Decompress one part (one or more whole xz streams) into its place in the tar; refuse a part that is
    not whole xz or that does not come to the size parts.json gives it."""
    def bad(why: str) -> NativeError:
        return NativeError(f"{path.name}: {why}", "the part matches parts.json but not its staging: stage again "
                           "and carry the new parts with their parts.json")

    done, open_stream = 0, False
    dec = lzma.LZMADecompressor(lzma.FORMAT_XZ)
    with path.open("rb") as src, tar_path.open("r+b") as out:
        out.seek(offset)
        for chunk in iter(lambda: src.read(CHUNK), b""):
            while chunk:
                try:
                    raw = dec.decompress(chunk)
                except lzma.LZMAError as exc:
                    raise bad(f"not valid xz after {done} bytes ({exc})") from None
                open_stream = True
                done += len(raw)
                if done > raw_size:
                    raise bad(f"decompresses to more than the {raw_size} bytes parts.json gives it")
                out.write(raw)
                if dec.eof:  # the next block's stream starts right after
                    chunk, dec, open_stream = dec.unused_data, lzma.LZMADecompressor(lzma.FORMAT_XZ), False
                else:
                    chunk = b""
    if open_stream or done != raw_size:
        raise bad(f"decompresses to {done} bytes{' (cut short)' if open_stream else ''}, parts.json gives {raw_size}")


def _unxz(parts_dir: Path, index: dict[str, Any], tar_path: Path, threads: int | None = None) -> str:
    """The xz format: every part decompressed into its place in the tar at once (threads: lzma releases the
    GIL), the tar hashed in order as the parts land. Returns its sha256."""
    parts = index["parts"]
    offsets = list(itertools.accumulate((p["raw_size"] for p in parts), initial=0))
    if offsets[-1] != index["tar_size"]:
        raise NativeError(f"parts.json: the parts' sizes add up to {offsets[-1]} bytes, its tar_size is "
                          f"{index['tar_size']}", "carry the parts.json of the staging the parts come from")
    with tar_path.open("wb") as f:
        f.truncate(index["tar_size"])
    n = threads or workers()
    print(f"rlstack: decompressing {len(parts)} parts on {n} threads", file=sys.stderr, flush=True)
    h = hashlib.sha256()
    with ThreadPoolExecutor(n, thread_name_prefix="rlstack-unxz") as pool, tar_path.open("rb") as back:
        futures = [pool.submit(_unxz_part, parts_dir / p["name"], tar_path, off, p["raw_size"])
                   for p, off in zip(parts, offsets, strict=False)]
        try:
            for future, part, off in zip(futures, parts, offsets, strict=False):
                future.result()
                back.seek(off)
                for chunk in _read(back, part["raw_size"]):
                    h.update(chunk)
        finally:
            for future in futures:
                future.cancel()
    return h.hexdigest()


def _read(f: io.BufferedReader, size: int) -> Iterable[bytes]:
    while size > 0:
        chunk = f.read(min(CHUNK, size))
        if not chunk:
            return
        size -= len(chunk)
        yield chunk


def _install_command(target: Path, files: list[str]) -> list[str]:
    """This Python's pip; where it has none (a uv-made venv), uv's pip aimed at this Python."""
    import importlib.util

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                "--no-cache-dir", "--upgrade", "--target", str(target), *files]
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).is_file():
        raise NativeError(f"{sys.executable} has no pip, and no uv is on PATH", "install pip for this Python")
    return [uv, "pip", "install", "-q", "--python", sys.executable, "--offline", "--no-deps", "--no-cache",
            "--target", str(target), *files]


def install(parts_dir: Path, target: Path, *, pip: list[str] | None = None) -> dict[str, Any]:
    """Join and check the parts, then install the wheels into `target` (put it first on PYTHONPATH).
    `pip`: a whole install command to which the wheel paths are appended (default: this Python's pip)."""
    index = verify_parts(parts_dir)
    with tempfile.TemporaryDirectory(prefix="rlstack-native-") as tmp:
        tar_path = Path(tmp) / "bundle.tar"
        t0 = time.monotonic()
        digest = _join(parts_dir, index, tar_path) if index["format"] == "tar" else _unxz(parts_dir, index, tar_path)
        if digest != index["tar_sha256"]:
            raise NativeError(f"the joined parts hash to {digest}, not {index['tar_sha256']}",
                              "the parts come from different stagings; carry one staging's parts")
        print(f"rlstack: {len(index['parts'])} parts joined and checked ({index['tar_size'] / 2**20:.0f} MiB) in "
              f"{time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        tar_path.unlink()  # the wheels are out: less disk held while pip installs them
        manifest = json.loads((Path(tmp) / MANIFEST).read_text())  # the tar's sha256 covers every wheel in it
        files = [str(Path(tmp) / "wheels" / w["file"]) for w in manifest["wheels"]]
        target.mkdir(parents=True, exist_ok=True)
        if files:
            cmd = [*pip, *files] if pip else _install_command(target, files)
            print(f"+ {' '.join(cmd[:12])} ... ({len(files)} wheels)", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, text=True, capture_output=True)
            if proc.returncode != 0:
                raise NativeError(f"pip install --target {target} failed (exit {proc.returncode}): "
                                  f"{proc.stderr[-1500:]}")
        (target / ".rlstack-native.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlstack.scripts.native_install", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="check the carried parts and install their wheels with pip --target")
    i.add_argument("--parts", type=Path, required=True)
    i.add_argument("--target", type=Path, required=True)
    v = sub.add_parser("verify", help="check the carried parts only")
    v.add_argument("--parts", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        if args.cmd == "verify":
            index = verify_parts(args.parts)
            carried = sum(p["size"] for p in index["parts"])
            print(f"{args.parts}: {len(index['parts'])} parts ok ({carried / 2**20:.0f} MiB, format "
                  f"{index['format']}; {index['tar_size'] / 2**20:.0f} MiB joined)")
            return 0
        manifest = install(args.parts, args.target)
    except NativeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"installed {len(manifest['wheels'])} wheels of stack {manifest['stack']} into {args.target}; "
          f"export PYTHONPATH={args.target}:$PYTHONPATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
