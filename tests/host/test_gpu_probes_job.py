"""The gpu-probes workflow's own commands, run here end to end for the cpu stack: the probe job (its GPU
layers skip with reasons) and the merge job, which must produce a compat_matrix.yaml update."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlstack import stacks
from rlstack.matrix import schema, store
from rlstack.stacks import locks

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "gpu-probes.yml"


def _invoke_commands(job: str) -> list[str]:
    """The invoke commands of a job's steps, set-up commands (./setup.sh, pip install) dropped."""
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]
    out = []
    for step in steps:
        for part in step.get("run", "").split("&&"):
            part = part.strip()
            if re.match(r"^\S*invoke\s", part):
                out.append(re.sub(r"^\S*invoke", f"{shlex.quote(sys.executable)} -m invoke", part))
    assert out, f"job {job} runs no invoke task"
    return out


def _copy_repo(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())


@pytest.mark.slow
def test_probe_and_merge_jobs_update_the_matrix(tmp_path: Path) -> None:
    _copy_repo(tmp_path)
    before = store.load(tmp_path / "compat_matrix.yaml")
    env = {**os.environ, "STACK": "cpu", "ARCH": "none", "RLSTACK_ROOT": str(tmp_path)}
    for cmd in _invoke_commands("probes"):
        proc = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    results = sorted((tmp_path / "probe-results").glob("*.json"))
    assert [p.name for p in results] == ["probe-cpu-none.json"]
    report = schema.read_report(results[0])
    runtime = [p for p in report.results if p.layer == "runtime"]
    assert runtime and all(p.status == "skip" and p.reason for p in runtime)  # skipped, with the reason

    for cmd in _invoke_commands("merge"):
        proc = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    after = store.load(tmp_path / "compat_matrix.yaml")
    cpu_hash = locks.lock_hash(stacks.load_stack("cpu"))
    new_rows = [r for r in after.rows if r.stack == "cpu" and r.lock_hash == cpu_hash and r.source == "predicted"]
    assert new_rows, "the merge did not add the cpu stack's row for its current lock"
    assert {r.key for r in before.rows} <= {r.key for r in after.rows}  # no row lost
    assert (tmp_path / "compat_matrix.yaml").read_text() != (ROOT / "compat_matrix.yaml").read_text()
    assert (tmp_path / "docs" / "compat_matrix.html").is_file()
