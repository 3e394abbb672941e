"""Runtime probes skip with their reason where they cannot run; resolve probes name the conflicting pins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.probes import resolve, runtime
from rlstack.stacks import resolver
from rlstack.stacks.model import load_stack


def test_runtime_probes_skip_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "has_gpu", lambda: (False, "no NVIDIA GPU on this machine"))
    results = runtime.run_all()
    assert [r.id for r in results] == [f"runtime:{n}" for n in runtime.BODIES]
    assert all(r.status == "skip" and r.reason for r in results)


def test_runtime_probe_skips_when_a_package_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_have", lambda mod: mod != "vllm")
    res = runtime.run_probe("vllm-lora")
    assert res.status == "skip" and "vllm not installed" in res.reason


def test_runtime_child_failure_is_diagnosed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe whose process dies: the log's signature names the wall (the child here is a stand-in body)."""
    monkeypatch.setattr(runtime, "has_gpu", lambda: (True, "test"))
    monkeypatch.setattr(runtime, "_have", lambda mod: True)
    import subprocess
    import sys

    real_run = subprocess.run

    def fake_run(cmd, **kw):  # type: ignore[no-untyped-def]
        return real_run([sys.executable, "-c", "import sys; print('AttributeError: '"
                               "\"'LRUCacheWorkerLoRAManager' object has no attribute 'get_dummy_lora_warmup_rank'\"); "
                               "sys.exit(1)"], **kw)

    monkeypatch.setattr(runtime.subprocess, "run", fake_run)
    res = runtime.run_probe("vllm-lora")
    assert res.status == "fail" and res.signature == "lora-warmup-rank" and res.fix


def test_grpo_step_names_a_wall_from_the_whole_train_log(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The cause can be far from the tail the report keeps: Unsloth says at load that it appends a pad token, and
    the out-of-range read it leads to asserts after the rollout (the H200 log of 2026-12-03)."""
    monkeypatch.setattr(runtime, "_cuda", lambda: None)
    monkeypatch.setattr(runtime, "_have", lambda mod: True)
    log = ("runs/tiny/tiny-x does not have a padding token! Will use pad_token = <|PAD_TOKEN|>.\n"
           + "".join(f"rollout line {i}\n" for i in range(200))
           + "Assertion `index out of bounds: 0 <= tmp21 < 384` failed.\n" + "  File x, line 1\n" * 40)
    monkeypatch.setattr(runtime.subprocess, "run", _fake_train([], 1, log))
    runtime.body_grpo_step()
    got = _emitted(capsys)
    assert got["status"] == "fail" and "exited 1: Unsloth adds a pad token" in str(got["reason"])
    assert dict(got["facts"])["wall"] == "unsloth-pad-token-out-of-range"  # type: ignore[call-overload]


def test_a_wall_a_probe_body_named_reaches_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "has_gpu", lambda: (True, "test"))
    monkeypatch.setattr(runtime, "_have", lambda mod: True)
    import subprocess
    import sys

    real_run = subprocess.run
    line = runtime.MARK + json.dumps({"status": "fail", "reason": "rlstack train exited 1",
                                      "facts": {"wall": "unsloth-pad-token-out-of-range"}})

    def fake_run(cmd, **kw):  # type: ignore[no-untyped-def]
        return real_run([sys.executable, "-c", f"print({line!r})"], **kw)

    monkeypatch.setattr(runtime.subprocess, "run", fake_run)
    res = runtime.run_probe("grpo-step")
    assert res.status == "fail" and res.signature == "unsloth-pad-token-out-of-range" and res.fix


def test_coinstall_conflict_names_the_torch_pins(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = ("error: No solution found when resolving dependencies\n  cause: Because vllm==0.21.0 depends on "
            "torch==2.11.0 and you require torch==2.10.0, we can conclude that your requirements are unsatisfiable.")
    monkeypatch.setenv("RLSTACK_CACHE", str(stack_tree / "cache"))
    seen = {}

    def fake_resolve(reqs, python, platform, hashes=True):  # type: ignore[no-untyped-def]
        seen["reqs"] = reqs
        return resolver.Resolution(False, text, ["uv", "pip", "compile"])

    monkeypatch.setattr(resolver, "resolve", fake_resolve)
    res = resolve.probe_coinstall(load_stack("portable"), load_stack("fp8-report"))
    assert res.status == "fail" and res.signature == "torch-pin-conflict"
    assert "vllm==0.21.0" in res.reason and "torch==2.10.0" in res.reason and "torch==2.11.0" in res.reason
    # the base stack's torch pin is in, the other stack's own torch pin is left to its packages
    assert "torch==2.10.0" in seen["reqs"] and "torch==2.11.0" not in seen["reqs"]


def test_resolve_result_is_cached_by_input(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSTACK_CACHE", str(stack_tree / "cache"))
    calls = []

    def fake_resolve(reqs, python, platform, hashes=True):  # type: ignore[no-untyped-def]
        calls.append(1)
        return resolver.Resolution(True, "a==1\nb==2\n", ["uv"])

    monkeypatch.setattr(resolver, "resolve", fake_resolve)
    cpu = load_stack("cpu")
    # a lock made from exactly these inputs is uv's answer already
    if resolve.lock_is_fresh(cpu):
        assert resolve.probe_stack(cpu).status == "pass" and not calls
    req = stack_tree / "images" / "cpu" / "requirements.in"
    req.write_text(req.read_text() + "tqdm\n")  # the lock is stale now: uv is asked, once per input
    cpu = load_stack("cpu")
    assert not resolve.lock_is_fresh(cpu)
    assert resolve.probe_stack(cpu).status == "pass"
    assert resolve.probe_stack(cpu).status == "pass"
    assert len(calls) == 1
    resolve.probe_stack(cpu, fresh=True)
    assert len(calls) == 2


def test_unreachable_index_is_a_skip_not_a_conflict(stack_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSTACK_CACHE", str(stack_tree / "cache"))
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: resolver.Resolution(
        False, "error: Failed to fetch: `https://pypi.org/simple/trl/`\n  Caused by: dns error", ["uv"]))
    res = resolve.probe_stack(load_stack("cpu"), fresh=True)
    assert res.status == "skip" and "could not be reached" in res.reason
    assert not list((stack_tree / "cache").rglob("*.json"))  # not cached


def test_runtime_report_records_environment_and_refuses_wrong_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime run files its results under the GPU present: a --gpu-arch that disagrees is an error before any
    probe runs; the report carries the environment it ran in (here: this venv, against the cpu lock)."""
    from rlstack.core.errors import RlstackError
    from rlstack.probes import suite

    monkeypatch.setattr(runtime, "gpu_facts", lambda: {"gpu": "NVIDIA H200", "driver": "580", "arch": "sm_90"})
    ran: list[str] = []
    monkeypatch.setattr(runtime, "run_all", lambda fp8=False, only=None: ran.append("x") or [])
    with pytest.raises(RlstackError, match="--gpu-arch sm_120, but the GPU here is sm_90"):
        suite.run("cpu", layers=["runtime"], gpu_arch="sm_120")
    assert ran == []
    with pytest.raises(RlstackError, match="unknown runtime probe"):
        suite.run("cpu", layers=["runtime"], runtime_only=["warp-drive"])
    report = suite.run("cpu", layers=["runtime"])
    assert report.gpu_arch == "sm_90" and report.driver == "580"
    env = report.environment
    assert env is not None and env.where == "native" and env.versions["torch"].startswith("2.10.0")
    assert report.torch_cuda == env.torch_cuda
    static = suite.run("cpu", layers=["contract"])
    assert static.environment is None


def test_grpo_step_probe_takes_the_stack_unsloth_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With unsloth installed the probe trains through it, on untied embeddings (Unsloth's generate on the tied
    tiny model hits a device-side assert before any GRPO code: seen on an H200)."""
    import subprocess

    seen: list[list[str]] = []
    monkeypatch.setattr(runtime, "_cuda", lambda: None)
    monkeypatch.setattr(runtime, "_have", lambda mod: True)
    monkeypatch.setenv("RLSTACK_PROBE_TRAIN_SET", "grpo.temperature=0.7")
    monkeypatch.setenv("RLSTACK_PROBE_LOGDIR", str(tmp_path))

    def fake_run(cmd, **kw):  # type: ignore[no-untyped-def]
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "NameError: name 'align_completion_tool_mask' is not defined")

    monkeypatch.setattr(runtime.subprocess, "run", fake_run)
    runtime.body_grpo_step()
    sets = [seen[0][i + 1] for i, a in enumerate(seen[0]) if a == "--set"]
    assert "model.loader=unsloth" in sets and "model.tiny.tie_word_embeddings=false" in sets
    assert sets[-1] == "grpo.temperature=0.7"
    assert "align_completion_tool_mask" in (tmp_path / "grpo-step-train.log").read_text()


def _fake_train(seen: list[list[str]], rc: int, out: str):  # type: ignore[no-untyped-def]
    import subprocess

    def fake_run(cmd, **kw):  # type: ignore[no-untyped-def]
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, rc, "", out)

    return fake_run


def _emitted(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    import json

    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(runtime.MARK)][-1]
    return dict(json.loads(line[len(runtime.MARK):]))


def test_grpo_step_probe_trains_with_fp8_in_an_fp8_rl_stack(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """RLSTACK_PROBE_FP8=1 (a stack marked fp8_rl): the step goes through `rlstack train --fp8` (Unsloth
    load_in_fp8 + fast_inference, vLLM rollouts), keeping the unsloth overrides; the reason names the loader
    that ran, read from rlstack train's own progress line."""
    seen: list[list[str]] = []
    monkeypatch.setattr(runtime, "_cuda", lambda: None)
    monkeypatch.setattr(runtime, "_have", lambda mod: True)
    monkeypatch.setenv("RLSTACK_PROBE_FP8", "1")
    monkeypatch.delenv("RLSTACK_PROBE_TRAIN_SET", raising=False)
    said = "rlstack train: smoke-cpu: tiny-abc via unsloth-fp8 on cuda, 1 steps, 64 prompts -> /tmp/x\n"
    monkeypatch.setattr(runtime.subprocess, "run", _fake_train(seen, 0, said))
    runtime.body_grpo_step()
    assert "--fp8" in seen[0]
    sets = [seen[0][i + 1] for i, a in enumerate(seen[0]) if a == "--set"]
    assert "model.loader=unsloth" in sets and "model.tiny.tie_word_embeddings=false" in sets
    got = _emitted(capsys)
    assert got["status"] == "pass" and "unsloth-fp8" in str(got["reason"]) and "--fp8" in str(got["reason"])

    # a run that says it loaded another way did not exercise the FP8 path
    seen.clear()
    monkeypatch.setattr(runtime.subprocess, "run", _fake_train(seen, 0, said.replace("unsloth-fp8", "unsloth")))
    runtime.body_grpo_step()
    got = _emitted(capsys)
    assert got["status"] == "fail" and "not Unsloth's FP8 RL path" in str(got["reason"])

    monkeypatch.setenv("RLSTACK_PROBE_FP8", "0")
    seen.clear()
    monkeypatch.setattr(runtime.subprocess, "run", _fake_train(seen, 0, said.replace("unsloth-fp8", "unsloth")))
    runtime.body_grpo_step()
    assert "--fp8" not in seen[0]
    got = _emitted(capsys)
    assert got["status"] == "pass" and "loader unsloth;" in str(got["reason"])


def test_fp8_runtime_follows_the_stack_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """suite.run asks the runtime probes for the FP8 path exactly where stack.toml says fp8_rl = true."""
    from rlstack.probes import environment, suite
    from rlstack.probes.model import Environment

    asked: dict[str, bool] = {}
    monkeypatch.setattr(runtime, "gpu_facts", lambda: {})
    monkeypatch.setattr(environment, "capture", lambda stack, locked: Environment(
        where="native", python="3.11", lock_match=False, fingerprint="0" * 12))
    for name in ("cpu", "portable", "fp8", "fp8-report"):
        monkeypatch.setattr(runtime, "run_all", lambda fp8=False, only=None, name=name: asked.update({name: fp8})
                            or [])
        suite.run(name, layers=["runtime"])
    assert asked == {"cpu": False, "portable": False, "fp8": True, "fp8-report": True}


@pytest.mark.parametrize(
    ("rows", "verdict"),
    [
        ([{"step": 1, "grad_norm": 0.31, "frac_reward_zero_std": 0.5}], "flows"),
        # every group tied: a zero norm is what a working backward gives too
        ([{"step": 1, "grad_norm": 0.0, "frac_reward_zero_std": 1.0}], "unshown"),
        # rewards differed within a group, so the loss had a gradient to give: a zero norm is a broken backward
        ([{"step": 1, "grad_norm": 0.0, "frac_reward_zero_std": 0.75}], "fail"),
        ([{"step": 1, "reward": 0.0}], "unshown"),
        ([], "unshown"),
    ],
)
def test_grpo_step_gradient_verdict(tmp_path: Path, rows: list[dict[str, float]], verdict: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got, said = runtime.gradient_verdict(path)
    assert got == verdict and said


def test_a_step_masked_out_of_the_loss_is_not_a_broken_backward(tmp_path: Path) -> None:
    """The fp8 grpo-step on an H200 (2026-12-04): rewards differed, grad norm 0, and every completion was cut and
    dropped from the loss (the row says its loss masked truncated completions). That shows nothing about the
    backward pass; where the loss kept them, the same zero is a failure, and its reason says so."""
    path = tmp_path / "metrics.jsonl"
    row = {"step": 1, "grad_norm": 0.0, "frac_reward_zero_std": 0.5, "completion_clipped_ratio": 1.0,
           "loss_masks_truncated": True}
    path.write_text(json.dumps(row) + "\n")
    got, said = runtime.gradient_verdict(path)
    assert got == "unshown" and "truncated" in said
    path.write_text(json.dumps({**row, "loss_masks_truncated": False}) + "\n")
    got, said = runtime.gradient_verdict(path)
    assert got == "fail" and "loss masks truncated False" in said
    from rlstack.probes import signatures

    assert not signatures.diagnose(f"the backward pass did not reach the LoRA weights ({said})")  # not the old wall


def test_a_probe_out_of_time_is_undecided_with_its_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A probe body that outlives its limit (a cold machine's compiles: the fp8 grpo-step on an H200 ran past
    570 s cold, 258 s warm) says nothing about the stack: undecided, never a pass and never a wall, and the
    output it had written is kept."""
    import subprocess

    monkeypatch.setattr(runtime, "has_gpu", lambda: (True, "test"))
    monkeypatch.setattr(runtime, "_have", lambda mod: True)
    monkeypatch.setenv("RLSTACK_PROBE_LOGDIR", str(tmp_path))

    def fake_run(cmd, **kw):  # type: ignore[no-untyped-def]
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"Capturing CUDA graphs 49%\n", stderr=None)

    monkeypatch.setattr(runtime.subprocess, "run", fake_run)
    res = runtime.run_probe("vllm-lora")
    assert res.status == "skip" and res.undecided and res.signature is None
    assert "timed out after 600 s" in res.reason and "Capturing CUDA graphs" in res.evidence[0].text
    assert "Capturing CUDA graphs" in (tmp_path / "vllm-lora.log").read_text()


def test_grpo_step_train_out_of_time_is_undecided(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The train inside grpo-step running out of its time: the body says undecided (it used to die with a
    TimeoutExpired traceback, which the report showed as a bare 'exited 1' failure), keeps the train log, and the
    parent carries the undecided flag into the result."""
    import subprocess
    import sys

    monkeypatch.setattr(runtime, "_cuda", lambda: None)
    monkeypatch.setattr(runtime, "_have", lambda mod: True)
    monkeypatch.setenv("RLSTACK_PROBE_FP8", "1")
    monkeypatch.setenv("RLSTACK_PROBE_LOGDIR", str(tmp_path))
    real_run = subprocess.run

    def fake_run(cmd, **kw):  # type: ignore[no-untyped-def]
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output="vLLM init\n", stderr="step 1 compiling\n")

    monkeypatch.setattr(runtime.subprocess, "run", fake_run)
    runtime.body_grpo_step()
    got = _emitted(capsys)
    facts = dict(got["facts"])  # type: ignore[call-overload]
    assert got["status"] == "skip" and facts["undecided"] is True and facts["timeout_s"] == 1170
    assert "did not finish in 1170 s" in str(got["reason"]) and "--fp8" in str(got["reason"])
    assert "step 1 compiling" in (tmp_path / "grpo-step-train.log").read_text()

    line = runtime.MARK + json.dumps(got)
    monkeypatch.setattr(runtime.subprocess, "run",
                        lambda cmd, **kw: real_run([sys.executable, "-c", f"print({line!r})"], **kw))
    monkeypatch.setattr(runtime, "has_gpu", lambda: (True, "test"))
    res = runtime.run_probe("grpo-step")
    assert res.status == "skip" and res.undecided and "did not finish" in res.reason


def test_grpo_step_result_carries_the_steps_numbers(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The probe's run folder is deleted when it ends: the step's clipped ratio, grad norm and tie share go into
    the result's facts, so a zero gradient can be read without a second GPU run."""
    import subprocess

    monkeypatch.setattr(runtime, "_cuda", lambda: None)
    monkeypatch.setattr(runtime, "_have", lambda mod: True)
    monkeypatch.setenv("RLSTACK_PROBE_FP8", "1")
    monkeypatch.delenv("RLSTACK_PROBE_TRAIN_SET", raising=False)
    said = "rlstack train: smoke-cpu: tiny-abc via unsloth-fp8 on cuda, 1 steps, 64 prompts -> /tmp/x\n"
    row = {"step": 1, "reward": 0.06, "grad_norm": 0.42, "frac_reward_zero_std": 0.5,
           "completion_clipped_ratio": 0.75, "kl": 0.0}

    def fake_run(cmd, **kw):  # type: ignore[no-untyped-def]
        run = Path(cmd[cmd.index("--output") + 1])
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        return subprocess.CompletedProcess(cmd, 0, "", said)

    monkeypatch.setattr(runtime.subprocess, "run", fake_run)
    runtime.body_grpo_step()
    got = _emitted(capsys)
    step = dict(dict(got["facts"])["step"])  # type: ignore[call-overload]
    assert got["status"] == "pass" and step["completion_clipped_ratio"] == 0.75 and step["grad_norm"] == 0.42
    assert "kl" not in step
