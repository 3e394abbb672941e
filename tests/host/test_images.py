"""Build args, content tag, build command and the build-time checks, without a Docker engine."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from rlstack import stacks
from rlstack.core.errors import DockerError, RlstackError
from rlstack.core.pkgnames import normalize
from rlstack.host import engine, images
from rlstack.scripts import image_checks
from rlstack.stacks import locks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(stack_tree: Path) -> Path:
    """stack_tree plus the Dockerfile, a source file and a recipe: enough for a content hash."""
    shutil.copy(ROOT / "images" / "Dockerfile", stack_tree / "images" / "Dockerfile")
    (stack_tree / "src" / "rlstack").mkdir(parents=True)
    (stack_tree / "src" / "rlstack" / "mod.py").write_text("x = 1\n")
    (stack_tree / "recipes").mkdir()
    (stack_tree / "recipes" / "r.toml").write_text("name = 'r'\n")
    return stack_tree


def test_build_args_come_from_stack_file_and_lock(tree: Path) -> None:
    for name in ("cpu", "portable", "fp8", "fp8-report"):
        st = stacks.load_stack(name)
        args = images.build_args(st, "base:1", git_rev="abc")
        assert args["STACK"] == name
        assert args["TORCH_VERSION"] == st.torch.version
        assert args["TORCH_CUDA"] == (st.torch.cuda or "none")
        assert args["GPU_ARCHS"].split(",") == (st.gpu_archs or [""])
        assert args["LOCK_HASH"] == locks.lock_hash(st)
        assert args["NVIDIA_VISIBLE_DEVICES"] == ("all" if st.gpu_required else "void")
        pins = locks.locked_versions(st)
        for item in args["KEY_PACKAGES"].split():
            pkg, ver = item.split("==")
            assert pins[normalize(pkg)] == ver


def test_every_build_arg_is_declared_in_the_dockerfile(tree: Path) -> None:
    declared = set(re.findall(r"^ARG (\w+)", (ROOT / "images" / "Dockerfile").read_text(), re.M))
    args = images.build_args(stacks.load_stack("cpu"), "base:1")
    assert set(args) <= declared, set(args) - declared


def test_content_hash_changes_with_source_lock_and_base_not_with_git(tree: Path) -> None:
    st = stacks.load_stack("cpu")
    h0 = images.content_hash(st, "base:1")
    assert images.content_hash(st, "base:1") == h0
    assert images.content_hash(st, "base:2") != h0
    (tree / "src" / "rlstack" / "mod.py").write_text("x = 2\n")
    h1 = images.content_hash(st, "base:1")
    assert h1 != h0
    with st.lock_file.open("a") as f:
        f.write("\n")
    h2 = images.content_hash(st, "base:1")
    assert h2 != h1
    (tree / "images" / "Dockerfile").write_text((tree / "images" / "Dockerfile").read_text() + "\n")
    assert images.content_hash(st, "base:1") != h2


def test_content_hash_ignores_bytecode(tree: Path) -> None:
    st = stacks.load_stack("cpu")
    h0 = images.content_hash(st, "b")
    cache = tree / "src" / "rlstack" / "__pycache__"
    cache.mkdir()
    (cache / "mod.cpython-311.pyc").write_bytes(b"\0")
    assert images.content_hash(st, "b") == h0


def test_plan_tags_and_build_command(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLSTACK_BASE_IMAGE", raising=False)
    ca = tree / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    st = stacks.load_stack("cpu")
    p = images.plan(st, ca_cert=ca, git_rev="r1", created="2026-01-01T00:00:00+00:00")
    assert p.base_image == st.base_image
    assert re.fullmatch(r"rlstack/cpu:[0-9a-f]{12}", p.tag)
    assert p.latest == "rlstack/cpu:latest"
    cmd = images.build_command(p, "/usr/bin/docker")
    assert cmd[:2] == ["/usr/bin/docker", "build"]
    assert cmd[-1] == str(tree)
    assert f"id=ca,src={ca}" in cmd
    assert "BASE_IMAGE=debian:bookworm-slim" in cmd
    assert "--no-cache" not in cmd
    assert cmd[cmd.index("--network") + 1] == "host"
    # the CA bundle's contents never appear on the command line, only its path as a secret source
    assert not any("BEGIN CERTIFICATE" in a for a in cmd)


def test_env_defaults_for_base_image_and_ca(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tree / "corp.pem"
    ca.write_text("x")
    monkeypatch.setenv("RLSTACK_BASE_IMAGE", "mirror.example/debian:bookworm-slim")
    monkeypatch.setenv("RLSTACK_CA_CERT", str(ca))
    p = images.plan(stacks.load_stack("cpu"), git_rev="r", created="t")
    assert p.base_image == "mirror.example/debian:bookworm-slim"
    assert p.ca_cert == ca
    assert p.args["BASE_IMAGE"] == "mirror.example/debian:bookworm-slim"


def test_missing_ca_file_is_a_clear_error(tree: Path) -> None:
    with pytest.raises(RlstackError, match="does not exist"):
        images.plan(stacks.load_stack("cpu"), ca_cert=tree / "nope.pem", git_rev="r", created="t")


def test_buildkit_problem_parser() -> None:
    ok_help = "Usage: docker build [OPTIONS] PATH\n      --secret stringArray   Secret file"
    assert engine.buildkit_problem({"ServerVersion": "20.10.24+dfsg1", "OSType": "linux"}, ok_help) is None
    assert "18.09" in (engine.buildkit_problem({"ServerVersion": "17.12.1"}, ok_help) or "")
    assert "buildx" in (engine.buildkit_problem(
        {"ServerVersion": "28.0.1"}, "ERROR: BuildKit is enabled but the buildx component is missing or broken.") or "")
    assert "--secret" in (engine.buildkit_problem({"ServerVersion": "20.10.0"}, "Usage: docker build") or "")


def test_nvidia_runtime_problem_names_the_toolkit() -> None:
    none = lambda _tool: None  # noqa: E731
    assert engine.nvidia_runtime_problem({"Runtimes": {"nvidia": {}, "runc": {}}}, none) is None
    assert engine.nvidia_runtime_problem({"Runtimes": {"runc": {}}},
                                         lambda t: "/usr/bin/x" if t == "nvidia-container-cli" else None) is None
    problem = engine.nvidia_runtime_problem({"Runtimes": {"runc": {}}}, none)
    assert problem is not None and "nvidia-container-toolkit" in problem and "runc" in problem


def test_no_engine_is_a_docker_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("RLSTACK_DOCKER", str(fake))
    with pytest.raises(DockerError, match="no Docker engine answers") as exc:
        engine.engine_info()
    assert "dockerd" in str(exc.value) and exc.value.exit_code == 5


LOCK = """# rlstack-lock: stack=t
alpha==1.0 \\
    --hash=sha256:00
beta-pkg==2.0.post1 \\
    --hash=sha256:11
winonly==3.0 ; sys_platform == 'win32' \\
    --hash=sha256:22
"""


def test_lock_parse_and_environment_equal() -> None:
    pins, conditional = image_checks.parse_lock(LOCK)
    assert pins == {"alpha": "1.0", "beta-pkg": "2.0.post1", "winonly": "3.0"}
    assert conditional == {"winonly"}
    installed = {"alpha": "1.0", "beta-pkg": "2.0.post1", "rlstack": "0.1.0"}
    assert image_checks.check_environment(pins, conditional, installed) == []


def test_environment_drift_is_reported() -> None:
    pins, conditional = image_checks.parse_lock(LOCK)
    problems = image_checks.check_environment(pins, conditional, {"alpha": "1.1", "extra": "9"})
    text = "\n".join(problems)
    assert "alpha is 1.1, the lock pins 1.0" in text
    assert "beta-pkg==2.0.post1 is in the lock but not installed" in text
    assert "extra==9 is installed but not in the lock" in text
    assert "winonly" not in text


def test_torch_checks_against_the_real_torch() -> None:
    torch = pytest.importorskip("torch")
    version = torch.__version__.split("+")[0]
    cuda = torch.version.cuda
    assert image_checks.check_torch(version, cuda, []) == []
    wrong = image_checks.check_torch("0.0.1", "99.9", [])
    assert any("stack.toml says torch.version = '0.0.1'" in p for p in wrong)
    assert any("torch.cuda = '99.9'" in p for p in wrong)
    if cuda:
        compiled = torch._C._cuda_getArchFlags().split()
        real = [a for a in compiled if a.startswith("sm_")][:2]
        assert image_checks.check_torch(version, cuda, real) == []
        bad = image_checks.check_torch(version, cuda, ["sm_11"])
        assert any("no kernels for sm_11" in p for p in bad)


def test_compile_imports_name_the_missing_package() -> None:
    """A GPU stack whose environment cannot import what torch.compile imports fails the build, naming it."""

    def no_setuptools(module: str) -> object:
        raise ModuleNotFoundError("No module named 'setuptools'", name="setuptools")

    problems = image_checks.check_compile_imports(no_setuptools)
    assert len(problems) == 1 and "torch.utils.cpp_extension" in problems[0] and "setuptools" in problems[0]
    assert image_checks.check_compile_imports(lambda module: object()) == []


def test_image_checks_cli_fails_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    lock_file = tmp_path / "requirements.lock"
    lock_file.write_text("definitely-not-installed==1.0 \\\n    --hash=sha256:00\n")
    rc = image_checks.main(["--torch-version", "0.0.1", "--torch-cuda", "none", "--lock", str(lock_file),
                            "--stack", "t"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "rlstack image check failed for stack 't'" in err
    assert "definitely-not-installed==1.0 is in the lock but not installed" in err
    assert "invoke lock --stack t" in err


def test_buildx_and_gha_cache_flags(tree: Path) -> None:
    st = stacks.load_stack("fp8")
    p = images.plan(st, buildx=True, cache="gha", git_rev="r", created="t")
    cmd = images.build_command(p, "docker")
    assert cmd[:4] == ["docker", "buildx", "build", "--load"]
    assert "type=gha,scope=rlstack-fp8" in cmd and "type=gha,mode=max,scope=rlstack-fp8" in cmd
    assert "--network" not in cmd  # the buildx container driver would need the network.host entitlement
    with pytest.raises(RlstackError, match="needs --buildx"):
        images.plan(st, cache="gha", git_rev="r", created="t")
    with pytest.raises(RlstackError, match="unknown build cache"):
        images.plan(st, buildx=True, cache="s3", git_rev="r", created="t")


def test_smoke_reruns_the_checks_with_the_stacks_values(tree: Path) -> None:
    st = stacks.load_stack("portable")
    p = images.plan(st, git_rev="r", created="t")
    from rlstack.host import containers

    cmd = containers.check_image_command(p, "docker")
    assert cmd[cmd.index("--entrypoint") + 1] == "python" and p.tag in cmd
    assert cmd[cmd.index("--gpu-archs") + 1] == ",".join(st.gpu_archs)
    assert cmd[cmd.index("--torch-cuda") + 1] == st.torch.cuda
    assert cmd[cmd.index("--lock") + 1] == "/opt/rlstack/images/portable/requirements.lock"


def test_disk_problem_names_the_free_space_and_need() -> None:
    from collections import namedtuple

    from rlstack.host import images

    usage = namedtuple("usage", "total used free")
    msg = images.disk_problem("/var/lib/docker", 12, usage=lambda p: usage(100e9, 97e9, 3e9))
    assert msg is not None and "3.0 GB free under /var/lib/docker" in msg and "12 GB" in msg
    assert images.disk_problem("/var/lib/docker", 12, usage=lambda p: usage(100e9, 50e9, 50e9)) is None

    def unreadable(p: str) -> object:
        raise FileNotFoundError(p)

    assert images.disk_problem("/remote", 12, usage=unreadable) is None


def test_build_refused_up_front_when_the_disk_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import namedtuple

    from rlstack import stacks
    from rlstack.core.errors import DockerError
    from rlstack.host import engine, images

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(engine, "engine_info", lambda: {"DockerRootDir": "/var/lib/docker", "ServerVersion": "27.0"})
    monkeypatch.setattr(engine, "image_exists", lambda ref: True)
    monkeypatch.setattr(engine, "require_buildkit", lambda info: None)
    monkeypatch.setattr(images.shutil, "disk_usage", lambda p: usage(100e9, 99e9, 1e9))
    ran: list[object] = []
    monkeypatch.setattr(images.runner, "run", lambda *a, **k: ran.append(a))
    p = images.plan(stacks.load_stack("cpu"), base_image="debian:bookworm-slim", git_rev="x", created="now")
    with pytest.raises(DockerError) as exc:
        images.ensure_built(p, force=True)
    assert "1.0 GB free" in str(exc.value) and "docker builder prune" in str(exc.value)
    assert ran == []  # nothing was started


def test_rlstack_is_built_with_the_hash_locked_backend() -> None:
    """The runtime stage builds rlstack's wheel with the build backend from images/build-backend.lock
    (--require-hashes, no build isolation, offline), never with one the installer fetches unpinned."""
    text = (ROOT / "images" / "Dockerfile").read_text()
    step = text[text.index("COPY src /opt/rlstack/src"):text.index("rlstack --version")]
    assert "--require-hashes" in step and "-r /opt/rlstack/images/build-backend.lock" in step
    assert "--no-build-isolation" in step and "--offline" in step
    assert "--no-deps /opt/rlstack " not in step  # the source folder itself is never handed to the installer
    assert Path("images/build-backend.lock") in images.context_files(ROOT)
    locks.check_build_backend(ROOT)


def _runtime_env(dockerfile: str, args: dict[str, str], base_path: str) -> dict[str, str]:
    """The ENV a container of the runtime stage starts with, as Docker evaluates the Dockerfile: every ENV of
    the stages it is built FROM (os, then runtime), $VAR / ${VAR} expanded from earlier ENV values and the build
    args, PATH starting as the base image's."""
    text = re.sub(r"\\\n", " ", dockerfile)
    stages: dict[str, list[str]] = {}
    parent: dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        m = re.match(r"FROM (\S+) AS (\w+)", line)
        if m:
            current, parent[m[2]] = m[2], m[1]
            stages[current] = []
        elif current and line.startswith("ENV "):
            stages[current].append(line[4:])
    runtime_chain = ["runtime"]
    while parent[runtime_chain[0]] in stages:
        runtime_chain.insert(0, parent[runtime_chain[0]])
    env = {"PATH": base_path}
    for stage in runtime_chain:
        for spec in stages[stage]:
            for word in shlex.split(spec):
                key, _, value = word.partition("=")
                env[key] = re.sub(r"\$\{?(\w+)\}?", lambda v: env.get(v[1], args.get(v[1], "")), value)
    return env


@pytest.mark.parametrize("name", stacks.stack_names())
def test_image_env_model_is_what_the_dockerfile_sets(name: str) -> None:
    """Stack.image_env (what the toolchain probe evaluates FlashInfer's toolkit lookup in) against the ENV the
    Dockerfile gives the runtime stage, with this stack's build args: a change to either side fails here."""
    from rlstack.stacks import model

    stack = stacks.load_stack(name)
    dockerfile = (ROOT / "images" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=debian:", dockerfile, re.M), "the PATH model assumes a Debian base image"
    env = _runtime_env(dockerfile, images.toolkit_args(stack), model.DEBIAN_PATH)
    want = stack.image_env()
    assert {k: env.get(k) for k in want} == want
    assert "CUDA_PATH" not in env  # FlashInfer reads it when CUDA_HOME is empty


def test_every_apt_install_over_a_cached_lists_folder_updates_first() -> None:
    """apt's package lists live in a BuildKit cache mount, not in any layer: a RUN that installs must fetch them
    itself, or a pruned cache under a cached earlier layer leaves `apt-get install` with no lists at all."""
    text = (ROOT / "images" / "Dockerfile").read_text()
    runs = re.findall(r"^RUN (.*?)(?<!\\)\n(?=\S|\n|$)", text, re.M | re.S)
    installs = [r for r in runs if "apt-get install" in r]
    assert installs, "the Dockerfile installs nothing with apt: this test no longer pins anything"
    for run in installs:
        assert "target=/var/lib/apt/lists" in run
        assert run.index("apt-get update") < run.index("apt-get install"), run
