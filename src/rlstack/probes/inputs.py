"""What a static probe's answer depends on, besides its case or rule: the locked wheels' sources
(fetch_sources) and the probes' own code (code_hash), the two halves of every cached result's key.

Its own module so that the suite (which runs the probes) and discovery (which the suite runs) both take them
from below, and neither imports the other to get them.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

from rlstack.core.errors import RlstackError
from rlstack.probes.remote import RemoteWheel
from rlstack.probes.wheels import SourceSet, WheelCache, WheelError
from rlstack.stacks.locks import LockedPackage
from rlstack.stacks.model import Stack

_HERE = Path(__file__).parent
# The files whose content decides a static probe's answer, besides the wheels: a change to any of them
# invalidates every cached result. A folder stands for the Python files in it.
_CODE = ("contract.py", "pyast.py", "toolchain.py", "discover", "contracts.yaml", "toolchain.yaml", "suite.py",
         "inputs.py")


@cache
def code_hash() -> str:
    h = hashlib.sha256()
    for name in _CODE:
        p = _HERE / name
        files = sorted(p.glob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(_HERE)).encode() + (f.read_bytes() if f.is_file() else b"-"))
    return h.hexdigest()


def fetch_sources(stack: Stack, names: set[str], locked: dict[str, LockedPackage], cache: WheelCache,
                  prefetch_skip: frozenset[str] = frozenset({"torch"}), any_platform: bool = False,
                  prefetch: bool = True) -> tuple[SourceSet, dict[str, str], dict[str, str]]:
    """Readers for the locked wheels of `names` (those in the lock), {package: why} for those that cannot be
    read, and {package: sha256 of the file read} (the cache key). Index listings are fetched in parallel; with
    `prefetch` each remote wheel's Python sources come in a few range requests (what discovery reads: nearly
    all of them), without it members are read as the analysis opens them (what a contract case reads: a few)."""
    wheels: dict[str, Path | RemoteWheel] = {}
    errors: dict[str, str] = {}
    digests: dict[str, str] = {}

    def one(name: str) -> None:
        try:
            w = cache.open(locked[name], stack.python, stack.platform, any_platform=any_platform)
            wheels[name] = w
            digests[name] = w.sha256 if isinstance(w, RemoteWheel) else cache.digest(w)
            if isinstance(w, RemoteWheel) and prefetch and name not in prefetch_skip:
                w.prefetch_sources()
        except WheelError as exc:
            errors[name] = str(exc)
        except RlstackError as exc:  # a member that RECORD does not vouch for, a file that changed size
            errors[name] = str(exc)
        except (OSError, KeyError, ValueError) as exc:  # the network, a malformed zip
            errors[name] = f"{type(exc).__name__}: {exc}"

    todo = sorted(n for n in names if n in locked)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, todo))
    return SourceSet(dict(sorted(wheels.items()))), errors, digests
