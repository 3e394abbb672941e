"""The option aliases several host commands share (the stack, the base image, the CA bundle): each declared once
here, so `invoke build --help` and `invoke train --help` say the same thing. An option one command alone takes
is declared in its signature, or beside it."""

from __future__ import annotations

from typing import Annotated

import typer

StackName = Annotated[str, typer.Option(help="stack name (images/<stack>/stack.toml)")]
StackList = Annotated[str | None, typer.Option(help="one stack or a comma-separated list (default: all)")]
BaseImage = Annotated[str | None, typer.Option(help="build on this base image instead of the machine's setting or "
                                                    "stack.toml's (invoke settings --base-image sets it once)")]
CaCert = Annotated[str | None, typer.Option(help="CA bundle of a TLS-intercepting proxy, passed to builds as a "
                                                 "BuildKit secret (invoke settings --ca-cert sets it once)")]
