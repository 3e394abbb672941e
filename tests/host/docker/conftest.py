"""Fixtures for the Docker tests: an engine (skip without one, fail with RLSTACK_REQUIRE_DOCKER=1), the
debootstrap base image, and the cpu stack's image built from the real Dockerfile with only BASE_IMAGE
swapped. The build runs from a temporary copy of the build context, so a test can touch a source file
without touching the checkout; BuildKit's cache is keyed by content, so the copy costs no rebuild."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlstack import stacks
from rlstack.core.errors import DockerError
from rlstack.host import engine, images
from rlstack.host.containers import Volumes
from rlstack.stacks import settings

ROOT = Path(__file__).resolve().parents[3]
TEST_BASE = os.environ.get("RLSTACK_TEST_BASE", "rlstack-test/bookworm-minbase")
TEST_REPO = "rlstack-test"
CA_MARKER = f"# rlstack-test-ca-marker {uuid.uuid4().hex}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def engine_info() -> dict[str, object]:
    try:
        return engine.engine_info()
    except DockerError as exc:
        if os.environ.get("RLSTACK_REQUIRE_DOCKER") == "1":
            pytest.fail(f"RLSTACK_REQUIRE_DOCKER=1 but {exc}")
        pytest.skip(f"no Docker engine: {exc.message} (set RLSTACK_REQUIRE_DOCKER=1 to make this a failure)")


@pytest.fixture(scope="session")
def base_image(engine_info: dict[str, object]) -> str:
    """The debootstrap bookworm minbase image; made by .ci/docker-setup.sh when missing (cached after)."""
    if not engine.image_exists(TEST_BASE):
        subprocess.run(["bash", str(ROOT / ".ci" / "docker-setup.sh")], check=True,
                       env={**os.environ, "RLSTACK_TEST_BASE": TEST_BASE})
    assert engine.image_exists(TEST_BASE)
    return TEST_BASE


@pytest.fixture(scope="session")
def ca_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The host's CA bundle plus a unique marker line: the build's TLS works as before, and the marker
    proves where the secret's bytes went (nowhere in the image, the tests check)."""
    src = settings.ca_cert() or Path("/etc/ssl/certs/ca-certificates.crt")
    out = tmp_path_factory.mktemp("ca") / "ca.pem"
    out.write_text(Path(src).read_text() + f"\n{CA_MARKER}\n")
    return out


@pytest.fixture(scope="session")
def ca_marker() -> str:
    return CA_MARKER


@pytest.fixture(scope="session")
def context_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return images.copy_context(tmp_path_factory.mktemp("context"), ROOT)


@pytest.fixture(scope="session")
def cpu_stack(context_copy: Path) -> stacks.Stack:
    return stacks.load_stack("cpu", context_copy / "images")


@pytest.fixture(scope="session")
def cpu_image(base_image: str, ca_bundle: Path, context_copy: Path, cpu_stack: stacks.Stack) -> str:
    plan = images.plan(cpu_stack, base_image=base_image, ca_cert=ca_bundle, root=context_copy, repo=TEST_REPO)
    tag = images.ensure_built(plan)
    # Earlier runs' images (other source trees) are not needed again: drop their tags so a CI machine that
    # keeps /var/lib/docker does not fill its disk with them.
    listed = subprocess.run([engine.client(), "images", "--format", "{{.Repository}}:{{.Tag}}", f"{TEST_REPO}/cpu"],
                            capture_output=True, text=True, check=False).stdout.split()
    stale = [ref for ref in listed if ref not in (tag, plan.latest)]
    if stale:
        subprocess.run([engine.client(), "rmi", *stale], capture_output=True, check=False)
    return tag


@pytest.fixture
def volumes(engine_info: dict[str, object]) -> Iterator[Volumes]:
    tag = uuid.uuid4().hex[:8]
    vols = Volumes(adapters=f"rlstack-test-adapters-{tag}", hf_cache=f"rlstack-test-hf-{tag}",
                   runs=f"rlstack-test-runs-{tag}", kernel_cache=f"rlstack-test-kernels-{tag}")
    yield vols
    for v in (vols.adapters, vols.hf_cache, vols.runs, vols.kernel_cache):
        subprocess.run([engine.client(), "volume", "rm", "-f", v], capture_output=True, check=False)
