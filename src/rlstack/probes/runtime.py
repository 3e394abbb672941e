"""Runtime probes: the stack on a real GPU. Each probe runs in its own Python process (a vLLM or CUDA crash
takes only that probe down, and its log is the evidence the signatures read), on this machine's Python:
inside an image, or natively on a GPU host (`rlstack probe --stack X --layer runtime -o FILE`).

Probes: CUDA init, a bitsandbytes 4-bit matmul, an FP8 matmul (torch._scaled_mm), a vLLM engine start
with enable_lora (its LoRA warmup runs at start; FP8 quantization when asked; unsloth_zoo's vLLM patches
applied first when unsloth_zoo is installed, as unsloth's fast_inference does) and one GRPO step through
`rlstack train` (in a stack marked `fp8_rl`, `rlstack train --fp8`: Unsloth's load_in_fp8 + fast_inference,
vLLM rollouts with LoRA). Without a GPU, or without the package a probe needs, it is skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlstack.probes.model import Evidence, ProbeResult

MARK = "RLSTACK-PROBE-RESULT:"
# Seconds each probe may take. grpo-step's is for a machine with cold kernel caches: cold, `rlstack train --fp8
# --max-steps 1` on the tiny model first pays vLLM's init with FlashInfer's JIT, then Unsloth's and Triton's
# compiles of step 1, far longer than warm (the cold and warm timings: docs/archive/notes.md). A probe that runs out of
# time is undecided (never a pass, never a wall).
TIMEOUTS = {"cuda-init": 120, "bnb-4bit": 300, "fp8-matmul": 300, "vllm-lora": 600, "grpo-step": 1200}


def _have(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def _emit(status: str, reason: str, **facts: Any) -> None:
    print(MARK + json.dumps({"status": status, "reason": reason, "facts": facts}), flush=True)


def _text(out: str | bytes | None) -> str:
    """What a timed-out subprocess had written: bytes or str depending on how it was started, or None."""
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def _keep_log(name: str, text: str) -> None:
    """The whole log of a probe, kept under $RLSTACK_PROBE_LOGDIR when set: the report holds only its tail."""
    folder = os.environ.get("RLSTACK_PROBE_LOGDIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.log"), "w") as fh:
            fh.write(text)


# --- the probe bodies (run in the child process) ------------------------------------------------------


def _cuda() -> Any:
    import torch

    if not torch.cuda.is_available():
        _emit("skip", "no CUDA device visible (torch.cuda.is_available() is False)")
        sys.exit(0)
    return torch


def body_cuda_init() -> None:
    torch = _cuda()
    props = torch.cuda.get_device_properties(0)
    x = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    cap = torch.cuda.get_device_capability(0)
    _emit("pass", f"{props.name} sm_{cap[0]}{cap[1]}, torch {torch.__version__} (CUDA {torch.version.cuda})",
          gpu=props.name, arch=f"sm_{cap[0]}{cap[1]}", torch=torch.__version__, torch_cuda=torch.version.cuda,
          total_gib=round(props.total_memory / 2**30, 1), sum=float(x.sum()),
          arch_list=torch.cuda.get_arch_list())


def body_bnb_4bit() -> None:
    torch = _cuda()
    import bitsandbytes as bnb
    import bitsandbytes.functional as bf

    torch.manual_seed(0)
    w = torch.randn(512, 512, dtype=torch.bfloat16, device="cuda") / 16
    x = torch.randn(8, 512, dtype=torch.bfloat16, device="cuda")
    q, state = bf.quantize_4bit(w, quant_type="nf4")  # bitsandbytes 0.50: no compute_dtype argument
    y = bnb.matmul_4bit(x, q.t(), quant_state=state)
    ref = x @ bf.dequantize_4bit(q, state).t()
    err = float((y - ref).abs().max() / ref.abs().max())
    status = "pass" if err < 0.05 else "fail"
    _emit(status, f"nf4 matmul 8x512x512, max rel err {err:.2e} vs dequantized reference",
          bitsandbytes=bnb.__version__, rel_err=err)


def body_fp8_matmul() -> None:
    torch = _cuda()
    cap = torch.cuda.get_device_capability(0)
    if cap < (8, 9):
        _emit("skip", f"sm_{cap[0]}{cap[1]} has no FP8 tensor cores (needs 8.9+)")
        return
    torch.manual_seed(0)
    a = torch.randn(64, 128, device="cuda")
    b = torch.randn(256, 128, device="cuda")
    sa, sb = a.abs().max() / 448, b.abs().max() / 448
    a8 = (a / sa).to(torch.float8_e4m3fn)
    b8 = (b / sb).to(torch.float8_e4m3fn)
    y = torch._scaled_mm(a8, b8.t(), scale_a=sa.float(), scale_b=sb.float(), out_dtype=torch.bfloat16)
    ref = a @ b.t()
    err = float((y.float() - ref).abs().max() / ref.abs().max())
    _emit("pass" if err < 0.1 else "fail", f"torch._scaled_mm e4m3 64x128x256, max rel err {err:.2e}", rel_err=err)


def _tiny_model() -> str:
    from rlstack.payload import tiny
    from rlstack.payload.recipes import TinySpec

    spec = TinySpec(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=512)
    return str(tiny.ensure(spec))


def body_vllm_lora() -> None:
    _cuda()
    fp8 = os.environ.get("RLSTACK_PROBE_FP8") == "1"
    patched = "no (unsloth_zoo not installed)"
    if os.environ.get("RLSTACK_PROBE_UNSLOTH_PATCHES") == "0":
        patched = "no (RLSTACK_PROBE_UNSLOTH_PATCHES=0: the control run, vLLM's own classes)"
    elif _have("unsloth_zoo"):
        import unsloth  # noqa: F401  (unsloth must be imported before unsloth_zoo)
        from unsloth_zoo.vllm_utils import patch_vllm

        patch_vllm(debug=False)
        patched = "yes (unsloth_zoo.vllm_utils.patch_vllm)"
    import vllm

    model = _tiny_model()
    t0 = time.perf_counter()
    llm = vllm.LLM(model=model, enable_lora=True, max_lora_rank=8, max_loras=1, max_model_len=256,
                   gpu_memory_utilization=0.3, enforce_eager=True, quantization="fp8" if fp8 else None)
    start = time.perf_counter() - t0
    out = llm.generate(["1 + 1 ="], vllm.SamplingParams(max_tokens=4, temperature=0))
    _emit("pass", f"vLLM {vllm.__version__} engine up with enable_lora (LoRA warmup ran){' fp8' if fp8 else ''} "
          f"in {start:.1f}s; unsloth patches: {patched}", vllm=vllm.__version__, fp8=fp8, start_s=round(start, 1),
          text=out[0].outputs[0].text)


LOADER_RE = re.compile(r"^rlstack train: .* via (\S+) on (\S+),", re.M)


def body_grpo_step() -> None:
    """One GRPO step through `rlstack train` on the tiny model: the stack's own training path. With
    RLSTACK_PROBE_FP8=1 (a stack marked fp8_rl) that is `--fp8`: Unsloth load_in_fp8 + fast_inference, so the
    rollouts go through vLLM with the LoRA adapter, as the report's FP8 RL run would."""
    _cuda()
    if not _have("rlstack.payload.train.grpo"):
        _emit("skip", "rlstack.payload.train is not in this installation")
        return
    fp8 = os.environ.get("RLSTACK_PROBE_FP8") == "1"
    with tempfile.TemporaryDirectory(prefix="rlstack-probe-grpo-") as tmp:
        from rlstack.core.options import argv_for
        from rlstack.payload.commands import train

        # the repetition reward beside the report's two: random tiny-model text scores 0 on those, and a step
        # where every group ties has zero gradients, which would hide a backward pass that does not reach LoRA
        from rlstack.payload.recipes import WITH_REPETITION, rewards_override

        overrides: list[str] = [rewards_override(WITH_REPETITION)]
        loader = "transformers+peft"
        if _have("unsloth"):
            # the stack's own training path: Unsloth's generated GRPO trainer (where the report's NameError
            # lives), on a tiny model with 64-wide heads so its kernels take their usual shapes
            # and untied embeddings: Unsloth's generate on this tied tiny model died in a device-side assert
            # (unsloth 2026.3.11 and 2026.6.1), before any GRPO code ran. Most likely not the
            # tying: those logs also show Unsloth appending a pad token past the embeddings, the wall the untied
            # model then hit in the loss (unsloth-pad-token-out-of-range); the tiny tokenizer has its own pad since.
            # Untied stays until a GPU run shows the tied model passing.
            overrides += ["model.loader=unsloth", "model.tiny.tie_word_embeddings=false", "model.tiny.hidden_size=256",
                          "model.tiny.intermediate_size=512", "model.tiny.num_attention_heads=4"]
            loader = "unsloth"
        if fp8:
            # rlstack train --fp8 loads through Unsloth whatever model.loader says (and says so when it cannot)
            loader = "unsloth-fp8"
        # extra recipe overrides, ';'-separated: for chasing a failure on a GPU host without editing code
        overrides += [item.strip() for item in os.environ.get("RLSTACK_PROBE_TRAIN_SET", "").split(";") if item.strip()]
        cmd = [sys.executable, "-m", "rlstack.cli", *argv_for(train, {
            "recipe": "smoke-cpu", "max_steps": 1, "adapter_name": "probe-grpo-step", "fp8": fp8,
            "adapters_root": f"{tmp}/adapters", "output": f"{tmp}/run", "data": "generated:64",
            "overrides": overrides})]
        print("$ " + " ".join(cmd), flush=True)
        limit = TIMEOUTS["grpo-step"] - 30
        try:
            proc = subprocess.run(cmd, text=True, capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired as exc:
            _keep_log("grpo-step-train", _text(exc.stdout) + _text(exc.stderr))
            _emit("skip", f"undecided: rlstack train{' --fp8' if fp8 else ''} --max-steps 1 ({loader}) did not finish "
                  f"in {limit} s (cold kernel caches compile for minutes: run the probe again, its caches are warm "
                  "now)", loader=loader, fp8=fp8, undecided=True, timeout_s=limit)
            return
        _keep_log("grpo-step-train", proc.stdout + proc.stderr)
        sys.stdout.write(proc.stdout[-6000:])
        sys.stdout.write(proc.stderr[-6000:])
        flag = " --fp8" if fp8 else ""
        if proc.returncode != 0:
            # named from the whole train log: the report keeps only its tail, where the cause may not be (Unsloth
            # says it appends a pad token at load; the assert it leads to comes after the rollout)
            from rlstack.probes import signatures

            hits = signatures.diagnose(proc.stdout + proc.stderr)
            named = f": {hits[0].signature.title}" if hits else ""
            _emit("fail", f"rlstack train{flag} --max-steps 1 ({loader}) exited {proc.returncode}{named}",
                  loader=loader, fp8=fp8, wall=hits[0].signature.id if hits else None,
                  wall_line=hits[0].excerpt if hits else None)
            return
        # the loader that ran, as rlstack train says it (its progress line), over the one asked for
        said = LOADER_RE.search(proc.stdout + proc.stderr)
        ran = said.group(1) if said else loader
        if fp8 and ran != "unsloth-fp8":
            _emit("fail", f"rlstack train --fp8 ran through {ran}, not Unsloth's FP8 RL path (unsloth-fp8)",
                  loader=ran, fp8=fp8)
            return
        what = " (load_in_fp8 + fast_inference: vLLM rollouts with LoRA)" if fp8 else ""
        verdict, grads = gradient_verdict(Path(tmp) / "run" / "metrics.jsonl")
        # the step's own numbers travel with the verdict: the run folder is gone when the probe ends, so without
        # them learning the clipped ratio behind a zero gradient takes a rerun on the GPU
        from rlstack.payload.train.metrics import read_rows

        last = (read_rows(Path(tmp) / "run" / "metrics.jsonl") or [{}])[-1]
        step = {k: last[k] for k in ("reward", "grad_norm", "frac_reward_zero_std", "completion_clipped_ratio",
                                     "loss_masks_truncated", "completion_mean_length", "step_time_s") if k in last}
        if verdict == "fail":
            _emit("fail", f"rlstack train{flag} ({ran}) ran a step whose rewards differed within a group, yet the "
                  f"gradient norm was 0: the backward pass did not reach the LoRA weights ({grads})", loader=ran,
                  fp8=fp8, step=step)
            return
        _emit("pass", f"one GRPO step through rlstack train{flag} (loader {ran}{what}; recipe smoke-cpu, "
              f"max_steps=1); {grads}", loader=ran, fp8=fp8, gradient=verdict, step=step)


def gradient_verdict(metrics_path: Path) -> tuple[str, str]:
    """Did the step's gradient reach the adapter? 'flows' (grad norm > 0), 'fail' (some group's rewards differed,
    so the loss had a gradient to give, and the norm is 0), or 'unshown' (every group tied, or nothing logged:
    a zero norm is then what a working backward pass gives too)."""
    from rlstack.payload.train.metrics import masked_out, read_rows, tied

    rows = [r for r in read_rows(metrics_path) if r.get("grad_norm") is not None]
    if not rows:
        return "unshown", "gradient flow not shown (no grad norm logged)"
    norm = max(float(r["grad_norm"]) for r in rows)
    if norm > 0:
        return "flows", f"grad norm {norm:.4g}: the gradient reached the LoRA weights"
    if all(tied(r) is True for r in rows):
        return "unshown", "gradient flow not shown (every group's rewards tied: zero advantages, grad norm 0)"
    # each row says whether its loss dropped truncated completions (rlstack train records it)
    if all(masked_out(r) is True for r in rows):
        return "unshown", ("gradient flow not shown (every completion was truncated and the loss drops "
                           "truncated completions: grad norm 0)")
    last = rows[-1]
    return "fail", (f"grad norm 0 with frac_reward_zero_std {last.get('frac_reward_zero_std')}, completions in "
                    f"the loss (clipped ratio {last.get('completion_clipped_ratio')}, loss masks truncated "
                    f"{last.get('loss_masks_truncated')})")


BODIES: dict[str, tuple[Callable[[], None], tuple[str, ...]]] = {
    "cuda-init": (body_cuda_init, ("torch",)),
    "bnb-4bit": (body_bnb_4bit, ("torch", "bitsandbytes")),
    "fp8-matmul": (body_fp8_matmul, ("torch",)),
    "vllm-lora": (body_vllm_lora, ("torch", "vllm")),
    "grpo-step": (body_grpo_step, ("torch", "trl", "peft", "transformers")),
}


# --- the parent side ------------------------------------------------------------------------------------


def has_gpu() -> tuple[bool, str]:
    """Whether a CUDA GPU is visible, decided without importing torch in this process."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False, "CUDA_VISIBLE_DEVICES is empty"
    smi = shutil.which("nvidia-smi")
    if smi is None and not os.path.exists("/dev/nvidia0"):
        return False, "no NVIDIA GPU on this machine (no nvidia-smi, no /dev/nvidia0)"
    return True, "GPU present"


def gpu_facts() -> dict[str, str]:
    """Driver version and arch from nvidia-smi, when there is one."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                             text=True, capture_output=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if not out:
        return {}
    name, driver, cap = (x.strip() for x in out[0].split(",")[:3])
    return {"gpu": name, "driver": driver, "arch": "sm_" + cap.replace(".", "")}


def run_probe(name: str, *, fp8: bool = False) -> ProbeResult:
    pid = f"runtime:{name}"
    _body, needs = BODIES[name]
    missing = [m for m in needs if not _have(m)]
    if missing:
        return ProbeResult(id=pid, layer="runtime", status="skip",
                           reason=f"{', '.join(missing)} not installed in this Python ({sys.executable})")
    ok, why = has_gpu()
    if not ok:
        return ProbeResult(id=pid, layer="runtime", status="skip", reason=why)
    cmd = [sys.executable, "-m", "rlstack.probes.runtime", name]
    env = {**os.environ, "RLSTACK_PROBE_FP8": "1" if fp8 else "0"}
    try:
        proc = subprocess.run(cmd, text=True, capture_output=True, timeout=TIMEOUTS[name], env=env)
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        # no verdict: a probe out of time says nothing about the stack (cold caches, a slow disk), so it is
        # undecided, which never passes and never names a wall; the log so far is kept
        log = _text(exc.stdout) + _text(exc.stderr) + f"\ntimed out after {TIMEOUTS[name]}s"
        _keep_log(name, log)
        return ProbeResult(id=pid, layer="runtime", status="skip", undecided=True,
                           reason=f"undecided: timed out after {TIMEOUTS[name]} s (run it again: kernel caches are "
                                  "warm the second time)",
                           evidence=[Evidence(text="\n".join(log.strip().splitlines()[-25:])[-3000:],
                                              command=" ".join(cmd))])
    _keep_log(name, log)
    from rlstack.probes import signatures

    result = next((json.loads(ln[len(MARK):]) for ln in reversed(log.splitlines()) if ln.startswith(MARK)), None)
    cmd_s = " ".join(cmd)
    if result is not None and rc == 0:
        ev = [Evidence(text=json.dumps(result["facts"])[:1500], command=cmd_s)]
        if result["status"] == "fail":
            ev.append(Evidence(text=log[-3000:]))
        wall = result["facts"].get("wall") if result["status"] == "fail" else None
        sig = signatures.by_id(wall) if wall else None
        return ProbeResult(id=pid, layer="runtime", status=result["status"], reason=result["reason"], evidence=ev,
                           signature=sig.id if sig else None, fix=sig.fix if sig else None,
                           undecided=result["status"] == "skip" and bool(result["facts"].get("undecided")))
    hits = signatures.diagnose(log)
    tail = "\n".join(log.strip().splitlines()[-25:])
    excerpt = [Evidence(text=m.excerpt) for m in hits[:3]]
    return ProbeResult(id=pid, layer="runtime", status="fail",
                       reason=(hits[0].signature.title if hits else f"exited {rc}"),
                       evidence=[*excerpt, Evidence(text=tail[-3000:], command=cmd_s)],
                       signature=hits[0].signature.id if hits else None,
                       fix=hits[0].signature.fix if hits else None)


def run_all(*, fp8: bool = False, only: list[str] | None = None) -> list[ProbeResult]:
    out = []
    for name in only or list(BODIES):
        t0 = time.perf_counter()
        res = run_probe(name, fp8=fp8)
        res.duration_s = round(time.perf_counter() - t0, 3)
        out.append(res)
    return out


def main(argv: list[str]) -> int:
    from rlstack.payload import kernelcache

    kernelcache.apply()  # a probe body's vLLM or Unsloth compiles into the same caches as rlstack train's
    name = argv[0]
    BODIES[name][0]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
