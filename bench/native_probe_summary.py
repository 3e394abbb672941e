"""Summarise the native sm_90 runtime-probe runs (bench/native_probe.sh on the device machine) into
bench/results/native_probe_sm90.{json,md}: what was carried, how long carrying and installing took, and what
each runtime probe found, per stack. Reads only the files the runs brought back (bench/results/sm90/).

The per-part carry times are the device lease's held seconds between consecutive `stash` calls, read off the
tool's replies during the runs; they are inputs here, not computed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_results
from rlstack.probes import signatures
from rlstack.probes.model import ProbeResult

SM90 = RESULTS / "sm90"
# held seconds of the device lease: (first stash call, last stash call, parts) per staging carried
CARRY_HELD_S = {"fp8": (149.4, 202.2, 11), "portable": (709.8, 1254.6, 68)}
RUN_FILES = {"fp8": ["probe-fp8-runtime.json", "probe-fp8-runtime-grpo-step.json"],
             "portable": ["probe-portable-runtime.json"]}
INSTALL_LOG = {"fp8": "fp8-run1.txt", "portable": "portable-run.txt"}


def main() -> None:
    table = []
    stacks = {}
    for stack, files in RUN_FILES.items():
        parts = json.loads((SM90 / f"parts-{stack}.json").read_text())
        install = re.search(r"install: (\d+) s", (SM90 / INSTALL_LOG[stack]).read_text())
        first, last, n = CARRY_HELD_S[stack]
        results: dict[str, dict[str, object]] = {}
        env: dict[str, object] = {}
        for f in files:  # later files supersede earlier results of the same probe
            r = json.loads((SM90 / f).read_text())
            env = r["environment"]
            for p in r["results"]:
                named = signatures.match_result(ProbeResult.model_validate(p))  # walls learned after the run too
                results[p["id"]] = {"status": p["status"], "s": p["duration_s"], "reason": p["reason"], "file": f,
                                    "wall": named.signature}
        stacks[stack] = {"parts": len(parts["parts"]), "mib": round(parts["tar_size"] / 2**20),
                         "carried": parts["carry"], "from_host": parts["host"], "left_out": parts["skip"],
                         "install_s": int(install[1]) if install else None,
                         "carry_s_per_part": round((last - first) / (n - 1), 1), "environment": env,
                         "results": results}
        for pid, res in results.items():
            table.append({"stack": stack, "probe": pid, "status": res["status"], "s": res["s"],
                          "wall": res["wall"] or "",
                          "env": f"py {env['python']}, torch {env['torch']} (CUDA {env['torch_cuda']}), nvcc "
                                 f"{env['toolkit']}, {len(env['deviations'])} off-lock"})
    notes = "\n".join(
        f"- **{s}**: {d['carried']} locked wheels carried ({d['mib']} MiB in {d['parts']} parts, "
        f"{d['carry_s_per_part']} s of device time per part), {d['from_host']} from the host, "
        f"{len(d['left_out'])} left out; pip install --target {d['install_s']} s. Off-lock: "
        f"{'; '.join(d['environment']['deviations'])}."  # type: ignore[index]
        for s, d in stacks.items())
    data = {"date": "2026-12-02", "gpu": {"name": "NVIDIA H200 (sm_90), driver 580.159.04"}, "stacks": stacks}
    write_results("native_probe_sm90", data, table, ["stack", "probe", "status", "s", "wall", "env"],
                  notes="Runtime probes run natively on the device machine's Python 3.12 with each stack's locked "
                        "wheels carried in (`invoke native-stage`, `bench/native_probe.sh`).\n\n" + notes)


if __name__ == "__main__":
    main()
