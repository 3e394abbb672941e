"""A stack's locked packages, staged for a GPU host with no Docker and no network, and installed there.

The runtime probes belong in the stack's image, but not every GPU machine runs Docker (the H200 this project
measures on does not, and neither does a locked-down cluster node). There the same probe code runs natively,
over the host's own Python, with the lock's packages laid on top: `stage` picks what the host lacks (the
host's `pip list --format=json` says what it has), fetches those wheels for the host's Python with the
lock's sha256 checked, packs them into one tar with a manifest and cuts it into parts small enough for
whatever carries them; `install` (standard library only: it runs before anything is installed) checks every
part and the whole, then installs the wheels with `pip --target` into an overlay directory that goes first
on PYTHONPATH. What stays different from the lock (kept from the host, skipped, another Python) is then
measured and recorded by the runtime report itself (rlstack.probes.environment), never assumed.

Run as `python -m rlstack.host.native install --parts DIR --target DIR` on the GPU host.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlstack.core.errors import RlstackError  # these three are standard library only, like this module
from rlstack.core.fileio import sha256_file, swap_in
from rlstack.core.pkgnames import normalize, public_version

PARTS_FILE = "parts.json"
MANIFEST = "manifest.json"
CHUNK = 1 << 22


class NativeError(RlstackError):
    exit_code = 9


@dataclass(frozen=True)
class Pick:
    """One locked package and what happens to it on the host: carry the locked wheel, use the host's copy, or
    leave it out (with why)."""

    name: str
    version: str
    action: str  # "carry" | "host" | "skip"
    why: str


def read_host_packages(path: Path) -> dict[str, str]:
    """{normalized name: version} from `pip list --format=json` (or `pip freeze` lines) taken on the host."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise NativeError(f"{path}: cannot read the host's package list: {exc.strerror}",
                          "on the GPU host run: python3 -m pip list --format=json > host-packages.json") from None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, list):
        try:
            return {normalize(d["name"]): str(d["version"]) for d in data}
        except (KeyError, TypeError):
            raise NativeError(f"{path}: a JSON list, but not of pip list's {{name, version}} entries",
                              "use: python3 -m pip list --format=json") from None
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "==" not in line:
            raise NativeError(f"{path}:{n}: '{line[:80]}' is neither pip list JSON nor a 'name==version' line",
                              "use: python3 -m pip list --format=json")
        name, version = line.split("==", 1)
        out[normalize(name)] = version.strip()
    return out


def plan(locked: dict[str, str], host: dict[str, str], *, skip: dict[str, str] | None = None,
         keep_host: set[str] | None = None) -> list[Pick]:
    """Decide per locked package. A host copy at the lock's version (ignoring a local label such as +cu130)
    is used as it is; `keep_host` names packages whose host copy stays even at another version (numpy, when
    host libraries were compiled against the newer one); `skip` names packages the probes do not need."""
    skip = {normalize(k): v for k, v in (skip or {}).items()}
    keep = {normalize(k) for k in keep_host or set()}
    unknown = sorted((set(skip) | keep) - set(locked))
    if unknown:
        raise NativeError(f"not in the lock: {', '.join(unknown)}", "name packages of the stack's lock")
    picks = []
    for name, version in sorted(locked.items()):
        have = host.get(name)
        if have is not None and public_version(have) == public_version(version):
            picks.append(Pick(name, version, "host", f"the host has {have}"))
        elif name in skip:
            picks.append(Pick(name, version, "skip", skip[name]))
        elif name in keep and have is not None:
            picks.append(Pick(name, version, "host", f"kept the host's {have}"))
        else:
            picks.append(Pick(name, version, "carry", f"the host has {have}" if have else "not on the host"))
    return picks


def split(tar: Path, out_dir: Path, part_bytes: int) -> list[dict[str, Any]]:
    """Cut `tar` into out_dir/part-NNN files of at most part_bytes each."""
    parts = []
    with tar.open("rb") as src:
        n = 0
        while True:
            name = f"part-{n:03d}"
            h, size = hashlib.sha256(), 0
            with (out_dir / name).open("wb") as dst:
                while size < part_bytes:
                    chunk = src.read(min(CHUNK, part_bytes - size))
                    if not chunk:
                        break
                    h.update(chunk)
                    dst.write(chunk)
                    size += len(chunk)
            if size == 0:
                (out_dir / name).unlink()
                break
            parts.append({"name": name, "sha256": h.hexdigest(), "size": size})
            n += 1
    return parts


def stage(stack_name: str, host_packages: Path, out_dir: Path, *, python: str, platform: str = "x86_64-manylinux_2_28",
          skip: dict[str, str] | None = None, keep_host: set[str] | None = None, part_mb: int = 55,
          cache: Any = None) -> dict[str, Any]:
    """Fetch the carried wheels (sha256 against the lock), pack and split them into out_dir. The folder is
    written aside and swapped in at the end, so an interrupted stage leaves the previous one whole."""
    from rlstack.host import locks
    from rlstack.host.locks import parse_locked
    from rlstack.host.stacks import load_stack
    from rlstack.probes.wheels import WheelCache

    if part_mb < 1:
        raise NativeError(f"--part-mb {part_mb}: a part must hold at least 1 MiB")
    stack = load_stack(stack_name)
    locked = parse_locked(stack.lock_file.read_text())
    picks = plan({n: p.version for n, p in locked.items()}, read_host_packages(host_packages), skip=skip,
                 keep_host=keep_host)
    cache = cache or WheelCache()
    carry = [p for p in picks if p.action == "carry"]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tar_path = work / "bundle.tar"
        wheels = []
        with tarfile.open(tar_path, "w") as tar:
            for i, p in enumerate(carry, 1):
                print(f"rlstack: [{i}/{len(carry)}] {p.name}=={p.version}", file=sys.stderr, flush=True)
                whl = cache.fetch(locked[p.name], python, platform)
                wheels.append({"name": p.name, "version": p.version, "file": whl.name, "sha256": sha256_file(whl),
                               "size": whl.stat().st_size})
                tar.add(whl, arcname=f"wheels/{whl.name}")
            manifest = {"stack": stack.name, "lock_hash": locks.lock_hash(stack), "python": python,
                        "platform": platform, "picks": [asdict(p) for p in picks], "wheels": wheels}
            data = json.dumps(manifest, indent=1).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        parts = split(tar_path, work, part_mb << 20)
        index = {"stack": stack.name, "lock_hash": manifest["lock_hash"], "python": python,
                 "tar_sha256": sha256_file(tar_path), "tar_size": tar_path.stat().st_size, "parts": parts,
                 "carry": len(carry), "host": sum(p.action == "host" for p in picks),
                 "skip": {p.name: p.why for p in picks if p.action == "skip"}}
        tar_path.unlink()
        (work / PARTS_FILE).write_text(json.dumps(index, indent=1) + "\n")
        swap_in(work, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return index


def verify_parts(parts_dir: Path) -> dict[str, Any]:
    """parts.json and every part it names, checked; says which part is missing or damaged."""
    try:
        index = json.loads((parts_dir / PARTS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise NativeError(f"{parts_dir / PARTS_FILE}: unreadable ({exc})",
                          "carry parts.json with the parts (invoke native-stage writes it)") from None
    bad = []
    for part in index["parts"]:
        path = parts_dir / part["name"]
        if not path.is_file():
            bad.append(f"{part['name']} missing")
        elif path.stat().st_size != part["size"] or sha256_file(path) != part["sha256"]:
            bad.append(f"{part['name']} damaged (size {path.stat().st_size}, expected {part['size']})")
    if bad:
        raise NativeError(f"{parts_dir}: {len(bad)} of {len(index['parts'])} parts unusable: {'; '.join(bad)}",
                          "carry those parts again")
    return index


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
        h = hashlib.sha256()
        with tar_path.open("wb") as out:
            for part in index["parts"]:
                with (parts_dir / part["name"]).open("rb") as src:
                    for chunk in iter(lambda s=src: s.read(CHUNK), b""):  # type: ignore[misc]
                        h.update(chunk)
                        out.write(chunk)
        if h.hexdigest() != index["tar_sha256"]:
            raise NativeError(f"the joined parts hash to {h.hexdigest()}, not {index['tar_sha256']}",
                              "the parts come from different stagings; carry one staging's parts")
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
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
    p = argparse.ArgumentParser(prog="python -m rlstack.host.native", description=__doc__.split("\n\n")[0])
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
            print(f"{args.parts}: {len(index['parts'])} parts ok ({index['tar_size'] / 2**20:.0f} MiB)")
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
