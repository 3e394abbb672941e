"""fastgen's options object (rlstack.payload.fastgen.options): one declaration per option, checked once, the
"auto" choices resolved in one place, and docs/fastgen-options.md rendered from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlstack.payload.fastgen import FastgenError, FastgenOptions, options_table
from rlstack.payload.fastgen.options import resolve

DOC = Path(__file__).resolve().parents[2] / "docs" / "fastgen-options.md"


def test_the_committed_options_table_is_the_rendering_of_the_options() -> None:
    """docs/fastgen-options.md cannot drift from the declarations: regenerate it with
    `python -c "from rlstack.payload.fastgen import options_table; print(options_table(), end='')"`."""
    assert DOC.read_text(encoding="utf-8") == options_table()
    for name in FastgenOptions.model_fields:
        assert f"| `{name}` |" in options_table()


def test_options_are_frozen_typed_and_only_those_set_are_dumped() -> None:
    options = FastgenOptions.of(decode_attention="matmul", attend_bucket=64)
    assert options.changed() == {"attend_bucket": 64, "decode_attention": "matmul"}
    assert options.model_dump() == {"decode_attention": "matmul", "attend_bucket": 64}
    assert FastgenOptions.model_validate(options.model_dump()) == options
    assert FastgenOptions.of(options, fp8="row").changed() == {"attend_bucket": 64, "decode_attention": "matmul",
                                                                "fp8": "row"}
    with pytest.raises(Exception, match="frozen"):
        options.fp8 = "row"  # type: ignore[misc]
    assert FastgenOptions.experimental("attention_tuning") and not FastgenOptions.experimental("decode_attention")


@pytest.mark.parametrize(("keywords", "message"), [
    ({"sample_in_graph": True}, "unknown option sample_in_graph"),  # measured no gain: deleted
    ({"compile_pick": True}, "unknown option compile_pick"),
    ({"compile_mode": "max-autotune-no-cudagraphs"}, "unknown option compile_mode"),
    ({"graph": "eager"}, "unknown graph 'eager'; one of manual, trees, none"),
    ({"length_bucket": "128"}, "length_bucket='128'"),
    ({"fuse_rotary": True, "shared_prompt": True}, "not shared_prompt's two"),
    ({"attention_tuning": "64,4"}, "block_n:num_warps:programs:num_stages"),
])
def test_keyword_callers_get_a_fastgen_error_naming_the_option(keywords: dict, message: str) -> None:
    with pytest.raises(FastgenError, match=message):
        FastgenOptions.of(**keywords)


def test_resolve_decides_each_auto_choice_once_and_says_why() -> None:
    config = type("Config", (), {"model_type": "qwen3"})()
    cpu = resolve(FastgenOptions(), "cpu", peft=True, config=config)
    assert (cpu.compile, cpu.graph, cpu.decode_attention, cpu.draw, cpu.fuse_rotary) == (False, "none", "matmul",
                                                                                          "torch", False)
    assert cpu.prefill_once and not cpu.memory_check and cpu.merge_lora and cpu.own_decoder
    assert set(cpu.why) == {"compile", "decode_attention", "fuse_rotary", "draw", "prefill_once"}
    assert cpu.why["fuse_rotary"] == "off CUDA" and cpu.rotary_why == "off CUDA"
    reference = resolve(FastgenOptions(reference_kernels=True), "cpu", peft=True, config=config)
    assert not reference.prefill_once and not reference.own_decoder and not reference.merge_lora
    asked = resolve(FastgenOptions(compile=True, graph="trees"), "cpu", peft=False, config=config)
    assert asked.compile and asked.graph == "none" and "compile" not in asked.why


def test_importing_fastgen_imports_no_torch() -> None:
    code = ("import sys, rlstack.payload.fastgen, rlstack.payload.recipes; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
