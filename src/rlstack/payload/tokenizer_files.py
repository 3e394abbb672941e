"""Tokenizer folders that every stack can read, whichever transformers wrote them.

Stacks hand models and adapters to each other (portable trains under transformers 5, fp8 serves them with vLLM 0.21
under transformers 4.57), and the tiny probe model is cached once for all of them. transformers 5 saves a generic
fast tokenizer as `"tokenizer_class": "TokenizersBackend"`, a class transformers 4 does not have: AutoTokenizer
there raises "Tokenizer class TokenizersBackend does not exist", which vLLM reports only as "Failed to load the
tokenizer" (in the portable adapter's hand-off to the fp8 stack, and in the fp8 grpo-step probe on a tiny model
portable had cached; wall `tokenizer-class-transformers5`). Both majors load the same files under the name
`PreTrainedTokenizerFast` (5.x keeps it as an alias of its backend class), so rlstack writes that name.
Model-specific names (Qwen2Tokenizer, ...) exist in both and are left alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CONFIG = "tokenizer_config.json"

# transformers 5-only class names -> the name transformers 4 and 5 both resolve to the same fast tokenizer
V5_ONLY_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def make_readable_by_all(folder: str | Path) -> bool:
    """Rewrite a saved tokenizer_config.json whose class only transformers 5 knows; True when it changed.
    The file is replaced atomically, so an interrupted rewrite leaves the old file, never an empty one."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        return False
    data = json.loads(path.read_text())
    new = V5_ONLY_CLASSES.get(str(data.get("tokenizer_class")))
    if new is None:
        return False
    data["tokenizer_class"] = new
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return True


def save(tokenizer: Any, folder: str | Path) -> None:
    """tokenizer.save_pretrained(folder), readable by transformers 4 and 5 alike."""
    tokenizer.save_pretrained(str(folder))
    make_readable_by_all(folder)
