"""fastgen's engine options: one typed, frozen object (``FastgenOptions``) declaring each option once, with its
type, default and a line on what it does; the checks between options; and the one place the "auto" choices are
resolved against the device and the model (``resolve``, which says why for each of them).

Why one object: the recipe (``grpo.fastgen_options``), the training hook, the evaluation and the benches all pass
these options, and each used to carry its own list of names, enums and checks. Now pydantic validates them once,
where they are made (a recipe at load, ``FastgenOptions.of`` for keyword callers), and ``docs/fastgen-options.md``
is rendered from the same declarations (``options_table``).

Options marked experimental were built and tested on the CPU (and some on a GPU) but not measured to gain, so they
stay off until a measurement makes one a default (docs/archive/notes.md keeps what was measured and what is planned).

Importing this module imports pydantic, not torch: a recipe validates its fastgen section on any machine.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator
from pydantic.json_schema import JsonDict

from rlstack.payload.fastgen.errors import FastgenError

Graph = Literal["manual", "trees", "none"]
DecodeAttention = Literal["auto", "matmul", "triton"]
Draw = Literal["auto", "torch", "triton"]
Fp8Scales = Literal["off", "row", "tensor"]
TUNING_FORM = "block_n:num_warps:programs:num_stages[:fused]"


class OptionError(ValueError):
    """A refused option value or combination: a ValueError, so pydantic reports it where the options are
    validated (a recipe's line), with the hint ``FastgenOptions.of`` gives keyword callers as a FastgenError's."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


# a field's json_schema_extra marking it experimental (see the module docstring)
EXPERIMENTAL: JsonDict = {"experimental": True}


class FastgenOptions(BaseModel):
    """How a FastGenerator decodes. Every field's default is the engine's default; None and "auto" are resolved
    against the device and the model by ``resolve``. Frozen: an engine's options do not change after it is made
    (an engine with other options is another engine: ``release`` the model's first)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    compile: bool | None = Field(
        default=None, description="compile the decode step with inductor; None: on CUDA, eager elsewhere")
    graph: Graph = Field(
        default="manual", description="manual: the compiled step captured once in a CUDA graph and replayed; trees: "
        "torch.compile's cudagraph trees (mode reduce-overhead); none: compiled kernels launched from Python")
    merge_lora: bool = Field(
        default=True, description="decode with a shadow of merged LoRA weights (False: through the PEFT modules, no "
        "extra memory, two extra matmuls a projection)")
    length_bucket: int = Field(
        default=128, gt=0, description="the static cache's length is prompt + new tokens rounded up to this: one "
        "compiled step and CUDA graph per (batch, bucketed length)")
    gqa_attention: bool = Field(
        default=True, description="fastgen's decode attention (each KV head read once) in the shadow; False: "
        "transformers' sdpa, which repeats K/V to every query head")
    memory_check: bool | None = Field(
        default=None, description="refuse, with the numbers, a shadow or cache that would not fit in free GPU "
        "memory, before allocating; None: on CUDA")
    pristine: bool | None = Field(
        default=None, description="build the shadow from a pristine copy of the modeling module; None: exactly "
        "where its classes were patched (Unsloth)")
    fuse_projections: bool = Field(
        default=True, description="each layer's q/k/v and gate/up projections as one GEMM each (the shadow's own "
        "weights only, fastgen.fused)")
    decode_attention: DecodeAttention = Field(
        default="auto", description="matmul: grouped matmuls over the whole static cache; triton: a split-KV kernel "
        "reading the filled slots (fastgen.split_attention); auto: triton on CUDA where it can run")
    draw: Draw = Field(
        default="auto", description="a sampling pick's temperature, top-k and draw in torch, or in two Triton "
        "kernels (fastgen.topk_draw, another random stream); auto: triton on CUDA where it can run")
    fuse_rotary: bool | None = Field(
        default=None, description="the q/k norms, rotary and cache write inside the triton attention kernel "
        "(fastgen.rotary_attention); None: on CUDA where it can serve the model")
    fp8: Fp8Scales = Field(
        default="off", description="the shadow's projections in FP8 (e4m3, row-wise or per-tensor scales, "
        "fastgen.fp8): rollouts from an FP8 approximation of the policy")
    reference_kernels: bool = Field(
        default=False, description="decode with transformers' own modules and kernels (adapter unmerged, eager, "
        "in a CUDA graph): generate's greedy tokens, for evaluations")
    attend_bucket: int = Field(
        default=0, json_schema_extra=EXPERIMENTAL, description="read the filled cache slots rounded up to N instead "
        "of the whole cache (0: off): one compiled step and graph per read length")
    shared_prompt: bool = Field(
        default=False, json_schema_extra=EXPERIMENTAL, description="with the triton attention: read a prompt's "
        "cache slots once per group of sequences that share it")
    prefill_once: bool | None = Field(
        default=None, json_schema_extra=EXPERIMENTAL, description="prefill each distinct prompt once and copy its "
        "cache rows to the rows that repeat it; None: on, off under reference_kernels")
    emulate_precision_casts: bool = Field(
        default=False, json_schema_extra=EXPERIMENTAL, description="inductor rounds a fused kernel's intermediates "
        "as eager does (compiled engines only)")
    attention_tuning: str | None = Field(
        default=None, json_schema_extra=EXPERIMENTAL, description=f"the triton attention's launch shape, "
        f"{TUNING_FORM} (None: split_attention.TUNING)")

    @field_validator("graph", "decode_attention", "draw", "fp8", mode="before")
    @classmethod
    def _known(cls, value: Any, info: Any) -> Any:
        allowed = get_args(cls.model_fields[info.field_name].annotation)
        if not isinstance(value, str) or value not in allowed:
            raise OptionError(f"fastgen: unknown {info.field_name} {value!r}; one of {', '.join(allowed)}",
                              f"use one of {', '.join(allowed)}")
        return value

    @field_validator("attend_bucket", mode="before")
    @classmethod
    def _slots(cls, value: Any) -> Any:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise OptionError(f"fastgen: attend_bucket must be a number of cache slots >= 0, not {value!r}",
                              "0 reads the whole cache; e.g. 256 reads the filled slots rounded up to 256")
        return value

    @field_validator("attention_tuning")
    @classmethod
    def _tuning(cls, value: str | None) -> str | None:
        if value is not None:
            parse_tuning(value)
        return value

    @model_validator(mode="after")
    def _together(self) -> FastgenOptions:
        """The refusals that depend on the options alone; those that depend on the device or the model (Triton,
        FP8 support, a PEFT model's own decoder, the model type) are ``resolve``'s."""
        if self.reference_kernels:
            _refuse_kernel_changes(self)
        if self.fuse_rotary and self.shared_prompt:
            raise OptionError("fastgen: fuse_rotary attends every slot in one pass, not shared_prompt's two",
                              "choose one of them")
        return self

    @model_serializer(mode="wrap")
    def _set_only(self, handler: Any) -> dict[str, Any]:
        """Only the options that were set: the defaults are the engine's, so a recipe that sets none dumps {} (its
        fingerprint and manifest as before this section was typed) and a dump validates back to the same object."""
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    @classmethod
    def of(cls, base: FastgenOptions | None = None, **keywords: Any) -> FastgenOptions:
        """``base`` (None: the defaults) with ``keywords`` set on top: the keyword way to make options (the benches'
        ``--variant KEY=VALUE``, tests, ``fastgen.generate``). A refusal raises FastgenError, saying what to do."""
        if base is not None and not keywords:
            return base
        try:
            return cls.model_validate({**(base.model_dump() if base is not None else {}), **keywords})
        except ValidationError as exc:
            raise _as_fastgen_error(exc) from None

    @staticmethod
    def experimental(name: str) -> bool:
        """Whether option ``name`` is experimental (built, not measured to gain; off by default)."""
        extra = FastgenOptions.model_fields[name].json_schema_extra
        return isinstance(extra, dict) and bool(extra.get("experimental"))

    def changed(self) -> dict[str, Any]:
        """The options set, by name (what a log line or a bench row says was asked for)."""
        return {name: getattr(self, name) for name in sorted(self.model_fields_set)}


def _as_fastgen_error(exc: ValidationError) -> FastgenError:
    """The first problem of a ValidationError as the FastgenError keyword callers have always had."""
    error = exc.errors()[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, OptionError):
        return FastgenError(str(cause), cause.hint)
    name = ".".join(str(x) for x in error["loc"]) or "options"
    known = ", ".join(FastgenOptions.model_fields)
    if error["type"] == "extra_forbidden":
        return FastgenError(f"fastgen: unknown option {name}", f"FastgenOptions takes: {known}")
    return FastgenError(f"fastgen: {name}={error.get('input')!r}: {error['msg']}", f"FastgenOptions takes: {known}")


def parse_tuning(spec: str) -> Any:
    """attention_tuning's ``split_attention.Tuning`` (split_attention imports no torch or triton at import)."""
    from rlstack.payload.fastgen import split_attention

    try:
        return split_attention.Tuning.parse(str(spec))
    except ValueError as exc:
        raise OptionError(f"fastgen: {exc}", "bench/attention_sweep.py prints each shape's spec") from None


# (the value, or values, of each option that leaves transformers' kernels alone under reference_kernels)
_KERNELS_KEPT: dict[str, tuple[Any, ...]] = {
    "compile": (None, False), "graph": ("manual", "none"), "attend_bucket": (0,),
    "decode_attention": ("auto", "matmul"), "fp8": ("off",), "prefill_once": (None, False),
    "emulate_precision_casts": (False,), "attention_tuning": (None,), "draw": ("auto", "torch"),
    "fuse_rotary": (None, False)}


def _refuse_kernel_changes(options: FastgenOptions) -> None:
    """reference_kernels promises transformers' kernels: refuse, naming it, any option that would change them
    (given a value other than its default), rather than drop it in silence."""
    changed = [f"{name}={getattr(options, name)!r}" for name, kept in _KERNELS_KEPT.items()
               if getattr(options, name) not in kept]
    if changed:
        raise OptionError(f"fastgen: reference_kernels decodes with transformers' own kernels; "
                          f"{', '.join(changed)} would change them",
                          "drop those options, or reference_kernels for fastgen's faster kernels")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The options as an engine on one device, for one model, runs them: every "auto" and None decided, and why
    (``why``: a line for each choice the options left to the engine)."""

    options: FastgenOptions
    compile: bool
    graph: str  # "none" where nothing is compiled or captured (and off CUDA)
    merge_lora: bool  # a PEFT model's LoRA merged into the shadow
    own_decoder: bool  # the shadow decodes (merged, or a plain model's shared tensors), not the model's modules
    own_attention: bool  # and with fastgen's decode attention
    decode_attention: str  # "matmul" or "triton"
    draw: str  # "torch" or "triton"
    fuse_rotary: bool
    rotary_why: str | None  # why the rotary stays in inductor's kernels where "auto" left it there
    prefill_once: bool
    memory_check: bool
    emulate_precision_casts: bool
    tuning: Any  # attention_tuning's split_attention.Tuning, or None
    why: dict[str, str]

    @property
    def draw_asked(self) -> bool:
        """draw="triton" asked for by name: a sampling it leaves to torch is a warning, not an info line."""
        return self.options.draw == "triton"

    @property
    def rotary_asked(self) -> bool:
        """fuse_rotary asked for by name: a module it cannot serve is an error, not a step aside."""
        return bool(self.options.fuse_rotary)


def resolve(options: FastgenOptions, device: Any, *, peft: bool, config: Any) -> Resolved:
    """``options`` for a model (``peft``: a PEFT model; ``config``: its config) on ``device`` (a torch.device):
    each "auto" and None decided (``auto_attention``, ``auto_draw``, ``auto_rotary``), and the refusals that
    depend on the device or the model, each saying what to do instead."""
    from rlstack.payload.fastgen import rotary_attention, triton_support
    from rlstack.payload.fastgen.memory import text_config

    o = options
    kind = getattr(device, "type", str(device))
    why: dict[str, str] = {}
    ref = o.reference_kernels  # generate's own kernels: no inductor, no fastgen attention, no shadow, no fusion
    compile_ = not ref and ((kind == "cuda") if o.compile is None else o.compile)
    if o.compile is None:
        why["compile"] = "off: reference_kernels" if ref else ("on CUDA" if compile_ else f"off CUDA ({kind})")
    # the eager step is captured too where reference_kernels asks for transformers' kernels
    graph = o.graph if ((compile_ or ref) and kind == "cuda") else "none"
    merge = o.merge_lora and not ref and peft
    own_decoder = not ref and (merge or not peft)
    own_attention = o.gqa_attention and not ref and own_decoder
    triton_why = triton_support.available(kind, "decode_attention='triton'")
    decode: str = o.decode_attention
    if decode == "auto":
        decode = auto_attention(kind, own_attention, o.attend_bucket, triton_why)
        why["decode_attention"] = (f"{decode}: device {kind}, fastgen's own attention {own_attention}, attend_bucket "
                                   f"{o.attend_bucket}, Triton {triton_why or 'runs'} (auto_attention)")
    for name, value, off in (("attend_bucket", o.attend_bucket, 0), ("decode_attention", decode, "matmul")):
        if value != off and not own_attention:
            raise FastgenError(f"fastgen: {name} needs fastgen's own decode attention",
                               f"keep gqa_attention=True and merge_lora=True (the defaults), or {name}={off!r}")
    if decode == "triton" and triton_why is not None:
        raise FastgenError(f"fastgen: {triton_why}", "use decode_attention='matmul' here")
    if o.fp8 != "off":
        from rlstack.payload.fastgen import fp8 as fp8_module

        fp8_why = fp8_module.unavailable(device)
        if fp8_why is not None:
            raise FastgenError(f"fastgen: {fp8_why}", "use fp8='off' (the default) here")
        if not own_decoder:
            raise FastgenError("fastgen: fp8 needs the merged shadow (its weights are what it quantizes)",
                               "keep merge_lora=True (the default)")
    if o.shared_prompt and decode != "triton":
        raise FastgenError("fastgen: shared_prompt reads the prompt once per group through the triton decode "
                           "attention", "add decode_attention='triton', or drop shared_prompt")
    tuning = parse_tuning(o.attention_tuning) if o.attention_tuning is not None else None
    if tuning is not None and decode != "triton":
        raise FastgenError("fastgen: attention_tuning is the triton decode attention's launch shape",
                           "add decode_attention='triton' (the default on CUDA), or drop attention_tuning")
    family_why = rotary_attention.family_why_not(text_config(config))
    rotary_why = None
    if o.fuse_rotary is None:
        rotary_why = auto_rotary(kind, decode, o.shared_prompt, family_why)
        why["fuse_rotary"] = "fused" if rotary_why is None else rotary_why
    elif o.fuse_rotary:
        if decode != "triton":
            raise FastgenError("fastgen: fuse_rotary does the norms, the rotary and the cache write in the triton "
                               "decode attention", "keep decode_attention 'auto' on CUDA (or 'triton'), or drop "
                               "fuse_rotary")
        if family_why is not None:
            raise FastgenError(f"fastgen: fuse_rotary: {family_why}", "drop fuse_rotary for this model")
    draw_triton_why = triton_support.available(kind, "draw='triton'")
    draw: str = o.draw
    if draw == "auto":
        draw = auto_draw(kind, ref, draw_triton_why)
        why["draw"] = (f"{draw}: device {kind}, reference_kernels {ref}, Triton {draw_triton_why or 'runs'} "
                       "(auto_draw)")
    if draw == "triton" and draw_triton_why is not None:
        raise FastgenError(f"fastgen: {draw_triton_why}", "use draw='torch' (or 'auto', the default) here")
    # off under reference_kernels: generate prefills every row, and a GEMM of fewer rows may round otherwise
    prefill_once = (not ref) if o.prefill_once is None else o.prefill_once
    if o.prefill_once is None:
        why["prefill_once"] = "off: reference_kernels prefills every row, as generate" if ref else "on"
    memory_check = (kind == "cuda") if o.memory_check is None else o.memory_check
    return Resolved(options=o, compile=compile_, graph=graph, merge_lora=merge, own_decoder=own_decoder,
                    own_attention=own_attention, decode_attention=decode, draw=draw,
                    fuse_rotary=(rotary_why is None) if o.fuse_rotary is None else o.fuse_rotary,
                    rotary_why=rotary_why, prefill_once=prefill_once, memory_check=memory_check,
                    emulate_precision_casts=o.emulate_precision_casts and compile_, tuning=tuning, why=why)


def auto_attention(device_type: str, own_attention: bool, attend_bucket: int, triton_why: str | None) -> str:
    """What ``decode_attention="auto"`` decodes with: the triton split kernel on CUDA where the engine attends with
    its own function (the merged shadow, gqa_attention), reads the whole cache (attend_bucket 0: the kernel reads
    the filled slots itself) and Triton imports (``triton_why`` is None); else the grouped matmuls.

    Why triton on CUDA: it reads only the filled slots, at every step of one graph, and measured faster at 64
    sequences and even at 8 (docs/decisions/0005-fastgen-defaults.md). Never on the CPU, where the kernel only runs
    in Triton's interpreter (tests)."""
    if device_type == "cuda" and own_attention and attend_bucket == 0 and triton_why is None:
        return "triton"
    return "matmul"


def auto_draw(device_type: str, reference_kernels: bool, triton_why: str | None) -> str:
    """What ``draw="auto"`` draws with: fastgen.topk_draw's kernels on CUDA where Triton imports (``triton_why`` is
    None), unless reference_kernels (which promises transformers' kernels) is on; else torch.

    Why the kernels on CUDA: measured faster through portable's default path at 8 and 64 sequences, in one
    process in both orders, their draw exact against transformers' top-k (docs/decisions/0005-fastgen-defaults.md).
    The samplings the kernels do not draw (top-p, min-p, no top-k) fall to torch at each call (``draw_why``)."""
    if device_type == "cuda" and triton_why is None and not reference_kernels:
        return "triton"
    return "torch"


def auto_rotary(device_type: str, decode_attention: str, shared_prompt: bool, family_why: str | None) -> str | None:
    """Why ``fuse_rotary=None`` leaves the q/k norms, the rotary and the cache write to inductor's kernels (None:
    it fuses them into the triton attention). It fuses on CUDA where the decode attention is the triton kernel
    (``decode_attention`` as resolved), shared_prompt is off and the model type is one ``fastgen.rotary_attention``
    knows (``family_why``, from the config; each module is checked again when the engine is built, and a module it
    cannot serve turns it off there, saying why).

    Why on CUDA: two kernels a layer fewer around the attention, measured faster at 8 and 64 sequences through
    portable's default path in both orders (docs/decisions/0005-fastgen-defaults.md); eager's roundings are
    kept, so the cache holds the key transformers' update would write (GPU test)."""
    if device_type != "cuda":
        return "off CUDA"
    if decode_attention != "triton":
        return f"the decode attention is {decode_attention!r}, not the triton kernel"
    if shared_prompt:
        return "shared_prompt reads the prompt in a pass of its own"
    return family_why


def options_table() -> str:
    """A Markdown table of every option (type or choices, default, experimental, what it does), rendered from
    ``FastgenOptions``: docs/fastgen-options.md is this text (a test keeps it so)."""
    lines = ["# fastgen engine options", "",
             "Generated from `rlstack.payload.fastgen.options.FastgenOptions` (`options_table()`); do not edit by "
             "hand. Set one in a recipe with `--set grpo.fastgen_options.KEY=VALUE`. `auto` and `None` are decided "
             "by `resolve` for the device and the model; experimental options are off until measured to gain.", "",
             "| option | type | default | experimental | description |", "|---|---|---|---|---|"]
    for name, field in FastgenOptions.model_fields.items():
        args = get_args(field.annotation)
        names = [repr(a) if isinstance(a, str) else ("None" if a is type(None) else a.__name__) for a in args]
        kind = " \\| ".join(f"`{n}`" for n in names) if args else f"`{getattr(field.annotation, '__name__', '?')}`"
        experimental = "yes" if FastgenOptions.experimental(name) else ""
        lines.append(f"| `{name}` | {kind} | `{field.default!r}` | {experimental} | {field.description} |")
    return "\n".join(lines) + "\n"
