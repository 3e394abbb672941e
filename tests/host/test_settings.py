"""Machine settings set once (invoke.yaml): precedence flag > environment > invoke.yaml > default, and every
image command picks them up without repeating --base-image."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstack import stacks
from rlstack.core.errors import DockerError
from rlstack.host import commands, engine, images
from rlstack.stacks import settings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for envs, _ in settings.FIELDS.values():
        for var in envs:
            monkeypatch.delenv(var, raising=False)


def test_precedence_and_persistence(clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    assert settings.lookup("base_image").source == "default"
    path = settings.store({"base_image": "local/base:1", "ca_cert": str(ca)})
    assert "base_image: local/base:1" in path.read_text()
    assert settings.lookup("base_image") == settings.Setting("base_image", "local/base:1", "invoke.yaml")
    assert settings.ca_cert() == ca
    monkeypatch.setenv("RLSTACK_BASE_IMAGE", "env/base:2")
    assert settings.base_image("stack/default") == "env/base:2"
    monkeypatch.delenv("RLSTACK_BASE_IMAGE")
    settings.store({"base_image": None})
    assert settings.base_image("stack/default") == "stack/default"
    assert settings.ca_cert() == ca  # the other setting stays


def test_bad_values_are_refused(clean_env: None, tmp_path: Path) -> None:
    with pytest.raises(settings.SettingsError, match="does not exist"):
        settings.store({"ca_cert": str(tmp_path / "missing.pem")})
    with pytest.raises(settings.SettingsError, match="unknown setting"):
        settings.store({"colour": "blue"})
    (tmp_path / "noise.pem").write_bytes(bytes(range(256)))  # it was stored, and broke every build's TLS later
    with pytest.raises(settings.SettingsError, match="holds no PEM certificate"):
        settings.store({"ca_cert": str(tmp_path / "noise.pem")})
    assert not settings.config_path().exists() or "noise" not in settings.config_path().read_text()
    settings.config_path().write_text("rlstack: [1, 2]\n")
    with pytest.raises(settings.SettingsError, match="expected a mapping"):
        settings.lookup("docker")


def test_the_settings_task_sets_and_shows(clean_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.settings(base_image="rlstack-test/bookworm-minbase", docker="/usr/bin/docker") == 0
    out = capsys.readouterr().out
    assert "rlstack-test/bookworm-minbase" in out and "invoke.yaml" in out
    assert commands.settings(unset=["docker"]) == 0
    assert settings.lookup("docker").source == "default"


def test_image_commands_use_the_base_image_setting(clean_env: None, stack_tree: Path) -> None:
    cpu = stacks.load_stack("cpu")
    default_tag = images.plan(cpu, git_rev="r", created="c").tag
    settings.store({"base_image": "local/base:1"})
    p = images.plan(cpu, git_rev="r", created="c")
    assert p.base_image == "local/base:1" and p.tag != default_tag and p.args["BASE_IMAGE"] == "local/base:1"
    assert images.plan(cpu, base_image="flag/base", git_rev="r", created="c").base_image == "flag/base"


def test_not_built_says_which_base_image_the_existing_one_used(clean_env: None, stack_tree: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = stacks.load_stack("cpu")
    p = images.plan(cpu, git_rev="r", created="c")
    monkeypatch.setattr(engine, "engine_info", lambda: {"ServerVersion": "27.0"})
    monkeypatch.setattr(engine, "image_exists", lambda ref: ref == p.latest)
    monkeypatch.setattr(images, "labels_of", lambda ref: {"io.rlstack.base-image": "rlstack-test/bookworm-minbase"})
    with pytest.raises(DockerError) as exc:
        images.require_built(p)
    msg = str(exc.value)
    assert "built on base image rlstack-test/bookworm-minbase" in msg
    assert "invoke settings --base-image rlstack-test/bookworm-minbase" in msg
    monkeypatch.setattr(engine, "image_exists", lambda ref: False)
    with pytest.raises(DockerError, match="no image of stack 'cpu'"):
        images.require_built(p)
