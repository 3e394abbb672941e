from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from rlstack import stacks
from rlstack.core import pkgnames
from rlstack.core.errors import LockError, StaleLockError
from rlstack.host import commands
from rlstack.stacks import locks, resolver


def test_committed_locks_are_fresh_and_hashed() -> None:
    for stack in stacks.load_all():
        locks.check(stack)
        text = stack.lock_file.read_text()
        pins = locks.parse_pins(text)
        assert pins["torch"] == stack.torch.version
        # every pinned package carries at least one sha256
        assert text.count("==") <= text.count("--hash=sha256:")


def test_fp8_report_lock_has_the_reports_versions() -> None:
    pins = locks.locked_versions(stacks.load_stack("fp8-report"))
    assert pins["vllm"] == "0.21.0"
    assert pins["unsloth"] == "2026.3.11"  # what vllm 0.21 allows, as in the report
    assert pins["unsloth-zoo"] == "2026.6.1"
    assert pins["nvidia-cuda-nvcc-cu12"] == "12.8.61"


def test_fp8_lock_keeps_vllm_and_torch_and_moves_the_rest() -> None:
    """The working FP8 stack: the report's vLLM and torch, with an unsloth pair from one release (the report's
    third wall began as a split pair) past the torch<2.11 cap and the inference_mode cast, and nvcc 13."""
    pins = locks.locked_versions(stacks.load_stack("fp8"))
    assert pins["vllm"] == "0.21.0" and pins["torch"] == "2.11.0" and pins["trl"] == "0.24.0"
    assert pins["unsloth"] == pins["unsloth-zoo"] == "2026.10.6"
    assert pins["nvidia-cuda-nvcc"] == "13.0.88" and "nvidia-cuda-nvcc-cu12" not in pins


def test_changed_pin_makes_lock_stale(stack_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = stack_tree / "images" / "cpu" / "requirements.in"
    req.write_text(req.read_text().replace("trl==0.24.0", "trl==0.23.0"))
    with pytest.raises(StaleLockError) as exc:
        locks.check(stacks.load_stack("cpu"))
    assert "stack 'cpu'" in str(exc.value)
    assert "invoke lock --stack cpu" in str(exc.value)
    assert commands.lock(check=True) == StaleLockError.exit_code
    captured = capsys.readouterr()
    err = captured.err
    assert "STALE" in err and "cpu" in err
    assert "lock ok: fp8" in captured.out


def test_stack_toml_change_makes_lock_stale(stack_tree: Path) -> None:
    path = stack_tree / "images" / "fp8" / "stack.toml"
    path.write_text(path.read_text().replace('version = "13.0.88"', 'version = "13.0.48"'))
    with pytest.raises(StaleLockError, match="stack 'fp8'"):
        locks.check(stacks.load_stack("fp8"))


def test_purpose_edit_keeps_lock_fresh(stack_tree: Path) -> None:
    path = stack_tree / "images" / "cpu" / "stack.toml"
    path.write_text(path.read_text().replace("GRPO training", "GRPO training (edited)"))
    locks.check(stacks.load_stack("cpu"))


def test_missing_lock_and_missing_header(stack_tree: Path) -> None:
    cpu = stacks.load_stack("cpu")
    body = cpu.lock_file.read_text()
    cpu.lock_file.unlink()
    with pytest.raises(StaleLockError, match="missing"):
        locks.check(cpu)
    cpu.lock_file.write_text("\n".join(body.splitlines()[2:]))
    with pytest.raises(StaleLockError, match="no rlstack-lock header"):
        locks.check(cpu)


def test_hand_edited_torch_is_caught(stack_tree: Path) -> None:
    cpu = stacks.load_stack("cpu")
    cpu.lock_file.write_text(cpu.lock_file.read_text().replace("torch==2.10.0", "torch==2.9.1"))
    with pytest.raises(LockError, match="torch is 2.9.1"):
        locks.check(cpu)


def test_wrong_cuda_build_is_caught(stack_tree: Path) -> None:
    path = stack_tree / "images" / "cpu" / "stack.toml"
    path.write_text(path.read_text().replace('cuda = "12.8"', 'cuda = "12.6"'))
    cpu = stacks.load_stack("cpu")
    with pytest.raises(LockError, match="CUDA runtime 12.8"):
        locks.check_lock_consistency(cpu)


def test_explain_failure_keeps_the_resolvers_words() -> None:
    stderr = (
        "Using Python 3.11\n  x No solution found when resolving dependencies:\n"
        "  cause: Because vllm==0.21.0 depends on torch==2.11.0 and you require torch==2.10.0, ...\n"
    )
    out = resolver.explain_failure(stderr)
    assert "vllm==0.21.0 depends on torch==2.11.0" in out
    assert "Using Python" not in out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv not installed")
def test_conflicting_pins_fail_with_names() -> None:
    """Needs PyPI. torch 2.10 and vllm 0.21 cannot share an environment."""
    res = resolver.resolve(["vllm==0.21.0", "torch==2.10.0"], "3.11", "x86_64-manylinux_2_28", hashes=False)
    assert not res.ok
    assert "torch==2.11.0" in res.text and "torch==2.10.0" in res.text


# --- one parser ------------------------------------------------------------------------------------------


def test_parse_locked_keeps_hashes_and_markers_and_pins_derive_from_it() -> None:
    text = ("# header\nFoo_Bar==1.2 ; sys_platform == 'linux' \\\n    --hash=sha256:" + "a" * 64 + "\n"
            "    # via x\nbaz==3 \\\n    --hash=sha256:" + "b" * 64 + "\n")
    got = locks.parse_locked(text)
    assert got["foo-bar"] == locks.LockedPackage("foo-bar", "1.2", frozenset({"a" * 64}), "sys_platform == 'linux'")
    assert got["baz"].marker is None and got["baz"].hashes == {"b" * 64}
    assert locks.parse_pins(text) == {"foo-bar": "1.2", "baz": "3"}
    fp8 = stacks.load_stack("fp8")
    assert locks.locked_versions(fp8) == {n: p.version for n, p in locks.locked_packages(fp8).items()}


# --- relocking changes only what must change -------------------------------------------------------------

FAKE_NEWEST = "99.0"


def _fake_uv(calls: list[dict[str, str]]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """A stand-in for `uv pip compile --output-file F`: like uv, it reads F as preferred pins and keeps each one
    that still satisfies the requirements; anything else gets the requirement's '==' version or FAKE_NEWEST."""
    from packaging.requirements import Requirement

    def run(cmd: list[str], *, cwd: str, **_: object) -> subprocess.CompletedProcess[str]:
        out = Path(cwd) / cmd[cmd.index("--output-file") + 1]
        prefer = locks.parse_pins(out.read_text()) if out.is_file() else {}
        calls.append(prefer)
        reqs = {}
        for line in (Path(cwd) / "requirements.in").read_text().split("\n"):
            if line.strip():
                r = Requirement(line)
                reqs[pkgnames.normalize(r.name)] = r.specifier
        pins = dict(prefer)
        for name, spec in reqs.items():
            if name not in pins or not spec.contains(pins[name], prereleases=True):
                exact = [s.version for s in spec if s.operator == "=="]
                pins[name] = exact[0] if exact else FAKE_NEWEST
        out.write_text("".join(f"{n}=={v} \\\n    --hash=sha256:{'0' * 64}\n" for n, v in sorted(pins.items())))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_relock_keeps_every_pin_that_still_fits(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, str]] = []
    monkeypatch.setattr(resolver.runner, "run", _fake_uv(calls))
    cpu = stacks.load_stack("cpu")
    before = locks.locked_versions(cpu)
    req = stack_tree / "images" / "cpu" / "requirements.in"
    req.write_text(req.read_text().replace("trl==0.24.0", "trl==0.23.0"))
    cpu = stacks.load_stack("cpu")
    resolver.write_lock(cpu)
    assert calls and calls[0] == before  # uv was handed the committed lock as its preferences
    after = locks.locked_versions(cpu)
    assert {n for n in before if after.get(n) != before[n]} == {"trl"} and after["trl"] == "0.23.0"
    locks.check(cpu)
    # upgrade=True resolves from scratch: no preferences, so unpinned packages move (the fake index has no
    # CUDA runtime for the consistency check to find)
    monkeypatch.setattr(locks, "check_lock_consistency", lambda stack: None)
    resolver.write_lock(cpu, upgrade=True)
    assert calls[-1] == {} and locks.locked_versions(cpu)["accelerate"] == FAKE_NEWEST


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv not installed")
def test_real_uv_keeps_a_preferred_pin() -> None:
    """Needs PyPI. uv reads the seeded --output-file as preferences: an old packaging stays while it fits,
    even when another requirement is added; without preferences uv picks the newest."""
    plat = "x86_64-manylinux_2_28"
    old = "# rlstack-lock: stack=x inputs=y\npackaging==24.0\n"
    kept = resolver.resolve(["packaging", "pyyaml"], "3.11", plat, preferences=old)
    assert kept.ok and locks.parse_pins(kept.text)["packaging"] == "24.0"
    fresh = resolver.resolve(["packaging"], "3.11", plat, hashes=False)
    assert fresh.ok and locks.parse_pins(fresh.text)["packaging"] != "24.0"
    forced = resolver.resolve(["packaging>=25"], "3.11", plat, preferences=old)
    assert forced.ok and locks.parse_pins(forced.text)["packaging"] != "24.0"


# --- the build backend's lock ----------------------------------------------------------------------------


def test_build_backend_lock_is_fresh_hashed_and_pins_pyprojects_backend() -> None:
    locks.check_build_backend()
    text = locks.build_backend_lock_file().read_text()
    locked = locks.parse_locked(text)
    hatchling = next(r for r in locks.build_requirements() if r.startswith("hatchling=="))
    assert locked["hatchling"].version == hatchling.split("==")[1]
    assert all(p.hashes for p in locked.values())


def test_build_backend_change_makes_every_stack_stale(stack_tree: Path) -> None:
    py = stack_tree / "pyproject.toml"
    text = py.read_text()
    pin = next(r for r in locks.build_requirements(stack_tree) if r.startswith("hatchling=="))
    py.write_text(text.replace(f'"{pin}"', '"hatchling==1.0.0"'))
    with pytest.raises(StaleLockError, match="build-backend.lock is stale"):
        locks.check(stacks.load_stack("cpu"))
    assert not locks.build_backend_is_fresh(stack_tree)
    py.write_text(text.replace(f'"{pin}"', '"hatchling>=1.25"'))
    with pytest.raises(LockError, match="not pinned with '=='"):
        locks.check_build_backend(stack_tree)
    py.write_text(text)
    (stack_tree / "images" / "build-backend.lock").unlink()
    with pytest.raises(StaleLockError, match="missing"):
        locks.check(stacks.load_stack("cpu"))


def test_hand_edited_build_backend_is_caught(stack_tree: Path) -> None:
    path = locks.build_backend_lock_file(stack_tree)
    version = locks.parse_pins(path.read_text())["hatchling"]
    path.write_text(path.read_text().replace(f"hatchling=={version}", "hatchling==1.0.0"))
    with pytest.raises(LockError, match="hatchling is 1.0.0"):
        locks.check_build_backend(stack_tree)


# --- the lock verifies itself: a hand edit fails and is named ----------------------------------------------


def _edit_cpu_lock(edit: Callable[[str], str]) -> tuple[stacks.Stack, str]:
    """Apply `edit` to the stack_tree's cpu lock; returns the stack and the lock as it was (what a fresh
    resolution of the same inputs gives back, the reference that names the edit)."""
    cpu = stacks.load_stack("cpu")
    original = cpu.lock_file.read_text()
    edited = edit(original)
    assert edited != original
    cpu.lock_file.write_text(edited)
    return cpu, original


def _drop_block(text: str, name: str) -> str:
    import re

    return re.sub(rf"^{name}==[^\n]*\\\n(?:[^\n]*\\\n)*[^\n]*\n(?:    #[^\n]*\n)*", "", text, count=1, flags=re.M)


def _answer(text: str) -> locks.Reference:
    return lambda requirements, python, platform, lock_text: text


def test_hand_edited_sha256_fails_and_names_its_line(stack_tree: Path) -> None:
    good = "180885b6d7b05a19dc2dd6f722c5ce930f615e81e9e5f79d3ca910ddb9e6859e"
    cpu, original = _edit_cpu_lock(lambda t: t.replace(good, good[:-1] + "f"))
    line = next(i for i, ln in enumerate(cpu.lock_file.read_text().splitlines(), 1) if "9e6859f" in ln)
    with pytest.raises(LockError, match="edited after 'invoke lock' wrote it") as exc:
        locks.check(cpu)
    assert isinstance(exc.value, locks.EditedLockError) and "invoke lock --stack cpu" in str(exc.value)
    with pytest.raises(locks.EditedLockError) as named:
        locks.check(cpu, reference=_answer(original))
    assert f"line {line}: accelerate==1.16.0: sha256:{good[:-1]}f is not the hash" in str(named.value)
    assert named.value.exit_code == LockError.exit_code


def test_deleted_package_line_fails_and_names_the_package(stack_tree: Path) -> None:
    cpu, original = _edit_cpu_lock(lambda t: t.replace("annotated-doc==0.0.7 \\\n", ""))
    with pytest.raises(LockError) as exc:
        locks.check(cpu)  # without a reference: the orphaned hash lines still name the place
    assert "is a sha256 with no package line above it" in str(exc.value)
    with pytest.raises(locks.EditedLockError) as named:
        locks.check(cpu, reference=_answer(original))
    assert "annotated-doc==0.0.7: missing from the lock" in str(named.value)


def test_deleted_block_fails_and_names_the_package(stack_tree: Path) -> None:
    cpu, original = _edit_cpu_lock(lambda t: _drop_block(t, "jinja2"))
    assert "jinja2" not in locks.locked_versions(cpu)
    with pytest.raises(LockError, match="do not match its rlstack-lock-digest line"):
        locks.check(cpu)
    with pytest.raises(locks.EditedLockError, match=r"jinja2==3\.1\.6: missing from the lock"):
        locks.check(cpu, reference=_answer(original))


def test_edited_version_fails_and_names_its_line(stack_tree: Path) -> None:
    cpu, original = _edit_cpu_lock(lambda t: t.replace("\nmarkupsafe==3.0.4 \\", "\nmarkupsafe==3.0.3 \\"))
    line = next(i for i, ln in enumerate(cpu.lock_file.read_text().splitlines(), 1) if ln.startswith("markupsafe=="))
    with pytest.raises(locks.EditedLockError, match=f"line {line}: markupsafe is 3.0.3, the resolution of the "
                                                    "stack's inputs gives 3.0.4"):
        locks.check(cpu, reference=_answer(original))


def test_lock_without_digest_is_not_rlstacks(stack_tree: Path) -> None:
    cpu, _ = _edit_cpu_lock(lambda t: "".join(ln for ln in t.splitlines(True) if "rlstack-lock-digest" not in ln))
    with pytest.raises(locks.EditedLockError, match="not written by 'rlstack lock', or edited") as exc:
        locks.check(cpu)
    assert "invoke lock --stack cpu" in str(exc.value)


def test_digest_line_edited_alone(stack_tree: Path) -> None:
    import re

    cpu, original = _edit_cpu_lock(lambda t: re.sub(r"(?m)^(# rlstack-lock-digest: sha256:)[0-9a-f]{64}$",
                                                    r"\g<1>" + "0" * 64, t))
    with pytest.raises(locks.EditedLockError, match="the digest line itself was changed"):
        locks.check(cpu, reference=_answer(original))


def test_layout_and_annotations_do_not_count(stack_tree: Path) -> None:
    """The digest seals the resolved set, not uv's comments: an edited '# via' line is no edit of the lock."""
    cpu, _ = _edit_cpu_lock(lambda t: t.replace("    #   trl\n", "    #   trl (and more)\n", 1))
    locks.check(cpu)


@pytest.mark.parametrize("added", ["this is not a requirement line\n", "--index-url https://evil.example/simple\n"])
def test_text_outside_every_pin_is_an_edit_though_the_digest_holds(stack_tree: Path, added: str) -> None:
    """The digest seals the entries, so a line that is none passed as 'lock ok'; pip would read it."""
    cpu, _ = _edit_cpu_lock(lambda t: t + added)
    with pytest.raises(locks.EditedLockError, match="lines that are no pin, hash or comment") as exc:
        locks.check(cpu)
    assert added.strip()[:40] in str(exc.value)


def test_binary_lock_is_a_clear_error(stack_tree: Path) -> None:
    cpu = stacks.load_stack("cpu")
    cpu.lock_file.write_bytes(b"\x00\x9a\xff" * 50)
    with pytest.raises(LockError, match="not UTF-8 text|not a lock"):
        locks.check(cpu)
    with pytest.raises(LockError, match="invoke lock --stack cpu"):
        locks.locked_packages(cpu)


def test_lock_check_command_names_each_edited_lock(stack_tree: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, original = _edit_cpu_lock(lambda t: _drop_block(t, "jinja2"))
    monkeypatch.setattr(resolver, "offline_reference", _answer(original))
    assert commands.lock(check=True) == LockError.exit_code
    out = capsys.readouterr()
    assert "lock EDITED" in out.err and "jinja2==3.1.6: missing from the lock" in out.err
    assert "lock ok: fp8" in out.out


def test_edited_build_backend_hash_is_caught(stack_tree: Path) -> None:
    path = locks.build_backend_lock_file(stack_tree)
    text = path.read_text()
    h = sorted(locks.parse_locked(text)["pluggy"].hashes)[0]
    path.write_text(text.replace(h, "0" * 64))
    with pytest.raises(locks.EditedLockError, match="build-backend.lock: edited") as exc:
        locks.check_build_backend(stack_tree, reference=_answer(text))
    assert f"pluggy==1.7.0: sha256:{'0' * 64}" in str(exc.value) and "invoke lock" in str(exc.value)
    assert not locks.build_backend_is_fresh(stack_tree)  # so `invoke lock` rewrites it


def test_relock_takes_every_hash_from_the_index(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv keeps a preferred pin's hashes as the preferences give them, so a relock hands uv the pins alone:
    a hand-edited sha256 cannot survive `invoke lock` and be sealed into a new digest."""
    seen: list[str] = []

    def run(cmd: list[str], *, cwd: str, **_: object) -> subprocess.CompletedProcess[str]:
        out = Path(cwd) / cmd[cmd.index("--output-file") + 1]
        seen.append(out.read_text())
        out.write_text(original.split("Do not edit.\n", 1)[1].split("\n", 1)[1])  # the body, as uv wrote it
        return subprocess.CompletedProcess(cmd, 0, "", "")

    cpu, original = _edit_cpu_lock(lambda t: t.replace("180885b6d7b05a19", "000085b6d7b05a19"))
    monkeypatch.setattr(resolver.runner, "run", run)
    resolver.write_lock(cpu)
    assert seen and "--hash" not in seen[-1] and "accelerate==1.16.0\n" in seen[-1]
    assert cpu.lock_file.read_text() == original
    locks.check(cpu)


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv not installed")
def test_real_offline_reference_names_a_deleted_block(stack_tree: Path) -> None:
    """uv re-resolves the stack's inputs from its cache alone; where the cache holds the lock's packages (any
    machine that ran ./setup.sh or invoke lock), it reproduces the committed lock and names the deleted block."""
    cpu = stacks.load_stack("cpu")
    text = cpu.lock_file.read_text()
    reference = resolver.offline_reference(locks.resolver_input(cpu), cpu.python, cpu.platform, text)
    if reference is None:
        pytest.skip("uv's cache cannot resolve the cpu stack offline here")
    assert locks.describe_edits(text, reference) == []
    cpu.lock_file.write_text(_drop_block(text, "jinja2"))
    with pytest.raises(locks.EditedLockError, match=r"jinja2==3\.1\.6: missing from the lock"):
        locks.check(cpu, reference=resolver.offline_reference)
