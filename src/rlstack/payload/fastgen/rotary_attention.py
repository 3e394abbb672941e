"""fastgen's own decode-step attention forward for the Llama family (``FastGenerator(fuse_rotary=True)``).

Why: transformers' attention module normalizes the query and key heads (Qwen3's q_norm / k_norm), applies the rotary
embedding and writes the key and value into the cache (``past_key_values.update``) before it calls the attention
function: compiled, two inductor kernels a layer around fastgen's triton attention (q's norm and rotary; k's norm,
rotary and the cache write), each reading and writing what the attention then reads again (their share of a step:
the profile's top kernels in docs/archive/notes.md). The split attention kernel reads the query and the cache
anyway, so it can do that work itself (``split_attention.Prologue``): each program normalizes and rotates its own
query heads, and
the program whose split holds this step's slot does the key, writes key and value into the cache and attends to them
from registers. That needs the module's forward to hand the kernel the projections' raw outputs, so for a decode
step (one query token, the triton attention's slot among its keywords) the forward here replaces transformers'; the
prompt's forward (prefill) is transformers' own.

Which modules: those of the model types in ``FAMILIES`` (Llama, Mistral, Qwen2 without q/k norms; Qwen3 with them,
RMSNorm over the head dimension), full-width rotary in rotate_half's convention, no sliding window, q/k/v/o
projections as attributes. What else in transformers' forward is not here: dropout (decoding is eval), the
attention weights (None, as fastgen's attention functions return), and the cache's write counter
(``cumulative_length`` in transformers 5), which FastGenerator._decode advances once a step for every layer.

torch is not imported at module level: the engine imports this module without a GPU's packages.
"""

from __future__ import annotations

import types
from typing import Any

from rlstack.payload.fastgen.keywords import GROUPS_KWARG, SLOT_KWARG, TUNING_KWARG

# model_type -> whether its attention normalizes the query and key heads (q_norm / k_norm) before the rotary
FAMILIES = {"llama": False, "mistral": False, "qwen2": False, "qwen3": True}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
# whether a cache layer's lazy_initialization takes the value states too (transformers 5) or the key states only
# (4.57): read by install() from the installed transformers, so the traced decode step finds a constant
_INIT_WITH_VALUE = True


def family_why_not(config: Any) -> str | None:
    """Why a model of ``config`` cannot decode with fuse_rotary, from its config alone (None: it can, as far as
    the config says; ``install`` checks each module): asked when the engine is made, before any shadow exists."""
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"model type {kind!r} is not one whose attention fuse_rotary knows ({', '.join(FAMILIES)})"
    factor = getattr(config, "partial_rotary_factor", None)
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, dict) and rope.get("partial_rotary_factor") is not None:
        factor = rope["partial_rotary_factor"]
    if factor not in (None, 1, 1.0):
        return f"its rotary embedding covers {factor} of each head (fuse_rotary rotates whole heads)"
    return None


def module_why_not(module: Any, norms: bool) -> str | None:
    """Why this attention module cannot decode through ``decode_forward`` (None: it can)."""
    missing = [n for n in PROJECTIONS if getattr(module, n, None) is None]
    if missing:
        return f"{type(module).__name__} has no {', '.join(missing)}"
    for name in ("layer_idx", "head_dim", "scaling"):
        if getattr(module, name, None) is None:
            return f"{type(module).__name__} has no {name}"
    if getattr(module, "sliding_window", None):
        return f"{type(module).__name__} {module.layer_idx} attends through a sliding window"
    if module.head_dim % 2:
        return f"its head size {module.head_dim} is odd (rotate_half needs two halves)"
    for name in ("q_norm", "k_norm"):
        norm = getattr(module, name, None)
        if not norms:
            if norm is not None:
                return f"{type(module).__name__} has a {name} its model type is not known to have"
            continue
        weight = getattr(norm, "weight", None)
        if weight is None or tuple(weight.shape) != (module.head_dim,) or \
                not isinstance(getattr(norm, "variance_epsilon", None), float):
            return f"{type(module).__name__}.{name} is not an RMSNorm over the head dimension"
    if norms and module.q_norm.variance_epsilon != module.k_norm.variance_epsilon:
        return f"{type(module).__name__}'s q_norm and k_norm have two epsilons (the kernel takes one)"
    return None


def attention_modules(model: Any) -> list[Any]:
    """The model's attention modules: those holding all four projections and a layer index."""
    return [m for m in model.modules()
            if all(hasattr(m, n) for n in PROJECTIONS) and hasattr(m, "layer_idx")]


def install(model: Any) -> int | str:
    """Give every attention module of ``model`` (fastgen's shadow) ``decode_forward`` for its decode steps: the
    number of modules, or why not (and then none is changed)."""
    why = family_why_not(model.config)
    if why is not None:
        return why
    norms = FAMILIES[model.config.model_type]
    modules = attention_modules(model)
    if not modules:
        return f"{type(model).__name__} has no attention module with {', '.join(PROJECTIONS)}"
    for module in modules:
        why = module_why_not(module, norms)
        if why is not None:
            return why
    global _INIT_WITH_VALUE
    import inspect

    from transformers.cache_utils import StaticLayer

    _INIT_WITH_VALUE = "value_states" in inspect.signature(StaticLayer.lazy_initialization).parameters
    for module in modules:
        module.forward = types.MethodType(decode_forward, module)
    return len(modules)


def uninstall(model: Any) -> None:
    """Give ``model``'s attention modules their class's forward back (what ``install`` changed)."""
    for module in attention_modules(model):
        if getattr(vars(module).get("forward"), "__func__", None) is decode_forward:
            del module.forward


def decode_forward(self: Any, hidden_states: Any, position_embeddings: Any, attention_mask: Any,
                   past_key_values: Any = None, **kwargs: Any) -> tuple[Any, None]:
    """The attention module's forward (``self``): a decode step through ``split_attention.attend`` with the
    prologue, anything else (the prompt's forward, a step without fastgen's slot) through transformers' own."""
    from rlstack.payload.fastgen import split_attention

    slot = kwargs.get(SLOT_KWARG)
    if slot is None or past_key_values is None or hidden_states.shape[1] != 1 or kwargs.get(GROUPS_KWARG) is not None:
        # the class's forward, unbound: this instance's own attribute is this function
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
    b = hidden_states.shape[0]
    d = self.head_dim
    query = self.q_proj(hidden_states).view(b, -1, d)  # [B, H, D] (one token)
    key = self.k_proj(hidden_states).view(b, -1, d)
    value = self.v_proj(hidden_states).view(b, -1, d)
    cos, sin = position_embeddings  # [B, 1, D]
    layer = past_key_values.layers[self.layer_idx]
    if getattr(layer, "is_initialized", True) is False:  # a layer is allocated at its first update
        layer.lazy_initialization(*((key[:, :, None], value[:, :, None]) if _INIT_WITH_VALUE else (key[:, :, None],)))
    q_norm, k_norm = getattr(self, "q_norm", None), getattr(self, "k_norm", None)
    prologue = split_attention.Prologue(
        key, value, None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
        0.0 if q_norm is None else q_norm.variance_epsilon, cos[:, 0], sin[:, 0])
    keep = None if attention_mask is None else attention_mask[:, 0, -1, :]  # [B, L]: bool (keep) or additive
    out = split_attention.attend(query[:, :, None], layer.keys, layer.values, keep, slot, self.scaling,
                                 tuning=kwargs.get(TUNING_KWARG), prologue=prologue)
    return self.o_proj(out.transpose(1, 2).reshape(b, 1, -1)), None
