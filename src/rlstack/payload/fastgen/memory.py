"""What fastgen allocates and whether it fits: the shadow's and a cache's bytes (``plan_memory``) against free GPU
memory, refused with the numbers (``FastgenMemoryError``) before anything is allocated; and the dtype the shadow
computes in. torch and peft are imported inside functions."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlstack.payload.fastgen.errors import FastgenError
from rlstack.payload.fastgen.shadow import is_peft, is_quantized


def round_up(n: int, m: int) -> int:
    """``n`` rounded up to a multiple of ``m``."""
    return ((n + m - 1) // m) * m


# Free memory the shadow must leave: a fraction of its own estimate plus a floor. Chosen, not measured: it has
# to absorb what the estimate leaves out (prefill activations, inductor/cuBLAS workspaces, the CUDA graph pool,
# allocator fragmentation). The GPU benchmark records the estimate beside the measured peak (rollout_peers.py).
MEMORY_MARGIN_FRACTION = 0.10
MEMORY_MARGIN_BYTES = 2 * 2**30


class FastgenMemoryError(FastgenError):
    """The shadow or a KV cache would not fit in free GPU memory (fastgen refuses before allocating)."""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes fastgen is about to allocate for one (batch, cache length): ``shadow`` (merged or dequantized
    projection weights and dtype-cast copies; 0 once built), ``kv`` (the static cache: 2 x layers x batch x KV heads
    x head_dim x length), ``logits`` (float32 logits and the sampling warpers' copies of them)."""

    shadow: int
    kv: int
    logits: int
    batch: int
    length: int

    @property
    def total(self) -> int:
        return self.shadow + self.kv + self.logits

    @property
    def margin(self) -> int:
        return int(self.total * MEMORY_MARGIN_FRACTION) + MEMORY_MARGIN_BYTES


def text_config(config: Any) -> Any:
    """The text model's config of a (possibly multimodal) model config."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def shadow_bytes(model: Any, dtype: Any, merge_lora: bool = True, fp8: bool = False) -> int:
    """Bytes the shadow allocates for ``model`` (what it shares with the trained model costs nothing): a dense
    ``dtype`` weight per LoRA'd projection and per quantized linear, a cast copy of every other floating tensor
    whose dtype differs from ``dtype`` (e.g. an fp32 embedding under PEFT's prepare_model_for_kbit_training), and
    with ``fp8`` one byte an element for the e4m3 copy of every linear but the output embedding (fastgen.fp8)."""
    import torch

    if not merge_lora and is_peft(model):
        return 0
    from peft.tuners.lora import LoraLayer

    root = model.get_base_model() if is_peft(model) else model
    itemsize = torch.empty((), dtype=dtype).element_size()
    total = 0
    dense_ids: set[int] = set()
    lora_bases = {id(mod.get_base_layer()) for mod in root.modules() if isinstance(mod, LoraLayer)}
    for mod in root.modules():
        if isinstance(mod, LoraLayer) or (is_quantized(mod) and id(mod) not in lora_bases):
            base: Any = mod.get_base_layer() if isinstance(mod, LoraLayer) else mod
            total += int(base.out_features) * int(base.in_features) * itemsize
            dense_ids.add(id(base.weight))  # the bias is shared or cast like any other tensor
            dense_ids.update(id(t) for n, t in mod.named_parameters() if "lora_" in n)  # trained model only
    seen: set[int] = set()
    for tensor in root.parameters():
        if id(tensor) in dense_ids or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if tensor.is_floating_point() and tensor.dtype != dtype:
            total += tensor.numel() * itemsize
    if fp8:
        head = root.get_output_embeddings()
        from rlstack.payload.fastgen.fp8 import fits

        for name, mod in root.named_modules():  # a LoRA layer's base among them, its A and B not
            if (isinstance(mod, torch.nn.Linear) and mod is not head and ".lora_" not in f".{name}"
                    and fits(mod.out_features, mod.in_features)):
                total += int(mod.out_features) * int(mod.in_features)
    return total


def plan_memory(model: Any, batch: int, length: int, dtype: Any, *, include_shadow: bool = True,
                merge_lora: bool = True, fp8: bool = False) -> MemoryPlan:
    """The MemoryPlan of serving ``batch`` sequences in a cache of ``length`` tokens (see MemoryPlan)."""
    import torch

    root = model.get_base_model() if is_peft(model) else model
    cfg = text_config(root.config)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    itemsize = torch.empty((), dtype=dtype).element_size()
    kv = 2 * int(cfg.num_hidden_layers) * batch * kv_heads * head_dim * length * itemsize
    logits = batch * int(cfg.vocab_size) * 4 * 6  # fp32 logits, sorted copy, cumsum, softmax, masks
    shadow = shadow_bytes(model, dtype, merge_lora, fp8) if include_shadow else 0
    return MemoryPlan(shadow=shadow, kv=kv, logits=logits, batch=batch, length=length)


def free_gpu_bytes(device: Any) -> tuple[int, int, int]:
    """(usable, free on the device, cached by torch): the driver's free memory plus what torch's caching allocator
    holds reserved but unallocated, which our allocations reuse before asking the driver."""
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    cached = max(0, int(torch.cuda.memory_reserved(device)) - int(torch.cuda.memory_allocated(device)))
    return int(free) + cached, int(free), cached


def check_memory(plan: MemoryPlan, device: Any) -> None:
    """Refuse (FastgenMemoryError, with the numbers) when ``plan`` plus its margin exceeds free GPU memory."""
    usable, free, cached = free_gpu_bytes(device)
    need = plan.total + plan.margin
    if need <= usable:
        return
    gib = 2**30
    raise FastgenMemoryError(
        f"fastgen: not enough free GPU memory: needs {need / gib:.2f} GiB = shadow weights {plan.shadow / gib:.2f}"
        f" + KV cache {plan.kv / gib:.2f} ({plan.batch} x {plan.length} tokens) + logits {plan.logits / gib:.2f}"
        f" + margin {plan.margin / gib:.2f} GiB; usable {usable / gib:.2f} GiB (device free {free / gib:.2f}"
        f" + cached by torch {cached / gib:.2f})",
        "fewer sequences per generation (grpo.per_device_train_batch_size) or a shorter "
        "grpo.max_completion_length, or grpo.fast_generation=false",
    )


def generation_dtype(model: Any) -> Any:
    """The dtype the shadow computes in: a quantized model's compute dtype (bitsandbytes ``compute_dtype``), else
    bf16 / fp16 when the model holds any, else its first floating dtype. Why the compute dtype first: PEFT's
    prepare_model_for_kbit_training casts every unquantized tensor of a QLoRA model to float32 (norms,
    embeddings), which would otherwise make a float32 shadow: twice the memory and bandwidth of the bf16 model."""
    import torch

    for mod in model.modules():
        compute = getattr(mod, "compute_dtype", None)
        if is_quantized(mod) and isinstance(compute, torch.dtype):
            return compute
    dtypes = [p.dtype for p in model.parameters() if p.is_floating_point()]
    if torch.bfloat16 in dtypes:
        return torch.bfloat16
    if torch.float16 in dtypes:
        return torch.float16
    return dtypes[0] if dtypes else torch.float32
