"""Fused projections in fastgen's shadow: a layer's q/k/v projections (and gate/up) as one GEMM each.

Why: at 8 sequences a decode step's GEMMs are skinny (8 rows), and the small ones (k_proj, v_proj) run far
below the memory bandwidth, so one q+k+v GEMM reading the same bytes takes less time than the three
(bench/fastgen_profile.py's per-GEMM times: docs/archive/notes.md). vLLM serves these layers fused the same way (its
QKVParallelLinear, MergedColumnParallelLinear). Fused, the step also runs 108 fewer kernels, which leaves less
time in between; the A/B of the whole step is bench/results/fastgen_profile.json. It is fastgen's default.

How, without a model-specific forward: the group's weights live in one buffer, [q; k; v] along the output rows,
and each projection's weight is a view of its rows, so ``_Shadow.refresh`` (which writes each merged weight in
place) keeps the fused buffer current with no copy. The group's first projection computes the one GEMM and
keeps its output in a slot the group shares; the others return their columns of it when they are called with
the same input tensor (transformers' Llama-family attention and MLP call them in order on one tensor), and
compute their own GEMM on their own rows otherwise, so a different call pattern is slower, never wrong. The
last member empties the slot, so torch.compile's trace ends with no tensor held outside the graph (dynamo
records the slot's writes as side effects; the decode graph holds one GEMM per group, tests/payload).

Only groups whose weights the shadow owns are fused (merged LoRA or dequantized bases: fastgen's GRPO case), and
only without biases: a shared weight would need a copy, a bias a fused copy to refresh.

torch is imported here at module level: this module is imported only when a shadow is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlstack.payload.fastgen import fp8 as _fp8

# sibling projections that read one input in transformers' Llama-family layers (Llama, Mistral, Qwen2/3, Gemma)
GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def plan(model: Any, owned: Callable[[str], bool]) -> list[tuple[str, tuple[str, ...]]]:
    """(parent module name, member names) for every group that can be fused: each member a bias-free
    ``nn.Linear`` whose weight the shadow owns (``owned(full name)``), all reading the same input width."""
    found = []
    for parent_name, parent in model.named_modules():
        for members in GROUPS:
            mods = [m for m in (getattr(parent, name, None) for name in members) if isinstance(m, torch.nn.Linear)]
            if len(mods) != len(members):
                continue
            names = [f"{parent_name}.{m}" if parent_name else m for m in members]
            if (len({m.in_features for m in mods}) == 1 and all(m.bias is None for m in mods)
                    and all(owned(n) for n in names)):
                found.append((parent_name, members))
    return found


def allocate(model: Any, groups: list[tuple[str, tuple[str, ...]]], dtype: Any,
             device: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """One buffer per group (uninitialised: the shadow fills each member's rows), and each member's weight as a
    view of its rows: ({parent name: fused buffer}, {member full name: view})."""
    fused: dict[str, Any] = {}
    views: dict[str, Any] = {}
    for parent_name, members in groups:
        parent = model.get_submodule(parent_name)
        mods = [getattr(parent, m) for m in members]
        buf = torch.empty((sum(m.out_features for m in mods), mods[0].in_features), dtype=dtype, device=device)
        fused[parent_name] = buf
        start = 0
        for m, mod in zip(members, mods, strict=True):
            views[f"{parent_name}.{m}" if parent_name else m] = buf[start:start + mod.out_features]
            start += mod.out_features
    return fused, views


class _Slot:
    """The group's GEMM output between its first member's call and the others' (a plain object: dynamo traces
    its attribute writes as side effects, where writes to a module's attributes would not be)."""

    def __init__(self) -> None:
        self.x: Any = None
        self.y: Any = None


class FusedLinear(torch.nn.Module):
    """One member of a fused group, in place of its ``nn.Linear`` (same ``weight`` parameter, a view of the
    group's buffer): the first member runs the group's GEMM, the others slice its output."""

    fused_weight: torch.Tensor  # the group's buffer, registered on the first member only

    def __init__(self, linear: Any, fused: Any, start: int, slot: _Slot, first: bool, last: bool) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # the view: named_parameters() stays what it was
        if first:  # not persistent, not a parameter: it aliases the members' weights
            self.register_buffer("fused_weight", fused, persistent=False)
        self.start = start
        self.slot = slot
        self.first = first
        self.last = last
        self.fp8: Any = None  # the group's fastgen.fp8.Fp8Weight, on every member, where fp8 is on

    def forward(self, x: Any) -> Any:
        stop = self.start + self.out_features
        slot = self.slot
        if self.first:
            y = self.fp8(x) if self.fp8 is not None else torch.nn.functional.linear(x, self.fused_weight)
            slot.x, slot.y = x, y
            return y[..., self.start:stop]
        if slot.x is x:
            out = slot.y[..., self.start:stop]
            if self.last:
                slot.x = slot.y = None
            return out
        if self.fp8 is not None:  # this member's rows of the group's FP8 copy, at the group's scale
            return _fp8.linear(x, *self.fp8.rows(self.start, stop))
        return torch.nn.functional.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rows from {self.start}"


def install(model: Any, groups: list[tuple[str, tuple[str, ...]]], fused: dict[str, Any]) -> int:
    """Put FusedLinear in place of each group's members (their weights already views of ``fused``); returns the
    number of GEMMs a decode step no longer launches."""
    saved = 0
    for parent_name, members in groups:
        parent = model.get_submodule(parent_name)
        slot = _Slot()
        start = 0
        for i, m in enumerate(members):
            linear = getattr(parent, m)
            setattr(parent, m, FusedLinear(linear, fused[parent_name], start, slot, first=i == 0,
                                           last=i == len(members) - 1))
            start += linear.out_features
        saved += len(members) - 1
    return saved


def install_fp8(model: Any, scales: str = "row") -> list[_fp8.Fp8Weight]:
    """FP8 in place of every projection of ``model`` (the shadow, fused groups installed already), the output
    embedding (lm_head) excepted, as vLLM leaves it, and any whose sizes _scaled_mm cannot take (``fits``): a
    fused group's members compute through its buffer's FP8 copy; any other ``nn.Linear`` becomes an Fp8Linear.
    Returns the copies, for the shadow to quantize again after every refresh: merged weights change with the
    adapter, and weights shared with the trained model change too where it is fully fine-tuned (one pass over
    the weights a generation). ``scales``: "row" or "tensor" (fastgen.fp8's docstring)."""
    rowwise = scales == "row"
    weights: list[_fp8.Fp8Weight] = []
    groups: dict[int, _fp8.Fp8Weight] = {}  # id of a fused group's shared slot -> its buffer's FP8 copy
    for mod in model.modules():
        if isinstance(mod, FusedLinear) and mod.first and _fp8.fits(*mod.fused_weight.shape):
            groups[id(mod.slot)] = _fp8.Fp8Weight(mod.fused_weight, rowwise)
            weights.append(groups[id(mod.slot)])
    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, mod in list(parent.named_children()):
            if isinstance(mod, FusedLinear):
                # every member holds the group's copy: one called off the group's pattern takes its rows of it
                mod.fp8 = groups.get(id(mod.slot))
            elif type(mod) is torch.nn.Linear and mod is not head and _fp8.fits(mod.out_features, mod.in_features):
                replacement = _fp8.Fp8Linear(mod, rowwise)
                setattr(parent, name, replacement)
                weights.append(replacement.fp8)
    return weights
