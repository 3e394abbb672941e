"""Run a built image on a GPU host that has no Docker: its own root filesystem, the NVIDIA driver injected, and
nothing else of the host (standard library only, the half of rlstack.host.rootfs that runs there).

GPU machines without a Docker daemon are common (HPC nodes, lent machines). An image is a root filesystem plus
a config; this rebuilds that filesystem from what `invoke rootfs-export` carried (a manifest of every entry
and xz parts holding the file contents the host cannot supply) and runs a command in it the way the NVIDIA
container toolkit runs a container: a private mount namespace, the device nodes /dev/nvidia*, the driver's
user-space libraries (bound read-only at /usr/local/nvidia, on LD_LIBRARY_PATH, as NVIDIA's own CUDA images
expect), and from the image's spec the environment, user, working folder, read-only root, tmpfs and volumes
that `docker run` would give it. No host CUDA toolkit, Python or site-packages is visible inside.

Files the host already has byte for byte (large wheels installed there at the same version, Python-independent)
are copied from the host after their sha256 is checked against the image's, so they need not travel; every
file of the assembled tree is checked against the manifest.

Run as `python3 -m rlstack.scripts.rootfs {survey,check,assemble,run}` with PYTHONPATH=src of a checkout, as root.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlstack.core.fileio import sha256_file
from rlstack.scripts.native_install import NativeError, _unxz, verify_parts, workers

MANIFEST = "rootfs-manifest.json.gz"
ASSEMBLED = ".rlstack-rootfs.json"  # written beside (not inside) the root: the image's tree stays the image's
DRIVER_MOUNT = "/usr/local/nvidia"
DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "tty")
NVIDIA_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


class RootfsError(NativeError):
    exit_code = 9


def load_manifest(path: Path) -> dict[str, Any]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as exc:
        raise RootfsError(f"{path}: unreadable manifest ({exc})", "carry the manifest rootfs-export wrote") from None
    if data.get("format") != 1:
        raise RootfsError(f"{path}: manifest format {data.get('format')}, this rlstack reads 1")
    return data


def host_candidates(entries: list[list[Any]], host_sites: list[Path]) -> dict[str, Path | None]:
    """For every entry the host is to supply: the first host file at the same site-packages path whose sha256 is
    the image's, else None."""
    wanted = [e for e in entries if e[0] == "h"]

    def find(e: list[Any]) -> tuple[str, Path | None]:
        _, path, _mode, _uid, _gid, size, digest, rel = e
        for site in host_sites:
            cand = site / rel
            try:
                if cand.is_file() and cand.stat().st_size == size and sha256_file(cand) == digest:
                    return path, cand
            except OSError:
                continue
        return path, None

    with ThreadPoolExecutor(workers()) as pool:
        return dict(pool.map(find, wanted))


def survey(manifest: dict[str, Any], host_sites: list[Path]) -> dict[str, Any]:
    """What this host can supply and what running an image here needs (read by the first call on a new host)."""
    found = host_candidates(manifest["entries"], host_sites)
    missing = sorted(p for p, c in found.items() if c is None)
    facts: dict[str, Any] = {"host_files": len(found), "host_missing": missing[:200], "missing_count": len(missing)}
    facts["unshare"] = subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
    facts["chroot"] = shutil.which("chroot")
    facts["nvidia_nodes"] = sorted(p.name for p in Path("/dev").glob("nvidia*"))
    drv = driver_dir()
    facts["driver_dir"] = str(drv or "")
    facts["driver_files"] = sorted(p.name for p in drv.glob("*"))[:400] if drv else []
    return facts


def driver_dir() -> Path | None:
    """The folder holding the driver's libcuda.so.1 (the NVIDIA runtime's convention first, then ldconfig's)."""
    for cand in (Path(DRIVER_MOUNT) / "lib64", Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64")):
        if (cand / "libcuda.so.1").exists():
            return cand
    return None


def load_spec(path: Path) -> dict[str, Any]:
    """The run spec rootfs-export wrote (rlstack.host.rootfs.run_spec)."""
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RootfsError(f"{path}: unreadable run spec ({exc})", "carry the rootfs-spec.json rootfs-export wrote"
                          ) from None
    if not isinstance(spec, dict):
        raise RootfsError(f"{path}: not a run spec (a JSON object)", "carry the rootfs-spec.json rootfs-export wrote")
    return spec


def check(manifest: Path, parts: list[Path], spec: Path | None = None) -> dict[str, Any]:
    """Whether everything `assemble` and `run` will read is here: the manifest, every export's parts (sha256 of
    each, all at once) and the spec. Seconds, so a job started in the background is refused at once, in the call
    that starts it, rather than in a log read a call later."""
    data = load_manifest(manifest)
    if spec is not None:
        load_spec(spec)
    counts = [len(verify_parts(folder)["parts"]) for folder in parts]
    return {"image": data.get("image"), "exports": len(parts), "parts": sum(counts)}


def assemble(manifest: dict[str, Any], parts: Path | list[Path] | None, root: Path, host_sites: list[Path]
             ) -> dict[str, Any]:
    """Build the image's tree at `root` (which must not exist): shipped contents from the parts, the rest from
    the host after its sha256 check; then links, modes and owners as the image has them."""
    if root.exists():
        raise RootfsError(f"{root} exists", "remove it, or pick another --root")
    t0 = time.monotonic()
    entries = manifest["entries"]
    from_host = host_candidates(entries, host_sites)
    missing = sorted(p for p, c in from_host.items() if c is None)
    if missing:
        raise RootfsError(f"{len(missing)} files the manifest expects from this host are not here byte for byte, "
                          f"e.g. {', '.join(missing[:5])}",
                          "export again without --host-packages (everything travels), or with this host's list")
    blobs = root.with_name(root.name + ".blobs")
    for folder in [parts] if isinstance(parts, Path) else parts or []:  # an export, then the ones built on it
        index = verify_parts(folder)
        with tempfile.TemporaryDirectory(dir=root.parent, prefix=".rlstack-rootfs-") as tmp:
            tar_path = Path(tmp) / "blobs.tar"
            if _unxz(folder, index, tar_path) != index["tar_sha256"]:
                raise RootfsError(f"{folder}: the joined parts do not hash to parts.json's tar_sha256",
                                  "carry one export's parts with its parts.json")
            with tarfile.open(tar_path) as tar:
                tar.extractall(blobs, filter="data")
    uses: dict[str, int] = {}
    for e in entries:
        if e[0] == "f":
            uses[e[6]] = uses.get(e[6], 0) + 1
    absent = [d for d in uses if not (blobs / d).is_file()]
    if absent:
        shutil.rmtree(blobs, ignore_errors=True)
        raise RootfsError(f"{len(absent)} file contents the manifest names are not in the parts (e.g. {absent[0]})",
                          "carry the parts and the manifest of one export")
    root.mkdir(parents=True)
    for kind, path, mode, uid, gid, _size, digest, extra in entries:
        dest = root / path.lstrip("/")
        if kind == "d":
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        if kind == "l":
            os.symlink(extra, dest)
            os.lchown(dest, uid, gid)
            continue
        if kind == "L":
            os.link(root / extra.lstrip("/"), dest)
            continue
        if kind == "f":  # the blob's last use moves it into place, earlier ones copy it
            uses[digest] -= 1
            (os.replace if uses[digest] == 0 else shutil.copyfile)(blobs / digest, dest)
        else:  # "h": from the host, checked above
            src = from_host[path]
            assert src is not None
            shutil.copyfile(src, dest)
        os.chown(dest, uid, gid)
        os.chmod(dest, mode)
    for kind, path, mode, uid, gid, *_ in reversed(entries):  # folders last: a read-only one is then full
        if kind == "d":
            dest = root / path.lstrip("/")
            os.chown(dest, uid, gid)
            os.chmod(dest, mode)
    shutil.rmtree(blobs, ignore_errors=True)
    bad = verify_tree(entries, root)
    if bad:
        raise RootfsError(f"{len(bad)} files differ from the manifest after assembly, e.g. {', '.join(bad[:5])}")
    report = {"image": manifest["image"], "image_id": manifest["image_id"], "entries": len(entries),
              "from_host": len(from_host), "seconds": round(time.monotonic() - t0, 1)}
    root.with_name(root.name + ASSEMBLED).write_text(json.dumps(report, indent=1) + "\n")
    return report


def verify_tree(entries: list[list[Any]], root: Path) -> list[str]:
    """Paths whose content is not the manifest's sha256 (every regular file, in parallel)."""
    files = [(e[1], e[6]) for e in entries if e[0] in ("f", "h")]

    def bad(item: tuple[str, str]) -> str | None:
        path, digest = item
        return None if sha256_file(root / path.lstrip("/")) == digest else path

    with ThreadPoolExecutor(workers()) as pool:
        return [p for p in pool.map(bad, files) if p]


def mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RootfsError(f"mount {' '.join(args)}: {proc.stderr.strip()}")


def bind_file(src: Path, dest: Path, read_only: bool = False) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists():
        dest.touch()
    mount("--bind", str(src), str(dest))
    if read_only:
        mount("-o", "remount,bind,ro", str(dest))


def run(root: Path, spec: dict[str, Any], argv: list[str], volumes: Path, binds: list[tuple[str, str]],
        env: dict[str, str], entrypoint: str | None = None) -> int:
    """`argv` in the image at `root`, as `docker run` with the NVIDIA runtime would run it (spec: the image's
    config and rlstack's run options, from rlstack.host.rootfs.run_spec)."""
    if os.geteuid() != 0:
        raise RootfsError("running an image needs root (mount namespaces, chroot)")
    if hasattr(os, "unshare"):  # Python >= 3.12
        os.unshare(os.CLONE_NEWNS)  # type: ignore[attr-defined]  # the mounts below end with this process
    elif os.environ.get("RLSTACK_ROOTFS_NS") != "1":  # older Pythons: util-linux's unshare runs us again
        os.environ["RLSTACK_ROOTFS_NS"] = "1"
        os.execvp("unshare", ["unshare", "-m", sys.executable, "-m", "rlstack.scripts.rootfs", *sys.argv[1:]])
    mount("--make-rprivate", "/")
    mount("--bind", str(root), str(root))
    mount("-t", "proc", "proc", str(root / "proc"))
    mount("--rbind", "/sys", str(root / "sys"))
    dev = root / "dev"
    mount("-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", str(dev))
    for name in DEVICE_NODES:
        bind_file(Path("/dev") / name, dev / name)
    for node in sorted(Path("/dev").glob("nvidia*")) if spec.get("gpus") else []:
        if node.is_dir():  # /dev/nvidia-caps
            (dev / node.name).mkdir(exist_ok=True)
            mount("--rbind", str(node), str(dev / node.name))
        else:
            bind_file(node, dev / node.name)
    (dev / "shm").mkdir()
    mount("-t", "tmpfs", "-o", f"size={spec.get('shm_size', '2g')},mode=1777,nosuid,nodev", "tmpfs", str(dev / "shm"))
    os.symlink("/proc/self/fd", dev / "fd")
    if spec.get("gpus"):
        drv = driver_dir()
        if drv is None:
            raise RootfsError("no NVIDIA driver library (libcuda.so.1) on this host", "is this a GPU host?")
        target = root / DRIVER_MOUNT.lstrip("/") / "lib64"
        target.mkdir(parents=True, exist_ok=True)
        mount("--bind", str(drv), str(target))
        mount("-o", "remount,bind,ro", str(target))
        smi = shutil.which("nvidia-smi")  # the NVIDIA runtime's 'utility' capability brings it too
        if smi:
            bind_file(Path(smi), root / "usr/bin/nvidia-smi", read_only=True)
    for tmp in spec.get("tmpfs", []):
        mount("-t", "tmpfs", "-o", tmp["options"], "tmpfs", str(root / tmp["path"].lstrip("/")))
    for vol in spec.get("volumes", []):
        src = volumes / vol["name"]
        if not src.exists():
            src.mkdir(parents=True)
            os.chown(src, 1000, 1000)
        dest = root / vol["target"].lstrip("/")
        dest.mkdir(parents=True, exist_ok=True)
        mount("--bind", str(src), str(dest))
        if vol.get("read_only"):
            mount("-o", "remount,bind,ro", str(dest))
    for src_s, target_s in binds:
        dest = root / target_s.lstrip("/")
        if Path(src_s).is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            mount("--bind", src_s, str(dest))
            mount("-o", "remount,bind,ro", str(dest))
        else:
            bind_file(Path(src_s), dest, read_only=True)
    if spec.get("read_only_root", True):
        mount("-o", "remount,bind,ro", str(root))
    full_env = dict(spec["env"])
    if spec.get("gpus"):  # the loader and the linker both find the driver's libcuda (JITs link -lcuda)
        for var in ("LD_LIBRARY_PATH", "LIBRARY_PATH"):
            full_env[var] = ":".join(p for p in (f"{DRIVER_MOUNT}/lib64", full_env.get(var)) if p)
    full_env.update(env)
    user = spec.get("user") or "0:0"
    entry = [entrypoint] if entrypoint is not None else list(spec["entrypoint"])
    cmd = ["chroot", f"--userspec={user}", str(root), "/usr/bin/env", "-i",
           *(f"{k}={v}" for k, v in sorted(full_env.items())),
           "/bin/sh", "-c", 'cd "$0" && exec "$@"', spec.get("workdir") or "/", *entry, *argv]
    print(f"rlstack rootfs: {manifest_label(root)} as {user}: {' '.join(entry + argv)}", file=sys.stderr, flush=True)
    return subprocess.run(cmd).returncode


def manifest_label(root: Path) -> str:
    try:
        return str(json.loads(root.with_name(root.name + ASSEMBLED).read_text())["image"])
    except (OSError, ValueError, KeyError):
        return str(root)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m rlstack.scripts.rootfs", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("survey", help="which host files match the manifest; what the host offers for running")
    s.add_argument("--manifest", type=Path, required=True)
    s.add_argument("--host-site", type=Path, action="append", default=[])
    c = sub.add_parser("check", help="the manifest, every part and the spec are here and whole (before assemble)")
    c.add_argument("--manifest", type=Path, required=True)
    c.add_argument("--parts", type=Path, action="append", default=[], help="an export's folder (repeatable)")
    c.add_argument("--spec", type=Path, help="rootfs-spec.json, checked when given")
    a = sub.add_parser("assemble", help="build the image's tree from the manifest, the parts and the host")
    a.add_argument("--manifest", type=Path, required=True)
    a.add_argument("--parts", type=Path, action="append", default=[],
                   help="an export's folder; again for a later export made with --previous")
    a.add_argument("--root", type=Path, required=True)
    a.add_argument("--host-site", type=Path, action="append", default=[])
    r = sub.add_parser("run", help="run a command in the assembled image (as root on the host)")
    r.add_argument("--root", type=Path, required=True)
    r.add_argument("--spec", type=Path, required=True, help="rootfs-spec.json from rlstack.host.rootfs")
    r.add_argument("--volumes", type=Path, required=True, help="host folder holding one folder per named volume")
    r.add_argument("--bind", action="append", default=[], help="HOST:TARGET, read-only (inputs, scripts)")
    r.add_argument("--env", action="append", default=[], help="NAME=VALUE added to the image's environment")
    r.add_argument("--entrypoint", help="run this instead of the image's entrypoint (as docker run --entrypoint)")
    r.add_argument("argv", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    try:
        if args.cmd == "survey":
            print(json.dumps(survey(load_manifest(args.manifest), args.host_site), indent=1))
            return 0
        if args.cmd == "check":
            print(json.dumps(check(args.manifest, args.parts, args.spec)))
            return 0
        if args.cmd == "assemble":
            print(json.dumps(assemble(load_manifest(args.manifest), args.parts, args.root, args.host_site)))
            return 0
        rest = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        binds = [(b.split(":", 1)[0], b.split(":", 1)[-1]) for b in args.bind]
        env = dict(e.split("=", 1) for e in args.env)
        return run(args.root, load_spec(args.spec), rest, args.volumes, binds, env, args.entrypoint)
    except NativeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
