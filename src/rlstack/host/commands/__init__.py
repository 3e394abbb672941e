"""The host's commands, one typed function each: what `invoke <task>` calls (tasks.py builds every task from
these signatures through typer's click parameters, rlstack.core.options). Each option is declared once, as an
`Annotated` alias or in place, with its real default in the signature. Commands that run a payload command in a
stack's container (`train`, `eval`, `adapters`) name that command's own option aliases (rlstack.payload.commands)
in their signatures and forward them with `argv_for`, so a reader sees every parameter a task takes, and a hint
that names a flag names one the user can pass here too.

The commands live by what they do, and this package re-exports every one (`commands.train(...)`):

    aliases      the option aliases several commands share (--stack, --base-image, --ca-cert)
    catalog      stacks, settings, lock
    images       build, rootfs-export, and CI's check-image, image-size, push
    training     train, with its --vllm-server compose run
    incontainer  eval, adapters, shell, runs (and the helpers train shares)
    onhost       smoke, native-stage, matrix: no container
    ci           the workflows' jobs (ci.jobs, ci.probe-job, ci.merge-probes, ci.free-disk)
    dev          test, bench, lint, typecheck

`TASKS`, here, says which task goes where: user tasks at invoke's root, CI's and development's in their
namespaces. `docs` is here too, beside the README sections it renders (the task table reads `TASKS`), so that
no command module imports this package back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from rlstack.core.errors import RlstackError
from rlstack.core.options import command_name, params, shown_default, summary
from rlstack.core.tables import markdown_table
from rlstack.host.commands.catalog import lock, settings, settings_table, stacks
from rlstack.host.commands.ci import ci_free_disk, ci_jobs, ci_merge_probes, probe_job
from rlstack.host.commands.dev import bench, lint, test, typecheck
from rlstack.host.commands.images import build, check_image, image_size, push, rootfs_export
from rlstack.host.commands.incontainer import adapters, eval_, runs, shell
from rlstack.host.commands.onhost import matrix, native_stage, smoke
from rlstack.host.commands.training import train
from rlstack.matrix import fp8
from rlstack.payload import commands as payload
from rlstack.probes import commands as probes

__all__ = ["TASKS", "adapters", "bench", "build", "check_image", "ci_free_disk", "ci_jobs", "ci_merge_probes", "docs",
           "eval_", "image_size", "lint", "lock", "matrix", "native_stage", "probe_job", "push", "readme_sections",
           "rootfs_export", "runs", "settings", "settings_table", "shell", "smoke", "stacks", "task_name",
           "tasks_section", "test", "train", "typecheck"]


def docs(check: Annotated[bool, typer.Option(help="fail when a generated README section or page is out of date, "
                                                  "write nothing")] = False) -> int:
    """Regenerate what is derived from data: the README's stacks, results, task and matrix tables, and
    docs/performance.md from bench/results."""
    from rlstack.host import docs as readme

    if check:
        stale = readme.stale_sections(readme_sections()) + readme.stale_pages()
        if stale:
            raise RlstackError(f"out of date: {', '.join(stale)}", "run: invoke docs")
        print("README sections and docs pages are current")
        return 0
    print(f"wrote {readme.render_readme(readme_sections())}")
    for page in readme.write_pages():
        print(f"wrote {page}")
    return 0


# --- what invoke offers ------------------------------------------------------------------------------------

# Each namespace's tasks, in the order `invoke --list` shows them: what a user runs at the root, what the
# workflows run under `ci.`, the project's own development under `dev.`. The payload and probe commands that
# also run natively on the host are their own functions (one declaration).
TASKS: dict[str, list[Callable[..., Any]]] = {
    "": [stacks, settings, lock, docs, build, train, eval_, shell, adapters, runs, payload.compare, smoke,
         probes.probe, fp8.probe_fp8, probes.diagnose, native_stage, rootfs_export, matrix, test, bench],
    "ci": [ci_jobs, probe_job, ci_merge_probes, ci_free_disk, check_image, image_size, push],
    "dev": [lint, typecheck],
}


def task_name(fn: Callable[..., Any], namespace: str = "") -> str:
    """The task's name inside its namespace (`ci_merge_probes` is `ci.merge-probes`, not `ci.ci-merge-probes`)."""
    return command_name(fn).removeprefix(f"{namespace}-") if namespace else command_name(fn)


def tasks_section() -> str:
    """The README's table of invoke tasks with their arguments, read from the functions they call (the one
    declaration of each option): what must be given, and the stack with its real default."""
    rows = []
    for namespace, fns in TASKS.items():
        for fn in fns:
            words = ["invoke " + ".".join(filter(None, [namespace, task_name(fn, namespace)]))]
            for p in params(fn):
                metavar = p.name.upper()
                if p.param_type_name == "argument":
                    words.append("[-- CMD]" if p.nargs == -1 else metavar)
                elif p.required:
                    words.append(f"{p.opts[0]} {metavar}")
                elif p.name == "stack":
                    words.append(f"[--stack {shown_default(p) or metavar}]")
            rows.append([f"`{' '.join(words)}`", summary(fn)])
    return markdown_table(["task", "what it does"], rows) + \
        "\n\n`invoke --help TASK` lists every option of a task, with its default.\n"


def readme_sections() -> dict[str, Callable[[], str]]:
    """Every generated README section: the data's (rlstack.host.docs) and the task table, rendered here beside
    the tasks it lists so that docs never imports the commands that call it."""
    from rlstack.host import docs as readme

    return {**readme.GENERATORS, "tasks": tasks_section}
