"""How much smaller, and at what host time, xz makes a native staging than the wheels' own deflate.

Why: every part carried to the GPU host costs ~8 s of scarce device time, and the portable stack is ~74 parts
of deflated wheels. xz is in Python's standard library on both sides (the GPU host has no `zstandard`), but it
is slow to compress, so the preset is a trade between parts saved and minutes of staging on this machine.

`members` measures representative members of the locked wheels (big CUDA libraries, torch's host code, Python
sources), unpacked in uv's cache: zlib level 6 (what wheel builders use by default; the stand-in for the
wheels' deflate) against lzma presets 0-6 (FORMAT_XZ, CHECK_CRC32, as staging writes them), with and without
the x86 BCJ filter, per-stream block sizes, decompression speed, and whether two threads compress twice as
fast (lzma releases the GIL). `stage` stages a stack twice, `--compress none` and `--compress xz`, and records
the real part counts and host times. Both merge into bench/results/stage_compression.json.

    .venv/bin/python bench/transport/stage_compression.py members
    .venv/bin/python bench/transport/stage_compression.py stage --stack fp8 \
        --host-packages bench/results/archive/sm90/h200_pip_list.json --python 3.12 --skip tilelang:unused ...
"""

from __future__ import annotations

import argparse
import bz2
import concurrent.futures
import glob
import io
import json
import lzma
import os
import platform
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from rlstack.core.tables import markdown_table  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "archive"  # a study of the transport, in its own layout
NAME = "stage_compression"
UV = Path("/root/.cache/uv/archive-v0")
MIB = 1 << 20

# (label, glob under uv's cache, what it stands for)
BINARIES = [
    ("libcublasLt.so.12", "*/nvidia/cublas/lib/libcublasLt.so.12", "CUDA library, mostly GPU code (fatbin)"),
    ("libcudnn_engines_precompiled.so.9", "*/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9", "CUDA library"),
    ("libnccl.so.2", "*/nvidia/nccl/lib/libnccl.so.2", "CUDA library"),
    ("libtorch_cuda.so", "*/torch/lib/libtorch_cuda.so", "torch's CUDA kernels"),
    ("libtorch_cpu.so", "*/torch/lib/libtorch_cpu.so", "torch's x86 host code"),
]


def _sample(path: Path, size: int) -> bytes:
    """`size` contiguous bytes from a third of the way in (past headers and symbol tables), or the whole file."""
    total = path.stat().st_size
    with path.open("rb") as f:
        f.seek(max(0, min(total // 3, total - size)))
        return f.read(size)


def _py_sources(size: int) -> bytes:
    """A tar of torch's .py files, up to `size` bytes: what most small wheels are made of."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(glob.glob(str(UV / "*/torch/**/*.py"), recursive=True)):
            if buf.tell() > size:
                break
            tar.add(path, arcname=os.path.relpath(path, UV))
    return buf.getvalue()[:size]


def samples(size: int) -> list[tuple[str, str, bytes]]:
    out = []
    for label, pattern, what in BINARIES:
        found = sorted(glob.glob(str(UV / pattern)))
        if found:
            out.append((label, what, _sample(Path(found[0]), size)))
    py = _py_sources(size)
    if py:
        out.append(("torch *.py (tar)", "Python sources", py))
    return out


def _filters(preset: int, bcj: bool) -> list[dict[str, Any]]:
    return ([{"id": lzma.FILTER_X86}] if bcj else []) + [{"id": lzma.FILTER_LZMA2, "preset": preset}]


def _xz(data: bytes, preset: int, bcj: bool = False, block: int = 0) -> bytes:
    """FORMAT_XZ, CRC32; `block`: independent streams of that many raw bytes each (0: one stream)."""
    step = block or len(data)
    return b"".join(lzma.compress(data[i:i + step], format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32,
                                  filters=_filters(preset, bcj)) for i in range(0, len(data), step))


def _timed(fn: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


def _cell(raw: int, zlib6: int, size: int, seconds: float, decompress_seconds: float) -> dict[str, Any]:
    return {"size": size, "vs_zlib6": round(size / zlib6, 4), "mb_s": round(raw / seconds / 1e6, 2),
            "decompress_mb_s": round(raw / decompress_seconds / 1e6, 1)}


def members(args: argparse.Namespace) -> dict[str, Any]:
    size = args.sample_mib * MIB
    rows = []
    total = {"raw": 0, "zlib6": 0}
    for label, what, data in samples(size):
        z, tz = _timed(zlib.compress, data, 6)
        row: dict[str, Any] = {"member": label, "what": what, "raw": len(data), "zlib6": len(z),
                               "zlib6_mb_s": round(len(data) / tz / 1e6, 1), "xz": {}}
        total["raw"] += len(data)
        total["zlib6"] += len(z)
        for preset in args.presets:
            for bcj in (False, True) if preset in args.bcj_presets else (False,):
                key = f"{preset}{'+x86' if bcj else ''}"
                c, tc = _timed(_xz, data, preset, bcj)
                d, td = _timed(lzma.decompress, c)
                assert d == data
                row["xz"][key] = _cell(len(data), len(z), len(c), tc, td)
                total[key] = total.get(key, 0) + len(c)
                print(f"{label:36} xz {key:6} {len(c) / len(z):.3f} of zlib6  {len(data) / tc / 1e6:6.2f} MB/s  "
                      f"(decompress {len(data) / td / 1e6:.0f} MB/s)", flush=True)
        for level in args.bz2:  # the standard library's other codec, for comparison
            c, tc = _timed(bz2.compress, data, level)
            d, td = _timed(bz2.decompress, c)
            key = f"bz2-{level}"
            row["xz"][key] = _cell(len(data), len(z), len(c), tc, td)
            total[key] = total.get(key, 0) + len(c)
            print(f"{label:36} {key:9} {len(c) / len(z):.3f} of zlib6  {len(data) / tc / 1e6:6.2f} MB/s", flush=True)
        rows.append(row)
    blocks = []
    data = b"".join(d[: size // 2] for _, _, d in samples(size))  # a mix, so block edges cut across kinds
    for preset in args.block_presets:
        whole = len(_xz(data, preset, bool(args.block_bcj)))
        for block in args.blocks:
            c = len(_xz(data, preset, bool(args.block_bcj), block * MIB))
            blocks.append({"preset": preset, "x86": bool(args.block_bcj), "block_mib": block, "size": c,
                           "vs_one_stream": round(c / whole, 4)})
            print(f"blocks preset {preset} {block} MiB: {c / whole:.4f} of one stream", flush=True)
    # lzma releases the GIL: two threads on two cores should compress about twice as fast as one
    scaling = {}
    chunk = data[: 8 * MIB]
    for threads in (1, 2):
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            list(pool.map(lambda b: _xz(b, args.scaling_preset), [chunk] * 2))
            scaling[str(threads)] = round(2 * len(chunk) / (time.perf_counter() - t0) / 1e6, 2)
    print(f"threads: {scaling} MB/s at preset {args.scaling_preset}", flush=True)
    return {"sample_mib": args.sample_mib, "presets": args.presets, "members": rows, "total": total,
            "blocks": blocks, "threads_mb_s": {"preset": args.scaling_preset, **scaling}}


def _slices(path: Path, size: int, n: int) -> list[bytes]:
    total = path.stat().st_size
    with path.open("rb") as f:
        out = []
        for k in range(n):
            f.seek(int(total * (2 * k + 1) / (2 * n)) - size // 2)
            out.append(f.read(size))
        return out


def estimate(args: argparse.Namespace) -> dict[str, Any]:
    """The portable stack's big packages, unpacked in uv's cache (torch 2.10, the cu12 libraries, triton): per
    package, xz (one staging block per slice, so exactly what staging compresses at once) against zlib -6 on
    slices of every file of at least 3 slices, and on slices of a tar of the package's smaller files, weighted
    by bytes. Why: staging the portable stack itself takes longer on this machine than a measurement should."""
    from rlstack.core.pkgnames import normalize, public_version
    from rlstack.stacks.locks import parse_locked
    from rlstack.stacks.model import load_stack

    locked = {n: p.version for n, p in parse_locked(load_stack(args.stack).lock_file.read_text()).items()}
    block = args.block_mib * MIB
    jobs: list[tuple[str, int, list[bytes]]] = []  # (package, bytes the slices stand for, slices)
    for top in sorted(UV.iterdir()):
        pkg = None
        for d in sorted(top.glob("*.dist-info")):
            name, _, version = d.name.removesuffix(".dist-info").partition("-")
            pin = locked.get(normalize(name))
            if pin and public_version(pin) == public_version(version) and normalize(name) not in args.skip_packages:
                pkg = f"{normalize(name)}=={version}"
        if pkg is None or sum(f.stat().st_size for f in top.rglob("*") if f.is_file()) < args.min_mib * MIB:
            continue
        small = []
        for path in sorted(top.rglob("*")):
            if path.is_file() and not path.is_symlink():
                if path.stat().st_size >= args.slices * block:
                    jobs.append((pkg, path.stat().st_size, _slices(path, block, args.slices)))
                else:
                    small.append(path)
        if small:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for path in small:
                    tar.add(path, arcname=str(path.relative_to(top)))
            data = buf.getvalue()
            step = max(block, len(data) // args.slices)
            picks = [data[i:i + block] for i in range(0, len(data), step)][: args.slices]
            jobs.append((pkg, len(data), picks))

    def measure(job: tuple[str, int, list[bytes]]) -> dict[str, Any]:
        pkg, weight, slices = job
        raw = sum(len(x) for x in slices)
        out: dict[str, Any] = {"package": pkg, "bytes": weight, "zlib6": sum(len(zlib.compress(x, 6)) for x in slices)}
        for preset in args.presets:
            t0 = time.perf_counter()
            out[f"xz{preset}"] = sum(len(_xz(x, preset)) for x in slices)
            out[f"xz{preset}_s"] = time.perf_counter() - t0
        out["raw"] = raw
        return out

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # lzma releases the GIL
        rows = list(pool.map(measure, jobs))
    by_pkg: dict[str, dict[str, float]] = {}
    for r in rows:
        agg = by_pkg.setdefault(r["package"], {"bytes": 0.0, "zlib6": 0.0, **{f"xz{p}": 0.0 for p in args.presets}})
        agg["bytes"] += r["bytes"]
        scale = r["bytes"] / r["raw"]  # each slice stands for its share of the file
        agg["zlib6"] += r["zlib6"] * scale
        for preset in args.presets:
            agg[f"xz{preset}"] += r[f"xz{preset}"] * scale
    total = {k: sum(a[k] for a in by_pkg.values()) for k in ["bytes", "zlib6", *[f"xz{p}" for p in args.presets]]}
    speed = {f"xz{p}": round(sum(r["raw"] for r in rows) / sum(r[f"xz{p}_s"] for r in rows) / 1e6, 2)
             for p in args.presets}
    for name, a in sorted(by_pkg.items(), key=lambda kv: -kv[1]["bytes"]):
        print(f"{name:45} {a['bytes'] / MIB:7.0f} MiB  zlib6 {a['zlib6'] / a['bytes']:.3f}  "
              + "  ".join(f"xz{p} {a[f'xz{p}'] / a['zlib6']:.3f}" for p in args.presets), flush=True)
    print(f"all: {total['bytes'] / MIB:.0f} MiB raw; " + ", ".join(
        f"xz{p} {total[f'xz{p}'] / total['zlib6']:.3f} of zlib6 at {speed[f'xz{p}']} MB/s per core"
        for p in args.presets), flush=True)
    return {"stack": args.stack, "min_mib": args.min_mib, "block_mib": args.block_mib, "slices": args.slices,
            "presets": args.presets,
            "packages": {k: {kk: round(v) for kk, v in a.items()} for k, a in by_pkg.items()},
            "total": {k: round(v) for k, v in total.items()}, "mb_s_per_core": speed, "sampled_bytes":
            sum(r["raw"] for r in rows)}


def deflate(args: argparse.Namespace) -> dict[str, Any]:
    """Is zlib -6 the wheels' own deflate? The largest members of the largest wheels in rlstack's wheel cache,
    their stored compressed size against zlib -6 of the same bytes. Why: the members and estimate tables
    compare xz with zlib -6, and the parts saved are relative to the wheels as published."""
    from rlstack.probes.wheels import cache_dir

    wheels = sorted((cache_dir() / "wheels").rglob("*.whl"), key=lambda w: -w.stat().st_size)[: args.wheels]
    rows = []
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            infos = sorted(z.infolist(), key=lambda i: -i.file_size)[: args.members]
            real = sum(i.compress_size for i in infos if i.compress_type == zipfile.ZIP_DEFLATED)
            level6 = sum(len(zlib.compress(z.read(i), 6)) - 6 for i in infos if i.compress_type == zipfile.ZIP_DEFLATED)
        rows.append({"wheel": whl.name, "members": len(infos), "deflate_vs_zlib6": round(real / max(level6, 1), 4)})
        print(f"{whl.name}: {real / max(level6, 1):.4f}", flush=True)
    return {"wheels": rows}


def validate(args: argparse.Namespace) -> dict[str, Any]:
    """A kept xz staging (`stage --keep`) taken apart as the GPU host would: parts checked, decompressed in
    parallel into the tar, its sha256 checked; then every stored wheel against the original in the wheel cache,
    member by member (names, order, CRC-32, size, date, mode), and each stored zip's own CRC test."""
    from rlstack.host import native
    from rlstack.probes.wheels import cache_dir

    parts = Path(args.parts)
    t0 = time.perf_counter()
    index = native.verify_parts(parts)
    verify_s = time.perf_counter() - t0
    members_n = 0
    with tempfile.TemporaryDirectory(prefix="rlstack-validate-", dir=parts.parent) as tmp:
        tar_path = Path(tmp) / "bundle.tar"
        t0 = time.perf_counter()
        digest = native._unxz(parts, index, tar_path)
        unxz_s = time.perf_counter() - t0
        if digest != index["tar_sha256"]:
            raise SystemExit(f"tar sha256 {digest} != {index['tar_sha256']}")
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        manifest = json.loads((Path(tmp) / "manifest.json").read_text())
        originals = {w.name: w for w in (cache_dir() / "wheels").rglob("*.whl")}
        for w in manifest["wheels"]:
            with zipfile.ZipFile(originals[w["file"]]) as a, zipfile.ZipFile(Path(tmp) / "wheels" / w["file"]) as b:
                key = [(i.filename, i.CRC, i.file_size, i.date_time, i.external_attr) for i in a.infolist()]
                if key != [(i.filename, i.CRC, i.file_size, i.date_time, i.external_attr) for i in b.infolist()]:
                    raise SystemExit(f"{w['file']}: members differ")
                if any(i.compress_type != zipfile.ZIP_STORED for i in b.infolist()) or b.testzip() is not None:
                    raise SystemExit(f"{w['file']}: not stored, or a member fails its CRC")
                members_n += len(key)
    out = {"parts": len(index["parts"]), "preset": index.get("preset"), "tar_bytes": index["tar_size"],
           "verify_s": round(verify_s, 1), "decompress_s": round(unxz_s, 1), "threads": native.workers(),
           "wheels": len(manifest["wheels"]), "members_identical": members_n}
    print(out, flush=True)
    return out


def stage(args: argparse.Namespace) -> dict[str, Any]:
    """Stage the stack both ways into temporary folders (not .stage/), timed; the parts.json of each says the rest."""
    from rlstack.host import native

    skips = {}
    for spec in args.skip or []:
        pkg, _, why = spec.partition(":")
        skips[pkg] = why or "left out with --skip"
    out: dict[str, Any] = {"stack": args.stack, "python": args.python, "skip": sorted(skips), "part_mb": args.part_mb,
                           "runs": {}}
    with tempfile.TemporaryDirectory(prefix="rlstack-stage-bench-") as tmp:
        for mode in args.modes:
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            dest = ROOT / ".stage" / f"bench-{args.stack}-{mode}" if args.keep else Path(tmp) / mode
            index = native.stage(args.stack, Path(args.host_packages), dest, python=args.python,
                                 skip=skips, part_mb=args.part_mb, compress=mode, preset=args.preset)
            wall = time.perf_counter() - t0
            carried = sum(p["size"] for p in index["parts"])
            key = mode if mode == "none" else f"{mode}-{index['preset']}"
            out["runs"][key] = {"compress": mode, "preset": index.get("preset"), "wall_s": round(wall, 1),
                                "parts": len(index["parts"]), "carried_bytes": carried, "tar_bytes": index["tar_size"],
                                "wheels": index["carry"], "load_before": round(load, 1),
                                "load_after": round(os.getloadavg()[0], 1)}
            print(f"{key}: {len(index['parts'])} parts, {carried / MIB:.0f} MiB carried, {wall:.0f} s", flush=True)
    return out


def render(result: dict[str, Any]) -> str:
    lines = [f"# Staging compression ({result.get('measured', '?')})", "",
             "Produced by `bench/transport/stage_compression.py`; machine: " + result.get("machine", "?"), ""]
    m = result.get("members")
    if m:
        keys = [k for k in m["total"] if k not in ("raw", "zlib6")]
        lines += [f"## Members ({m['sample_mib']} MiB samples from uv's cache), size relative to zlib -6", "",
                  "Cells: compressed size / zlib-6 size, compression MB/s on one core (decompression MB/s). "
                  "xz N: lzma preset N, FORMAT_XZ, CHECK_CRC32; +x86: with the x86 BCJ filter first.", ""]
        head = ["member", "zlib6 of raw", *[k if k.startswith("bz2") else f"xz {k}" for k in keys]]
        rows = []
        for r in m["members"]:
            cells = [r["xz"].get(k) for k in keys]
            rows.append([r["member"], f"{r['zlib6'] / r['raw']:.3f}",
                         *[f"{c['vs_zlib6']:.3f}, {c['mb_s']:.1f} ({c['decompress_mb_s']:.0f})" if c else ""
                           for c in cells]])
        t = m["total"]
        mbs = {k: t["raw"] / sum(t["raw"] and r["raw"] / r["xz"][k]["mb_s"] for r in m["members"] if k in r["xz"])
               for k in keys}
        rows.append(["all samples (equal weight)", f"{t['zlib6'] / t['raw']:.3f}",
                     *[f"**{t[k] / t['zlib6']:.3f}**, {mbs[k]:.1f}" for k in keys]])
        lines += [markdown_table(head, rows), ""]
        lines += ["Host time for 6 GB raw on 2 cores at each preset's all-samples speed: "
                  + ", ".join(f"{k}: {6000 / (2 * mbs[k]) / 60:.0f} min" for k in keys), ""]
        if m.get("blocks"):
            lines += ["Independent streams of N MiB raw (what lets parts decompress separately), relative to one "
                      "stream over the same mixed data: "
                      + ", ".join(f"preset {b['preset']}{'+x86' if b['x86'] else ''} {b['block_mib']} MiB "
                                  f"{b['vs_one_stream']:.4f}" for b in m["blocks"]), ""]
        th = m.get("threads_mb_s")
        if th:
            lines += [f"Two blocks compressed by 1 thread, then by 2 threads at once, preset {th['preset']}: "
                      f"{th['1']} and {th['2']} MB/s (lzma releases the GIL, but the second core was busy with other "
                      "jobs; the fp8 staging below, 2 threads, ran at about twice one core's speed).", ""]
    e = result.get("estimate")
    if e:
        t = e["total"]
        presets = e["presets"]
        lines += [f"## The {e['stack']} stack's packages of at least {e['min_mib']} MiB unpacked in uv's cache "
                  f"(xz on {e['block_mib']} MiB slices, one staging block each, {e['slices']} per file)", "",
                  f"{e['sampled_bytes'] / MIB:.0f} MiB sampled, standing for {t['bytes'] / MIB:.0f} MiB. Cells: "
                  "compressed size relative to zlib -6 (the wheels' own deflate, below).", ""]
        rows = [[name, f"{a['bytes'] / MIB:.0f}", f"{a['zlib6'] / a['bytes']:.3f}",
                 *[f"{a[f'xz{q}'] / a['zlib6']:.3f}" for q in presets]]
                for name, a in sorted(e["packages"].items(), key=lambda kv: -kv[1]["bytes"])]
        rows.append(["**all**", f"{t['bytes'] / MIB:.0f}", f"{t['zlib6'] / t['bytes']:.3f}",
                     *[f"**{t[f'xz{q}'] / t['zlib6']:.3f}**" for q in presets]])
        lines += [markdown_table(["package", "MiB unpacked", "zlib6 of raw", *[f"xz {q}" for q in presets]], rows), "",
                  "Speed on these slices, per core: " + ", ".join(
                      f"xz {q} {e['mb_s_per_core'][f'xz{q}']} MB/s" for q in presets) + ".", ""]
    d = result.get("deflate")
    if d:
        lines += ["## The wheels' own deflate", "",
                  "Largest members of the largest wheels in the wheel cache, stored compressed size / zlib -6: "
                  + ", ".join(f"{w['wheel'].split('-')[0]} {w['deflate_vs_zlib6']:.4f}" for w in d["wheels"]), ""]
    s = result.get("stage")
    if s:
        lines += [f"## Staging {s['stack']} for Python {s['python']} (skipped: {', '.join(s['skip']) or 'none'}), "
                  f"parts of at most {s['part_mb']} MiB", ""]
        rows = [[r["compress"], "" if r.get("preset") is None else r["preset"], r["wheels"], r["parts"],
                 f"{r['carried_bytes'] / MIB:.0f}", f"{r['tar_bytes'] / MIB:.0f}", f"{r['wall_s']:.0f}",
                 f"{r['load_before']} / {r['load_after']}"] for r in s["runs"].values()]
        lines += [markdown_table(["compress", "preset", "wheels", "parts", "carried MiB", "joined tar MiB",
                                  "host wall s", "load avg before / after"], rows), "",
                  "The `none` run's wall time includes downloading the wheels; the xz runs found them cached.", ""]
    v = result.get("validate")
    if v:
        lines += ["## The kept xz staging, taken apart as the GPU host does", "",
                  f"{v['parts']} parts (preset {v['preset']}) verified in {v['verify_s']} s, decompressed in parallel "
                  f"into the {v['tar_bytes'] / MIB:.0f} MiB tar on {v['threads']} threads in {v['decompress_s']} s, "
                  f"tar sha256 as staged; {v['wheels']} stored wheels, {v['members_identical']} members identical to "
                  "the original wheels (name, order, CRC-32, size, date, mode), every stored zip passes its CRC test. "
                  f"At the per-thread speed measured here, the GPU host's 16 threads would take about "
                  f"{v['decompress_s'] * v['threads'] / 16:.0f} s (expected, not measured there).", ""]
    lines += ["Speeds are from a 2-core machine shared with CI jobs (the load average is recorded), so they are lower "
              "bounds. Device time is not measured here: with each part carried in its own call at a roughly fixed "
              "cost, fewer parts are expected to cost proportionally less device time; the install there also "
              "decompresses, and extracts a tar of stored (larger) wheels.", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("members")
    m.add_argument("--sample-mib", type=int, default=16)
    m.add_argument("--presets", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5, 6])
    m.add_argument("--bcj-presets", type=int, nargs="*", default=[2, 3, 6])
    m.add_argument("--block-presets", type=int, nargs="*", default=[3])
    m.add_argument("--block-bcj", type=int, default=1)
    m.add_argument("--blocks", type=int, nargs="*", default=[2, 4, 8, 16])
    m.add_argument("--scaling-preset", type=int, default=3)
    m.add_argument("--bz2", type=int, nargs="*", default=[9])
    e = sub.add_parser("estimate")
    e.add_argument("--block-mib", type=int, default=2)
    e.add_argument("--slices", type=int, default=3)
    e.add_argument("--presets", type=int, nargs="+", default=[0, 1])
    e.add_argument("--stack", default="portable")
    e.add_argument("--min-mib", type=int, default=20, help="packages of at least this many MiB unpacked")
    e.add_argument("--skip-packages", nargs="*", default=[])
    sub.add_parser("render", help="rewrite the .md from the .json")
    v = sub.add_parser("validate")
    v.add_argument("--parts", required=True, help="a staging kept by stage --keep")
    d = sub.add_parser("deflate")
    d.add_argument("--wheels", type=int, default=6)
    d.add_argument("--members", type=int, default=4)
    s = sub.add_parser("stage")
    s.add_argument("--stack", required=True)
    s.add_argument("--host-packages", required=True)
    s.add_argument("--python", required=True)
    s.add_argument("--skip", action="append")
    s.add_argument("--part-mb", type=int, default=55)
    s.add_argument("--preset", type=int, default=None)
    s.add_argument("--modes", nargs="+", default=["none", "xz"])
    s.add_argument("--keep", action="store_true", help="stage into .stage/bench-STACK-MODE and keep it")
    args = p.parse_args()
    path = RESULTS / f"{NAME}.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    if args.cmd == "members":
        result["members"] = members(args)
    elif args.cmd == "estimate":
        result["estimate"] = estimate(args)
    elif args.cmd == "deflate":
        result["deflate"] = deflate(args)
    elif args.cmd == "validate":
        result["validate"] = validate(args)
    elif args.cmd == "render":
        (RESULTS / f"{NAME}.md").write_text(render(result))
        return 0
    else:  # runs of the same staging (stack, skips, part size) accumulate: one mode or preset per invocation
        new = stage(args)
        old = result.get("stage") or {}
        same = all(old.get(k) == new[k] for k in ("stack", "python", "skip", "part_mb"))
        result["stage"] = {**new, "runs": {**(old.get("runs", {}) if same else {}), **new["runs"]}}
    result["measured"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result["machine"] = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                         f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end "
                         f"(shared with other jobs: speeds are lower bounds)")
    path.write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{NAME}.md").write_text(render(result))
    print(f"wrote {path} and {NAME}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
