"""fastgen's triton decode attention (decode_attention="triton", fastgen.split_attention): its kernel and the
engine around it in Triton's CPU interpreter (a process of their own, see tests/payload/triton_interpreted.py),
and the refusals that keep it off where it cannot run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlstack.payload import fastgen  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # every kernel call runs in Python
def test_the_kernel_and_the_engine_in_tritons_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # the timeout only guards against a hang: the interpreted module's time scales with the CPU's single-thread
    # speed, and on a slower CI machine it ran past a 600 s guard while every test in it passed
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
                           str(HERE / "triton_interpreted.py")], env=env, capture_output=True, text=True,
                          timeout=2400, cwd=HERE.parents[1])
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail and "deselected" not in tail, tail


def _register_use(kernel, types: dict[str, str], const: dict[str, int], capability: int, num_warps: int,
                  aligned: frozenset[str] | set[str] = frozenset(), ir: dict | None = None,
                  num_stages: int | None = None) -> dict:
    """Compile ``kernel`` ahead of time for sm_<capability> (Triton + the ptxas in its wheel, no GPU) and read
    ptxas's resource use from the cubin: {"REG": ..., "STACK": ..., ...}. ``aligned``: the arguments a launch
    passes divisible by 16 (pointers from torch, strides and sizes of the shapes used), which Triton's launcher
    specializes on, as here: what lets it vectorize loads and pipeline them (cp.async), so a compile without
    them is another kernel. ``ir``, where given, gets the TTGIR and PTX."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip(f"no {cuobjdump} in this triton wheel")
    assert set(const) == {n for n in kernel.arg_names if n.isupper()}  # every constexpr the kernel takes
    signature = {n: "constexpr" if n in const else types.get(n, "i32") for n in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(kernel.arg_names.index(n),): v for n, v in const.items()},
                       attrs={(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    options = {"num_warps": num_warps} | ({"num_stages": num_stages} if num_stages is not None else {})
    compiled = triton_compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"rlstack-{kernel.__name__}-{capability}-{os.getpid()}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    if ir is not None:
        ir.update(ttgir=compiled.asm["ttgir"], ptx=compiled.asm["ptx"])
    try:
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout
    finally:
        cubin.unlink()
    return dict(f.split(":", 1) for f in next(line for line in usage.splitlines() if "REG:" in line).split())


# the attention kernel's non-constexpr argument types as fastgen launches it on a bf16 cache (others are i32), and
# what the launch passes divisible by 16: every pointer, the strides and the length (4,096 / 128 / 768 elements).
# No float: inside the compiled step inductor types a Python float fp64 (the test after the next one)
_ATTENTION_TYPES = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "mask_ptr": "*u8", "slot_ptr": "*i64",
                    "rows_ptr": "*i32", "prefix_ptr": "*i64", "o_ptr": "*fp32", "lse_ptr": "*fp32", "f_ptr": "*bf16",
                    "cnt_ptr": "*i32", "kn_ptr": "*bf16", "vn_ptr": "*bf16", "qw_ptr": "*bf16", "kw_ptr": "*bf16",
                    "cos_ptr": "*bf16", "sin_ptr": "*bf16"}
_ATTENTION_ALIGNED = frozenset({*(n for n in _ATTENTION_TYPES if n.endswith("_ptr")), "sq_b", "sq_h", "sk_b", "sk_h",
                                "sk_n", "sv_b", "sv_h", "sv_n", "sm_b", "length", "skn_b", "skn_h", "svn_b", "svn_h",
                                "sc_b", "ss_b"})


def _attention_const(**changes: int) -> dict:
    """The attention kernel's constexprs as fastgen launches it for the Qwen3-4B shape (8 KV heads of 4 query
    heads, head dim 128, a bool mask, compiled not interpreted): one split of one pass, with ``changes``."""
    from rlstack.payload.fastgen import split_attention as sa

    return {"SCALE": 128 ** -0.5, "KV": 8, "G": 4, "SPLITS": 1, "D": 128, "BLOCK_D": 128, "BLOCK_H": sa.MIN_BLOCK_H,
            "BLOCK": sa.BLOCK_N, "MASK": 1, "ITERS": 1, "PASS": 0, "R": 1, "SPLIT0": 0, "TOTAL": 1,
            "FUSE": 0, "S_P2": 1, "INTERPRETED": 0, "PRO": 0, "NORM": 0, "EPS": 0.0, "HALF": 1, **changes}


@pytest.mark.parametrize("capability", [90, 120], ids=["sm_90", "sm_120"])
@pytest.mark.parametrize("batch", [8, 64])
def test_the_attention_kernel_compiles_for_hopper_and_blackwell_without_spilling(capability: int,
                                                                                batch: int) -> None:
    """Triton compiles ahead of time for a GPU it does not have: the kernel as fastgen launches it for the Qwen3-4B
    shape (8 KV heads of 4 query heads, head dim 128, a 768-slot bf16 cache) becomes a cubin for the H200 and for
    Blackwell cards, and ptxas keeps it in registers (no stack: the kernel's while-loop form spilled 2 KB a
    thread at BLOCK_N 64 and 4 warps). What the flex template failed on the GPU in the 2026-12-04 lease, a
    compile error, shows here first. And the loop stays software-pipelined (K and V blocks copied ahead with
    cp.async): a condition inside the loop once cost that, one around it (empty splits skip it) does not."""
    from rlstack.payload.fastgen import split_attention as sa

    every = sa.splits_for(batch, 8, 768)
    # every filled slot at once; and shared_prompt's two passes (the prompt once for 4 sequences, then the rest)
    r = sa.rows_per_entry(4)
    s1 = sa.splits_for(batch // r, 8, 768)
    for pass_, rows, splits, first in ((0, 1, every, 0), (1, r, s1, 0), (2, 1, every, s1)):
        const = _attention_const(SPLITS=splits, ITERS=sa.iters_for(768, splits), PASS=pass_, R=rows, SPLIT0=first,
                                 TOTAL=first + splits if pass_ == 2 else splits)
        ir: dict = {}
        use = _register_use(sa.kernel(), _ATTENTION_TYPES, const, capability, sa.NUM_WARPS, _ATTENTION_ALIGNED, ir)
        assert use["STACK"] == "0" and int(use["REG"]) <= 255, (pass_, use)
        assert "cp.async" in ir["ptx"], (pass_, "the loop's loads are not pipelined")


@pytest.mark.parametrize("capability", [90, 120], ids=["sm_90", "sm_120"])
def test_the_kernel_that_merges_its_own_splits_compiles_with_a_released_ticket_and_l2_reads(capability: int) -> None:
    """fuse_merge, ahead of time as fastgen would launch it for the Qwen3-4B shape: at 8 sequences (8 splits) the
    stores of a split are followed by a CTA barrier and one acq_rel atomic at GPU scope (the ticket), the last
    program's reads of the others' partials bypass L1 (ld.global.cg), and nothing spills; at 64 (one split) the
    kernel stores the attention at once and takes no ticket."""
    import re

    from rlstack.payload.fastgen import split_attention as sa

    for batch in (8, 64):
        splits = sa.splits_for(batch, 8, 768)
        const = _attention_const(SPLITS=splits, ITERS=sa.iters_for(768, splits), TOTAL=splits, FUSE=1,
                                 S_P2=1 << max(0, (splits - 1).bit_length()))
        ir: dict = {}
        use = _register_use(sa.kernel(), _ATTENTION_TYPES, const, capability, sa.NUM_WARPS, _ATTENTION_ALIGNED, ir)
        assert use["STACK"] == "0" and int(use["REG"]) <= 255, (batch, use)
        ptx = ir["ptx"]
        atomics = re.findall(r"atom\.[\w.]*", ptx)
        if splits == 1:
            assert not atomics, atomics
            continue
        assert any("acq_rel" in a and "gpu" in a and "add" in a for a in atomics), atomics
        before = ptx[:re.search(r"atom\.[\w.]*add", ptx).start()]  # type: ignore[union-attr]
        assert before.rfind("bar.sync") > before.rfind("st.global"), "the ticket is taken before every store"
        assert "ld.global.cg" in ptx[len(before):]


@pytest.mark.parametrize("spec", ["32:2:512:default", "64:2:128:2", "128:4:2048:2", "128:8:512:default"])
def test_the_sweeps_launch_shapes_compile_for_hopper_without_spilling(spec: str) -> None:
    """bench/attention_sweep.py's default grid reaches shapes the engine never ran (2 warps, 128-slot blocks):
    each compiles for sm_90 at 8 and 64 sequences with its registers held (no stack) and its loads pipelined, so
    a lease's sweep rows are timings, not compile errors."""
    from rlstack.payload.fastgen import split_attention as sa

    tuning = sa.Tuning.parse(spec)
    for batch in (8, 64):
        splits = sa.splits_for(batch, 8, 768, tuning)
        const = _attention_const(SPLITS=splits, ITERS=sa.iters_for(768, splits, tuning), TOTAL=splits,
                                 BLOCK=tuning.block_n)
        ir: dict = {}
        use = _register_use(sa.kernel(), _ATTENTION_TYPES, const, 90, tuning.num_warps, _ATTENTION_ALIGNED, ir,
                            num_stages=tuning.num_stages)
        assert use["STACK"] == "0" and int(use["REG"]) <= 255, (spec, batch, use)
        assert "cp.async" in ir["ptx"], (spec, batch)


@pytest.mark.parametrize("capability", [90, 120], ids=["sm_90", "sm_120"])
def test_the_kernel_with_the_rotary_prologue_compiles_without_spilling_and_stays_pipelined(capability: int) -> None:
    """fuse_rotary's prologue (Qwen3's q/k RMSNorm, the rotary embedding, the new key and value written to the
    cache and attended from registers) ahead of time as fastgen would launch it on the Qwen3-4B shape at 8 and 64
    sequences: in registers (no stack), the loop's loads still copied ahead (cp.async: the prologue stands before
    the loop and the new slot's work after it, nothing inside it), and the cache written (st.global of the key)."""
    from rlstack.payload.fastgen import split_attention as sa

    for batch in (8, 64):
        splits = sa.splits_for(batch, 8, 768)
        const = _attention_const(SPLITS=splits, ITERS=sa.iters_for(768, splits), TOTAL=splits, PRO=1, NORM=1,
                                 EPS=1e-6, HALF=64)
        ir: dict = {}
        use = _register_use(sa.kernel(), _ATTENTION_TYPES, const, capability, sa.NUM_WARPS, _ATTENTION_ALIGNED, ir)
        assert use["STACK"] == "0" and int(use["REG"]) <= 255, (batch, use)
        assert "cp.async" in ir["ptx"], (batch, "the loop's loads are not pipelined")
        assert "rsqrt" in ir["ptx"], batch


def _as_inductor_redeclares(kernel, tmp_path: Path, name: str):
    """``kernel`` as inductor's compile worker gets it when a compiled graph launches it: the source of the kernel
    and of every Triton helper it calls, spliced by inductor's own closure function
    (`user_defined_triton_kernel_transitive_closure_source_code`) into a module of their own, imported here."""
    import importlib.util

    from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code

    src = user_defined_triton_kernel_transitive_closure_source_code(kernel)
    path = tmp_path / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n@triton.jit\n" + src)  # Triton reads the file
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_kernel_inductor_launches_finds_its_helpers_where_inductor_declares_them(tmp_path: Path) -> None:
    """Inside a compiled graph inductor compiles each Triton kernel in a worker from source: the kernel's and its
    helpers', each helper declared under the name its `def` gives it. A helper bound to a module global of another
    name (split_attention's rounding helper as `rounded`, called as `_rounded`) passed every interpreter and
    ahead-of-time test here and failed on the H100 (NameError in the worker; fastgen fell back to eager). Each
    kernel re-declared as inductor does finds every helper it calls; the prologue kernel compiles from there for
    sm_90."""
    from triton import JITFunction

    from rlstack.payload.fastgen import split_attention as sa
    from rlstack.payload.fastgen import topk_draw as td

    kernels = {"split_kernel": sa.kernel(), **dict(zip(("chunk_top", "row_draw", "noise_of"), td.kernels(),
                                                       strict=True))}
    for name, kernel in kernels.items():
        module = _as_inductor_redeclares(kernel, tmp_path, f"redeclared_{name}")
        called = [n for n in kernel.fn.__code__.co_names if isinstance(kernel.fn.__globals__.get(n), JITFunction)]
        for helper in called:
            assert isinstance(getattr(module, helper, None), JITFunction), (name, helper)
    assert "_rounded" in sa.kernel().fn.__code__.co_names  # the helper the GPU missed is among those checked
    module = _as_inductor_redeclares(sa.kernel(), tmp_path, "redeclared_prologue")
    splits = sa.splits_for(8, 8, 768)
    const = _attention_const(SPLITS=splits, ITERS=sa.iters_for(768, splits), TOTAL=splits, PRO=1, NORM=1, EPS=1e-6,
                             HALF=64)
    use = _register_use(module.split_kernel, _ATTENTION_TYPES, const, 90, sa.NUM_WARPS, _ATTENTION_ALIGNED)
    assert use["STACK"] == "0", use


def test_the_attention_kernel_compiles_with_the_arguments_attend_passes_typed_as_inductor_types_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the compiled decode step inductor compiles the kernel itself, typing each runtime argument from the
    value attend passes: a Python float as fp64. The softmax scale passed that way made the scores fp64 and the
    compile failed on the H200 (2026-12-05), while the ahead-of-time test above, typing it fp32 by hand, passed.
    Here the launch's own arguments are recorded (the kernel not run) and typed that way, then compiled."""
    pytest.importorskip("triton")
    from rlstack.payload.fastgen import split_attention as sa

    launches: list[tuple[tuple, dict]] = []

    class Recorder:
        def __getitem__(self, grid: tuple) -> object:
            return lambda *args, **kwargs: launches.append((args, kwargs))

    monkeypatch.setattr(sa, "_KERNEL", Recorder())
    b, kv, g, length, d = 8, 8, 4, 768, 128
    query = torch.zeros(b, kv * g, 1, d, dtype=torch.bfloat16)
    key = value = torch.zeros(b, kv, length, d, dtype=torch.bfloat16)
    keep = torch.ones(b, length, dtype=torch.bool)
    sa.attend(query, key, value, keep, torch.tensor([300]), d ** -0.5)
    new = torch.zeros(b, kv, d, dtype=torch.bfloat16)
    weight = torch.ones(d, dtype=torch.bfloat16)
    turn = torch.zeros(b, d, dtype=torch.bfloat16)
    sa.attend(query, key, value, keep, torch.tensor([300]), d ** -0.5,
              prologue=sa.Prologue(new, new, weight, weight, 1e-6, turn, turn))  # fuse_rotary's launch
    monkeypatch.undo()  # the real kernel again, to compile
    pointer = {torch.bfloat16: "*bf16", torch.uint8: "*u8", torch.int64: "*i64", torch.int32: "*i32",
               torch.float32: "*fp32"}
    kernel = sa.kernel()
    runtime = [n for n in kernel.arg_names if not n.isupper()]
    assert len(launches) == 2
    for args, kwargs in launches:
        assert len(args) == len(runtime)
        types = {n: pointer[v.dtype] if isinstance(v, torch.Tensor) else "fp64" if isinstance(v, float) else "i64"
                 for n, v in zip(runtime, args, strict=True)}
        const = {n: v for n, v in kwargs.items() if n.isupper()}
        use = _register_use(kernel, types, const, 90, sa.NUM_WARPS)
        assert use["STACK"] == "0", use


def test_compiled_the_attention_loop_runs_the_splits_own_blocks_not_the_fixed_trip_count() -> None:
    """The fixed trip count (ITERS, the longest split's blocks) is the interpreter's: compiled, the loop's bound is
    the split's own blocks, so a split of a half-filled cache runs half the dots. The compiled kernel does not
    change with ITERS; the interpreted form is the one that reads it."""
    from rlstack.payload.fastgen import split_attention as sa

    ptx = {}
    for iters in (3, 24):
        const = _attention_const(ITERS=iters)
        ir: dict = {}
        _register_use(sa.kernel(), _ATTENTION_TYPES, const, 90, sa.NUM_WARPS, _ATTENTION_ALIGNED, ir)
        ptx[iters] = ir["ptx"]
    assert ptx[3] == ptx[24]


def _tiny(**config: object) -> torch.nn.Module:
    """A two-layer Qwen3, ``config`` changing its config."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=512,
                                   **config)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def test_off_cuda_without_the_interpreter_it_is_refused_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(fastgen.FastgenError, match="runs on CUDA .*TRITON_INTERPRET=1") as err:
        fastgen.FastGenerator(_tiny(), compile=False, decode_attention="triton")
    assert "use decode_attention='matmul'" in str(err.value)  # what to do instead


def test_a_launch_shape_is_checked_when_made_and_sets_the_splits() -> None:
    from rlstack.payload.fastgen import split_attention as sa

    assert sa.Tuning(block_n=sa.BLOCK_N, num_warps=sa.NUM_WARPS, programs=sa.TARGET_PROGRAMS) == sa.TUNING
    for bad in ({"block_n": 48}, {"block_n": 8}, {"num_warps": 3}, {"programs": 0}, {"num_stages": 0}):
        with pytest.raises(ValueError, match="split attention"):
            sa.Tuning(**bad)
    wide = sa.Tuning(block_n=64, programs=2048)
    assert sa.splits_for(64, 8, 768, wide) == 4 and sa.splits_for(64, 8, 768) == 1
    assert sa.iters_for(768, 4, wide) == 3  # 192 slots a split: 3 blocks of 64
    assert wide.label() == "block_n=64,num_warps=8,programs=2048,num_stages=default,fuse_merge=False"
    with pytest.raises(ValueError, match="fuse_merge"):
        sa.Tuning(fuse_merge=1)  # type: ignore[arg-type]
    for tuning in (sa.TUNING, wide, sa.Tuning(block_n=128, num_warps=4, programs=128, num_stages=2, fuse_merge=True)):
        assert sa.Tuning.parse(tuning.spec()) == tuning
    assert sa.TUNING.spec() == "32:8:512:default" and sa.Tuning.parse("64:4:2048:2:fused").fuse_merge
    for bad in ("64:4:2048", "64:4:2048:2:fast", "a:4:2048:2", "64,4,2048,2", "64:3:2048:2"):
        with pytest.raises(ValueError, match="split attention"):
            sa.Tuning.parse(bad)


def test_the_default_attention_is_the_triton_kernel_on_cuda_only_where_it_can_run() -> None:
    from rlstack.payload.fastgen.options import auto_attention

    assert auto_attention("cuda", True, 0, None) == "triton"
    assert auto_attention("cpu", True, 0, None) == "matmul"  # the interpreter is for tests, never a default
    assert auto_attention("cuda", False, 0, None) == "matmul"  # PEFT modules, gqa_attention off, reference kernels
    assert auto_attention("cuda", True, 256, None) == "matmul"  # attend_bucket compiles a step per read length
    assert auto_attention("cuda", True, 0, "decode_attention needs the triton package") == "matmul"


def test_the_default_engine_attends_with_matmuls_on_the_cpu_even_under_the_interpreter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    engine = fastgen.FastGenerator(_tiny(), compile=False)
    assert engine.decode_attention == "matmul" and "decode attention" not in engine.describe()
    with pytest.raises(fastgen.FastgenError, match="shared_prompt .* triton decode attention"):
        fastgen.FastGenerator(_tiny(), compile=False, shared_prompt=True)  # auto chose matmul: said, not dropped


def test_sequences_of_one_prompt_are_found_and_tabled_for_the_prompt_pass() -> None:
    from rlstack.payload.fastgen import split_attention as sa

    ids = torch.tensor([[1, 2], [5, 6], [1, 2], [1, 2], [0, 2], [1, 2], [1, 2]])
    mask = torch.ones_like(ids)
    mask[4, 0] = 0  # [0, 2] left-padded: another prompt than any [1, 2]
    entries = sa.prompt_groups(ids, mask, 4)
    assert entries == [[0, 2, 3, 5], [6], [1], [4]]  # a group of five: two reads; first appearances in order
    assert sa.entry_table(entries, 7, 4) == [[0, 2, 3, 5], [6, -1, -1, -1], [1, -1, -1, -1], [4, -1, -1, -1],
                                             [-1] * 4, [-1] * 4, [-1] * 4]
    assert sa.rows_per_entry(4) == 4 and sa.rows_per_entry(1) == 16 and sa.rows_per_entry(32) == 1


def test_shared_prompt_without_the_triton_attention_is_refused() -> None:
    with pytest.raises(fastgen.FastgenError, match="shared_prompt .* triton decode attention") as err:
        fastgen.FastGenerator(_tiny(), compile=False, shared_prompt=True)
    assert "decode_attention='triton'" in str(err.value)


def test_unknown_kinds_and_a_triton_attention_without_fastgens_own_are_refused() -> None:
    with pytest.raises(fastgen.FastgenError, match="unknown decode_attention 'flex'"):
        fastgen.FastGenerator(_tiny(), compile=False, decode_attention="flex")  # retired on 2026-12-04
    with pytest.raises(fastgen.FastgenError, match="decode_attention needs fastgen's own decode attention"):
        fastgen.FastGenerator(_tiny(), compile=False, decode_attention="triton", gqa_attention=False)


@pytest.mark.parametrize(("shared_prompt", "fuse_rotary", "key_only_init"),
                         [(False, False, False), (True, False, False), (False, True, False), (False, True, True)],
                         ids=["every-slot", "prompt-once-a-group", "rotary-in-the-kernel",
                              "rotary-in-the-kernel-4.57-cache-layers"])
def test_the_triton_decode_step_traces_into_one_graph_that_clones_no_cache(monkeypatch: pytest.MonkeyPatch,
                                                                         shared_prompt: bool, fuse_rotary: bool,
                                                                         key_only_init: bool) -> None:
    """What torch.compile makes of the decode step with the triton attention (decode_attention="triton"),
    traced on the host as on an sm_90 GPU: dynamo takes each kernel call as a user-defined Triton kernel inside
    one graph (fullgraph: no break around it), and functionalization, which reads the kernels' TTIR to find what
    they write, clones only their outputs. A kernel it thought wrote its inputs would copy the KV cache (or a
    weight) every step: on the 4B shape at 64 sequences, GBs a step, which only a GPU profile would show.
    Tracing only: the backend stops before inductor (no GPU to compile or run for). On a CPU dynamo treats a
    Triton kernel as plain Python unless torch reports triton usable, and Triton's TTIR needs a target: both
    are supplied here, as an H200 would. With shared_prompt the attention is two kernel calls a layer, reading
    the loop's entry table and prompt length in place. With fuse_rotary the kernel writes the cache (this step's
    key and value): functionalization then clones the cache for it, and inductor's reinplacing pass, run here as
    inductor runs it on this graph, must take those clones out again (the cache is a graph input the step
    mutates anyway), or every layer would copy its whole cache every step. Its cache layers are allocated inside
    the step (their first update): ``key_only_init`` gives them transformers 4.57's ``lazy_initialization(key)``
    (5.x's takes the value too; calling 4.57's with both failed this trace under 4.57.6)."""
    pytest.importorskip("triton")
    peft = pytest.importorskip("peft")
    import torch._dynamo
    import torch.utils._triton as torch_triton
    from test_fastgen import _tiny
    from torch._dynamo.backends.common import aot_autograd
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    from rlstack.payload.fastgen import triton_support

    class _Hopper:
        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_active_torch_device(self) -> object:
            return torch.device("cpu")

    monkeypatch.setattr(torch_triton, "has_triton", lambda: True)
    monkeypatch.setattr(triton_support, "available", lambda *args: None)
    monkeypatch.setattr(driver, "_active", _Hopper())
    if key_only_init:
        import inspect

        from transformers.cache_utils import StaticLayer

        init = StaticLayer.lazy_initialization
        with_value = "value_states" in inspect.signature(init).parameters

        def key_only(self, key_states):  # 4.57's signature (the values take the keys' shape)
            return init(self, key_states, key_states) if with_value else init(self, key_states)

        monkeypatch.setattr(StaticLayer, "lazy_initialization", key_only)
    model = peft.get_peft_model(_tiny(3), peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    engine = fastgen.FastGenerator(model.eval(), compile=True, decode_attention="triton",
                                   shared_prompt=shared_prompt, fuse_rotary=fuse_rotary)
    batch, length = 3, 128
    engine._reserve(batch, length)
    engine._shadow.refresh()
    cache, mask = engine._cache(batch, length)
    loop = engine._loop(batch, length)
    graphs: list = []

    class _Traced(Exception):
        pass

    def keep(gm, inputs):
        graphs.append(gm)
        raise _Traced

    torch._dynamo.reset()
    try:
        with torch.no_grad(), pytest.raises(Exception, match="_Traced"):
            torch.compile(engine._decode, backend=aot_autograd(fw_compiler=keep), fullgraph=True,
                          dynamic=False)(loop.tok, mask, loop.pos, cache, loop.slot, None, engine._groups(loop))
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    import re

    def cloned(code: str) -> tuple[int, list[str]]:
        calls = re.findall(r"triton_kernel_wrapper_functional\(.*?tensors_to_clone = \[([^\]]*)\]", code)
        return len(calls), sorted({name.strip(" '") for call in calls for name in call.split(",") if name.strip()})

    calls, clones = cloned(graphs[0].code)
    assert calls == 2 * (2 if shared_prompt else 1), graphs[0].code
    assert clones == (["k_ptr", "lse_ptr", "o_ptr", "v_ptr"] if fuse_rotary else ["lse_ptr", "o_ptr"]), clones
    from torch._inductor.fx_passes.reinplace import reinplace_inplaceable_ops_core

    reinplace_inplaceable_ops_core(graphs[0].graph)  # what inductor's post-grad passes do with the graph
    graphs[0].recompile()
    after = graphs[0].code
    assert after.count("triton_kernel_wrapper_") >= calls  # every launch still there, cloning no cache
    assert not {"k_ptr", "v_ptr"} & set(cloned(after)[1]), after


def test_a_computed_bool_mask_reaches_the_kernel_through_inductors_lowering() -> None:
    """Inside the compiled decode step the mask is computed, and inductor did not lower the bitcast view the
    kernel's uint8 mask used to be made with (on the H200 that sent the step to eager decoding, 2026-12-05). Real
    inductor on the CPU: where its C++ build lacks setuptools (this venv), the failure comes after lowering."""
    from rlstack.payload.fastgen import split_attention

    def prepared(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        keep = (torch.arange(x.shape[-1]) < n)[None, :].expand(x.shape[0], -1)
        kind, m = split_attention.mask_argument(keep, x)
        return m.to(torch.int32) * kind + x.to(torch.int32)

    x, n = torch.ones(3, 16), torch.tensor(5)
    assert split_attention.mask_argument(None, x) == (0, x)
    kind, eager = split_attention.mask_argument(torch.tensor([[True, False]]), x)
    assert kind == 1 and eager.dtype == torch.uint8 and eager.tolist() == [[1, 0]]
    assert split_attention.mask_argument(torch.zeros(1, 2), x)[0] == 2
    torch._dynamo.reset()
    try:
        out = torch.compile(prepared, backend="inductor", fullgraph=True)(x, n)
    except Exception as exc:  # lowering passed where only inductor's C++ build is missing
        assert "No module named 'setuptools'" in str(exc), str(exc)[:2000]
    else:
        assert torch.equal(out, prepared(x, n))


# fastgen.topk_draw: draw="triton" (its kernels run in the interpreter in triton_interpreted.py)

def test_the_top_k_draw_is_refused_where_it_cannot_run_or_would_change_what_it_promises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(fastgen.FastgenError, match="draw='triton' runs on CUDA") as err:
        fastgen.FastGenerator(_tiny(), compile=False, draw="triton")
    assert "use draw='torch'" in str(err.value)
    with pytest.raises(fastgen.FastgenError, match="unknown draw 'cuda'"):
        fastgen.FastGenerator(_tiny(), compile=False, draw="cuda")
    with pytest.raises(fastgen.FastgenError, match="reference_kernels .*draw='triton'"):
        fastgen.FastGenerator(_tiny(), reference_kernels=True, draw="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # "auto" (the default) draws in torch off CUDA, and beside reference_kernels anywhere
    assert fastgen.FastGenerator(_tiny(), compile=False).draw == "torch"
    assert fastgen.FastGenerator(_tiny(), compile=False, draw="auto").draw == "torch"


def test_auto_draws_in_the_kernels_on_cuda_unless_reference_kernels_own_the_pick() -> None:
    from rlstack.payload.fastgen.options import auto_draw

    assert auto_draw("cuda", False, None) == "triton"
    assert auto_draw("cpu", False, None) == "torch"
    assert auto_draw("cuda", True, None) == "torch"  # reference_kernels: transformers' kernels
    assert auto_draw("cuda", False, "triton is not installed") == "torch"


def test_the_top_k_draw_says_which_samplings_it_leaves_to_torch() -> None:
    from rlstack.payload.fastgen import topk_draw as td

    assert td.applies(True, 50, 1.0, None, 151936, 64) is None
    assert td.applies(True, 1, 1.0, None, 300, 3) is None
    assert "greedy" in (td.applies(False, 50, 1.0, None, 300, 3) or "")
    for top_k in (None, 0, 300):
        assert "without top-k" in (td.applies(True, top_k, 1.0, None, 300, 3) or "")
    assert td.applies(True, 129, 1.0, None, 151936, 8) == "top_k 129 > 128"
    assert td.applies(True, 50, 0.95, None, 151936, 8) == td.applies(True, 50, 1.0, 0.1, 151936, 8) == \
        "top-p / min-p sampling"
    assert "2**31" in (td.applies(True, 50, 1.0, None, 151936, 20000) or "")


@pytest.mark.parametrize(("vocab", "top_k"), [(151936, 50), (151936, 20), (151936, 128), (32000, 50), (300, 5)])
def test_a_rows_chunks_hold_its_top_k_and_fill_the_gpu(vocab: int, top_k: int) -> None:
    from rlstack.payload.fastgen import topk_draw as td

    plan = td.Plan.make(vocab, top_k)
    assert plan.kp >= top_k and plan.kp & (plan.kp - 1) == 0 and plan.width >= plan.kp
    assert (plan.chunks - 1) * plan.width < vocab <= plan.chunks * plan.width <= vocab + plan.width
    assert plan.chunks <= td.TARGET_CHUNKS and plan.cand_p2 >= plan.chunks * plan.kp
    if vocab == 151936:  # Qwen3's vocabulary: 38 chunks a row (304 programs at 8 sequences), <= 8,192 candidates
        assert plan.chunks == 38 and plan.cand_p2 <= 8192


@pytest.mark.parametrize(("capability", "top_k"),
                         [(90, 50), (120, 50), pytest.param(90, 128, marks=pytest.mark.slow)],  # ~5-9 s each
                         ids=["sm_90-k50", "sm_120-k50", "sm_90-k128"])
def test_the_top_k_draw_compiles_for_hopper_and_blackwell_without_spilling(capability: int, top_k: int) -> None:
    """Both kernels as draw launches them for Qwen3's 151,936-token vocabulary (float32 logits), ahead of time:
    no stack (the row kernel's 4,096 candidates at top_k 50, 8,192 at the largest top_k, sort in registers), and
    temperature as a constexpr."""
    from rlstack.payload.fastgen import topk_draw as td

    plan = td.Plan.make(151936, top_k)
    chunk_top, row_draw, _ = td.kernels()
    ptrs = {"logits_ptr": "*fp32", "cand_ptr": "*u64", "seed_ptr": "*i64", "step_ptr": "*i64", "tok_ptr": "*i64",
            "invalid_ptr": "*i1", "live_ptr": "*i1", "eos_ptr": "*i64", "tokens_ptr": "*i64", "pos_ptr": "*i64"}
    aligned = {*ptrs, "stride_b", "stride_tokens"}
    # the engine's launch: the pick's bookkeeping in the row program (ADVANCE), Qwen3's two EOS ids
    for kernel, const in ((chunk_top, {"INV_T": 1.0, "CHUNKS": plan.chunks, "WIDTH": plan.width, "KP": plan.kp}),
                          (row_draw, {"INV_T": td.inverse_temperature(0.7), "K": top_k, "CHUNKS": plan.chunks,
                                      "KP": plan.kp, "CAND_P2": plan.cand_p2, "CHUNKS_P2": 64,
                                      "WIDTH": plan.width, "ADVANCE": 1, "N_EOS": 2, "EOS_P2": 2,
                                      "PAD": 151643})):
        use = _register_use(kernel, ptrs, const, capability, td.NUM_WARPS,
                            {n for n in aligned if n in kernel.arg_names})
        assert use["STACK"] == "0" and int(use["REG"]) <= 255, (kernel.__name__, use)


# fuse_rotary: the q/k norms, the rotary and the cache write in the triton attention (fastgen.rotary_attention);
# decoding with it runs in the interpreter in triton_interpreted.py

def test_fuse_rotary_is_refused_where_the_kernel_does_not_attend_or_the_model_is_not_one_it_knows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the triton attention may be chosen on this CPU
    with pytest.raises(fastgen.FastgenError, match="fuse_rotary does the norms.*in the triton") as err:
        fastgen.FastGenerator(_tiny(), compile=False, decode_attention="matmul", fuse_rotary=True)
    assert "decode_attention 'auto' on CUDA" in str(err.value)
    with pytest.raises(fastgen.FastgenError, match="not shared_prompt's two"):
        fastgen.FastGenerator(_tiny(), compile=False, decode_attention="triton", shared_prompt=True,
                              fuse_rotary=True)
    with pytest.raises(fastgen.FastgenError, match="reference_kernels .*fuse_rotary=True"):
        fastgen.FastGenerator(_tiny(), reference_kernels=True, fuse_rotary=True)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50))
    with pytest.raises(fastgen.FastgenError, match="model type 'gpt2' is not one whose attention fuse_rotary knows"):
        fastgen.FastGenerator(gpt2, compile=False, decode_attention="triton", fuse_rotary=True)
    assert fastgen.FastGenerator(_tiny(), compile=False, decode_attention="triton", fuse_rotary=True).fuse_rotary


def test_fuse_rotary_takes_only_attention_modules_it_can_serve() -> None:
    """rotary_attention's checks, module by module: Qwen3's layers pass; a sliding window, a norm whose weight is
    not one per head element, a norm the model type does not have, two epsilons, a partial rotary are refused;
    install changes no module when one is refused."""
    from rlstack.payload.fastgen import rotary_attention as ra

    model = _tiny()
    modules = ra.attention_modules(model)
    assert len(modules) == 2 and all(ra.module_why_not(m, norms=True) is None for m in modules)
    assert ra.module_why_not(modules[0], norms=False) == \
        "Qwen3Attention has a q_norm its model type is not known to have"
    modules[1].sliding_window = 64
    assert "sliding window" in str(ra.module_why_not(modules[1], norms=True))
    assert "sliding window" in str(ra.install(model))
    assert all("forward" not in vars(m) for m in modules)  # nothing installed
    modules[1].sliding_window = None
    modules[1].k_norm.variance_epsilon = 1e-5
    assert "two epsilons" in str(ra.module_why_not(modules[1], norms=True))
    modules[1].k_norm.variance_epsilon = modules[1].q_norm.variance_epsilon
    modules[1].q_norm.weight = torch.nn.Parameter(torch.ones(4))
    assert "not an RMSNorm over the head dimension" in str(ra.module_why_not(modules[1], norms=True))
    cfg = transformers.Qwen3Config(partial_rotary_factor=0.5)
    assert "covers 0.5 of each head" in str(ra.family_why_not(cfg))
    fresh = _tiny()
    assert ra.install(fresh) == 2 and all("forward" in vars(m) for m in ra.attention_modules(fresh))


def test_auto_fuses_the_rotary_on_cuda_where_the_triton_attention_decodes_a_model_it_knows() -> None:
    from rlstack.payload.fastgen.options import auto_rotary

    assert auto_rotary("cuda", "triton", False, None) is None
    assert auto_rotary("cpu", "triton", False, None) == "off CUDA"
    assert "'matmul', not the triton kernel" in str(auto_rotary("cuda", "matmul", False, None))
    assert "shared_prompt" in str(auto_rotary("cuda", "triton", True, None))
    why = "model type 'gpt2' is not one whose attention fuse_rotary knows"
    assert auto_rotary("cuda", "triton", False, why) == why


def test_auto_rotary_steps_aside_saying_why_where_asking_for_it_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The default ("auto") never refuses: off CUDA, for a model type it does not know, and (as on CUDA, where it
    chose the fusion from the config) for an attention module it cannot serve, found when the engine is built,
    inductor's kernels do the work and the engine says why (``rotary_why``, an info line); asked for by name, the
    same module is an error that names it."""
    import logging

    from rlstack.payload.fastgen import options as options_module
    from rlstack.payload.fastgen import rotary_attention as ra

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the triton attention may be chosen on this CPU
    eng = fastgen.FastGenerator(_tiny(), compile=False, decode_attention="triton")
    assert not eng.fuse_rotary and eng.rotary_why == "off CUDA"
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50))
    assert not fastgen.FastGenerator(gpt2, compile=False).fuse_rotary

    def windowed() -> torch.nn.Module:  # its second layer attends through a window (the shadow's copy too)
        return _tiny(layer_types=["full_attention", "sliding_attention"], sliding_window=64, use_sliding_window=True)

    monkeypatch.setattr(options_module, "auto_rotary", lambda *_: None)  # as "auto" decides on CUDA
    eng = fastgen.FastGenerator(windowed(), compile=False, decode_attention="triton")
    assert eng.fuse_rotary and eng.rotary_why is None
    with caplog.at_level(logging.INFO, logger="rlstack.payload.fastgen.engine"):
        eng._build()
    assert not eng.fuse_rotary and "sliding window" in str(eng.rotary_why)
    assert "stay in inductor's kernels" in caplog.text and "sliding window" in caplog.text
    assert all("forward" not in vars(m) for m in ra.attention_modules(eng.decoder))
    asked = fastgen.FastGenerator(windowed(), compile=False, decode_attention="triton", fuse_rotary=True)
    with pytest.raises(fastgen.FastgenError, match="fuse_rotary: .*sliding window"):
        asked._build()


def test_auto_rotary_whose_first_compile_fails_compiles_the_step_without_it_not_eager(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Where the compiled step with the rotary in the kernel fails to compile (on the H100 a kernel helper
    inductor could not see did), "auto" puts transformers' forward back on the attention modules and compiles
    the step without it before anything goes eager (several times slower), saying why; asked for by name, the
    failure goes eager as any compile failure does. The compiled step is stood in for: a CPU cannot compile the
    triton kernel."""
    import logging
    from types import SimpleNamespace

    from rlstack.payload.fastgen import options as options_module
    from rlstack.payload.fastgen import rotary_attention as ra

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(options_module, "auto_rotary", lambda *_: None)  # as "auto" decides on CUDA
    cache = SimpleNamespace(layers=[])

    def made(asked: bool | None) -> tuple[fastgen.FastGenerator, list[bool]]:
        eng = fastgen.FastGenerator(_tiny(), compile=False, decode_attention="triton", fuse_rotary=asked)
        eng._build()
        assert eng.fuse_rotary and all("forward" in vars(m) for m in ra.attention_modules(eng.decoder))
        calls: list[bool] = []

        def step(*_: object) -> str:  # fails to compile while the rotary's forward is installed
            calls.append(eng.fuse_rotary)
            if any("forward" in vars(m) for m in ra.attention_modules(eng.decoder)):
                raise RuntimeError("InductorError: NameError: '_rounded' is not defined")
            return "compiled"

        eng.compile, eng._step = True, step
        monkeypatch.setattr(eng, "_decode", lambda *_: "eager")
        return eng, calls

    eng, calls = made(None)
    with caplog.at_level(logging.WARNING, logger="rlstack.payload.fastgen.engine"):
        assert eng._decode_step(None, None, None, cache) == "compiled"
    assert calls == [True, False] and eng.compile_error is None and eng._compiled_ok
    assert not eng.fuse_rotary and "_rounded" in str(eng.rotary_why) and "stay in inductor's kernels" in caplog.text
    assert not any("forward" in vars(m) for m in ra.attention_modules(eng.decoder))
    assert "rotary" not in eng.describe()
    asked, _ = made(True)
    assert asked._decode_step(None, None, None, cache) == "eager"
    assert asked.fuse_rotary and "_rounded" in str(asked.compile_error)
