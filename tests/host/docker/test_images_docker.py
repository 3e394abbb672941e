"""The cpu stack's real image, built from images/Dockerfile with only the base image swapped: what it is
(non-root, labelled, no build secret inside), what a source change rebuilds, and containers that share
the adapters volume (one trains and writes an adapter, another reads and verifies it)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO

import pytest

from rlstack import stacks
from rlstack.core.errors import DockerError
from rlstack.core.options import argv_for
from rlstack.core.pkgnames import normalize
from rlstack.host import commands, containers, engine, images
from rlstack.host.containers import Volumes
from rlstack.payload import commands as payload
from rlstack.payload.train import checkpoints
from rlstack.stacks import locks, settings

TEST_REPO = "rlstack-test"

pytestmark = pytest.mark.docker


def _docker(*args: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([engine.client(), *args], capture_output=True, text=True, check=check, **kw)  # type: ignore[call-overload]


def test_image_runs_as_non_root_with_labels(cpu_image: str, cpu_stack: stacks.Stack) -> None:
    meta = engine.inspect(cpu_image)
    assert meta["Config"]["User"] == "1000:1000"
    assert meta["Config"]["Entrypoint"] == ["rlstack"]
    assert {"/adapters", "/hf-cache", "/kernel-cache"} <= set(meta["Config"]["Volumes"])
    env = dict(e.split("=", 1) for e in meta["Config"]["Env"])
    assert env["RLSTACK_STACK"] == "cpu"
    assert env["RLSTACK_LOCK_HASH"] == locks.lock_hash(cpu_stack)
    assert env["HF_HOME"] == "/hf-cache"
    assert env["RLSTACK_KERNEL_CACHE"] == "/kernel-cache"
    labels = meta["Config"]["Labels"]
    assert labels["io.rlstack.stack"] == "cpu"
    assert labels["io.rlstack.lock-hash"] == locks.lock_hash(cpu_stack)
    assert labels["io.rlstack.torch"] == cpu_stack.torch.version
    assert labels["io.rlstack.cuda"] == cpu_stack.torch.cuda
    pins = locks.locked_versions(cpu_stack)
    for pkg in cpu_stack.key_packages:
        assert f"{pkg}=={pins[normalize(pkg)]}" in labels["io.rlstack.packages"].split()
    assert labels["org.opencontainers.image.revision"]
    assert labels["org.opencontainers.image.created"]
    out = _docker("run", "--rm", "--entrypoint", "id", cpu_image).stdout
    assert out.startswith("uid=1000(rlstack) gid=1000(rlstack)")
    assert _docker("run", "--rm", cpu_image, "--version").stdout.strip().startswith("rlstack ")


def test_build_is_skipped_when_the_content_tag_exists(cpu_image: str, cpu_stack: stacks.Stack, base_image: str,
                                                      context_copy: Path, capfd: pytest.CaptureFixture[str]) -> None:
    plan = images.plan(cpu_stack, base_image=base_image, root=context_copy, repo=TEST_REPO)
    assert plan.tag == cpu_image
    assert images.ensure_built(plan) == cpu_image
    captured = capfd.readouterr()
    assert "is up to date" in captured.out
    assert " build " not in captured.err


def test_unpullable_base_image_suggests_base_image(engine_info: object, cpu_stack: stacks.Stack,
                                                   context_copy: Path) -> None:
    plan = images.plan(cpu_stack, base_image=f"rlstack-test/no-such-base-{uuid.uuid4().hex[:6]}:0",
                       root=context_copy, repo=TEST_REPO)
    with pytest.raises(DockerError, match="cannot be pulled") as exc:
        images.ensure_built(plan)
    assert "--base-image" in str(exc.value)


def _iter_layer_files(image: str) -> Iterator[tuple[str, str, IO[bytes]]]:
    """(layer, path, file) for every regular file of every layer, streamed from `docker save` (no copy
    of the image lands on disk)."""
    proc = subprocess.Popen([engine.client(), "save", image], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
        for member in outer:
            if not (member.isfile() and member.name.endswith("layer.tar")):
                continue
            layer = outer.extractfile(member)
            assert layer is not None
            with tarfile.open(fileobj=layer, mode="r|") as inner:
                for f in inner:
                    if f.isfile():
                        fh = inner.extractfile(f)
                        assert fh is not None
                        yield member.name, f.name, fh
    assert proc.wait() == 0


def _scan_for(image: str, needles: list[bytes], digests: set[str]) -> list[str]:
    hits = []
    overlap = max(len(n) for n in needles)
    for layer, path, fh in _iter_layer_files(image):
        h = hashlib.sha256()
        tail = b""
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            window = tail + chunk
            hits += [f"{layer}:{path} contains {n[:40]!r}" for n in needles if n in window]
            tail = window[-overlap:]
        if h.hexdigest() in digests:
            hits.append(f"{layer}:{path} is the build's CA bundle")
    return hits


@pytest.fixture(scope="session")
def rebuilt(cpu_image: str, cpu_stack: stacks.Stack, base_image: str, ca_bundle: Path,
            context_copy: Path) -> Iterator[tuple[str, str]]:
    """(before, after) tags around a one-line change to a project source file; `after` is removed at the end
    (its layers but the last two are shared with `before`)."""
    src = context_copy / "src" / "rlstack" / "__init__.py"
    src.write_text(src.read_text() + f"\n# touched by the rebuild test {uuid.uuid4().hex}\n")
    plan = images.plan(cpu_stack, base_image=base_image, ca_cert=ca_bundle, root=context_copy, repo=TEST_REPO)
    assert plan.tag != cpu_image
    after = images.ensure_built(plan)
    yield cpu_image, after
    _docker("tag", cpu_image, plan.latest, check=False)
    _docker("rmi", after, check=False)


def test_source_change_rebuilds_only_the_project_layers(rebuilt: tuple[str, str]) -> None:
    before, after = (images.layer_digests(t) for t in rebuilt)
    assert len(before) == len(after)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    # The source COPY and the --no-deps install of rlstack, nothing else: the OS, Python and the
    # multi-GB locked environment are the same layers (same digests).
    assert changed == [len(after) - 2, len(after) - 1], changed
    hist = _docker("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", rebuilt[1]).stdout.splitlines()
    with_files = [line.split("\t", 1)[1] for line in hist if not line.startswith("0B")]
    assert "uv pip install" in with_files[0] and "/opt/rlstack" in with_files[0], with_files[:2]
    assert with_files[1].startswith("COPY src /opt/rlstack/src"), with_files[:2]


def test_no_ca_bundle_or_secret_in_any_layer(rebuilt: tuple[str, str], ca_bundle: Path, ca_marker: str) -> None:
    """The rebuilt image ran its rlstack install step with the marked CA bundle as a secret: neither the
    bundle nor its marker may be in any layer, the history or the config."""
    image = rebuilt[1]
    digests = {hashlib.sha256(ca_bundle.read_bytes()).hexdigest()}
    host = settings.ca_cert()
    if host and host.is_file():
        digests.add(hashlib.sha256(host.read_bytes()).hexdigest())
    hits = _scan_for(image, [ca_marker.encode()], digests)
    assert hits == []
    meta = json.dumps(engine.inspect(image)) + _docker("history", "--no-trunc", image).stdout
    assert ca_marker not in meta


def _run(spec: containers.RunSpec, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    cmd = containers.run_command(spec, engine.client())
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=900,
                          check=False)


@pytest.mark.slow
def test_train_in_one_container_verify_in_another(cpu_image: str, cpu_stack: stacks.Stack,
                                                  volumes: Volumes) -> None:
    token = f"hf_test_{uuid.uuid4().hex}"
    env = {"HF_TOKEN": token}
    train = containers.spec_for(
        cpu_stack, cpu_image,
        argv_for(payload.train, {"recipe": "recipes/smoke-cpu.toml", "overrides": ["grpo.max_steps=2"],
                                 "adapter_name": "t1"}),
        volumes=volumes, environ=env, cwd=Path("/nonexistent"),
    )
    assert "HF_TOKEN" in train.env_names
    cmd = containers.run_command(train, engine.client())
    assert token not in " ".join(cmd)
    proc = _run(train, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert token not in proc.stdout + proc.stderr

    check = containers.spec_for(cpu_stack, cpu_image, ["adapters", "--json", "--verify"], adapters_read_only=True,
                                volumes=volumes, environ={})
    proc = _run(check)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = json.loads(proc.stdout)
    assert [(e["folder"], e["ok"], e["hashes_checked"]) for e in entries] == [("t1", True, True)]
    m = entries[0]["manifest"]
    assert m["name"] == "t1" and m["stack"] == "cpu" and m["lock_hash"] == locks.lock_hash(cpu_stack)
    assert m["files"] and all(len(h) == 64 for h in m["files"].values())

    # eval's mount is read-only: a write into the adapters volume is refused
    probe = replace(check, entrypoint="sh", argv=("-c", "touch /adapters/t1/x"))
    proc = _run(probe)
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr
    # and the root filesystem is read-only too, while /tmp is writable
    probe = replace(check, entrypoint="sh", argv=("-c", "touch /tmp/ok && touch /opt/rlstack/x"))
    proc = _run(probe)
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr

    # the token never reached the image or its history
    meta = json.dumps(engine.inspect(cpu_image)) + _docker("history", "--no-trunc", cpu_image).stdout
    assert token not in meta


def test_gpu_stack_is_refused_before_any_build_without_nvidia_runtime(engine_info: dict[str, object]) -> None:
    """A GPU stack's image is 8-10 GB and minutes to build: an engine that cannot run it says so first."""
    import time

    if engine.nvidia_runtime_problem(engine_info) is None:
        pytest.skip("this engine has an NVIDIA runtime")
    portable = stacks.load_stack("portable")
    plan = images.plan(portable, repo=TEST_REPO)
    t0 = time.monotonic()
    with pytest.raises(DockerError, match="nvidia-container-toolkit"):
        containers.ready_image(portable, base_image=plan.base_image)
    assert time.monotonic() - t0 < 30 and not engine.image_exists(plan.tag)


def test_check_image_passes_in_the_built_image(cpu_image: str, cpu_stack: stacks.Stack, base_image: str,
                                             context_copy: Path, capfd: pytest.CaptureFixture[str]) -> None:
    plan = replace(images.plan(cpu_stack, base_image=base_image, root=context_copy, repo=TEST_REPO), tag=cpu_image)
    containers.check_image(plan)  # read-only root: Python finds its temporary folder on the tmpfs
    out = capfd.readouterr()
    assert "No usable temporary directory" not in out.err + out.out


@pytest.mark.slow
def test_cpu_stack_end_to_end_through_the_host_commands(cpu_image: str, base_image: str, volumes: Volumes,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """What the README shows: `invoke train --stack cpu` (the stack's default recipe, no download), then
    `invoke eval` of its adapter, with the run folders copied out to ./runs on the host."""
    monkeypatch.setattr(images, "REPO", TEST_REPO)
    monkeypatch.setattr(containers, "Volumes", lambda: volumes)
    monkeypatch.setenv("RLSTACK_BASE_IMAGE", base_image)
    monkeypatch.chdir(tmp_path)
    assert images.plan(stacks.load_stack("cpu")).tag == cpu_image  # the real checkout's image: no rebuild
    assert commands.train(stack="cpu", max_steps=2, adapter_name="e2e") == 0
    run = tmp_path / "runs" / "train" / "e2e"
    assert (run / "metrics.jsonl").is_file() and (run / "reward_curve.png").is_file()
    out = capfd.readouterr().out
    assert f"metrics:  {run / 'metrics.jsonl'}" in out
    assert commands.eval_(stack="cpu", adapter="e2e", n=4, max_new_tokens=8) == 0
    results = list((tmp_path / "runs" / "eval").glob("e2e-*/results.json"))
    assert len(results) == 1 and json.loads(results[0].read_text())["n"] == 4
    assert f"results:  {results[0]}" in capfd.readouterr().out
    assert commands.adapters(stack="cpu", verify=True) == 0
    assert commands.runs(stack="cpu") == 0
    listed = capfd.readouterr().out.split()
    assert "train/e2e" in listed and f"eval/{results[0].parent.name}" in listed


def _wait_for(cmd: list[str], until: float, pred: object, alive: subprocess.Popen[str] | None = None) -> str:
    import time

    while time.monotonic() < until:
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the container exited ({alive.returncode}) before {' '.join(cmd)} saw it")
        out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
        if pred(out):  # type: ignore[operator]
            return out
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting on {' '.join(cmd)}")


@pytest.mark.slow
def test_killed_training_resumes_from_its_checkpoint(cpu_image: str, cpu_stack: stacks.Stack,
                                                     volumes: Volumes, tmp_path: Path) -> None:
    """SIGTERM then SIGKILL a training container after its first checkpoint; --resume in a new container
    continues with one metrics row per step, and no adapter is visible before the run completes."""
    import time

    name = f"rlstack-test-kill-{uuid.uuid4().hex[:8]}"
    # the kill must land between checkpoint-2 and the end of the run: a warm machine trains a smoke step in
    # about 0.5 s, so 6 steps left the poll a window of 2 s (missed once in CI); 16 steps leave about 7 s
    steps = 16
    base = ["--adapter-name", "k1", "--set", "grpo.save_steps=2", "--set", f"grpo.max_steps={steps}"]
    spec = replace(containers.spec_for(cpu_stack, cpu_image, ["train", "--recipe", "recipes/smoke-cpu.toml", *base],
                                       volumes=volumes, environ={}, cwd=Path("/nonexistent")), name=name)
    # the container's output goes to a file: an unread pipe fills up and stalls the training it watches
    log = tmp_path / "train.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(containers.run_command(spec, engine.client()), stdout=fh, stderr=subprocess.STDOUT,
                                text=True)
    try:
        try:
            # sealed, not just named: the folder appears when the save starts, and a kill during the save
            # leaves a torn checkpoint that --resume rightly refuses (missed so once in CI, 2026-12-04)
            first = "/opt/rlstack/runs/train/k1/checkpoints/checkpoint-2"
            _wait_for([engine.client(), "exec", name, "ls", "-A", first],
                      time.monotonic() + 600, lambda out: checkpoints.SEAL in out.split(), alive=proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- training log ---\n{log.read_text()[-3000:]}") from None
        _docker("kill", "--signal", "TERM", name, check=False)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _docker("kill", name, check=False)  # SIGKILL
            proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            _docker("kill", name, check=False)
            proc.wait(timeout=60)
    assert proc.returncode != 0  # it was interrupted, not finished

    ls = replace(spec, name=None, entrypoint="sh", argv=("-c", "ls -A /adapters"), adapters_read_only=True)
    assert _run(ls).stdout.split() == [] or all(e.startswith(".") for e in _run(ls).stdout.split())

    resumed = replace(spec, name=None, argv=(*spec.argv, "--resume"))
    out = _run(resumed)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming k1 from checkpoint-" in out.stderr
    cat = replace(spec, name=None, entrypoint="cat", argv=("/opt/rlstack/runs/train/k1/metrics.jsonl",))
    rows = [json.loads(line)["step"] for line in _run(cat).stdout.splitlines() if line.strip()]
    assert rows == list(range(1, steps + 1))
    check = replace(spec, name=None, argv=("adapters", "--json", "--verify"), adapters_read_only=True)
    entries = json.loads(_run(check).stdout)
    assert [e["folder"] for e in entries] == ["k1"] and entries[0]["ok"]
    assert entries[0]["manifest"]["metrics"]["steps"] == steps
