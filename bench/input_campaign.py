"""The bad-input campaign of issue 44, rerunnable: every command line a user types on the CPU paths (`rlstack`
train/eval/rescore/compare/adapters/probe/diagnose and the host's invoke tasks that need no Docker daemon) fed
inputs it must refuse, each case in its own temporary folder, and each outcome recorded: the exit code, whether
the output holds a Python traceback, whether an invalid input was accepted (exit 0), and whether data was lost
(a finished adapter or run changed, rows dropped from a matrix, a temp file left behind, the checkout edited).

Why a bench and not a unit test: it runs a few real tiny trainings and evaluations (minutes on two cores), and it
is the yardstick the issue's "done" is measured by (0 tracebacks, 0 silent acceptances, 0 data lost); each fix it
led to has its own fast test beside the behaviour. A few valid inputs ride along as controls, so a command that
refuses everything cannot pass.

    python bench/input_campaign.py [--only SUBSTRING] [--list] [--keep DIR]

Writes bench/results/input_campaign.json (rows: per class of input; `extra.cases`: every case). Docker is
replaced by a stub that fails (the host tasks must refuse bad input before they reach it); the full-disk and
read-only cases mount a small tmpfs and are skipped where mounting is not allowed (they need root).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from rlstack.core import results  # noqa: E402

RLSTACK = [sys.executable, "-m", "rlstack.cli"]
INVOKE = [sys.executable, "-m", "invoke", "--search-root", str(ROOT)]
TRACEBACK = "Traceback (most recent call last)"
STARTED = "rlstack train: step 1/"  # the line a training prints after its first step
TRAIN = ["train", "--recipe", "smoke-cpu", "--data", "generated:32", "--max-steps", "1"]


@dataclasses.dataclass
class Outcome:
    rc: int | None  # None: it hung past its timeout
    output: str
    lost: str | None = None  # what data was lost, when any
    note: str = ""


@dataclasses.dataclass
class Case:
    id: str
    cls: str
    argv: list[str] = dataclasses.field(default_factory=list)
    expect: str = "error"  # "error": invalid input, must exit non-zero; "ok": a valid control; "any": either
    setup: Callable[[Path], object] | None = None  # what it returns is ignored
    check: Callable[[Path, Outcome], str | None] | None = None  # data lost, in words
    run: Callable[[Path], Outcome] | None = None  # a case that is more than one command
    timeout: float = 180
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    tool: str = "rlstack"


def sh(
    argv: list[str],
    t: Path,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    tool: str = "rlstack",
    stdout: int | None = None,
    stop_on: str | None = None,
) -> Outcome:
    """One command in folder t; its exit code and output (None when it hung)."""
    full = [*(RLSTACK if tool == "rlstack" else INVOKE), *[a.format(t=t, F=FIX, root=ROOT) for a in argv]]
    e = {**os.environ, **BASE_ENV(t), **{k: v.format(t=t, F=FIX) for k, v in (env or {}).items()}}
    if stop_on:
        return _until(full, t, e, timeout, stop_on)
    try:
        p = subprocess.run(
            full,
            cwd=t,
            env=e,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out = p.stdout.decode("utf-8", "replace") if p.stdout else ""
        return Outcome(p.returncode, out)
    except subprocess.TimeoutExpired as exc:
        return Outcome(None, (exc.output or b"").decode("utf-8", "replace"), note=f"hung past {timeout:.0f} s")


def _until(full: list[str], t: Path, env: dict[str, str], timeout: float, stop_on: str) -> Outcome:
    """Run until the output shows `stop_on` (the line a training prints once its work has started: the input was
    accepted), then stop it; else its exit code. Saves a full training per invalid input that gets through."""
    p = subprocess.Popen(
        full,
        cwd=t,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert p.stdout is not None
    lines: list[str] = []
    deadline = time.time() + timeout
    timer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
    timer.start()
    try:
        for raw in p.stdout:
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            if stop_on in line:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                return Outcome(0, "".join(lines), note="accepted: its work started (stopped there)")
        p.wait()
    finally:
        timer.cancel()
    if time.time() >= deadline:
        return Outcome(None, "".join(lines), note=f"hung past {timeout:.0f} s")
    return Outcome(p.returncode, "".join(lines))


def BASE_ENV(t: Path) -> dict[str, str]:
    return {
        "RLSTACK_ADAPTERS": str(t / "adapters"),
        "RLSTACK_SETTINGS_FILE": str(t / "invoke.yaml"),
        "RLSTACK_DOCKER": str(FIX / "docker-stub"),
        "PYTHONWARNINGS": "ignore",
        "NO_COLOR": "1",
    }


FIX = Path()  # the shared fixtures, made once (fixtures())


def digest(path: Path) -> str:
    """sha256 over a file or a folder's files (names and bytes), to tell whether a case changed it."""
    h = hashlib.sha256()
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.name != ".rlstack-lock")
    )
    for p in files:
        h.update(str(p.relative_to(path)).encode() if p != path else b"")
        h.update(p.read_bytes())
    return h.hexdigest()


def fixtures(fix: Path) -> None:
    """A real tiny adapter (1 step) and its run folder, an evaluation of it, a probe report, a matrix copy, good
    data and recipe files, a project copy for lock edits, and the Docker stub."""
    fix.mkdir(parents=True, exist_ok=True)
    stub = fix / "docker-stub"
    stub.write_text(
        '#!/bin/sh\necho "docker stub: $*" >> "${TMPDIR:-/tmp}/docker-stub.log"\n'
        "echo 'Cannot connect to the Docker daemon (stub)' >&2\nexit 1\n"
    )
    stub.chmod(0o755)
    (fix / "data.jsonl").write_text(
        "".join(json.dumps({"question": f"What is {i} + 2?", "answer": f"#### {i + 2}"}) + "\n" for i in range(40))
    )
    shutil.copy(ROOT / "recipes" / "smoke-cpu.toml", fix / "recipe.toml")
    shutil.copy(ROOT / "compat_matrix.yaml", fix / "matrix.yaml")
    proj = fix / "root"
    shutil.copytree(ROOT / "images", proj / "images")
    shutil.copytree(ROOT / "recipes", proj / "recipes")
    shutil.copy(ROOT / "pyproject.toml", proj / "pyproject.toml")
    steps = [
        ([*TRAIN, "--adapter-name", "t1", "--output", "{F}/run1", "--adapters-root", "{F}/adapters"], 600),
        (
            [
                "eval",
                "--adapter",
                "{F}/adapters/t1",
                "-n",
                "4",
                "--data",
                "generated:4",
                "--max-new-tokens",
                "8",
                "--output",
                "{F}/ev",
            ],
            600,
        ),
        (["probe", "--stack", "cpu", "--layer", "resolve", "-o", "{F}/probe.json"], 120),
    ]
    for argv, limit in steps:
        o = sh(argv, fix, timeout=limit)
        if o.rc != 0:
            raise SystemExit(f"fixture step failed ({o.rc}): {' '.join(argv)}\n{o.output[-3000:]}")


def copy_fixture(*names: str) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        for n in names:
            src, dst = FIX / n, t / n
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)

    return setup


def write(name: str, content: str | bytes, *more: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        for m in more:
            m(t)
        p = t / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())

    return setup


def unchanged(*names: str) -> Callable[[Path, Outcome], str | None]:
    """A check: the named fixtures copied into the case folder are byte for byte as they were."""

    def check(t: Path, o: Outcome) -> str | None:
        changed = [n for n in names if not (t / n).exists() or digest(t / n) != digest(FIX / n)]
        return f"changed or removed: {', '.join(changed)}" if changed else None

    return check


def no_temp_left(t: Path, o: Outcome) -> str | None:
    stray = [str(p.relative_to(t)) for p in t.rglob("*") if ".tmp" in p.name or p.name.endswith("~")]
    return f"temp files left: {stray[:5]}" if stray else None


BINARY = bytes(range(256)) * 8 + b"\xff\xfe\x00\x80"
BAD_TOML = "name = 'x'\n[grpo\nlearning_rate = \n"
RESULTS = "ev/results.json"


def _json_edit(src: str, dst: str, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        data = json.loads((FIX / src).read_text())
        edit(data)
        (t / dst).parent.mkdir(parents=True, exist_ok=True)
        (t / dst).write_text(json.dumps(data))

    return setup


def _set_correct(value: object) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for key in ("per_question", "questions", "rows"):
            if isinstance(d.get(key), list) and d[key]:
                first = d[key][0]
                if isinstance(first, dict) and "correct" in first:
                    first["correct"] = value
                    return
            if isinstance(d.get(key), dict) and d[key]:
                k = next(iter(d[key]))
                if isinstance(d[key][k], dict) and "correct" in d[key][k]:
                    d[key][k]["correct"] = value
                else:
                    d[key][k] = value
                return
        d["correct"] = value

    return edit


def _lock_edit(edit: Callable[[str], str]) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        shutil.copytree(FIX / "root", t / "root")
        p = t / "root" / "images" / "cpu" / "requirements.lock"
        p.write_text(edit(p.read_text()))

    return setup


def _flip_hash(text: str) -> str:
    i = text.index("--hash=sha256:") + len("--hash=sha256:")
    return text[:i] + ("0" if text[i] != "0" else "1") + text[i + 1 :]


def _drop_block(text: str) -> str:
    start = text.index("\nannotated-types==")
    end = text.index("\nanyio==")
    return text[:start] + text[end:]


def _drop_hash_line(text: str) -> str:
    lines = text.splitlines(keepends=True)
    i = next(k for k, ln in enumerate(lines) if "--hash=sha256:" in ln)
    return "".join(lines[:i] + lines[i + 1 :])


def _bump_version(text: str) -> str:
    return text.replace("anyio==4.16.0", "anyio==4.15.0", 1)


LOCK_ENV = {"RLSTACK_ROOT": "{t}/root"}


# --- cases that are more than one command ----------------------------------------------------------------------


def resume_finished(t: Path) -> Outcome:
    copy_fixture("adapters", "run1")(t)
    before = {n: digest(t / n) for n in ("adapters/t1", "run1/checkpoints", "run1/recipe.json")}
    o = sh([*TRAIN, "--adapter-name", "t1", "--output", "{t}/run1", "--adapters-root", "{t}/adapters", "--resume"], t)
    o2 = sh([*TRAIN, "--adapter-name", "t1", "--output", "{t}/run1", "--adapters-root", "{t}/adapters", "--resume"], t)
    changed = [n for n, d in before.items() if digest(t / n) != d]
    return Outcome(o.rc if o.rc else o2.rc, o.output + o2.output, f"changed: {changed}" if changed else None)


def same_name_concurrent(t: Path) -> Outcome:
    argv = [
        *RLSTACK,
        *TRAIN,
        "--adapter-name",
        "dup",
        "--output",
        str(t / "run"),
        "--adapters-root",
        str(t / "adapters"),
    ]
    env = {**os.environ, **BASE_ENV(t)}
    a = subprocess.Popen(argv, cwd=t, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(8)
    b = subprocess.run(argv, cwd=t, env=env, capture_output=True, timeout=300)
    out_a = a.communicate(timeout=600)[0].decode("utf-8", "replace")
    out = b.stdout.decode("utf-8", "replace") + b.stderr.decode("utf-8", "replace")
    steps = (
        [
            json.loads(line).get("step")
            for line in (t / "run" / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        if (t / "run" / "metrics.jsonl").exists()
        else []
    )
    lost = (
        None
        if a.returncode == 0 and steps == sorted(set(steps))
        else f"first run exited {a.returncode}, metrics steps {steps}"
    )
    # the second, refused, is the case; the first must finish untouched
    return Outcome(b.returncode, out + "\n--- first run ---\n" + out_a[-2000:], lost)


def kill_mid_train(t: Path) -> Outcome:
    """SIGKILL a 3-step run after its first metrics line (before any sealed checkpoint): the rerun either goes on
    or names the one command that works, and that command works."""
    argv = [
        *RLSTACK,
        *TRAIN[:-1],
        "3",
        "--adapter-name",
        "k",
        "--output",
        str(t / "run"),
        "--adapters-root",
        str(t / "adapters"),
    ]
    p = subprocess.Popen(
        argv,
        cwd=t,
        env={**os.environ, **BASE_ENV(t)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 400
    metrics = t / "run" / "metrics.jsonl"
    while time.time() < deadline and p.poll() is None and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    again = [*TRAIN[:-1], "3", "--adapter-name", "k", "--output", "{t}/run", "--adapters-root", "{t}/adapters"]
    o = sh(again, t, timeout=400)
    if o.rc == 0:
        return Outcome(0, o.output, note="the plain rerun went on")
    # the refusal names the one command that works: follow it
    told = [flag for flag in ("--overwrite", "--resume") if f"with {flag}" in o.output]
    if not told:
        return Outcome(o.rc, o.output, "the refusal names no command that works")
    o2 = sh([*again, told[0]], t, timeout=400)
    lost = None if o2.rc == 0 else f"the command the refusal named ({told[0]}) failed too ({o2.rc})"
    return Outcome(
        o2.rc,
        o.output + "\n--- " + told[0] + " ---\n" + o2.output,
        lost,
        f"plain rerun exited {o.rc}, naming {told[0]}; that exited {o2.rc}",
    )


def matrix_concurrent(t: Path) -> Outcome:
    """8 merges of the same report into one matrix at once: every one ends cleanly, no row is lost."""
    copy_fixture("matrix.yaml", "probe.json")(t)
    before = (t / "matrix.yaml").read_text().count("\n- stack:") + (t / "matrix.yaml").read_text().count("\n  - stack:")
    argv = [*INVOKE, "matrix", "--file", str(t / "matrix.yaml"), "--results", str(t / "probe.json"), "--no-readme"]
    env = {**os.environ, **BASE_ENV(t)}
    ps = [subprocess.Popen(argv, cwd=t, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(8)]
    outs = [p.communicate(timeout=300)[0].decode("utf-8", "replace") for p in ps]
    after = (t / "matrix.yaml").read_text().count("\n- stack:") + (t / "matrix.yaml").read_text().count("\n  - stack:")
    check = sh(["matrix", "--file", "{t}/matrix.yaml", "--check"], t, tool="invoke")
    lost = None if after >= before and check.rc == 0 else f"rows {before} -> {after}, check exited {check.rc}"
    lost = lost or no_temp_left(t, check)
    bad = [p.returncode for p in ps if p.returncode != 0]
    return Outcome(1 if bad else 0, "\n".join(outs) + check.output, lost, f"{len(bad)} of 8 merges exited non-zero")


def matrix_kill(t: Path) -> Outcome:
    """SIGKILL merges at several moments: the matrix stays whole and no temp file stays beside it."""
    copy_fixture("matrix.yaml", "probe.json")(t)
    argv = [*INVOKE, "matrix", "--file", str(t / "matrix.yaml"), "--results", str(t / "probe.json"), "--no-readme"]
    env = {**os.environ, **BASE_ENV(t)}
    for delay in (0.5, 0.9, 1.2, 1.5, 1.8):
        p = subprocess.Popen(argv, cwd=t, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.kill()
        p.wait()
    check = sh(["matrix", "--file", "{t}/matrix.yaml", "--check"], t, tool="invoke")
    lost = None if check.rc == 0 else "matrix no longer valid"
    lost = lost or no_temp_left(t, check)
    return Outcome(check.rc, check.output, lost, "5 kills, then --check (a valid input: must pass)")


def stdout_full(argv: list[str]) -> Callable[[Path], Outcome]:
    """The command's output to /dev/full: the write fails with ENOSPC."""

    def run(t: Path) -> Outcome:
        copy_fixture("ev", "adapters")(t)
        full = [*RLSTACK, *[a.format(t=t, F=FIX) for a in argv]]
        with open("/dev/full", "wb") as dev:
            p = subprocess.run(
                full, cwd=t, env={**os.environ, **BASE_ENV(t)}, stdout=dev, stderr=subprocess.PIPE, timeout=120
            )
        return Outcome(p.returncode, p.stderr.decode("utf-8", "replace"))

    return run


def stdout_closed(argv: list[str]) -> Callable[[Path], Outcome]:
    """The reader of the output goes away after one byte (`| head -c1`): a broken pipe, not a traceback."""

    def run(t: Path) -> Outcome:
        copy_fixture("ev", "adapters")(t)
        full = [*RLSTACK, *[a.format(t=t, F=FIX) for a in argv]]
        p = subprocess.Popen(
            full, cwd=t, env={**os.environ, **BASE_ENV(t)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert p.stdout is not None and p.stderr is not None
        p.stdout.read(1)
        p.stdout.close()
        err = p.stderr.read().decode("utf-8", "replace")
        p.wait(timeout=120)
        return Outcome(p.returncode, err, note="reader closed after 1 byte (exit code not judged)")

    return run


class Tmpfs:
    """A small tmpfs at t/small (or read-only), unmounted on exit; None where mounting is not allowed."""

    def __init__(self, t: Path, size: str, readonly: bool = False) -> None:
        self.path, self.size, self.readonly = t / "small", size, readonly

    def __enter__(self) -> Path | None:
        self.path.mkdir()
        opts = f"size={self.size}" + (",ro" if self.readonly else "")
        ok = (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(self.path)], capture_output=True
            ).returncode
            == 0
        )
        self.mounted = ok
        return self.path if ok else None

    def __exit__(self, *exc: object) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def on_tmpfs(
    size: str,
    argv: list[str],
    pre: Callable[[Path, Path], None] | None = None,
    readonly: bool = False,
    timeout: float = 300,
    tool: str = "rlstack",
    after: Callable[[Path, Path, Outcome], str | None] | None = None,
) -> Callable[[Path], Outcome]:
    def run(t: Path) -> Outcome:
        with Tmpfs(t, size, readonly) as small:
            if small is None:
                return Outcome(None, "", note="skipped: cannot mount a tmpfs here (needs root)")
            if pre:
                pre(t, small)
            o = sh(argv, t, timeout=timeout, tool=tool)
            if after:
                o.lost = after(t, small, o)
            return o

    return run


def _fill(t: Path, small: Path) -> None:
    copy_fixture("ev", "matrix.yaml", "probe.json")(t)
    shutil.copy(t / "matrix.yaml", small / "matrix.yaml")
    try:  # fill what is left
        with open(small / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass


def _matrix_intact(t: Path, small: Path, o: Outcome) -> str | None:
    ok = (small / "matrix.yaml").read_bytes() == (t / "matrix.yaml").read_bytes()
    stray = [p.name for p in small.iterdir() if p.name not in ("matrix.yaml", "filler", "matrix.yaml.lock")]
    return None if ok and not stray else f"matrix torn: {not ok}, stray files {stray}"


# --- the cases -------------------------------------------------------------------------------------------------


def cases() -> list[Case]:
    c: list[Case] = []
    add = c.append
    tr = ["--output", "{t}/run", "--adapters-root", "{t}/adapters"]

    # names: every place a name enters, on the stack and on the host
    bad_names = {
        "dotdot": "../escape",
        "slash": "a/b",
        "abs": "/tmp/abs",
        "space": "my run",
        "unicode": "módel",
        "long300": "a" * 300,
        "empty": "",
        "dot": ".",
        "dotdot-only": "..",
        "leading-dash": "-rf",
        "newline": "a\nb",
        "leading-dot": ".hidden",
        "semicolon": "x;rm -rf ~",
        "backslash": "a\\b",
        "tab": "a\tb",
        "emoji": "run🙂",
    }
    for key, name in bad_names.items():
        add(Case(f"train-name-{key}", "names", [*TRAIN, "--adapter-name", name, *tr]))
    for key in ("dotdot", "slash", "space", "long300", "empty", "leading-dash"):
        add(Case(f"eval-adapter-{key}", "names", ["eval", "--adapter", bad_names[key], "-n", "2"]))
        add(
            Case(
                f"host-train-name-{key}",
                "names",
                ["train", "--stack", "cpu", "--adapter-name", bad_names[key]],
                tool="invoke",
            )
        )
    for key in ("dotdot", "abs", "space", "empty"):
        add(Case(f"host-runs-copy-{key}", "names", ["runs", "--copy", "train/" + bad_names[key]], tool="invoke"))
    add(Case("host-runs-copy-bare-dotdot", "names", ["runs", "--copy", "../x"], tool="invoke"))
    add(Case("host-runs-copy-no-kind", "names", ["runs", "--copy", "x"], tool="invoke"))
    add(Case("host-eval-output-name", "names", ["eval", "--stack", "cpu", "--adapter", "../x"], tool="invoke"))
    add(
        Case(
            "recipe-name-in-file",
            "names",
            [*TRAIN[:2], "{t}/r.toml", *TRAIN[3:], "--adapter-name", "n1", *tr],
            setup=write(
                "r.toml",
                (ROOT / "recipes" / "smoke-cpu.toml").read_text().replace('name = "smoke-cpu"', 'name = "../evil"'),
            ),
        )
    )
    add(Case("set-recipe-name", "names", [*TRAIN, "--set", "name=../evil", *tr]))
    add(Case("host-stack-dotdot", "names", ["train", "--stack", "../cpu"], tool="invoke"))
    add(Case("probe-stack-dotdot", "names", ["probe", "--stack", "../../etc", "--layer", "resolve"]))
    add(Case("probe-stack-unknown", "names", ["probe", "--stack", "nosuch", "--layer", "resolve"]))
    add(
        Case("probe-gpu-arch-shell", "names", ["probe", "--stack", "cpu", "--gpu-arch", "foo;rm", "--layer", "resolve"])
    )
    add(Case("probe-layer-unknown", "names", ["probe", "--stack", "cpu", "--layer", "nosuch"]))
    add(
        Case(
            "probe-runtime-probe-unknown",
            "names",
            ["probe", "--stack", "cpu", "--layer", "runtime", "--runtime-probes", "nosuch"],
        )
    )
    add(Case("lock-stack-unknown", "names", ["lock", "--check", "--stack", "nosuch"], tool="invoke"))
    add(Case("bench-unknown", "names", ["bench", "nosuch"], tool="invoke"))
    add(
        Case(
            "train-name-valid-control",
            "names",
            [*TRAIN, "--adapter-name", "ok.name_1-x", *tr],
            expect="ok",
            timeout=400,
        )
    )

    # numbers
    for flag, values in {"--max-steps": ["0", "-1", "abc", "1e3", "99999999999999999999", "2.5"]}.items():
        for v in values:
            add(Case(f"train{flag}={v}", "numbers", [*TRAIN[:-2], flag, v, "--adapter-name", "n", *tr]))
    for key, v in [
        ("grpo.learning_rate", "inf"),
        ("grpo.learning_rate", "nan"),
        ("grpo.learning_rate", "-1"),
        ("grpo.learning_rate", "0"),
        ("grpo.learning_rate", "abc"),
        ("grpo.num_generations", "0"),
        ("grpo.num_generations", "-2"),
        ("grpo.per_device_train_batch_size", "0"),
        ("grpo.max_completion_length", "0"),
        ("grpo.temperature", "-1"),
        ("grpo.save_steps", "0"),
        ("grpo.beta", "nan"),
        ("lora.r", "0"),
        ("lora.alpha", "-1"),
        ("grpo.max_steps", "-3"),
        ("grpo.num_generations", "3"),
        ("model.tiny.hidden_size", "0"),
        ("grpo.nosuch", "1"),
        ("nosuch", "1"),
        ("grpo.learning_rate", "1e400"),
    ]:
        steps = TRAIN if key != "grpo.max_steps" else TRAIN[:-2]  # --max-steps would override the field
        add(Case(f"set-{key}={v}", "numbers", [*steps, "--set", f"{key}={v}", "--adapter-name", "n", *tr]))
    add(Case("set-no-equals", "numbers", [*TRAIN, "--set", "grpo.max_steps", "--adapter-name", "n", *tr]))
    for spec in [
        "generated:0",
        "generated:-5",
        "generated:abc",
        "generated:1e3",
        "generated:99999999999",
        "generated:",
        "generated:3",
        "generated-nosuch:8",
        "generated:８",
    ]:
        add(Case(f"train-data-{spec}", "numbers", [*TRAIN[:3], spec, *TRAIN[4:], "--adapter-name", "n", *tr]))
    for flag, v in [
        ("-n", "0"),
        ("-n", "-5"),
        ("--batch-size", "0"),
        ("--max-new-tokens", "0"),
        ("--batch-size", "-1"),
        ("-n", "x"),
        ("--seed", "abc"),
    ]:
        add(
            Case(
                f"eval{flag}={v}",
                "numbers",
                [
                    "eval",
                    "--model",
                    "tiny",
                    "--recipe",
                    "smoke-cpu",
                    "--data",
                    "generated:4",
                    flag,
                    v,
                    "--output",
                    "{t}/ev",
                ],
            )
        )
    for v in ["0", "-1", "abc", "1e9"]:
        add(
            Case(f"compare-iters={v}", "numbers", ["compare", RESULTS, RESULTS, "--iters", v], setup=copy_fixture("ev"))
        )
    add(
        Case(
            "host-native-stage-preset-99",
            "numbers",
            ["native-stage", "--stack", "cpu", "--host-packages", "{t}", "--xz-preset", "99"],
            tool="invoke",
        )
    )
    add(
        Case(
            "host-native-stage-part-0",
            "numbers",
            ["native-stage", "--stack", "cpu", "--host-packages", "{t}", "--part-mb", "0"],
            tool="invoke",
        )
    )

    # paths and folders
    add(Case("train-recipe-missing", "paths", ["train", "--recipe", "{t}/nope.toml", *tr]))
    add(Case("train-recipe-dir", "paths", ["train", "--recipe", "{t}", *tr]))
    add(Case("train-data-missing", "paths", [*TRAIN[:3], "{t}/nope.jsonl", *TRAIN[4:], *tr]))
    add(Case("train-data-dir", "paths", [*TRAIN[:3], "{t}", *TRAIN[4:], *tr]))
    add(Case("train-model-missing-folder", "paths", [*TRAIN, "--model", "{t}/nomodel", *tr]))
    add(
        Case(
            "train-model-empty-folder",
            "paths",
            [*TRAIN, "--model", "{t}/empty", *tr],
            setup=lambda t: (t / "empty").mkdir(),
        )
    )
    add(
        Case(
            "train-output-is-file",
            "paths",
            [*TRAIN, "--adapter-name", "n", "--output", "{t}/f", "--adapters-root", "{t}/adapters"],
            setup=write("f", "x"),
        )
    )
    add(
        Case(
            "train-adapters-root-is-file",
            "paths",
            [*TRAIN, "--adapter-name", "n", "--output", "{t}/run", "--adapters-root", "{t}/f"],
            setup=write("f", "x"),
        )
    )
    add(
        Case(
            "train-output-dev-null",
            "paths",
            [*TRAIN, "--adapter-name", "n", "--output", "/dev/null", "--adapters-root", "{t}/adapters"],
        )
    )
    add(Case("eval-adapter-missing-folder", "paths", ["eval", "--adapter", "{t}/none", "-n", "2"]))
    add(Case("eval-adapter-is-file", "paths", ["eval", "--adapter", "{t}/f", "-n", "2"], setup=write("f", "x")))
    add(
        Case(
            "eval-output-is-file",
            "paths",
            [
                "eval",
                "--model",
                "tiny",
                "--recipe",
                "smoke-cpu",
                "--data",
                "generated:2",
                "-n",
                "2",
                "--output",
                "{t}/f",
            ],
            setup=write("f", "x"),
        )
    )
    add(
        Case("eval-data-dir", "paths", ["eval", "--model", "tiny", "--recipe", "smoke-cpu", "--data", "{t}", "-n", "2"])
    )
    add(Case("diagnose-missing", "paths", ["diagnose", "{t}/nope.log"]))
    add(Case("diagnose-dir", "paths", ["diagnose", "{t}"]))
    add(Case("rescore-missing", "paths", ["rescore", "{t}/nope.jsonl"]))
    add(Case("rescore-dir", "paths", ["rescore", "{t}"]))
    add(
        Case(
            "rescore-output-is-dir",
            "paths",
            ["rescore", "ev/generations.jsonl", "--output", "{t}"],
            setup=copy_fixture("ev"),
        )
    )
    add(Case("compare-missing", "paths", ["compare", "{t}/a.json", "{t}/b.json"]))
    add(Case("compare-dir", "paths", ["compare", "{t}", RESULTS], setup=copy_fixture("ev")))
    add(Case("adapters-root-missing", "paths", ["adapters", "--root", "{t}/none"], expect="any"))
    add(Case("adapters-root-file", "paths", ["adapters", "--root", "{t}/f"], setup=write("f", "x")))
    add(Case("probe-output-is-dir", "paths", ["probe", "--stack", "cpu", "--layer", "resolve", "-o", "{t}"]))
    add(
        Case(
            "matrix-results-missing",
            "paths",
            ["matrix", "--file", "{t}/matrix.yaml", "--results", "{t}/no.json", "--no-readme"],
            tool="invoke",
            setup=copy_fixture("matrix.yaml"),
            check=unchanged("matrix.yaml"),
        )
    )
    add(
        Case(
            "matrix-results-dir",
            "paths",
            ["matrix", "--file", "{t}/matrix.yaml", "--results", "{t}", "--no-readme"],
            tool="invoke",
            setup=copy_fixture("matrix.yaml"),
            check=unchanged("matrix.yaml"),
        )
    )
    add(Case("matrix-file-dir", "paths", ["matrix", "--file", "{t}", "--check"], tool="invoke"))
    add(
        Case(
            "matrix-file-missing-no-init",
            "paths",
            ["matrix", "--file", "{t}/m.yaml", "--results", "{t}/probe.json", "--no-readme"],
            tool="invoke",
            setup=copy_fixture("probe.json"),
        )
    )
    add(
        Case(
            "matrix-readme-missing-beside",
            "paths",
            ["matrix", "--file", "{t}/matrix.yaml", "--results", "{t}/probe.json"],
            tool="invoke",
            expect="any",
            setup=copy_fixture("matrix.yaml", "probe.json"),
        )
    )
    add(
        Case(
            "native-stage-host-packages-missing",
            "paths",
            ["native-stage", "--stack", "cpu", "--host-packages", "{t}/none"],
            tool="invoke",
        )
    )
    add(Case("settings-ca-cert-missing", "paths", ["settings", "--ca-cert", "{t}/none.pem"], tool="invoke"))
    add(
        Case(
            "settings-ca-cert-binary",
            "paths",
            ["settings", "--ca-cert", "{t}/ca.pem"],
            tool="invoke",
            setup=write("ca.pem", BINARY),
        )
    )
    add(Case("settings-unset-unknown", "paths", ["settings", "--unset", "nosuch"], tool="invoke"))
    add(
        Case(
            "data-symlink-loop",
            "paths",
            [*TRAIN[:3], "{t}/loop.jsonl", *TRAIN[4:], *tr],
            setup=lambda t: (t / "loop.jsonl").symlink_to(t / "loop.jsonl"),
        )
    )
    add(
        Case(
            "data-fifo",
            "paths",
            [*TRAIN[:3], "{t}/fifo.jsonl", *TRAIN[4:], *tr],
            timeout=60,
            setup=lambda t: os.mkfifo(t / "fifo.jsonl"),
        )
    )
    add(
        Case(
            "diagnose-fifo",
            "paths",
            ["diagnose", "{t}/fifo.log"],
            timeout=30,
            setup=lambda t: os.mkfifo(t / "fifo.log"),
        )
    )

    # binary files where text is expected
    add(Case("recipe-binary", "binary", ["train", "--recipe", "{t}/r.toml", *tr], setup=write("r.toml", BINARY)))
    add(Case("data-binary", "binary", [*TRAIN[:3], "{t}/d.jsonl", *TRAIN[4:], *tr], setup=write("d.jsonl", BINARY)))
    add(
        Case(
            "compare-binary",
            "binary",
            ["compare", "{t}/b.json", RESULTS],
            setup=write("b.json", BINARY, copy_fixture("ev")),
        )
    )
    add(Case("rescore-binary", "binary", ["rescore", "{t}/g.jsonl"], setup=write("g.jsonl", BINARY)))
    add(Case("diagnose-binary", "binary", ["diagnose", "{t}/b.log"], setup=write("b.log", BINARY), expect="any"))
    add(
        Case(
            "matrix-results-binary",
            "binary",
            ["matrix", "--file", "{t}/matrix.yaml", "--results", "{t}/b.json", "--no-readme"],
            tool="invoke",
            setup=write("b.json", BINARY, copy_fixture("matrix.yaml")),
            check=unchanged("matrix.yaml"),
        )
    )
    add(
        Case(
            "matrix-file-binary",
            "binary",
            ["matrix", "--file", "{t}/m.yaml", "--check"],
            tool="invoke",
            setup=write("m.yaml", BINARY),
        )
    )
    add(
        Case(
            "manifest-binary",
            "binary",
            ["adapters", "--root", "{t}/adapters", "--verify"],
            setup=write("adapters/t1/manifest.json", BINARY, copy_fixture("adapters")),
        )
    )
    add(
        Case(
            "eval-adapter-manifest-binary",
            "binary",
            ["eval", "--adapter", "t1", "-n", "2"],
            setup=write("adapters/t1/manifest.json", BINARY, copy_fixture("adapters")),
        )
    )
    add(
        Case(
            "lock-binary",
            "binary",
            ["lock", "--check", "--stack", "cpu"],
            tool="invoke",
            env=LOCK_ENV,
            setup=_lock_edit(lambda s: BINARY.decode("latin-1")),
        )
    )
    add(
        Case(
            "stack-toml-binary",
            "binary",
            ["probe", "--stack", "cpu", "--layer", "resolve"],
            env=LOCK_ENV,
            setup=lambda t: (
                shutil.copytree(FIX / "root", t / "root"),
                (t / "root/images/cpu/stack.toml").write_bytes(BINARY),
            ),
        )
    )
    add(
        Case(
            "resume-recipe-json-binary",
            "binary",
            [*TRAIN, "--adapter-name", "t1", "--resume", "--output", "{t}/run1", "--adapters-root", "{t}/adapters"],
            setup=write("run1/recipe.json", BINARY, copy_fixture("run1", "adapters")),
        )
    )
    add(
        Case(
            "resume-metrics-binary",
            "binary",
            [*TRAIN, "--adapter-name", "t1", "--resume", "--output", "{t}/run1", "--adapters-root", "{t}/adapters"],
            expect="any",
            setup=write("run1/metrics.jsonl", BINARY, copy_fixture("run1", "adapters")),
        )
    )

    # malformed text: TOML, JSON, JSONL, YAML, locks
    add(
        Case(
            "recipe-toml-syntax", "malformed", ["train", "--recipe", "{t}/r.toml", *tr], setup=write("r.toml", BAD_TOML)
        )
    )
    add(
        Case(
            "recipe-unknown-key",
            "malformed",
            ["train", "--recipe", "{t}/r.toml", "--max-steps", "1", *tr],
            setup=write("r.toml", (ROOT / "recipes/smoke-cpu.toml").read_text() + "\nnosuch = 1\n"),
        )
    )
    add(
        Case(
            "recipe-wrong-type",
            "malformed",
            ["train", "--recipe", "{t}/r.toml", *tr],
            setup=write(
                "r.toml", (ROOT / "recipes/smoke-cpu.toml").read_text().replace("max_steps = 40", 'max_steps = "ten"')
            ),
        )
    )
    add(Case("recipe-empty", "malformed", ["train", "--recipe", "{t}/r.toml", *tr], setup=write("r.toml", "")))
    add(
        Case(
            "recipe-deep-nesting",
            "malformed",
            ["train", "--recipe", "{t}/r.toml", *tr],
            setup=write("r.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n"),
        )
    )
    for key, text in {
        "bad-line": '{"question": "q", "answer": "#### 1"}\n{not json\n',
        "missing-answer": '{"question": "q"}\n',
        "array": "[1, 2]\n",
        "empty": "",
        "answer-no-number": '{"question": "q", "answer": "none"}\n',
        "only-blank": "\n\n  \n",
        "huge-int": '{"question": "q", "answer": ' + "9" * 5000 + "}\n",
        "nested": "[" * 100000 + "]" * 100000 + "\n",
        "null-answer": '{"question": "q", "answer": null}\n',
        "utf16": '{"question": "q", "answer": "#### 1"}\n',
    }.items():
        content: str | bytes = text.encode("utf-16") if key == "utf16" else text
        add(
            Case(
                f"data-jsonl-{key}",
                "malformed",
                [*TRAIN[:3], "{t}/d.jsonl", *TRAIN[4:], "--adapter-name", "n", *tr],
                setup=write("d.jsonl", content),
            )
        )
    add(
        Case(
            "data-fewer-than-a-step",
            "malformed",
            [*TRAIN[:3], "{t}/d.jsonl", *TRAIN[4:], "--adapter-name", "n", *tr],
            setup=write("d.jsonl", '{"question": "What is 1 + 1?", "answer": "#### 2"}\n'),
        )
    )
    texts: dict[str, str | None] = {
        "truncated": None,
        "empty-object": "{}",
        "list": "[]",
        "not-json": "results",
        "nan": '{"accuracy": NaN}',
    }
    for key, maybe in texts.items():
        add(
            Case(
                f"compare-results-{key}",
                "malformed",
                ["compare", "{t}/b.json", RESULTS],
                setup=_truncated if maybe is None else write("b.json", maybe, copy_fixture("ev")),
            )
        )
    add(
        Case(
            "compare-correct-maybe",
            "malformed",
            ["compare", "{t}/b.json", RESULTS],
            setup=then(copy_fixture("ev"), _json_edit(RESULTS, "b.json", _set_correct("maybe"))),
        )
    )
    add(
        Case(
            "compare-correct-int-2",
            "malformed",
            ["compare", "{t}/b.json", RESULTS],
            setup=then(copy_fixture("ev"), _json_edit(RESULTS, "b.json", _set_correct(2))),
        )
    )
    add(
        Case(
            "compare-same-results-control",
            "malformed",
            ["compare", RESULTS, RESULTS],
            expect="ok",
            setup=copy_fixture("ev"),
        )
    )
    add(
        Case(
            "compare-no-common-questions",
            "malformed",
            ["compare", "{t}/b.json", RESULTS],
            setup=then(copy_fixture("ev"), _json_edit(RESULTS, "b.json", _shift_ids)),
        )
    )
    for key, text in {
        "bad-line": '{"id": "1", "generation": "#### 2", "reference": "2"}\n{oops\n',
        "missing-generation": '{"id": "1", "reference": "2"}\n',
        "empty": "",
        "number-generation": '{"id": "1", "generation": 5, "reference": "2"}\n',
    }.items():
        add(Case(f"rescore-{key}", "malformed", ["rescore", "{t}/g.jsonl"], setup=write("g.jsonl", text)))
    probe_bad = {
        "not-json": "{",
        "empty-object": "{}",
        "list": "[]",
        "wrong-types": None,
        "future-date": None,
        "unknown-stack": None,
        "bad-arch": None,
    }
    for key in probe_bad:
        add(
            Case(
                f"matrix-probe-{key}",
                "malformed",
                ["matrix", "--file", "{t}/matrix.yaml", "--results", "{t}/p.json", "--no-readme"],
                tool="invoke",
                setup=_probe_setup(key, probe_bad[key]),
                check=unchanged("matrix.yaml"),
            )
        )
    add(
        Case(
            "matrix-probe-valid-control",
            "malformed",
            ["matrix", "--file", "{t}/matrix.yaml", "--results", "{t}/probe.json", "--no-readme"],
            tool="invoke",
            expect="ok",
            setup=copy_fixture("matrix.yaml", "probe.json"),
        )
    )
    add(
        Case(
            "matrix-yaml-syntax",
            "malformed",
            ["matrix", "--file", "{t}/m.yaml", "--check"],
            tool="invoke",
            setup=write("m.yaml", "rows: [\n  - {stack: cpu\n"),
        )
    )
    add(
        Case(
            "matrix-yaml-empty",
            "malformed",
            ["matrix", "--file", "{t}/m.yaml", "--check"],
            tool="invoke",
            setup=write("m.yaml", ""),
        )
    )
    add(
        Case(
            "matrix-yaml-wrong-schema",
            "malformed",
            ["matrix", "--file", "{t}/m.yaml", "--check"],
            tool="invoke",
            setup=write("m.yaml", "schema: 99\nrows: 5\n"),
        )
    )
    add(
        Case(
            "matrix-drop-malformed",
            "malformed",
            ["matrix", "--file", "{t}/matrix.yaml", "--drop", "::::", "--no-readme"],
            tool="invoke",
            setup=copy_fixture("matrix.yaml"),
            check=unchanged("matrix.yaml"),
        )
    )
    add(
        Case(
            "matrix-drop-unknown-stack",
            "malformed",
            ["matrix", "--file", "{t}/matrix.yaml", "--drop", "nosuch", "--no-readme"],
            tool="invoke",
            setup=copy_fixture("matrix.yaml"),
            check=unchanged("matrix.yaml"),
        )
    )
    for key, edit in {
        "hash-flipped": _flip_hash,
        "block-deleted": _drop_block,
        "hash-line-deleted": _drop_hash_line,
        "version-bumped": _bump_version,
        "empty": lambda s: "",
        "garbage-appended": lambda s: s + "this is not a requirement line\n",
        "digest-line-removed": lambda s: "".join(ln for ln in s.splitlines(keepends=True) if "lock-digest" not in ln),
    }.items():
        add(
            Case(
                f"lock-check-{key}",
                "malformed",
                ["lock", "--check", "--stack", "cpu"],
                tool="invoke",
                env=LOCK_ENV,
                setup=_lock_edit(edit),
            )
        )
        if key in ("hash-flipped", "block-deleted", "empty"):
            add(
                Case(
                    f"probe-lock-{key}",
                    "malformed",
                    ["probe", "--stack", "cpu", "--layer", "resolve"],
                    env=LOCK_ENV,
                    setup=_lock_edit(edit),
                )
            )
    add(
        Case(
            "lock-check-control",
            "malformed",
            ["lock", "--check", "--stack", "cpu"],
            tool="invoke",
            env=LOCK_ENV,
            expect="ok",
            setup=_lock_edit(lambda s: s),
        )
    )
    add(
        Case(
            "stack-toml-syntax",
            "malformed",
            ["probe", "--stack", "cpu", "--layer", "resolve"],
            env=LOCK_ENV,
            setup=lambda t: (
                shutil.copytree(FIX / "root", t / "root"),
                (t / "root/images/cpu/stack.toml").write_text(BAD_TOML),
            ),
        )
    )
    add(
        Case(
            "settings-file-malformed",
            "malformed",
            ["stacks"],
            tool="invoke",
            setup=write("invoke.yaml", "rlstack: [\n"),
        )
    )
    add(
        Case(
            "manifest-not-json",
            "malformed",
            ["adapters", "--root", "{t}/adapters", "--json"],
            expect="any",
            setup=write("adapters/t1/manifest.json", "{", copy_fixture("adapters")),
        )
    )
    add(
        Case(
            "manifest-path-escape",
            "malformed",
            ["eval", "--adapter", "t1", "-n", "2"],
            setup=then(copy_fixture("adapters"), _manifest_escape),
        )
    )

    # the adapter store: tampering and symlinks
    add(
        Case(
            "adapter-file-symlink-out",
            "tamper",
            ["eval", "--adapter", "t1", "-n", "2"],
            setup=then(copy_fixture("adapters"), lambda t: _symlink_out(t, "adapters/t1/adapter_model.safetensors")),
        )
    )
    add(
        Case(
            "adapter-folder-symlink",
            "tamper",
            ["eval", "--adapter", "t1", "-n", "2"],
            setup=then(copy_fixture("adapters"), _symlink_store),
        )
    )
    add(
        Case(
            "adapter-byte-flipped",
            "tamper",
            ["adapters", "--root", "{t}/adapters", "--verify"],
            setup=then(copy_fixture("adapters"), lambda t: _flip_byte(t / "adapters/t1/adapter_model.safetensors")),
        )
    )
    add(
        Case(
            "adapter-eval-byte-flipped",
            "tamper",
            ["eval", "--adapter", "t1", "-n", "2"],
            setup=then(copy_fixture("adapters"), lambda t: _flip_byte(t / "adapters/t1/adapter_model.safetensors")),
        )
    )
    add(
        Case(
            "adapter-file-removed",
            "tamper",
            ["eval", "--adapter", "t1", "-n", "2"],
            setup=then(copy_fixture("adapters"), lambda t: (t / "adapters/t1/adapter_config.json").unlink()),
        )
    )
    add(
        Case(
            "adapter-extra-file",
            "tamper",
            ["adapters", "--root", "{t}/adapters", "--verify"],
            expect="any",
            setup=write("adapters/t1/extra.bin", b"x", copy_fixture("adapters")),
        )
    )

    # run folders: resume, reruns, same name
    # valid: a finished run's --resume says so and changes nothing (the check is what it changed)
    add(Case("resume-finished-run", "runs", run=resume_finished, expect="ok", timeout=400))
    add(
        Case(
            "rerun-finished-without-overwrite",
            "runs",
            [*TRAIN, "--adapter-name", "t1", "--output", "{t}/run1", "--adapters-root", "{t}/adapters"],
            setup=copy_fixture("run1", "adapters"),
            check=unchanged("run1", "adapters/t1"),
        )
    )
    add(
        Case(
            "resume-changed-recipe",
            "runs",
            [
                *TRAIN,
                "--adapter-name",
                "t1",
                "--output",
                "{t}/run1",
                "--adapters-root",
                "{t}/adapters",
                "--resume",
                "--set",
                "grpo.learning_rate=0.1",
            ],
            setup=copy_fixture("run1", "adapters"),
            check=unchanged("run1/recipe.json", "adapters/t1"),
        )
    )
    add(
        Case(
            "resume-smaller-max-steps",
            "runs",
            [*TRAIN, "--adapter-name", "t1", "--output", "{t}/run1", "--adapters-root", "{t}/adapters", "--resume"],
            expect="any",
            setup=copy_fixture("run1", "adapters"),
            check=unchanged("run1/checkpoints", "adapters/t1"),
        )
    )
    add(
        Case(
            "run-folder-locked",
            "runs",
            [*TRAIN, "--adapter-name", "t1", "--output", "{t}/run1", "--adapters-root", "{t}/adapters", "--resume"],
            run=_locked_run,
            timeout=120,
        )
    )
    add(Case("train-same-name-concurrent", "concurrency", run=same_name_concurrent, timeout=700))
    add(Case("kill-mid-train-then-rerun", "kills", run=kill_mid_train, expect="ok", timeout=900))
    add(Case("matrix-8-concurrent-merges", "concurrency", run=matrix_concurrent, expect="ok", timeout=400))
    add(Case("matrix-kill-mid-write", "kills", run=matrix_kill, expect="ok", timeout=200))

    # full disk, read-only file systems, closed output
    add(
        Case(
            "rescore-full-disk",
            "disk",
            run=on_tmpfs("64k", ["rescore", "ev/generations.jsonl", "--output", "{t}/small/out.json"], pre=_fill),
        )
    )
    add(
        Case(
            "matrix-full-disk",
            "disk",
            run=on_tmpfs(
                "256k",
                ["matrix", "--file", "{t}/small/matrix.yaml", "--results", "{t}/probe.json", "--no-readme"],
                pre=_fill,
                tool="invoke",
                after=_matrix_intact,
            ),
        )
    )
    add(
        Case(
            "probe-output-full-disk",
            "disk",
            run=on_tmpfs("64k", ["probe", "--stack", "cpu", "--layer", "resolve", "-o", "{t}/small/p.json"], pre=_fill),
        )
    )
    add(
        Case(
            "train-full-disk",
            "disk",
            run=on_tmpfs(
                "600k",
                [*TRAIN, "--adapter-name", "n", "--output", "{t}/small/run", "--adapters-root", "{t}/small/adapters"],
                timeout=500,
            ),
        )
    )
    add(
        Case(
            "eval-output-read-only",
            "disk",
            run=on_tmpfs(
                "1m",
                [
                    "eval",
                    "--model",
                    "tiny",
                    "--recipe",
                    "smoke-cpu",
                    "--data",
                    "generated:2",
                    "-n",
                    "2",
                    "--output",
                    "{t}/small/ev",
                ],
                readonly=True,
            ),
        )
    )
    add(
        Case(
            "train-read-only",
            "disk",
            run=on_tmpfs(
                "1m",
                [*TRAIN, "--adapter-name", "n", "--output", "{t}/small/run", "--adapters-root", "{t}/small/ad"],
                readonly=True,
            ),
        )
    )
    add(Case("compare-stdout-full", "disk", run=stdout_full(["compare", RESULTS, RESULTS, "--json"])))
    add(Case("adapters-stdout-full", "disk", run=stdout_full(["adapters", "--root", "{t}/adapters", "--json"])))
    add(Case("compare-stdout-closed", "disk", run=stdout_closed(["compare", RESULTS, RESULTS, "--json"]), expect="any"))
    add(Case("diagnose-stdout-closed", "disk", run=stdout_closed(["diagnose", "--help"]), expect="any"))

    # the environment a command reads
    add(
        Case(
            "env-path-map-malformed",
            "environment",
            ["compare", RESULTS, "{t}/none.json"],
            env={"RLSTACK_PATH_MAP": "{{not json"},
            setup=copy_fixture("ev"),
        )
    )
    add(
        Case(
            "env-adapters-is-file",
            "environment",
            ["adapters"],
            env={"RLSTACK_ADAPTERS": "{t}/f"},
            setup=write("f", "x"),
        )
    )
    add(
        Case(
            "env-root-missing",
            "environment",
            ["probe", "--stack", "cpu", "--layer", "resolve"],
            env={"RLSTACK_ROOT": "{t}/none"},
        )
    )
    add(
        Case(
            "env-model-cache-is-file",
            "environment",
            [*TRAIN, "--adapter-name", "n", *tr],
            env={"RLSTACK_MODEL_CACHE": "{t}/f"},
            setup=write("f", "x"),
            expect="any",
            timeout=400,
        )
    )
    add(Case("unknown-flag", "environment", ["train", "--nosuch"]))
    add(Case("unknown-command", "environment", ["nosuch"]))
    return c


def _truncated(t: Path) -> None:
    copy_fixture("ev")(t)
    (t / "b.json").write_text((FIX / RESULTS).read_text()[:200])


def _shift_ids(d: dict) -> None:
    for key in ("per_question", "questions", "rows"):
        rows = d.get(key)
        if isinstance(rows, list):
            for r in rows:
                if isinstance(r, dict) and "id" in r:
                    r["id"] = "other-" + str(r["id"])
        elif isinstance(rows, dict):
            d[key] = {"other-" + k: v for k, v in rows.items()}


def _probe_setup(key: str, text: str | None) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        copy_fixture("matrix.yaml")(t)
        if text is not None:
            (t / "p.json").write_text(text)
            return
        d = json.loads((FIX / "probe.json").read_text())
        if key == "wrong-types":
            d["results"] = "all passed"
        elif key == "future-date":
            d["date"] = "2999-01-01T00:00:00Z"
        elif key == "unknown-stack":
            d["stack"] = "nosuch"
        elif key == "bad-arch":
            d["gpu_arch"] = "sm_999"
        (t / "p.json").write_text(json.dumps(d))

    return setup


def _manifest_escape(t: Path) -> None:
    p = t / "adapters/t1/manifest.json"
    d = json.loads(p.read_text())
    files = d.get("files")
    if isinstance(files, dict) and files:
        k = next(iter(files))
        files["../../outside.bin"] = files.pop(k)
    p.write_text(json.dumps(d))


def then(*steps: Callable[[Path], object]) -> Callable[[Path], None]:
    """One setup made of several, run in order."""

    def setup(t: Path) -> None:
        for step in steps:
            step(t)

    return setup


def _symlink_store(t: Path) -> None:
    """The adapter folder as a symlink into a folder outside the store."""
    (t / "adapters").rename(t / "real")
    (t / "adapters").mkdir()
    (t / "adapters/t1").symlink_to(t / "real/t1")


def _symlink_out(t: Path, rel: str) -> None:
    p = t / rel
    shutil.copy(p, t / "outside.bin")
    p.unlink()
    p.symlink_to(t / "outside.bin")


def _flip_byte(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))


def _locked_run(t: Path) -> Outcome:
    """A second writer while the run folder's lock is held by another process: refused, the folder untouched."""
    copy_fixture("run1", "adapters")(t)
    code = (
        f"import sys, time, pathlib; sys.path.insert(0, {str(ROOT / 'src')!r})\n"
        "from rlstack.core import locking\n"
        f"with locking.exclusive(pathlib.Path({str(t / 'run1')!r}), 'run folder', 'wait'):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert holder.stdout is not None
    first = holder.stdout.readline().decode()
    try:
        if "held" not in first:
            return Outcome(None, first + holder.stdout.read().decode(), note="could not hold the lock")
        o = sh(
            [
                *TRAIN,
                "--adapter-name",
                "t1",
                "--output",
                "{t}/run1",
                "--adapters-root",
                "{t}/adapters",
                "--resume",
                "--max-steps",
                "2",
            ],
            t,
            timeout=120,
        )
    finally:
        holder.kill()
        holder.wait()
    o.lost = unchanged("run1/checkpoints", "adapters/t1")(t, o)
    return o


def judge(case: Case, o: Outcome) -> dict[str, Any]:
    traceback = TRACEBACK in o.output
    skipped = o.note.startswith("skipped")
    silent = case.expect == "error" and o.rc == 0
    refused_valid = case.expect == "ok" and o.rc not in (0, None)
    hung = o.rc is None and not skipped
    if skipped:
        verdict = "skipped"
    elif traceback or hung:
        verdict = "traceback" if traceback else "hang"
    elif silent:
        verdict = "silent"
    elif o.lost:
        verdict = "data-lost"
    elif refused_valid:
        verdict = "refused-valid"
    else:
        verdict = "clear-error" if o.rc else "ok"
    last = [ln for ln in o.output.strip().splitlines() if ln.strip()][-3:]
    return {
        "case": case.id,
        "class": case.cls,
        "tool": case.tool,
        "command": " ".join(case.argv)[:300],
        "expect": case.expect,
        "exit": o.rc,
        "traceback": traceback,
        "silent": silent,
        "data_lost": o.lost,
        "verdict": verdict,
        "note": o.note,
        "last_lines": [ln[:300] for ln in last],
    }


def _local(value: Any, t: Path) -> Any:
    if isinstance(value, list):
        return [_local(v, t) for v in value]
    if isinstance(value, str):
        return value.replace(str(t), "{t}").replace(str(FIX), "{F}").replace(str(ROOT), "{root}")
    return value


def repo_state() -> str:
    """What of the checkout a case could write by mistake (the matrix and its pages, the locks, machine
    settings); not the whole tree, which others may be editing while the campaign runs (each case's ./runs and
    .stage are its own temporary folder)."""
    h = hashlib.sha256()
    readme = (ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else ""
    h.update(readme[readme.find("compat-matrix:start") : readme.find("compat-matrix:end")].encode())
    for rel in (
        "compat_matrix.yaml",
        "docs/compat_matrix.html",
        "invoke.yaml",
        *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "images").glob("*/requirements.lock"))),
    ):
        if (ROOT / rel).exists():
            h.update(rel.encode() + (ROOT / rel).read_bytes())
    return h.hexdigest()


def main() -> int:
    global FIX
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="run only cases whose id contains this")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--keep", help="fixtures folder to reuse (made when missing) and keep")
    ap.add_argument("--no-write", action="store_true", help="print, do not write bench/results")
    args = ap.parse_args()
    all_cases = cases()
    if args.list:
        for cs in all_cases:
            print(f"{cs.cls:12} {cs.id}")
        print(f"{len(all_cases)} cases")
        return 0
    base = Path(tempfile.mkdtemp(prefix="rlstack-campaign-"))
    FIX = Path(args.keep) if args.keep else base / "fixtures"
    t0 = time.time()
    if not (FIX / "probe.json").exists():
        fixtures(FIX)
    print(f"fixtures in {FIX} ({time.time() - t0:.0f} s)", flush=True)
    selected = [cs for cs in all_cases if args.only in cs.id]
    rows = []
    state = repo_state()
    for i, cs in enumerate(selected, 1):
        t = base / f"case-{i:03d}"
        t.mkdir()
        start = time.time()
        try:
            if cs.setup:
                cs.setup(t)
            # an invalid input to train that reaches the training's first line was accepted: stop it there
            stop = STARTED if cs.expect == "error" and cs.argv[:1] == ["train"] and cs.tool == "rlstack" else None
            o = cs.run(t) if cs.run else sh(cs.argv, t, timeout=cs.timeout, env=cs.env, tool=cs.tool, stop_on=stop)
            if cs.check and o.lost is None and o.rc is not None:
                o.lost = cs.check(t, o)
        except Exception as exc:  # the harness's own failure is recorded, not hidden
            o = Outcome(None, f"harness error: {type(exc).__name__}: {exc}", note="harness error")
        if cs.tool == "invoke" or cs.run:
            now = repo_state()
            if now != state:
                o.lost = (o.lost or "") + " the checkout changed"
                state = now
        row = judge(cs, o)
        # no machine-local path in a committed file: the case folder, the fixtures and the checkout by name
        for key in ("last_lines", "data_lost", "note"):
            row[key] = _local(row[key], t)
        row["seconds"] = round(time.time() - start, 1)
        rows.append(row)
        print(
            f"[{i}/{len(selected)}] {row['verdict']:13} exit {row['exit']!s:4} {cs.id}"
            + (
                f"  <- {row['last_lines'][-1][:150]}"
                if row["verdict"] not in ("clear-error", "ok") and row["last_lines"]
                else ""
            ),
            flush=True,
        )
        shutil.rmtree(t, ignore_errors=True)
    summary = summarize(rows)
    print(json.dumps(summary["total"], indent=1))
    shutil.rmtree(base, ignore_errors=True)  # the cases' folders (and the fixtures, unless --keep put them elsewhere)
    if args.no_write or args.only:
        return 0
    results.write(
        results.Result(
            question="reliability",
            title="Bad inputs to every CPU command line: tracebacks, silent acceptances, data lost",
            ran=results.Ran(command="python bench/input_campaign.py", bench="input_campaign", stack=None),
            where=results.Where.detect(environment="host", machine=f"{os.cpu_count()} CPU cores, shared"),
            columns=[
                "class",
                "cases",
                "clear_error",
                "ok",
                "traceback",
                "silent",
                "data_lost",
                "hang",
                "refused_valid",
                "skipped",
            ],
            rows=summary["rows"],
            notes=f"{len(rows)} cases in {time.time() - t0:.0f} s; Docker replaced by a failing "
            "stub; each case's command, exit code and last lines are in extra.cases",
            extra={"total": summary["total"], "cases": rows},
        ),
        "input_campaign",
    )
    return 0


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ["clear-error", "ok", "traceback", "silent", "data-lost", "hang", "refused-valid", "skipped"]
    out = []
    for cls in dict.fromkeys(r["class"] for r in rows):
        mine = [r for r in rows if r["class"] == cls]
        out.append(
            {
                "class": cls,
                "cases": len(mine),
                **{k.replace("-", "_"): sum(r["verdict"] == k for r in mine) for k in keys},
            }
        )
    total = {
        "class": "all",
        "cases": len(rows),
        **{k.replace("-", "_"): sum(r["verdict"] == k for r in rows) for k in keys},
    }
    return {"rows": [*out, total], "total": total}


if __name__ == "__main__":
    sys.exit(main())
