"""Stacks as data: each `images/<name>/stack.toml` + `requirements.in` is the single source of truth for
a stack's versions. Everything else (lock inputs, Docker build args, labels, CI matrix, docs tables) is
derived from the `Stack` objects loaded here, so a version is written exactly once."""

from __future__ import annotations

import re
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from packaging.requirements import InvalidRequirement
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlstack.core.errors import StackFileError, UnknownStackError
from rlstack.core.paths import images_dir
from rlstack.core.pkgnames import normalize, requirement_name

ARCH_RE = re.compile(r"^sm_\d{2,3}a?$")
VERSION_RE = re.compile(r"^\d+(\.\d+)*$")

Version = Annotated[str, Field(pattern=r"^\d+(\.\d+)+$")]
IMAGE_VENV = "/opt/venv"  # the stack's virtual environment in its image (images/Dockerfile)
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # debian:*-slim's PATH


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TorchSpec(_Strict):
    """torch as PyPI serves it: the wheel's CUDA build is part of the wheel, so it is pinned here."""

    version: Version
    cuda: Version | None = Field(
        description="CUDA runtime the PyPI torch wheel is built against (torch.version.cuda), or null"
    )


class ToolkitSpec(_Strict):
    """The CUDA compiler (nvcc) as a pip wheel: a hash-locked pin instead of a system install, so the
    report's 'CUDA 12.8 < 12.9' wall becomes a one-line change here."""

    version: Version
    package: str = Field(pattern=r"^nvidia-cuda-nvcc(-cu\d+)?$")
    components: dict[str, Version] = Field(
        default_factory=dict, description="other toolkit wheels the JIT compilers need and no locked library "
        "brings (e.g. nvidia-cuda-cccl: CCCL's headers, which FlashInfer's kernels include); pinned like nvcc")
    home: str = Field(default="/opt/cuda", pattern=r"^/[^\s]+$",
                      description="CUDA_HOME in the image: the toolkit folder rlstack.scripts.cuda_toolkit "
                      "assembles from these wheels")


class Stack(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    purpose: str = Field(min_length=10)
    base_image: str = Field(min_length=1)
    python: str = Field(pattern=r"^3\.\d+$")
    platform: str = "x86_64-manylinux_2_28"
    gpu_required: bool
    gpu_archs: list[str] = Field(default_factory=list)
    torch: TorchSpec
    cuda_toolkit: ToolkitSpec | None = None
    key_packages: list[str] = Field(default_factory=list, description="versions shown in tables and labels")
    max_image_gb: float = Field(gt=0, description="CI fails an image larger than this")
    ci_canary: bool = Field(False, description="its first GPU probe job runs alone before the rest")
    fp8_rl: bool = Field(False, description="Unsloth's FP8 RL path: runtime probes load vLLM with quantization=fp8 "
                                            "and the grpo-step probe trains with --fp8")
    default_recipe: str = Field("gsm8k-grpo", min_length=1,
                                description="the recipe `invoke train --stack NAME` runs when none is given")

    # Not part of the file; set by the loader.
    folder: Path = Field(default=Path("."), exclude=True)

    @field_validator("gpu_archs")
    @classmethod
    def _archs(cls, archs: list[str]) -> list[str]:
        bad = [a for a in archs if not ARCH_RE.match(a)]
        if bad:
            raise ValueError(f"not a GPU arch of the form sm_90: {', '.join(bad)}")
        return archs

    @model_validator(mode="after")
    def _gpu_consistency(self) -> Stack:
        if self.gpu_required and not self.gpu_archs:
            raise ValueError("gpu_required is true but gpu_archs is empty")
        if self.gpu_required and self.torch.cuda is None:
            raise ValueError("gpu_required is true but torch.cuda is null (a CPU-only torch)")
        return self

    @property
    def stack_file(self) -> Path:
        return self.folder / "stack.toml"

    @property
    def requirements_in(self) -> Path:
        return self.folder / "requirements.in"

    @property
    def lock_file(self) -> Path:
        return self.folder / "requirements.lock"

    @cached_property
    def top_level(self) -> list[str]:
        """The requirement lines of requirements.in (comments and blanks dropped)."""
        return read_requirement_lines(self.requirements_in)

    def derived_pins(self) -> list[str]:
        """Pins that stack.toml owns and the lock must honour; written into the resolver's input so that
        requirements.in never repeats them."""
        pins = [f"torch=={self.torch.version}"]
        if self.cuda_toolkit:
            pins.append(f"{self.cuda_toolkit.package}=={self.cuda_toolkit.version}")
            pins += [f"{name}=={version}" for name, version in sorted(self.cuda_toolkit.components.items())]
        return pins

    @property
    def cuda_label(self) -> str:
        return self.torch.cuda or "cpu"

    def image_env(self) -> dict[str, str]:
        """The variables of images/Dockerfile's ENV that decide which CUDA toolkit a JIT compiler finds in this
        stack's containers (FlashInfer's and torch's lookup: CUDA_HOME, CUDA_PATH, then `which nvcc` over PATH),
        so that the toolchain probe evaluates that lookup without building the image. PATH is the venv's bin
        before the Debian base image's own PATH; CUDA_HOME is [cuda_toolkit] home, empty for a stack without a
        toolkit (the Dockerfile's ENV sets it from a build arg either way). tests/host/test_images.py checks this
        against the Dockerfile."""
        return {"PATH": f"{IMAGE_VENV}/bin:{DEBIAN_PATH}", "VIRTUAL_ENV": IMAGE_VENV,
                "CUDA_HOME": self.cuda_toolkit.home if self.cuda_toolkit else ""}


def read_requirement_lines(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def stack_names(root: Path | None = None) -> list[str]:
    base = root or images_dir()
    return sorted(p.parent.name for p in base.glob("*/stack.toml"))


def _format_validation(path: Path, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "(file)"
        parts.append(f"{path}: field '{field}': {e['msg']}")
    return "\n".join(parts)


def load_stack_file(path: Path) -> Stack:
    """Parse and validate one stack.toml; every problem names the file and the field."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StackFileError(f"{path}: no such stack file") from None
    except UnicodeDecodeError:
        raise StackFileError(f"{path}: not a text file (not UTF-8)",
                             "restore it: git checkout -- " + str(path)) from None
    except IsADirectoryError:
        raise StackFileError(f"{path}: a folder, not a stack file", "see images/cpu/stack.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise StackFileError(f"{path}: not valid TOML: {exc}", "fix the syntax; see images/cpu/stack.toml") from None
    if not isinstance(data, dict):
        raise StackFileError(f"{path}: expected a TOML table")
    try:
        stack = Stack.model_validate({**data, "folder": path.parent})
    except ValidationError as exc:
        raise StackFileError(_format_validation(path, exc), "see images/cpu/stack.toml for a valid file") from None
    if stack.name != path.parent.name:
        raise StackFileError(
            f"{path}: field 'name': is '{stack.name}' but the folder is '{path.parent.name}'",
            "a stack's name is its folder's name",
        )
    if not stack.requirements_in.is_file():
        raise StackFileError(f"{stack.requirements_in}: missing", "each stack folder needs a requirements.in")
    toolkit = [stack.cuda_toolkit.package, *stack.cuda_toolkit.components] if stack.cuda_toolkit else []
    owned = {normalize(p) for p in ("torch", *toolkit)}
    for line in stack.top_level:
        try:
            pkg = requirement_name(line)
        except InvalidRequirement as exc:
            raise StackFileError(f"{stack.requirements_in}: '{line}' is not a requirement: {exc}",
                                 "one PEP 508 requirement per line (name, extras, version, marker)") from None
        if pkg in owned:
            raise StackFileError(
                f"{stack.requirements_in}: '{line}' pins {pkg}, which stack.toml owns",
                "set the version in stack.toml ([torch] / [cuda_toolkit]) and drop the line",
            )
    return stack


def load_stack(name: str, root: Path | None = None) -> Stack:
    names = stack_names(root)
    if name not in names:
        valid = ", ".join(names) or "(none found under images/)"
        raise UnknownStackError(f"unknown stack '{name}'", f"valid stacks: {valid}")
    return load_stack_file((root or images_dir()) / name / "stack.toml")


def load_all(root: Path | None = None) -> list[Stack]:
    return [load_stack(n, root) for n in stack_names(root)]


def resolve_names(spec: str | None, root: Path | None = None) -> list[str]:
    """'cpu', 'cpu,fp8' or None/'all' -> validated names."""
    if not spec or spec == "all":
        return stack_names(root)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        load_stack(n, root)  # raises with the valid list
    return names


Layer = Literal["resolve", "contract", "toolchain", "runtime"]
