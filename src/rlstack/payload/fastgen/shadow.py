"""The shadow decoder: a plain transformers model whose LoRA'd projections hold merged weights and whose other
tensors are shared with the trained model, built from a pristine copy of the modeling module where Unsloth patched
its classes (``patched_members``, ``shadow_class``). torch, transformers, peft and bitsandbytes are imported
inside functions."""

from __future__ import annotations

from typing import Any

from rlstack.payload.fastgen.errors import FastgenError


def is_peft(model: Any) -> bool:
    """A PEFT model (what get_base_model unwraps)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def is_quantized(module: Any) -> bool:
    """A bitsandbytes 4-bit / 8-bit linear layer (its weight is packed: it cannot be shared with a dense model)."""
    return type(getattr(module, "weight", None)).__name__ in ("Params4bit", "Int8Params")


# Pristine copies of modeling modules, by original module name (see _pristine_module), and the way back.
_PRISTINE: dict[str, Any] = {}
_PRISTINE_ORIGIN: dict[str, str] = {}


def patched_members(module: Any) -> list[str]:
    """What was replaced in a transformers modeling module after it was imported: classes defined in its source
    whose name now points at a class from elsewhere, and methods of its classes that come from another module.

    Why: Unsloth patches the model classes themselves when it loads a model (FastQwen3Model.pre_patch sets
    ``Qwen3ForCausalLM.forward``, ``Qwen3Model.forward``, ``Qwen3DecoderLayer.forward``, ``Qwen3Attention.forward``
    to its own kernels, whose inference path keeps its own KV layout and cannot take a StaticCache, and rebinds
    ``modeling_qwen3.Qwen3RotaryEmbedding`` to its own rotary class). A shadow built from those classes would run
    Unsloth's code, not transformers'. An untouched module returns [] (decorators keep ``__module__``).
    """
    import re
    import types
    from pathlib import Path

    name = module.__name__
    package = name.split(".")[0]
    try:
        source = Path(module.__file__).read_text(encoding="utf-8")
    except (OSError, TypeError):
        return []

    def foreign(origin: str | None) -> bool:  # transformers' own decorators (hub_kernels) are not patches
        return origin is not None and origin.split(".")[0] != package

    out = []
    for cls_name in re.findall(r"^class (\w+)\b", source, flags=re.MULTILINE):
        obj = getattr(module, cls_name, None)
        if not isinstance(obj, type):
            continue
        if foreign(obj.__module__):
            out.append(f"{cls_name} -> {obj.__module__}.{obj.__qualname__}")
            continue
        for attr, fn in vars(obj).items():
            if isinstance(fn, types.FunctionType) and foreign(fn.__module__):
                out.append(f"{cls_name}.{attr} -> {fn.__module__}")
    return out


def _pristine_module(name: str) -> Any:
    """A fresh execution of the modeling module ``name`` from its source file: the classes exactly as transformers
    wrote them, whatever was patched into the imported module since. It is registered as a sibling module
    (``<package>._rlstack_fastgen_pristine_<leaf>``) so its relative imports resolve to the same transformers
    package; it shares everything else (configs, cache classes, attention registries) with the live one.

    Module-level functions that Unsloth wraps and keeps the originals of (``masking_utils.create_causal_mask``
    under ``_unsloth_original_create_causal_mask``: a torch.compile'd wrapper) are bound back to the originals,
    so the shadow's compiled decode step does not nest another compiled function."""
    import importlib.util
    import sys

    cached = _PRISTINE.get(name)
    if cached is not None:
        return cached
    original = sys.modules[name]
    package, _, leaf = name.rpartition(".")
    new_name = f"{package}._rlstack_fastgen_pristine_{leaf}"
    spec = importlib.util.spec_from_file_location(new_name, original.__file__)
    if spec is None or spec.loader is None:
        raise FastgenError(f"fastgen: cannot re-read the source of {name}", "grpo.fast_generation=false")
    module = importlib.util.module_from_spec(spec)
    sys.modules[new_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[new_name]
        raise
    try:
        import transformers.masking_utils as masking_utils

        for attr in list(vars(module)):
            kept = getattr(masking_utils, f"_unsloth_original_{attr}", None)
            if kept is not None:
                setattr(module, attr, kept)
    except ImportError:  # pragma: no cover - transformers without masking_utils (< 4.53)
        pass
    _PRISTINE[name] = module
    _PRISTINE_ORIGIN[new_name] = name
    return module


def _kind(cls: type) -> tuple[str, str]:
    """(original module, qualified name) of a module class: a pristine copy's classes are the same kind as the
    live module's classes they were copied from."""
    return _PRISTINE_ORIGIN.get(cls.__module__, cls.__module__), cls.__qualname__


def _params_on_meta() -> Any:
    """Context: every parameter registered while it is active goes to the meta device (no memory), buffers stay
    real. Why not ``torch.device("meta")`` for all: modules whose buffers the shadow cannot take from the trained
    model (a rotary embedding Unsloth replaced by its own class) must compute their own, as the model's
    constructor does. This is what accelerate's init_empty_weights(include_buffers=False) does; written out to
    keep fastgen's imports to torch + transformers + peft."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def manager() -> Any:
        original = torch.nn.Module.register_parameter

        def register(module: Any, name: str, param: Any) -> None:
            original(module, name, param)
            if param is not None and param.device.type != "meta":
                kept = module._parameters[name]
                module._parameters[name] = torch.nn.Parameter(kept.to("meta"), requires_grad=kept.requires_grad)

        torch.nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            torch.nn.Module.register_parameter = original  # type: ignore[method-assign]

    return manager()


def shadow_class(model_class: type, pristine: bool | None = None) -> tuple[type, list[str]]:
    """The class to build the shadow from, and the patches that made it a pristine copy ([] when the live class
    is used). pristine=None: a pristine copy exactly when the class's modeling module was patched."""
    import sys

    module = sys.modules.get(model_class.__module__)
    patches = patched_members(module) if module is not None else []
    use_pristine = bool(patches) if pristine is None else pristine
    if not use_pristine:
        return model_class, []
    copy = _pristine_module(model_class.__module__)
    cls = getattr(copy, model_class.__name__, None)
    if not isinstance(cls, type):
        raise FastgenError(f"fastgen: {model_class.__name__} is not defined in {model_class.__module__}'s source",
                           "grpo.fast_generation=false")
    return cls, patches or ["(forced)"]


class _Shadow:
    """A plain transformers model whose LoRA'd projections hold merged weights (``W + scale * B @ A``) and whose
    other tensors are shared with (or, where their dtype differs from the generation dtype, cast copies of) the
    trained model. ``refresh()`` recomputes the merged weights in place, so compiled graphs stay valid.

    Quantized (bitsandbytes) bases are dequantized into the shadow: LoRA'd ones on every refresh (with the merge),
    the others once (a 4-bit base is frozen). When the model's modeling module was patched (Unsloth), the shadow is
    built from a pristine copy of it, so generation runs transformers' code on the trained tensors."""

    def __init__(self, peft_model: Any, dtype: Any, gqa_attention: bool = True, pristine: bool | None = None,
                 fuse_projections: bool = True, fp8: str = "off") -> None:
        import copy

        import torch
        from peft.tuners.lora import LoraLayer

        from rlstack.payload.fastgen import fused
        from rlstack.payload.fastgen.attention import register_attention

        # the transformers model (with LoRA modules inside when it is a PEFT model)
        lora_root = peft_model.get_base_model() if is_peft(peft_model) else peft_model
        config = copy.deepcopy(lora_root.config)
        config.use_cache = True
        config._attn_implementation = register_attention() if gqa_attention else "sdpa"
        self.dtype = dtype
        cls, self.patches = shadow_class(type(lora_root), pristine)
        with _params_on_meta():
            shadow = cls(config)
        shadow.eval()
        device = next(p for p in lora_root.parameters()).device
        self._merged: list[tuple[Any, Any]] = []  # (lora layer, shadow weight buffer)
        self._casts: list[tuple[Any, Any]] = []  # (source tensor, cast copy)
        self._cast_by_id: dict[int, Any] = {}
        self.own_buffers: list[str] = []  # buffers the shadow computed itself (no same-kind source)
        lora_names = {name for name, mod in lora_root.named_modules() if isinstance(mod, LoraLayer)}
        # remove_duplicate=False: a module registered under several names (Unsloth sets the model's one rotary
        # embedding as self_attn.rotary_emb of every layer) must be found under each, model.rotary_emb included
        src_modules = dict(lora_root.named_modules(remove_duplicate=False))
        groups: list[tuple[str, tuple[str, ...]]] = []
        fused_bufs: dict[str, Any] = {}
        views: dict[str, Any] = {}

        def owned(name: str) -> bool:  # and on the device the group's buffer goes to (a split device_map)
            src = src_modules.get(name)
            if src is None or not (name in lora_names or is_quantized(src)):
                return False
            base = src.get_base_layer() if name in lora_names else src
            return bool(base.weight.device == device)

        if fuse_projections:  # the shadow's own weights only: see fastgen.fused
            groups = fused.plan(shadow, owned)
            fused_bufs, views = fused.allocate(shadow, groups, dtype, device)
        for name, mod in shadow.named_modules():
            src = src_modules.get(name)
            if src is None:
                raise FastgenError(f"fastgen: cannot map module {name} of the shadow model",
                                   "use merge_lora=False for this model")
            if name in lora_names or is_quantized(src):
                base = src.get_base_layer() if name in lora_names else src
                shape = (base.out_features, base.in_features)
                buf = views[name] if name in views else torch.empty(shape, dtype=dtype, device=base.weight.device)
                if name not in lora_names:  # frozen quantized base: dequantize once
                    with torch.no_grad():
                        buf.copy_(_dense_weight(base).reshape(shape).to(dtype))
                else:
                    self._merged.append((src, buf))
                mod._parameters["weight"] = torch.nn.Parameter(buf, requires_grad=False)
                if getattr(base, "bias", None) is not None:
                    mod._parameters["bias"] = torch.nn.Parameter(self._share(base.bias), requires_grad=False)
                continue
            for pname, param in list(mod._parameters.items()):
                if param is None:
                    continue
                src_param = src._parameters.get(pname)
                if src_param is None:
                    raise FastgenError(f"fastgen: no source for {name}.{pname}", "use merge_lora=False")
                mod._parameters[pname] = torch.nn.Parameter(self._share(src_param), requires_grad=False)
            same_kind = _kind(type(src)) == _kind(type(mod))
            for bname, own in list(mod._buffers.items()):
                if own is None:
                    continue
                src_buf = src._buffers.get(bname) if same_kind else None
                if src_buf is not None and src_buf.shape == own.shape and src_buf.dtype == own.dtype:
                    mod._buffers[bname] = src_buf
                else:
                    mod._buffers[bname] = own.to(device)
                    self.own_buffers.append(f"{name}.{bname}" if name else bname)
            if same_kind:
                for attr, value in vars(src).items():  # plain tensor attributes, e.g. rotary original_inv_freq
                    if isinstance(value, torch.Tensor) and not attr.startswith("_") and hasattr(mod, attr):
                        setattr(mod, attr, value)
            else:
                for attr, value in list(vars(mod).items()):
                    if isinstance(value, torch.Tensor) and not attr.startswith("_"):
                        setattr(mod, attr, value.to(device))
        if getattr(config, "tie_word_embeddings", False) and hasattr(shadow, "lm_head"):
            shadow.lm_head._parameters["weight"] = shadow.get_input_embeddings()._parameters["weight"]
        leftover = [n for n, p in shadow.named_parameters() if p.is_meta] + \
                   [n for n, b in shadow.named_buffers() if b.is_meta]
        if leftover:
            raise FastgenError(f"fastgen: shadow model has unmapped tensors: {leftover[:5]}", "use merge_lora=False")
        # GEMMs a decode step saves by fusing (0 where nothing could be fused: shared weights, biases, other names)
        self.fused_gemms_saved = fused.install(shadow, groups, fused_bufs) if groups else 0
        self._fp8: list[Any] = []  # fastgen.fp8.Fp8Weight of every projection (fp8), quantized at each refresh
        if fp8 != "off":
            self._fp8 = fused.install_fp8(shadow, fp8)
        self.model = shadow
        self.refresh()

    def _share(self, tensor: Any) -> Any:
        if tensor.dtype == self.dtype or not tensor.is_floating_point():
            return tensor.detach()
        known = self._cast_by_id.get(id(tensor))
        if known is not None:
            return known
        copy = tensor.detach().to(self.dtype)
        self._casts.append((tensor, copy))
        self._cast_by_id[id(tensor)] = copy
        return copy

    def refresh(self) -> None:
        """Recompute merged weights (and cast copies) from the live trained tensors.

        Each merged weight is written once and read once more: the base (dequantized straight into it where
        bitsandbytes can, ``_dense_into``), then ``W += scale * B @ A`` as one GEMM whose output accumulates onto
        it (``addmm_``, rounded once). Why not PEFT's ``get_delta_weight`` (kept for what the GEMM form does not
        cover, ``_plain_lora``): it writes B @ A, scales it into another tensor and adds that, ~5 more passes over
        each weight than the GEMM, on every generate of a GRPO step."""
        import torch

        with torch.no_grad():
            for src, dst in self._casts:
                dst.copy_(src.detach())
            for layer, buf in self._merged:
                _dense_into(layer.get_base_layer(), buf)
                if getattr(layer, "merged", False):
                    raise FastgenError("fastgen: the LoRA adapter is merged into the base weights already",
                                       "unmerge it, or use merge_lora=False")
                for adapter in layer.active_adapters:
                    if adapter in getattr(layer, "lora_A", {}) and not layer.disable_adapters:
                        if getattr(layer, "use_dora", {}).get(adapter, False):
                            raise FastgenError("fastgen does not merge DoRA adapters", "use merge_lora=False")
                        if _plain_lora(layer, adapter):
                            a = layer.lora_A[adapter].weight
                            b = layer.lora_B[adapter].weight
                            buf.addmm_(b.to(buf.dtype), a.to(buf.dtype), alpha=float(layer.scaling[adapter]))
                        else:
                            buf.add_(layer.get_delta_weight(adapter).to(self.dtype))
            for weight in self._fp8:  # the FP8 copies from the weights as they are now (just merged, or trained)
                weight.quantize()


def _plain_lora(layer: Any, adapter: str) -> bool:
    """Whether ``adapter``'s delta on ``layer`` is ``scale * B.weight @ A.weight`` and nothing else (two linear
    maps, no fan_in_fan_out transpose, no PEFT variant such as DoRA, a number for the scale): what the refresh's
    one GEMM computes. Anything else goes through PEFT's own ``get_delta_weight``."""
    import torch

    b_modules = getattr(layer, "lora_B", None)
    a, b = layer.lora_A[adapter], b_modules[adapter] if b_modules is not None and adapter in b_modules else None
    return (isinstance(a, torch.nn.Linear) and isinstance(b, torch.nn.Linear)
            and not getattr(layer, "fan_in_fan_out", False)
            and adapter not in (getattr(layer, "lora_variant", None) or {})
            and isinstance(layer.scaling.get(adapter), int | float))


def _dense_into(base: Any, buf: Any) -> None:
    """Write the base layer's dense weight into ``buf``: a bitsandbytes 4-bit weight on CUDA is dequantized
    straight into it (bitsandbytes' ``out=``, one write; its CPU backend has no such kernel), anything else
    through ``_dense_weight`` and a copy."""
    weight = base.weight
    state = getattr(weight, "quant_state", None)
    if (type(weight).__name__ == "Params4bit" and buf.is_cuda and state is not None and weight.data.shape[0] != 1
            and tuple(state.shape) == tuple(buf.shape) and state.dtype == buf.dtype and buf.is_contiguous()):
        import bitsandbytes.functional as bnbf

        bnbf.dequantize_4bit(weight.data, state, out=buf)
        return
    buf.copy_(_dense_weight(base).reshape(buf.shape).to(buf.dtype))


def keep_nf4_on_cpu(model: Any) -> Any:
    """MODEL with bitsandbytes' CPU repack of its 4-bit weights turned off, returned: the layout _dense_weight
    refuses. bitsandbytes 0.50 repacks a 4-bit weight in place on the first eval-mode forward without grad on a CPU
    with AVX512-BF16 and from then on computes in bf16 whatever compute_dtype says; the training forward (train
    mode) and every GPU never do, so a CPU model that fastgen shadows, or that a test compares with, must not."""
    for mod in model.modules():
        if hasattr(mod, "support_avx512bf16_for_cpu"):
            mod.support_avx512bf16_for_cpu = False
    return model


def _dense_weight(base: Any) -> Any:
    """The base layer's weight as a dense tensor (dequantizing bitsandbytes 4-bit / 8-bit weights)."""
    weight = base.weight
    cls = type(weight).__name__
    if cls == "Params4bit":
        import bitsandbytes.functional as bnbf

        if getattr(weight.quant_state, "packing_format_for_cpu", False):
            # bitsandbytes (0.50) repacks a 4-bit weight in place for its CPU kernel on the first eval-mode forward
            # without grad on a CPU with AVX512-BF16; dequantize_4bit reads that layout as NF4 all the same and
            # returns another matrix, and bitsandbytes' own inverse rewrites the layer's quant_state in place
            raise FastgenError("fastgen: bitsandbytes repacked a 4-bit weight for its CPU kernel (an eval-mode "
                               "forward without grad); its layout is no longer NF4, and dequantized it would "
                               "decode another model", "grpo.fast_generation=false")
        return bnbf.dequantize_4bit(weight.data, weight.quant_state)
    if cls == "Int8Params":
        from peft.utils.integrations import dequantize_bnb_weight

        return dequantize_bnb_weight(weight, state=base.state)
    return weight.detach()
