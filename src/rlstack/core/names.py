"""Names a user gives that become one folder name: adapter names, run names, recipe names, a run folder to copy
out of a container. One check for all of them, made where the name enters and before any work starts, so a
name can never reach outside the folder it is meant for (`../x`, `a/b`) and is the same bytes everywhere it
lands: the adapter store, the runs volume, ./runs on the host, Docker volume paths, compose project names and
shell commands.

The policy: 1 to 128 characters, ASCII letters, digits, '.', '_' and '-', starting with a letter or a digit.
No spaces (they split in shell commands), no other Unicode (file systems and tools normalise it differently,
so one name could become two folders), no path separators and no leading dot ('.', '..' and hidden folders),
and 128 characters leaves room for the suffixes rlstack adds within a file system's 255-byte name limit.
"""

from __future__ import annotations

import re

from rlstack.core.errors import RlstackError

MAX_LENGTH = 128
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)
_ALLOWED = re.compile(r"[A-Za-z0-9._-]")
POLICY = ("1-128 characters: ASCII letters, digits, '.', '_' and '-', starting with a letter or digit "
          "(no spaces, no other Unicode, no '/')")


class InvalidNameError(RlstackError):
    """A user-given name that cannot be a single, portable folder name."""


def _problem(value: str) -> str:
    if value == "":
        return "is empty"
    if "/" in value or "\\" in value or value in (".", ".."):
        return "is a path, not a single name (it would reach outside the folder it names)"
    if len(value) > MAX_LENGTH:
        return f"is {len(value)} characters long, over the {MAX_LENGTH} allowed"
    if any(c.isspace() for c in value):
        return "contains whitespace"
    if not value.isascii():
        return "contains non-ASCII characters"
    bad = sorted({c for c in value if not _ALLOWED.fullmatch(c)})
    if bad:
        return f"contains {', '.join(repr(c) for c in bad)}"
    return "starts with a character other than a letter or digit"


def check_name(value: str, what: str = "name") -> str:
    """`value` when it is a safe single folder name (the policy above); else an InvalidNameError that says
    what is wrong with it, under the flag or field `what` it came from, and what a valid one looks like."""
    if isinstance(value, str) and _NAME.fullmatch(value):
        return value
    shown = value if len(str(value)) <= 60 else str(value)[:57] + "..."
    raise InvalidNameError(f"{what} {shown!r} {_problem(str(value))}",
                           f"a name is {POLICY}, e.g. my-run-1")


def to_name(text: str, fallback: str = "run") -> str:
    """A safe name made from any text (a model id such as 'org/model' or 'embedded:smollm2-135m'), for folders
    rlstack names itself: every character outside the policy becomes '-', leading ones that cannot start a
    name are dropped, and the result is cut to MAX_LENGTH. For names a user typed use check_name: it refuses
    rather than changing what the user asked for."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text).lstrip("._-")[:MAX_LENGTH].rstrip("._-")
    return cleaned or fallback
