"""A stack's image: `invoke build` and the CI checks of what was built (`ci.check-image`, `ci.image-size`,
`ci.push`). The image itself, its tag and its build, is rlstack.host.images."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import typer

from rlstack.host.commands.aliases import BaseImage, CaCert, StackName


def _plan(stack: str, base_image: str | None, ca_cert: str | None, **kw: Any) -> Any:
    from rlstack import stacks as stack_files
    from rlstack.host import images

    return images.plan(stack_files.load_stack(stack), base_image=base_image or None, ca_cert=ca_cert or None, **kw)


def build(
    stack: StackName = "cpu",
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    no_cache: Annotated[bool, typer.Option(help="rebuild every layer")] = False,
    force: Annotated[bool, typer.Option(help="build even when the content tag exists")] = False,
    buildx: Annotated[bool, typer.Option(help="build with `docker buildx build --load` (CI)")] = False,
    cache: Annotated[Literal["gha"] | None, typer.Option(help="remote BuildKit cache: gha = GitHub Actions (needs "
                                                              "--buildx)")] = None,
) -> int:
    """Build rlstack/<stack>:<hash12> and :latest with BuildKit; skipped when the content tag exists."""
    from rlstack.host import images

    print(images.ensure_built(_plan(stack, base_image, ca_cert, no_cache=no_cache, buildx=buildx, cache=cache),
                              force=force))
    return 0


def check_image(stack: StackName = "cpu", base_image: BaseImage = None, ca_cert: CaCert = None) -> int:
    """Run the built image: `rlstack --version`, then the build-time checks again inside the final image."""
    from rlstack.host import containers, images

    containers.check_image(images.require_built(_plan(stack, base_image, ca_cert)))
    return 0


def image_size(stack: StackName = "cpu", base_image: BaseImage = None, ca_cert: CaCert = None) -> int:
    """Print the image's size; fail when it is over the stack's max_image_gb."""
    from rlstack.host import images

    images.check_size(images.require_built(_plan(stack, base_image, ca_cert)))
    return 0


def push(
    registry: Annotated[str, typer.Option(help="registry prefix, e.g. ghcr.io/OWNER")],
    stack: StackName = "cpu",
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
) -> int:
    """Push rlstack/<stack>:<hash12> as <registry>/rlstack-<stack>:<hash12> and :latest."""
    from rlstack.host import images

    print(images.push(images.require_built(_plan(stack, base_image, ca_cert)), registry))
    return 0


def rootfs_export(
    out: Annotated[str, typer.Option(help="folder for the manifest, parts.json, the parts and rootfs-spec.json")],
    stack: StackName = "cpu",
    base_image: BaseImage = None,
    ca_cert: CaCert = None,
    host_packages: Annotated[str | None, typer.Option(
        help="the GPU host's `pip list --format=json`: large files of wheels it has at the same version stay "
             "out of the parts (copied there after a sha256 check)")] = None,
    preset: Annotated[int, typer.Option(min=0, max=9, help="xz preset of the parts (higher: fewer parts, slower)")
                      ] = 1,
    manifest_only: Annotated[bool, typer.Option(help="write the manifest only (no parts): for a first survey of "
                                                     "what the GPU host can supply")] = False,
    previous: Annotated[list[str] | None, typer.Option(
        help="an earlier export the GPU host already holds, repeatable (this stack's before a rebuild, or another "
             "stack's carried in the same lease): only contents none of them has go into the parts")] = None,
) -> int:
    """Export the built image for a GPU host without Docker (run there by rlstack.scripts.rootfs)."""
    import json
    from pathlib import Path

    from rlstack.host import images, rootfs

    p = images.require_built(_plan(stack, base_image, ca_cert))
    summary = rootfs.export(p.stack, p.tag, Path(out), host_packages=Path(host_packages) if host_packages else None,
                            preset=preset, manifest_only=manifest_only,
                            previous=[Path(p) for p in previous or []])
    print(json.dumps(summary))
    return 0
