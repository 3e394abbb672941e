"""FP8 projections in fastgen's shadow (``FastGenerator(fp8="row")``): rollouts in FP8 without vLLM.

Why: a decode step reads every weight once, so its GEMMs are bound by the memory bandwidth (and take most of the
step: docs/performance.md), and FP8 weights are half the bytes of bf16 ones. vLLM serves the same model
this way (``quantization="fp8"``, faster than its bf16: docs/performance.md); Unsloth's FP8 RL reaches it
only through vLLM, and on Blackwell through flashinfer kernels that need a CUDA 12.9 toolkit (the report in
shared/background). This is torch's own ``_scaled_mm`` (cuBLASLt per tensor, CUTLASS row-wise): no toolkit, no vLLM.

What: every projection but lm_head holds an e4m3 copy of its weight with float32 scales (an absolute maximum over
448, e4m3's largest value), and activations are quantized per call with scales of their own (dynamic), computed on
the device: no host sync, so the step still captures into one CUDA graph. Two granularities
(``FastgenOptions.fp8``): "row", a scale per output channel of the weight and per token of the activation (torch's
row-wise _scaled_mm, bf16 out: CUTLASS kernels for sm_89, sm_90, sm_100 and sm_120 in
aten/src/ATen/native/cuda/RowwiseScaledMM.cu of torch's main branch, read, not run), where one outlier blurs its
row, not the whole tensor; "tensor", one scale per tensor, as vLLM's online ``quantization="fp8"`` (a fused group,
fastgen.fused, then shares one scale for its buffer, as vLLM's fused q/k/v does). Off CUDA the product is computed
from the dequantized e4m3 values in float32 (the same numbers; oneDNN's ``_scaled_mm`` has no fast path on a CPU
without FP8 units, too slow for the CPU benches to run it: docs/archive/notes.md); a test pins that the two agree for
per-tensor scales, the only ones ``_scaled_mm`` takes on the CPU, and another that the CUDA branch passes torch's
own checks of its arguments (fake CUDA tensors).

What it changes: the rollouts are sampled from an FP8 approximation of the policy, not from the policy.
GRPO's loss takes its log-probs from the training model, so the difference shows as off-policy rollouts by the
per-token KL that bench/fastgen_fidelity.py measures (``--engine-option fp8=row``). Off by default.

The shadow keeps its bf16 weights (the merge's target) and refreshes the FP8 copies from them after every
merge, in place, so captured graphs stay valid; the copies cost one byte a weight element on top.
torch is imported at module level: this module is imported only when a shadow is built.
"""

from __future__ import annotations

from typing import Any

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
TINY = 1e-12  # the floor of a scale: an all-zero tensor (a zero-initialised LoRA B) quantizes to zeros
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (sm_89), Hopper (sm_90), Blackwell (sm_100, sm_120)
ALIGN = 16  # _scaled_mm on CUDA takes inner and output sizes divisible by 16 (torch's own check)


def fits(out_features: int, in_features: int) -> bool:
    """Whether a weight [out, in] can go through _scaled_mm (a projection that cannot stays in bf16)."""
    return out_features % ALIGN == 0 and in_features % ALIGN == 0


def unavailable(device: Any) -> str | None:
    """None where FP8 projections can run on ``device``, else why not (FastGenerator refuses fp8 with it)."""
    if device.type == "cpu":
        return None  # the dequantized product (see linear): what the CPU tests and benches run
    if device.type != "cuda":
        return f"fp8 runs on CUDA (compute capability >= 8.9) or the CPU, not {device.type}"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"fp8 needs FP8 tensor cores (compute capability >= 8.9); this GPU is "
                f"{capability[0]}.{capability[1]}")
    return None


def _amax(t: Any, rowwise: bool) -> Any:
    """The scale's absolute maximum: per row ([R, 1]) or of the whole tensor ([]), floored (TINY)."""
    a = t.abs().amax(dim=-1, keepdim=True) if rowwise else t.abs().amax()
    return a.float().clamp_min(TINY)


class Fp8Weight(torch.nn.Module):
    """The e4m3 copy of one bf16 weight [N, K] and its scales ([N] row-wise, [] per tensor), refreshed in place
    from it (``quantize``)."""

    w8: torch.Tensor
    scale: torch.Tensor

    def __init__(self, source: Any, rowwise: bool = True) -> None:
        super().__init__()
        self.source = source  # the shadow's bf16 tensor (a buffer the merge writes), not a copy
        self.rowwise = rowwise
        shape = (source.shape[0],) if rowwise else ()
        self.register_buffer("w8", torch.empty(source.shape, dtype=FP8, device=source.device), persistent=False)
        self.register_buffer("scale", torch.ones(shape, dtype=torch.float32, device=source.device),
                             persistent=False)
        self.quantize()

    @torch.no_grad()
    def quantize(self) -> None:
        """Scales and e4m3 values from the source's current contents (after each merge)."""
        src = self.source.float()
        amax = _amax(src, self.rowwise)
        self.w8.copy_((src / (amax / FP8_MAX)).to(FP8))
        self.scale.copy_((amax / FP8_MAX).reshape(self.scale.shape))

    def rows(self, start: int, stop: int) -> tuple[Any, Any]:
        """(e4m3 values, scales) of output rows [start, stop): a fused member's own part of its group's copy."""
        return self.w8[start:stop], self.scale[start:stop] if self.rowwise else self.scale

    def dequantized(self) -> Any:
        """The weight the FP8 GEMM multiplies by, in float32 (for tests and error measurements)."""
        return self.w8.float() * (self.scale[:, None] if self.rowwise else self.scale)

    def forward(self, x: Any) -> Any:
        return linear(x, self.w8, self.scale)


def quantize_activation(x2: Any, rowwise: bool) -> tuple[Any, Any]:
    """(e4m3 values, float32 scales: [M, 1] per token, or []) of a [M, K] activation."""
    scale = _amax(x2, rowwise) / FP8_MAX
    return (x2.float() / scale).to(FP8), scale


def linear(x: Any, w8: Any, scale: Any) -> Any:
    """``x @ W.T`` for x [..., K] in bf16 / fp16 / fp32, in x's dtype: x quantized per call with the weight's
    granularity (scale [N]: per token; []: per tensor), W given as its e4m3 values [N, K] and scales; through
    torch._scaled_mm on CUDA (row-wise: bf16 out, cast after), from the dequantized values elsewhere (see the
    module docstring)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    rowwise = scale.dim() == 1
    xq, x_scale = quantize_activation(x2, rowwise)
    if x.device.type == "cuda":
        if rowwise:
            out = torch._scaled_mm(xq, w8.t(), scale_a=x_scale, scale_b=scale[None, :].contiguous(),
                                   out_dtype=torch.bfloat16).to(x.dtype)
        else:
            out = torch._scaled_mm(xq, w8.t(), scale_a=x_scale, scale_b=scale, out_dtype=x.dtype)
    else:
        w_scale = scale[:, None] if rowwise else scale
        out = ((xq.float() * x_scale) @ (w8.float() * w_scale).t()).to(x.dtype)
    return out.reshape(*x.shape[:-1], w8.shape[0])


class Fp8Linear(torch.nn.Module):
    """An ``nn.Linear`` of the shadow computing through its weight's FP8 copy (``weight`` and ``bias`` stay the
    shadow's parameters, so named_parameters() and the merge are what they were; the bias is added in the
    activation's dtype, as vLLM's FP8 layers do)."""

    def __init__(self, linear_module: Any, rowwise: bool = True) -> None:
        super().__init__()
        self.in_features = linear_module.in_features
        self.out_features = linear_module.out_features
        self.weight = linear_module.weight
        self.bias = linear_module.bias
        self.fp8 = Fp8Weight(linear_module.weight, rowwise)

    def forward(self, x: Any) -> Any:
        out = self.fp8(x)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        scales = "row-wise" if self.fp8.rowwise else "per-tensor"
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 {scales} scales"
