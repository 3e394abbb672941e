"""Names built at run time: the strings a package hands to `eval`, `exec`, `importlib.import_module` or
`__import__`, resolved from source where their values are pinned down there.

Unsloth reaches TRL's trainers this way (`eval(f"trl.trainer.{trainer_file}")`, `exec(f"from trl.trainer import
({RLTrainer_name}, ...)")`), so a name that TRL drops breaks at run time without any import statement naming it.
A string constant resolves as it stands; an f-string resolves when each of its placeholders is a name whose
values the enclosing function pins down (a str default, the constants it is compared with: the known list of
trainer files), every combination of them. What cannot be resolved is counted as unchecked, never dropped.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Mapping

from rlstack.probes import pyast

# the callees whose first argument is code or a module name
CALLS = {"eval": "eval", "exec": "exec", "import_module": "module", "importlib.import_module": "module",
         "__import__": "module"}
_MOST = 64  # combinations of placeholder values tried per string: beyond that it is counted as unchecked
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def calls(nodes: tuple[ast.AST, ...]) -> list[tuple[ast.Call, str]]:
    """(call, 'eval' | 'exec' | 'module') for every such call in a site's nodes whose first argument is a string
    constant or an f-string."""
    out = []
    for top in nodes:
        for n in pyast.walk(top):
            if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant | ast.JoinedStr):
                how = CALLS.get(ast.unparse(n.func))
                if how and (not isinstance(n.args[0], ast.Constant) or isinstance(n.args[0].value, str)):
                    out.append((n, how))
    return out


def expand(arg: ast.expr, values: Mapping[str, tuple[str, ...]]) -> list[str] | None:
    """Every string the argument can be, or None when one of its placeholders is not pinned down."""
    if isinstance(arg, ast.Constant):
        return [str(arg.value)]
    assert isinstance(arg, ast.JoinedStr)
    parts: list[tuple[str, ...]] = []
    for v in arg.values:
        if isinstance(v, ast.Constant):
            parts.append((str(v.value),))
        elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.format_spec is None \
                and v.conversion == -1 and v.value.id in values:
            parts.append(values[v.value.id])
        else:
            return None
    total = 1
    for p in parts:
        total *= len(p)
    if total > _MOST:
        return None
    return ["".join(c) for c in itertools.product(*parts)]


def literal_text(arg: ast.expr) -> str:
    """The constant parts of a string argument (what says which package it reaches, resolved or not)."""
    if isinstance(arg, ast.Constant):
        return str(arg.value)
    return "".join(str(v.value) for v in getattr(arg, "values", []) if isinstance(v, ast.Constant))


def targets(how: str, text: str) -> list[tuple[str, str | None]]:
    """(module, name or None) a resolved string reaches: an exec'd import's modules and names, a module name,
    or an eval'd dotted name as (its dotted prefix, its last part); the caller finds the module prefix."""
    if how == "exec":
        try:
            tree = pyast.parse(text)
        except SyntaxError:
            return []
        out: list[tuple[str, str | None]] = []
        for n in pyast.walk(tree):
            if isinstance(n, ast.Import):
                out += [(x.name, None) for x in n.names]
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                out += [(n.module, x.name) for x in n.names if x.name != "*"]
        return out
    text = text.strip()
    if not DOTTED.fullmatch(text):
        return []
    if how == "module":
        return [(text, None)]
    return [(text, None)] if "." not in text else [(text.rsplit(".", 1)[0], text.rsplit(".", 1)[1])]
