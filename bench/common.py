"""Shared pieces of the GPU benchmarks: environment record, measured ceilings, the Qwen3-4B-shaped random model,
a full-vocab word tokenizer, and the results writer (the one schema of rlstack.core.results).

Why measured ceilings: the floor of a memory-bound decode step is bytes / bandwidth, and datasheet bandwidth is
a lead, not a reading; each run measures its own device-to-device copy rate and bf16 matmul rate.
Runs on any CUDA machine; nothing is downloaded (weights are random, the tokenizer is built locally).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

# Qwen3-4B (Qwen/Qwen3-4B config.json): the dims the brief fixes.
QWEN3_4B = dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
                rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False)
# Smoke mode (RLSTACK_BENCH_SMOKE=1): a tiny model on the CPU to check the scripts' logic anywhere; its numbers are
# written to /tmp only, never to bench/results.
SMOKE = os.environ.get("RLSTACK_BENCH_SMOKE") == "1"
DEVICE = "cpu" if SMOKE else "cuda"
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128)
EOS_ID = 151645  # Qwen3's <|im_end|>
PAD_ID = 151643  # Qwen3's <|endoftext|>


def now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def versions() -> dict[str, str]:
    """Versions of the packages the numbers depend on (None when absent)."""
    import importlib.metadata as md

    out: dict[str, str] = {"python": platform.python_version()}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets", "triton",
                 "tokenizers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def gpu_info() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"cuda": False}
    p = torch.cuda.get_device_properties(0)
    info: dict[str, Any] = {"cuda": True, "name": p.name, "sm": f"sm_{p.major}{p.minor}",
                            "multiprocessors": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1),
                            "torch_cuda": torch.version.cuda}
    try:
        import subprocess

        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,power.draw",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = q.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def sync() -> None:
    import torch

    if torch.cuda.is_available() and DEVICE == "cuda":
        torch.cuda.synchronize()


def cuda_time(fn: Callable[[], Any], *, warmup: int = 3, reps: int = 10) -> list[float]:
    """Seconds per call, timed with CUDA events after warm-up (one event pair per call)."""
    import torch

    if DEVICE != "cuda":
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def measure_ceilings() -> dict[str, float]:
    """Device-to-device copy bandwidth (bytes read + written, 4 GiB buffers rotated) and bf16 matmul rate
    (8192^3 on random data), medians of 10 timed runs each."""
    import torch

    n = 2**30 if not SMOKE else 2**22  # 1 Gi float32 elements = 4 GiB per buffer
    bufs = [torch.empty(n, dtype=torch.float32, device=DEVICE).normal_() for _ in range(2)]
    dst = torch.empty_like(bufs[0])
    i = [0]

    def copy() -> None:
        dst.copy_(bufs[i[0] % 2])
        i[0] += 1

    t_copy = statistics.median(cuda_time(copy))
    bw = 2 * n * 4 / t_copy
    bufs.clear()
    m = 8192 if not SMOKE else 256
    a = torch.randn(m, m, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=DEVICE, dtype=torch.bfloat16)
    t_mm = statistics.median(cuda_time(lambda: a @ b))
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return {"copy_bandwidth_Bps": bw, "copy_bandwidth_TBps": bw / 1e12, "bf16_matmul_flops": 2 * m**3 / t_mm,
            "bf16_matmul_TFLOPs": 2 * m**3 / t_mm / 1e12}


def qwen3_4b_config(**overrides: Any) -> Any:
    from transformers import Qwen3Config

    kw = dict(QWEN3_4B)
    if SMOKE:
        kw.update(TINY)
    kw.update(overrides)
    cfg = Qwen3Config(**kw, bos_token_id=None, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(dtype: str = "bfloat16", seed: int = 0, **overrides: Any) -> Any:
    """The Qwen3-4B-shaped model with random weights, built directly on the GPU (no download, no CPU copy)."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = qwen3_4b_config(**overrides)
    with torch.device(DEVICE):
        model = Qwen3ForCausalLM(cfg).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    return model


def build_tokenizer(vocab_size: int = QWEN3_4B["vocab_size"]) -> Any:
    """A word-level tokenizer over the model's whole vocabulary ("t0".."tN", Qwen3's EOS/PAD ids as specials), so
    any id a random model samples decodes to text and re-encodes to the same id (TRL goes text -> ids -> text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    vocab["<|endoftext|>"] = PAD_ID
    vocab["<|im_end|>"] = EOS_ID
    del vocab[f"t{PAD_ID}"], vocab[f"t{EOS_ID}"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="t0")
    fast.padding_side = "left"
    return fast


def random_prompts(n: int, lengths: Sequence[int], seed: int = 0, low: int = 1000, high: int = 150000) -> list[str]:
    """n prompts as text of random token words, lengths cycling through `lengths` (GSM8K prompts vary)."""
    import random

    rng = random.Random(seed)
    return [" ".join(f"t{rng.randrange(low, high)}" for _ in range(lengths[i % len(lengths)])) for i in range(n)]


def decode_floor(cfg: Any, batch: int, prompt_len: int, new_tokens: int, bandwidth_Bps: float,
                 weight_bytes_per_param: float = 2.0, kv_bytes: int = 2) -> dict[str, float]:
    """Memory-bandwidth floor of the decode phase: every step reads all weights once (tied embedding read once, as
    the lm_head) plus the KV cache filled so far (average context prompt + T/2), at the measured copy bandwidth."""
    h, L, inter, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = h * (nh * hd) + 2 * h * (nkv * hd) + (nh * hd) * h + 3 * h * inter + 2 * h + 2 * hd
    params = L * per_layer + v * h + h
    weight_bytes = params * weight_bytes_per_param
    kv_per_token = L * 2 * nkv * hd * kv_bytes
    avg_ctx = prompt_len + new_tokens / 2
    kv_bytes_step = batch * avg_ctx * kv_per_token
    step_s = (weight_bytes + kv_bytes_step) / bandwidth_Bps
    return {"params": params, "weight_bytes": weight_bytes, "kv_bytes_per_token": kv_per_token,
            "kv_bytes_per_step_avg": kv_bytes_step, "floor_step_s": step_s,
            "floor_tokens_per_s": batch / step_s}


def reset_peak() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float:
    import torch

    if DEVICE != "cuda":
        return 0.0
    return torch.cuda.max_memory_allocated() / 2**30


def header() -> dict[str, Any]:
    return {"date": now(), "gpu": gpu_info(), "versions": versions(), "argv": sys.argv,
            "host": platform.node()}


def write_results(name: str, data: dict[str, Any], table: list[dict[str, Any]], columns: Sequence[str],
                  notes: str = "", quiet: bool = False, *, question: str, title: str, stack: str | None = None,
                  lock_hash: str | None = None, engine: str | None = None, environment: str = "native",
                  deviations: Sequence[str] = (), metric: str | None = None, lower_is_better: bool = False,
                  baseline: dict[str, Any] | None = None, group_by: str | None = None,
                  headline: dict[str, Any] | None = None) -> Path:
    """Write bench/results/<name>.json in the one results schema (rlstack.core.results; a copy under $OUT when
    set, for the device tool) and print the table last, so it ends the run's output. `data` is the run's
    record: its `date`, `gpu` and `argv` (from header()) fill the schema's when and where, the rest goes to
    `extra`; `question` names the table of docs/performance.md the rows belong in (`invoke docs` renders it)."""
    from rlstack.core import results

    folder = RESULTS if not SMOKE else Path("/tmp/rlstack-bench-smoke")
    gpu = data.get("gpu") if isinstance(data.get("gpu"), dict) else {}
    smi = str(gpu.get("nvidia_smi") or "")
    argv = [str(a) for a in data.get("argv") or sys.argv]
    extra = {k: v for k, v in data.items() if k not in ("date", "gpu", "argv", "table")}
    if gpu:
        extra["gpu_detail"] = gpu
    result = results.Result(
        question=question, title=title, date=str(data.get("date") or now()), columns=list(columns), rows=table,
        ran=results.Ran(command="python3 " + " ".join(argv), bench=Path(argv[0]).stem if argv else name,
                        stack=stack, lock_hash=lock_hash, engine=engine),
        where=results.Where(gpu=gpu.get("name"), driver=smi.split(",")[0].strip() or None,
                            environment="host" if SMOKE else environment, deviations=list(deviations)),
        metric=metric, lower_is_better=lower_is_better, baseline=baseline, group_by=group_by, headline=headline,
        notes=notes,
        extra=json.loads(json.dumps({**extra, "smoke": SMOKE}, default=str)))
    path = results.write(result, name, folder)
    if os.environ.get("OUT") and not SMOKE:
        results.write(result, name, Path(os.environ["OUT"]))
    if not quiet:
        lines = [f"# {name}", "", f"{result.date} on {result.where.gpu or 'cpu'}", ""]
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in table]
        print("\n".join(lines) + "\n", flush=True)
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


class Timer:
    """Wall-clock timer that synchronizes CUDA at both ends (for multi-kernel regions like a whole generate)."""

    def __enter__(self) -> Timer:
        sync()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        sync()
        self.s = time.perf_counter() - self.t0


def trl_compat() -> list[str]:
    """trl 0.24.0 + transformers 5.x: trl.import_utils computes `_X_available = _is_package_available("X")`, which in
    transformers 5 returns a (bool, version) tuple - always truthy - so `import trl.trainer.grpo_trainer` tries to
    import mergekit (and other optional extras) and fails. Unpack those tuples to their bool before trl's trainers
    import. Returns the names fixed (recorded in the results). The stack needs the same fix
    (docs/archive/notes.md)."""
    import trl.import_utils as iu

    fixed = []
    for name, value in list(vars(iu).items()):
        if name.startswith("_") and name.endswith("_available") and isinstance(value, tuple):
            setattr(iu, name, bool(value[0]))
            fixed.append(name)
    return fixed


def file_safe(text: str) -> str:
    """``text`` as a file name the device tool brings back: its reply leaves out names with characters other than
    letters, digits and ``_.-`` (an engine option's ``=``, a launch spec's ``:``), so ``=`` becomes ``-`` (a
    ``key-value`` still reads as one) and any other such character ``_``."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]", "_", text.replace("=", "-"))


def engine_options(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings as FastGenerator keyword arguments: true/false as booleans, digits as ints."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--engine-option wants KEY=VALUE, got {pair!r} (e.g. merge_lora=false)")
        low = value.lower()
        out[key] = low == "true" if low in ("true", "false") else int(value) if value.isdigit() else value
    return out


def add_variant(ap: Any, purpose: str) -> None:
    """The benches' one `--variant KEY=VALUE[,KEY=VALUE]` (repeatable; read with variants): an A/B of engine
    options in one process, `purpose` saying what each variant gets in the bench's help."""
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help=f"an A/B in one process: {purpose}, with these options on top of --engine-option ('' "
                         f"for none); repeatable")


def variants(specs: list[str], options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{--variant label: its FastGenerator options on top of ``options``}; without variants, the one run of
    ``options`` under the label ''."""
    return {v: {**options, **engine_options([x for x in v.split(",") if x])} for v in specs} or {"": options}


def add_engine_option(ap: Any, purpose: str) -> None:
    """The benches' one `--engine-option KEY=VALUE` (repeatable; read with engine_options): a FastGenerator option
    switched for one run, `purpose` saying what for in the bench's help."""
    ap.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                    help=f"a FastGenerator option, {purpose}; repeatable")
