"""Names fastgen's modules share: the attention function's registered name and the keywords a decode step passes
through the model's forward to the attention (transformers hands a forward's extra keywords to the attention
function in 4.57 and 5.x). A module of their own so that the engine, the attention functions and
``rotary_attention`` import them without importing each other."""

from __future__ import annotations

ENGINE_ATTR = "_rlstack_fastgen_engine"  # where a model keeps its FastGenerator (see get_engine)
ATTN_NAME = "rlstack_fastgen"  # fastgen's decode attention, as registered with transformers
READ_KWARG = "fastgen_read"  # how many cache slots a decode step's attention reads (attend_bucket)
SLOT_KWARG = "fastgen_slot"  # the [1] tensor of the slot a decode step writes (decode_attention="triton")
GROUPS_KWARG = "fastgen_groups"  # (entry table, prompt length) of shared_prompt (fastgen.split_attention.attend)
TUNING_KWARG = "fastgen_tuning"  # attention_tuning's split_attention.Tuning (decode_attention="triton")
