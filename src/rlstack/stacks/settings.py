"""Settings a user sets once per machine: the base image to build on, the CA bundle of a TLS-intercepting proxy,
the docker client. They persist in invoke's own project config, `invoke.yaml` beside tasks.py (git-ignored:
they describe this machine, not the project), under the key `rlstack`; `invoke settings` shows and sets them.

Precedence, highest first: a command's own flag, the environment (RLSTACK_BASE_IMAGE, RLSTACK_CA_CERT,
RLSTACK_DOCKER; for the CA bundle also SSL_CERT_FILE, PIP_CERT, REQUESTS_CA_BUNDLE, which pip and uv
already honour), invoke.yaml, the built-in default (the stack's base_image, no CA bundle, /usr/bin/docker).
This module is the one place each of them is looked up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlstack.core.errors import RlstackError
from rlstack.core.fileio import write_atomic
from rlstack.core.paths import project_root

CONFIG_FILE = "invoke.yaml"
SECTION = "rlstack"
FIELDS = {  # setting -> (environment variables, what it is)
    "base_image": (("RLSTACK_BASE_IMAGE",), "image every stack builds on (the image tag hashes it)"),
    "ca_cert": (("RLSTACK_CA_CERT", "SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"),
                "CA bundle of a TLS-intercepting proxy (a BuildKit secret in builds; uv and wheel downloads)"),
    "docker": (("RLSTACK_DOCKER",), "docker client to call"),
}
# Debian's docker.io client (20.10) has BuildKit built in; a newer static client without the buildx plugin
# refuses DOCKER_BUILDKIT=1 builds. Prefer the former where it exists.
PREFERRED_DOCKER = "/usr/bin/docker"


class SettingsError(RlstackError):
    pass


@dataclass(frozen=True)
class Setting:
    name: str
    value: str | None
    source: str  # "environment (VAR)", "invoke.yaml", "default"


def config_path(root: Path | None = None) -> Path:
    """invoke.yaml beside tasks.py; $RLSTACK_SETTINGS_FILE names another (tests use their own)."""
    env = os.environ.get("RLSTACK_SETTINGS_FILE")
    if env and root is None:
        return Path(env)
    return (root or project_root()) / CONFIG_FILE


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML: {exc}", f"fix or delete {path}") from None
    if not isinstance(data, dict) or not isinstance(data.get(SECTION) or {}, dict):
        raise SettingsError(f"{path}: expected a mapping with an '{SECTION}' mapping", f"fix or delete {path}")
    return data


def stored(root: Path | None = None) -> dict[str, str]:
    section = _read(config_path(root)).get(SECTION) or {}
    return {k: str(v) for k, v in section.items() if k in FIELDS and v not in (None, "")}


def lookup(name: str, root: Path | None = None) -> Setting:
    envs, _ = FIELDS[name]
    for var in envs:
        if os.environ.get(var):
            return Setting(name, os.environ[var], f"environment ({var})")
    value = stored(root).get(name)
    if value:
        return Setting(name, value, CONFIG_FILE)
    return Setting(name, None, "default")


def base_image(stack_default: str) -> str:
    return lookup("base_image").value or stack_default


def ca_cert() -> Path | None:
    value = lookup("ca_cert").value
    return Path(value) if value else None


def docker_client() -> str:
    value = lookup("docker").value
    if value:
        return value
    return PREFERRED_DOCKER if os.path.exists(PREFERRED_DOCKER) else "docker"


PEM_MARK = b"-----BEGIN CERTIFICATE-----"


def _check_pem(path: Path) -> None:
    """A CA bundle is a PEM file holding at least one certificate: anything else (a binary file, a key, a typo's
    wrong file) would be stored and then break every later build's TLS with a message far from its cause."""
    if not path.is_file():
        raise SettingsError(f"CA bundle {path} does not exist", "pass the path of a PEM file")
    try:
        head = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"CA bundle {path}: cannot read it ({exc.strerror or exc})",
                            "pass the path of a PEM file you can read") from None
    if PEM_MARK not in head:
        raise SettingsError(f"CA bundle {path} holds no PEM certificate ('{PEM_MARK.decode()}')",
                            "pass the proxy's CA certificates in PEM form (e.g. /etc/ssl/certs/ca-certificates.crt)")


def store(updates: dict[str, str | None], root: Path | None = None) -> Path:
    """Set (a value) or unset (None) settings in invoke.yaml, keeping every other key of the file."""
    unknown = sorted(set(updates) - set(FIELDS))
    if unknown:
        raise SettingsError(f"unknown setting(s): {', '.join(unknown)}", f"settings: {', '.join(FIELDS)}")
    path = config_path(root)
    data = _read(path)
    section = dict(data.get(SECTION) or {})
    for k, v in updates.items():
        if v is None:
            section.pop(k, None)
        else:
            if k == "ca_cert":
                _check_pem(Path(v))
            section[k] = v
    if section:
        data[SECTION] = section
    else:
        data.pop(SECTION, None)
    write_atomic(path, "# Machine settings for rlstack (invoke settings); not committed.\n" +
                 yaml.safe_dump(data, sort_keys=True))
    return path
