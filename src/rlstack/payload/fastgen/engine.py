"""The engine: a FastGenerator decodes a (PEFT or plain) causal LM with a static KV cache and a compiled
(CUDA-graphed) decode step.

Why: with ``use_vllm=False`` TRL calls ``model.generate`` eagerly on the PEFT model with a dynamic cache. For a 4B
model at batch 8 every decode step is ~1,000 small kernel launches issued from Python (plus LoRA's extra two
matmuls per projection), so the GPU idles most of the time while the step is memory-bound. The engine keeps
everything inside the portable stack (torch + transformers + peft, no vLLM):

* LoRA is folded into a *shadow* copy of the projection weights (``fastgen.shadow``), refreshed before every
  generation; the base weights are never modified, so training sees exactly the weights it had.
* The KV cache is a transformers ``StaticCache`` sized to a bucketed length, so every decode step has the same
  shapes and one captured CUDA graph replays it (``fastgen.compiling``).
* Sampling reproduces transformers' default logits warpers on the float32 logits, from the generation config as
  the model's own ``_prepare_generation_config`` resolves it (``fastgen.sampling``).
* Nothing is allocated before a memory check (``fastgen.memory``).

What each option does, and its default, is ``FastgenOptions`` (``fastgen.options``; docs/fastgen-options.md).
Everything heavy is imported inside functions: ``import rlstack.payload.fastgen`` must stay cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rlstack.payload.fastgen.compiling import compiled, first_compiled_call
from rlstack.payload.fastgen.errors import FastgenError, error_text
from rlstack.payload.fastgen.keywords import GROUPS_KWARG, READ_KWARG, SLOT_KWARG, TUNING_KWARG
from rlstack.payload.fastgen.memory import (
    MemoryPlan,
    check_memory,
    generation_dtype,
    plan_memory,
    round_up,
    text_config,
)
from rlstack.payload.fastgen.options import FastgenOptions, resolve
from rlstack.payload.fastgen.prefill import prefill
from rlstack.payload.fastgen.sampling import Sampling, _Loop, pick
from rlstack.payload.fastgen.shadow import _Shadow, is_peft, patched_members


class FastGenerator:
    """Generate completions for a (PEFT or plain) causal LM with a static KV cache and a compiled decode step.

    One instance per model (see ``get_engine``); it keeps one StaticCache (and one captured CUDA graph) per
    (batch, bucketed length, slots read) so repeated GRPO steps replay the same graph. ``options``: a
    FastgenOptions, or keywords on top of it (``FastgenOptions.of``). The options as this engine runs them are
    ``resolved`` (every "auto" decided, and why); the engine's attributes of the same names are those.

    Fallbacks, each once and said (a warning, and the ``*_error`` attribute): a failed first compile of the step
    (``compile_error``: eager from then on; where "auto" chose fuse_rotary, the step is first compiled again
    without it), a failed CUDA graph capture (``graph_error``: compiled kernels launched from Python), a failed
    first launch of the Triton draw (``draw_error``: the torch draw).
    """

    def __init__(self, model: Any, options: FastgenOptions | None = None, **keywords: Any) -> None:
        self.model = model
        self.decoder: Any = None  # built on the first generate(), after the memory check (see _build)
        self.options = FastgenOptions.of(options, **keywords)
        self.device = next(model.parameters()).device
        self.peft = is_peft(model)
        r = self.resolved = resolve(self.options, self.device, peft=self.peft, config=model.config)
        o = self.options
        self.reference_kernels, self.length_bucket, self.pristine = o.reference_kernels, o.length_bucket, o.pristine
        self.fp8, self.shared_prompt, self.attend_bucket = o.fp8, o.shared_prompt, o.attend_bucket
        self.gqa_attention = o.gqa_attention and not o.reference_kernels
        self.fuse_projections = o.fuse_projections and not o.reference_kernels
        self.compile, self.graph, self.merge_lora, self.own_decoder = r.compile, r.graph, r.merge_lora, r.own_decoder
        self.decode_attention, self.draw, self.tuning = r.decode_attention, r.draw, r.tuning
        self.prefill_once, self.memory_check = r.prefill_once, r.memory_check
        self.emulate_precision_casts = r.emulate_precision_casts
        # why "auto" (None) left the rotary to inductor, or turned it off later (a module _build found it cannot
        # serve, a first compile that failed with it: _rotary_off); None: fused
        self.fuse_rotary, self.rotary_why = r.fuse_rotary, r.rotary_why
        if r.rotary_why is not None and self.device.type == "cuda":
            self._rotary_off(r.rotary_why)  # (off CUDA, nothing to say)
        if self.decode_attention == "triton":
            from rlstack.payload.fastgen import split_attention

            split_attention.kernel()  # built here, not inside the compiled step (see kernel)
            if (self.tuning or split_attention.TUNING).fuse_merge:  # its ticket counters (split_attention.counters)
                split_attention.counters(self.device)
        if self.draw == "triton":
            from rlstack.payload.fastgen import topk_draw

            topk_draw.kernels()  # built here, outside any graph a pick is captured in
        self.draw_why: str | None = None  # why the last sampling call drew in torch despite draw="triton"
        self.draw_error: str | None = None  # the kernels' first launch failed: torch draws from then on
        self._draw_ok = False
        self.dtype = generation_dtype(model)
        self._shadow: _Shadow | None = None
        self.patches: list[str] = []  # what made the shadow a pristine copy (Unsloth's class patches)
        self.last_plan: MemoryPlan | None = None
        self._caches: dict[tuple[int, int], Any] = {}
        # (batch, length, slots read) -> (graph, logits) of the step; slots read == length without attend_bucket
        self._graphs: dict[tuple[int, int, int], Any] = {}
        self._loops: dict[tuple[int, int], _Loop] = {}
        self._eos: dict[tuple[int, ...], Any] = {}
        self._pool: Any = None
        self.compiles = 0
        self.compile_error: str | None = None
        self.graph_error: str | None = None
        self._compiled_ok = False
        self._step: Any = None
        self._takes_cache_position = False
        self.announced = False  # hook.say_how_once said how this engine serves
        self.prefilled_rows = 0  # rows the last generate's prefill ran (fewer than its batch with prefill_once)

    def _build(self) -> None:
        """Build the decoder (the merged shadow, or the PEFT model's base) and the compiled step, once."""
        if self.decoder is not None:
            return
        model = self.model
        if self.own_decoder:
            self._shadow = _Shadow(model, self.dtype, gqa_attention=self.gqa_attention, pristine=self.pristine,
                                   fuse_projections=self.fuse_projections, fp8=self.fp8)
            self.patches = self._shadow.patches
            self.decoder = self._shadow.model
        else:
            import sys

            root = model.get_base_model() if self.peft else model
            module = sys.modules.get(type(root).__module__)
            patched = patched_members(module) if module is not None else []
            if patched:
                raise FastgenError(f"fastgen: the model's classes are patched ({patched[0]}, ...): decoding through "
                                   "them is not transformers' code",
                                   "use transformers' generate for its kernels" if self.reference_kernels
                                   else "use merge_lora=True (the default)")
            self.decoder = root
        if self.fuse_rotary:
            from rlstack.payload.fastgen import rotary_attention

            served = rotary_attention.install(self.decoder)
            if isinstance(served, str):
                if self.resolved.rotary_asked:
                    raise FastgenError(f"fastgen: fuse_rotary: {served}", "drop fuse_rotary for this model")
                self._rotary_off(served)  # "auto" chose it from the config; a module says otherwise
        import inspect

        self._takes_cache_position = "cache_position" in inspect.signature(self.decoder.forward).parameters
        self._step = compiled(self._decode, self.graph, self.emulate_precision_casts) if self.compile else self._decode


    def describe(self) -> str:
        """One line on how this engine serves (the hook prints it once a run), so a training log says which path
        its rollouts took: the measured step time means little without it."""
        if self._shadow is not None:
            shadow = f"{str(self.dtype).removeprefix('torch.')} shadow" + (", LoRA merged" if self.peft else "")
        else:
            shadow = "the model's own modules" if self.peft else "the model's weights"
        if self.reference_kernels:
            graph = "transformers' kernels" + (" in a CUDA graph" if self.graph == "manual" else ", eager")
        else:
            graph = f"graph {self.graph}" if self.compile else "eager (compile off)"
        parts = [shadow, f"fused projections ({self.fused_gemms_saved} GEMMs fewer a step)"
                 if self.fused_gemms_saved else "projections apart", graph]
        if self.decode_attention != "matmul":
            parts.append(f"{self.decode_attention} decode attention"
                         + (f" (launch {self.tuning.spec()})" if self.tuning is not None else "")
                         + (", the prompt read once a group" if self.shared_prompt else ""))
        if self.fp8 != "off":
            parts.append(f"FP8 projections ({self.fp8_weights} e4m3 weights, {self.fp8}-wise scales)")
        if self.attend_bucket:
            parts.append(f"attention over the filled cache in {self.attend_bucket}-slot steps")
        if self.prefill_once:
            parts.append("each distinct prompt prefilled once")
        if self.emulate_precision_casts and self.compile:  # (a failed compile turned compile off: eager)
            parts.append("inductor rounding as eager does")
        if self.fuse_rotary:
            parts.append("q/k norm, rotary and cache write in the attention kernel")
        if self.draw == "triton":
            parts.append("top-k draw in Triton" if self.draw_error is None
                         else "top-k draw in torch (the Triton kernels failed)")
        if self.patches:
            parts.append(f"pristine copy of {len(self.patches)} patched members")
        return ", ".join(parts)


    @property
    def fp8_weights(self) -> int:
        """FP8 copies the shadow computes through (fp8; a fused group's is one; 0 before the shadow is built)."""
        return len(self._shadow._fp8) if self._shadow is not None else 0

    @property
    def fused_gemms_saved(self) -> int:
        """GEMMs a decode step no longer launches (fuse_projections; 0 before the shadow is built or without one)."""
        return self._shadow.fused_gemms_saved if self._shadow is not None else 0

    def plan(self, batch: int, length: int) -> MemoryPlan:
        """What serving ``batch`` sequences in a ``length``-token cache would allocate now (see MemoryPlan)."""
        return plan_memory(self.model, batch, length, self.dtype,
                           include_shadow=self.decoder is None and self.own_decoder, merge_lora=self.own_decoder,
                           fp8=self.fp8 != "off")

    def _reserve(self, batch: int, length: int) -> None:
        """Before anything new is allocated for this shape: the memory check (on CUDA), then the build."""
        if self.decoder is not None and (batch, length) in self._caches:
            return
        plan = self.plan(batch, length)
        self.last_plan = plan
        if self.memory_check:
            check_memory(plan, self.device)
        self._build()

    def _decode(self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any,
                slot: Any = None, read: int | None = None, groups: Any = None) -> Any:
        """One decode step's float32 logits [B, V]; ``slot`` ([1] on the device, the slot this step writes) goes
        where it is used: as cache_position (transformers 4.x) and to the triton decode attention, with
        ``groups`` (shared_prompt: the loop's entry table and prompt length)."""
        extra = self._cache_kwargs(slot) | (
            {READ_KWARG: read} if read is not None else {}) | (
            {SLOT_KWARG: slot} if self.decode_attention == "triton" and slot is not None else {}) | (
            {GROUPS_KWARG: groups} if groups is not None else {}) | (
            {TUNING_KWARG: self.tuning} if self.tuning is not None and slot is not None else {})
        out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           past_key_values=cache, use_cache=True, **extra)
        if self.fuse_rotary and slot is not None:
            # the layers' write counters (transformers 5), which update() advanced and the kernel does not: one
            # kernel for all of them (the next step's mask reads layer 0's)
            lengths = self._lengths(cache)
            if lengths:
                import torch

                torch._foreach_add_(lengths, 1)
        return out.logits[:, -1, :].float()

    def read_length(self, filled: int, length: int) -> int:
        """The cache slots a decode step's attention reads when ``filled`` slots hold keys (this step's
        included): all ``length`` of them, or with ``attend_bucket`` the filled ones rounded up to it. Each
        distinct value is its own compiled step and CUDA graph, so a generation through a cache of L slots
        captures up to L / attend_bucket graphs (on the first call of each shape, like the one it replaces)."""
        return min(length, round_up(filled, self.attend_bucket)) if self.attend_bucket else length

    def _cache_kwargs(self, cache_position: Any) -> dict[str, Any]:
        """``cache_position`` where the decoder's forward takes it (transformers 4.x). Why pass it: without it,
        4.57 derives the write position from ``StaticCache.get_seq_length()``, which counts the non-zero key slots
        of batch row 0; a left-padded row 0 whose pad token embeds to zero (an embedding with padding_idx, or
        Unsloth's zeroed pad row) has zero keys there, so the count falls short and decode overwrites the prompt.
        transformers 5 counts writes in the cache itself and its forward has no such argument."""
        return {"cache_position": cache_position} if self._takes_cache_position else {}

    def _rotary_off(self, why: str, level: int = logging.INFO) -> None:
        """Leave the q/k norms, the rotary and the cache write to transformers' forward (inductor's kernels) from
        here on, saying why: what "auto" does where the fused path cannot serve (``level``: info where that is
        expected, a warning where something failed)."""
        from rlstack.payload.fastgen import rotary_attention

        if self.decoder is not None:
            rotary_attention.uninstall(self.decoder)
        self.fuse_rotary, self.rotary_why = False, why
        logging.getLogger(__name__).log(level, "fastgen: the q/k norms, rotary and cache write stay in inductor's "
                                        "kernels: %s", why)

    @staticmethod
    def _lengths(cache: Any) -> list[Any]:
        import torch

        return [layer.cumulative_length for layer in cache.layers
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def _decode_step(self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any,
                     slot: Any = None, read: int | None = None, groups: Any = None) -> Any:
        """One decode step through the compiled function; if compilation itself fails (an unsupported model or
        torch build), fall back to eager decoding, with a warning, rather than failing the training run. The
        cache length is rolled back first because the failed call may have advanced it."""
        if not self.compile:
            return self._decode(input_ids, attention_mask, position_ids, cache, slot, read, groups)
        import torch

        if self.graph == "trees":
            torch.compiler.cudagraph_mark_step_begin()
        if self._compiled_ok:
            return self._step(input_ids, attention_mask, position_ids, cache, slot, read, groups)
        out, why = first_compiled_call(
            lambda: self._step(input_ids, attention_mask, position_ids, cache, slot, read, groups),
            self._lengths(cache))
        if why is not None and self.fuse_rotary and not self.resolved.rotary_asked:
            # "auto" chose the rotary in the kernel: the step without it compiles before anything goes eager
            # (eager is several times slower; a kernel helper inductor's compile worker cannot resolve fails the step)
            self._rotary_off(f"the compiled step with it failed: {why}", logging.WARNING)
            out, why = first_compiled_call(
                lambda: self._step(input_ids, attention_mask, position_ids, cache, slot, read, groups),
                self._lengths(cache))
        if why is None:
            self._compiled_ok = True
            return out
        self.compile_error = why
        logging.getLogger(__name__).warning("fastgen: compiled decoding failed, using eager: %s", why)
        self.compile = False
        self.graph = "none"
        self._step = self._decode
        return self._decode(input_ids, attention_mask, position_ids, cache, slot, read, groups)

    def _capture(self, cache: Any, loop: _Loop, body: Callable[[], Any],
                 warm: Callable[[], Any] | None = None) -> tuple[Any, Any] | None:
        """(graph, body's output) of ``body`` captured once, right after a prefill: the two warm-up runs (``warm``,
        default ``body``) see a valid cache, and what they advance (the cache's write positions, the loop's state)
        is set back before and after, so their writes land where the first real step overwrites them. None when
        the warm-up left compilation off (nothing compiled to capture). Raises what capture raises."""
        import torch

        state = self._lengths(cache) + loop.tensors()
        snap = [t.clone() for t in state]
        rng = torch.cuda.get_rng_state(self.device)  # whatever a warm-up draws is given back

        def restore() -> None:
            for cur, old in zip(state, snap, strict=True):
                cur.copy_(old)

        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    restore()
                    (warm or body)()
            torch.cuda.current_stream().wait_stream(stream)
            restore()
            if not (self.compile or self.reference_kernels):  # the warm-up's compile failed: nothing to capture
                return None
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self._pool):
                out = body()
            return g, out
        finally:
            torch.cuda.synchronize()
            restore()
            torch.cuda.set_rng_state(rng, self.device)

    def _captured(self, key: tuple[int, int, int], cache: Any, mask: Any, loop: _Loop) -> Any:
        """(graph, logits) of one decode step alone for this cache and read length (key: batch, length, slots
        read), reading the loop's token, position and (transformers 4.x) slot in place; captured on first use
        (a later read length mid-generation: the warm-ups write the slot the next real step overwrites, as
        after a prefill). None when capture is impossible (graph_error)."""
        if key in self._graphs:
            return self._graphs[key]
        read = self._read_arg(key)
        entry = None
        try:
            # the warm-up goes through _decode_step, which compiles, or falls back to eager and says so
            groups = self._groups(loop)
            entry = self._capture(cache, loop,
                                  lambda: self._step(loop.tok, mask, loop.pos, cache, loop.slot, read, groups),
                                  warm=lambda: self._decode_step(loop.tok, mask, loop.pos, cache, loop.slot, read,
                                                                 groups))
        except Exception as exc:
            self.graph_error = error_text(exc)
            logging.getLogger(__name__).warning("fastgen: CUDA graph capture failed, launching kernels: %s",
                                                self.graph_error)
        self._graphs[key] = entry
        return entry

    def _read_arg(self, key: tuple[int, int, int]) -> int | None:
        """What _decode passes as the read length: None for the whole cache, so that without attend_bucket the
        compiled step is the one it always was (no extra keyword)."""
        return key[2] if key[2] < key[1] else None


    def _eos_tensor(self, ids: tuple[int, ...]) -> Any:
        """The EOS ids on the device, one tensor per set of ids (a captured graph reads the tensor it saw)."""
        if not ids:
            return None
        if ids not in self._eos:
            import torch

            self._eos[ids] = torch.tensor(ids, dtype=torch.long, device=self.device)
        return self._eos[ids]

    def _loop(self, batch: int, length: int) -> _Loop:
        """The decode loop's state for this cache shape, allocated once (a captured graph reads these tensors)."""
        key = (batch, length)
        if key not in self._loops:
            per_entry = 1
            if self.shared_prompt:
                from rlstack.payload.fastgen import split_attention

                cfg = text_config(self.decoder.config)
                kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads  # None: one per head
                per_entry = split_attention.rows_per_entry(cfg.num_attention_heads // kv)
            self._loops[key] = _Loop.new(batch, length, self.device, per_entry)
        return self._loops[key]

    def _groups(self, loop: _Loop) -> tuple[Any, Any] | None:
        """What the triton decode attention takes for shared_prompt: the loop's entry table and prompt length
        (filled by _run before each generation's first step, read in place by the captured graph)."""
        return (loop.entries, loop.prompt) if self.shared_prompt else None


    def _pick_step(self, logits: Any, loop: _Loop, sampling: Sampling, eos: Any, generator: Any = None) -> None:
        """The pick (``sampling.pick``) of this step, through draw="triton"'s kernels where they draw it."""
        pick(logits, loop, sampling, eos, generator, self._kernel_draw(sampling, logits))

    def _kernel_draw(self, sampling: Sampling, logits: Any) -> Callable[[Any, _Loop, Any, int], bool] | None:
        """draw="triton"'s draw for this pick, or None where the torch draw serves (the option off, a sampling the
        kernels do not draw, their first launch failed). The first launch is tried here: where it raises, the
        failure is kept in ``draw_error``, said once, and the torch draw serves from then on."""
        if self.draw != "triton" or self.draw_error is not None:
            return None
        from rlstack.payload.fastgen import topk_draw

        why = topk_draw.applies(sampling.do_sample, sampling.top_k, sampling.top_p, sampling.min_p,
                                logits.shape[-1], logits.shape[0])
        if why != self.draw_why and why is not None and sampling.do_sample:
            # a warning where draw='triton' was asked for; chosen by "auto", the torch draw is what was asked
            logging.getLogger(__name__).log(logging.WARNING if self.resolved.draw_asked else logging.INFO,
                                            "fastgen: draw='triton' does not draw %s: drawing in torch", why)
        self.draw_why = why
        if why is not None:
            return None

        def kernel(logits: Any, loop: _Loop, eos: Any, pad: int) -> bool:
            advance = topk_draw.Advance(live=loop.unfinished, eos=eos, tokens=loop.tokens, tok=loop.tok,
                                        pos=loop.pos, pad=pad)
            topk_draw.draw(logits, int(sampling.top_k or 0), sampling.temperature, loop.seed, loop.k, loop.invalid,
                           advance=advance)
            return True

        if self._draw_ok:
            return kernel

        def first(logits: Any, loop: _Loop, eos: Any, pad: int) -> bool:
            # a launch that raises does so before it runs (Triton's compile), so the loop is as it was for torch
            try:
                kernel(logits, loop, eos, pad)
            except Exception as exc:
                self.draw_error = error_text(exc)
                logging.getLogger(__name__).warning("fastgen: the Triton top-k draw failed, drawing in torch: %s",
                                                    self.draw_error)
                return False
            self._draw_ok = True
            return True

        return first


    def _cache(self, batch: int, length: int) -> Any:
        from transformers import StaticCache

        key = (batch, length)
        entry = self._caches.get(key)
        if entry is None:
            import torch

            cache = StaticCache(config=self.decoder.config, max_cache_len=length)
            mask = torch.ones((batch, length), dtype=torch.long, device=self.device)
            entry = (cache, mask)
            self._caches[key] = entry
            self.compiles += 1
        else:
            entry[0].reset()
        return entry


    def generate(self, input_ids: Any, attention_mask: Any | None, max_new_tokens: int,
                 sampling: Sampling | None = None, generator: Any = None,
                 on_logits: Callable[[int, Any], None] | None = None) -> Any:
        """Return [B, P + T'] token ids like ``model.generate`` (prompt, then completions padded with the pad token
        after EOS; T' <= max_new_tokens, shorter only when every row finished early).

        ``on_logits(step, logits)`` sees each step's float32 logits [B, V] before sampling, unwarped: what the
        engine computes, for measuring it against the training model (bench/fastgen_fidelity.py). The tensor is
        the engine's buffer, overwritten by the next step: copy what you keep."""
        import torch

        sampling = sampling or Sampling()
        if input_ids.dim() != 2:
            raise FastgenError("fastgen expects input_ids of shape [batch, prompt_len]", "")
        input_ids = input_ids.to(self.device)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.to(self.device)
        if bool((attention_mask[:, -1] == 0).any()):
            raise FastgenError("fastgen needs left-padded prompts (a row ends with padding)",
                               "tokenize with padding_side='left', as TRL does")
        total = round_up(input_ids.shape[1] + max_new_tokens, self.length_bucket)
        # Normal autograd-free mode whatever the caller runs under: Unsloth's GRPO trainer generates inside
        # torch.inference_mode() and autocast (fp16 unless told bf16). Tensors fastgen keeps between calls (the
        # shadow, caches, graphs) must not become inference tensors, and the shadow computes in its own dtype,
        # as transformers' generate on a model of that dtype does.
        with torch.inference_mode(False), torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            self._reserve(input_ids.shape[0], total)
            was_training = self.decoder.training
            if self._shadow is not None:
                self._shadow.refresh()
            else:
                self.decoder.eval()
            try:
                out = self._run(input_ids, attention_mask, max_new_tokens, total, sampling, generator, on_logits)
            finally:
                if was_training and self._shadow is None:
                    self.decoder.train()
        return out

    def _run(self, input_ids: Any, attention_mask: Any, max_new_tokens: int, total: int, sampling: Sampling,
             generator: Any, on_logits: Callable[[int, Any], None] | None = None) -> Any:
        import torch

        batch, prompt_len = input_ids.shape
        cache, full_mask = self._cache(batch, total)
        full_mask.fill_(1)
        full_mask[:, :prompt_len] = attention_mask
        positions = attention_mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(attention_mask == 0, 1)
        next_pos = positions[:, -1] + 1
        # the prompt's cache slots (used where the forward takes cache_position: transformers 4.x, see
        # _cache_kwargs); each decode step's slot is the loop's
        slots = self._cache_kwargs(torch.arange(prompt_len, device=self.device))
        logits, self.prefilled_rows = prefill(self.decoder, input_ids, attention_mask, full_mask, positions, cache,
                                              slots, self.prefill_once)
        loop = self._loop(batch, total)
        loop.pos.copy_(next_pos[:, None] - 1)  # _pick advances position, slot and k to the first decode step's
        loop.slot.fill_(prompt_len - 1)
        loop.k.zero_()
        loop.tokens.fill_(sampling.pad_token_id)
        loop.unfinished.fill_(True)
        loop.invalid.fill_(False)
        if self.shared_prompt:  # the sequences that share a prompt (one read of the ids, before the loop)
            from rlstack.payload.fastgen import split_attention

            per_entry = loop.entries.shape[1]
            entries = split_attention.prompt_groups(input_ids, attention_mask, per_entry)
            loop.entries.copy_(torch.tensor(split_attention.entry_table(entries, batch, per_entry),
                                            dtype=torch.int32))
            loop.prompt.fill_(prompt_len)
        eos = self._eos_tensor(sampling.eos_token_ids)
        if on_logits is not None:
            on_logits(0, logits)
        if self.draw == "triton" and self._kernel_draw(sampling, logits) is not None:
            # the generation's seed of the kernels' random numbers, from the caller's generator (or torch's
            # default one); drawn only where they draw, so that a torch draw consumes what generate would
            loop.seed.random_(generator=generator)
        self._pick_step(logits, loop, sampling, eos, generator)  # token 0, from the prefill's logits
        # captured only now: the warm-up runs decode token 0 into the slot the first real step overwrites (the
        # loop's slot before this pick was the prompt's last, which a 4.x cache would have lost)
        captured = None
        read = 0
        steps_done = max_new_tokens
        for k in range(1, max_new_tokens):  # decode the token picked at k - 1, then pick token k
            # this step writes slot prompt_len + k - 1 and attends over every slot up to it
            if (new_read := self.read_length(prompt_len + k, total)) != read:
                read = new_read
                key = (batch, total, read)
                if self.graph == "manual":
                    captured = self._captured(key, cache, full_mask, loop)
            if captured is not None:
                captured[0].replay()
                logits = captured[1]
            else:
                logits = self._decode_step(loop.tok, full_mask, loop.pos, cache, loop.slot, self._read_arg(key),
                                           self._groups(loop))
            if on_logits is not None:
                on_logits(k, logits)
            self._pick_step(logits, loop, sampling, eos, generator)
            if eos is not None and k % 16 == 15 and k < max_new_tokens - 1 and not bool(loop.unfinished.any()):
                steps_done = k + 1
                break
        if sampling.do_sample and bool(loop.invalid.any()):
            raise FastgenError("fastgen: the sampling probabilities were not a distribution (NaN or inf logits) "
                               f"in rows {loop.invalid.nonzero().flatten().tolist()}",
                               "transformers' generate raises the same on such logits: check the model's dtype")
        tokens = loop.tokens[:, :steps_done].clone()
        if eos is not None and steps_done > 0:
            # like generate: stop at the step where the last row finished
            is_eos = torch.isin(tokens, eos)
            first = torch.where(is_eos.any(1), is_eos.int().argmax(1),
                                torch.full_like(is_eos[:, 0], steps_done - 1, dtype=torch.long))
            tokens = tokens[:, : int(first.max()) + 1]
        return torch.cat([input_ids, tokens.to(input_ids.dtype)], dim=1)

