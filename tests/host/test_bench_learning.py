"""bench/learning.py: pairing two evaluations (compare's numbers and identical greedy generations), the record it
writes after every phase (in the one results schema), and one real run on the CPU at a tiny size (slow)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from rlstack.core import results
from rlstack.payload import embedded, recipes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def learning(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("learning")


def _eval_folder(
    folder: Path, correct: list[bool], formatted: list[bool], texts: list[str], engine: str = "transformers@cpu"
) -> Path:
    """An evaluation as rlstack eval writes it: results.json with per-question outcomes, generations.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = [f"easy-1000003-{i}" for i in range(len(correct))]
    (folder / "generations.jsonl").write_text(
        "".join(
            json.dumps({"id": q, "question": "?", "reference": "1", "generation": t, "new_tokens": 3}) + "\n"
            for q, t in zip(ids, texts, strict=True)
        )
    )
    data = {
        "n": len(ids),
        "correct": sum(correct),
        "accuracy": sum(correct) / len(ids),
        "format_ok": sum(formatted),
        "config": {"engine": engine},
        "generations": "generations.jsonl",
        "per_question": dict(zip(ids, correct, strict=True)),
        "per_question_format": dict(zip(ids, formatted, strict=True)),
    }
    (folder / "results.json").write_text(json.dumps(data))
    return folder / "results.json"


def test_identical_generations_counts_and_locates_where_texts_part(learning: ModuleType, tmp_path: Path) -> None:
    a = _eval_folder(tmp_path / "a", [True] * 4, [True] * 4, ["2 + 3 = 5.\n#### 5", "x", "abc  def", "same"])
    b = _eval_folder(tmp_path / "b", [True] * 4, [True] * 4, ["2 + 3 = 6.\n#### 6", "x", "abc def", "same"])
    got = learning.identical_generations(a.with_name("generations.jsonl"), b.with_name("generations.jsonl"))
    assert (got["paired"], got["identical"], got["differing"], got["identical_ignoring_whitespace"]) == (4, 2, 2, 3)
    first = got["examples"][0]
    assert first["id"] == "easy-1000003-0" and first["common_prefix_chars"] == len("2 + 3 = ")
    assert first["a"].startswith("2 + 3 = 5") and first["b"].startswith("2 + 3 = 6")
    assert got["median_common_prefix_chars"] == (8 + 4) / 2  # 'abc ' then a second space against 'd'


def test_pair_is_compare_plus_identical_generations(learning: ModuleType, tmp_path: Path) -> None:
    """10 questions: b fixes 6 that a got wrong and breaks none; McNemar's exact p of 6 vs 0 discordant pairs is
    2 * 0.5**6. Format: 2 fixed, 1 broken."""
    a_ok = [False] * 6 + [True] * 2 + [False] * 2
    b_ok = [True] * 8 + [False] * 2
    a_fmt = [False, False, True, True, True, True, True, True, True, True]
    b_fmt = [True, True, False, True, True, True, True, True, True, True]
    a = _eval_folder(tmp_path / "a", a_ok, a_fmt, [f"t{i}" for i in range(10)], "transformers@cuda")
    b = _eval_folder(tmp_path / "b", b_ok, b_fmt, [f"t{i}" if i > 6 else f"u{i}" for i in range(10)], "vllm")
    c = learning.pair(a, b, iters=500)
    assert (c["n"], c["base_correct"], c["tuned_correct"]) == (10, 2, 8)
    assert c["mcnemar_exact_p"] == pytest.approx(2 * 0.5**6)
    assert c["format"]["discordant"] == {"base_only": 1, "tuned_only": 2}
    assert c["identical_generations"]["identical"] == 3 and c["identical_generations"]["paired"] == 10
    row = learning.pair_row("fp8", "hf", "vllm", c)
    assert row["identical_generations"] == "3/10" and row["a_correct"] == 2 and row["b_correct"] == 8
    assert row["delta_points"] == 60.0 and row["ci95"].startswith("[+")


def test_pair_files_writes_a_valid_results_file(learning: ModuleType, tmp_path: Path) -> None:
    a = _eval_folder(tmp_path / "fastgen", [True, False, True], [True] * 3, ["a", "b", "c"])
    b = _eval_folder(tmp_path / "own", [True, True, True], [True] * 3, ["a", "x", "c"])
    assert learning.main(["--pair", str(a), str(b), "--stack-name", "portable", "--out", str(tmp_path / "o")]) == 0
    [path] = (tmp_path / "o").glob("learning-portable-pair-*.json")
    got = results.read(path)
    assert got.question == "learning" and got.ran.bench == "learning" and got.ran.stack == "portable"
    assert got.columns == learning.PAIR_COLUMNS and got.rows[0]["identical_generations"] == "2/3"
    assert got.where.environment in ("host", "native") and got.extra["status"] == "done"
    assert got.extra["compare"]["n"] == 3


def test_two_pairs_in_one_minute_keep_two_records(learning: ModuleType, tmp_path: Path) -> None:
    a = _eval_folder(tmp_path / "fastgen", [True, False, True], [True] * 3, ["a", "b", "c"])
    b = _eval_folder(tmp_path / "own", [True, True, True], [True] * 3, ["a", "x", "c"])
    for x, y in ((a, b), (b, a)):
        assert learning.main(["--pair", str(x), str(y), "--stack-name", "portable", "--out", str(tmp_path / "o")]) == 0
    got = list((tmp_path / "o").glob("learning-portable-pair-*.json"))
    assert sorted(results.read(g).rows[0]["a_correct"] for g in got) == [2, 3]
    assert not [d for d in (tmp_path / "o").iterdir() if d.is_dir()]  # a pair's record has no folder


def test_pairing_two_runs_overlays_their_reward_curves(learning: ModuleType, tmp_path: Path) -> None:
    evals = []
    for run, rewards in (
        ("learning-portable-fastgen-20261207-1000", [0.1, 0.5]),
        ("learning-portable-own-20261207-1010", [0.2, 0.4]),
    ):
        evals.append(_eval_folder(tmp_path / run / "tuned", [True, False], [True, True], ["a", "b"]))
        curve = [{"step": i + 1, "reward": r} for i, r in enumerate(rewards)]
        (tmp_path / f"{run}.json").write_text(json.dumps({"extra": {"curve": curve}}))
    curves = learning.run_curves(*evals)
    assert [[r["reward"] for r in c] for c in curves.values()] == [[0.1, 0.5], [0.2, 0.4]]
    assert learning.main(["--pair", *map(str, evals), "--stack-name", "portable", "--out", str(tmp_path / "o")]) == 0
    got = results.read(next((tmp_path / "o").glob("learning-portable-pair-*.json")))
    assert got.extra["curves"] == curves and Path(got.extra["png"]["path"]).stat().st_size > 1000
    assert learning.run_curves(evals[0], tmp_path / "elsewhere" / "tuned" / "results.json") == {}


def _fake_phases(
    learning: ModuleType, monkeypatch: pytest.MonkeyPatch, fail: str | None = None, kill_in_train: bool = False
) -> list[list[str]]:
    """Phase.run replaced by what each rlstack command would leave on disk: an eval's results.json, a train's
    metrics rows (one per step, each announced by the progress line) and adapter manifest; `kill_in_train` sends
    this process SIGTERM after the steps, as a device call's time limit does (the bench's own handler stays)."""
    calls: list[list[str]] = []

    def run(
        argv: list[str], env: dict[str, str], on_line: Callable[[str], None] | None = None
    ) -> tuple[int, list[str], float]:
        calls.append(argv)
        assert env["RLSTACK_STACK"] in ("portable", "fp8") and env["RLSTACK_ADAPTERS"].endswith("adapters")
        cmd = argv[0]
        if cmd == fail:
            return 1, ["Traceback ...", "RuntimeError: boom"], 0.5
        out = Path(argv[argv.index("--output") + 1])
        if cmd == "eval":
            tuned = "--adapter" in argv
            _eval_folder(out, [True, True, False, tuned], [tuned] * 4, ["a", "b", "c", "d" if tuned else "e"])
        else:
            out.mkdir(parents=True, exist_ok=True)
            assert on_line is not None
            on_line("rlstack train: smollm2-gpu: embedded:smollm2-135m via unsloth on cuda, 2 steps, 50 prompts")
            on_line("rlstack train: rollouts through rlstack.payload.fastgen (grpo.fast_generation = true, ...)")
            for step in (1, 2):
                with (out / "metrics.jsonl").open("a") as f:
                    f.write(
                        json.dumps(
                            {
                                "step": step,
                                "reward": 0.5 * step,
                                "loss": 0.1,
                                "step_time_s": 0.4 + step,
                                "correctness_mean": 0.2,
                                "format_mean": 0.3,
                                "num_tokens": 9,
                            }
                        )
                        + "\n"
                    )
                on_line(f"rlstack train: step {step}/2 | reward {0.5 * step:.3f}")
            if kill_in_train:
                os.kill(os.getpid(), signal.SIGTERM)
            root = Path(argv[argv.index("--adapters-root") + 1]) / "tuned"
            root.mkdir(parents=True)
            (root / "manifest.json").write_text(json.dumps({"metrics": {"loader": "unsloth", "steps": 2}}))
        return 0, ["ok"], 1.0

    monkeypatch.setattr(learning.Phase, "run", staticmethod(run))
    monkeypatch.delenv("RLSTACK_STACK", raising=False)  # the bench names the stack for the phases
    if not kill_in_train:
        monkeypatch.setattr(learning, "_stop_on_signal", lambda record: None)
    monkeypatch.setattr(learning, "_png", lambda *a: {"path": None, "why": "not drawn in this test"})
    return calls


def test_a_run_pairs_base_and_tuned_and_records_the_curve(
    learning: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_phases(learning, monkeypatch)
    monkeypatch.delenv("OUT", raising=False)
    assert (
        learning.main(
            [
                "--stack-name",
                "portable",
                "--steps",
                "2",
                "--eval-n",
                "4",
                "--set",
                "model.load_in_4bit=true",  # QLoRA: both evaluations score the 4-bit base training ran on
                "--out",
                str(tmp_path),
                "--work",
                str(tmp_path / "work"),
            ]
        )
        == 0
    )
    base, train, tuned = calls
    assert base[:3] == ["eval", "--model", "embedded:smollm2-135m"] and "--load-in-4bit" in base
    assert tuned[:2] == ["eval", "--adapter"] and "--load-in-4bit" in tuned
    for flag in ("-n", "--data", "--split", "--max-new-tokens", "--batch-size", "--backend", "--seed"):
        assert base[base.index(flag) + 1] == tuned[tuned.index(flag) + 1], flag  # one set of problems, one length
    assert base[base.index("--data") + 1] == "generated-easy:256" and base[base.index("-n") + 1] == "4"
    assert "grpo.fast_generation=true" in train and train[train.index("--max-steps") + 1] == "2"
    [path] = tmp_path.glob("learning-portable-fastgen-*.json")
    got = results.read(path)
    assert "RLSTACK_STACK" not in os.environ  # set for the phases and the lock hash only
    assert got.ran.lock_hash and len(got.ran.lock_hash) == 64 and got.ran.stack == "portable"
    assert got.ran.command.startswith("python3 bench/learning.py --stack-name portable --steps 2 --eval-n 4 --set")
    assert got.extra["status"] == "done" and [r["step"] for r in got.extra["curve"]] == [1, 2]
    assert got.extra["curve"][1] == {
        "step": 2,
        "reward": 1.0,
        "loss": 0.1,
        "step_time_s": 2.4,
        "correctness_mean": 0.2,
        "format_mean": 0.3,
    }
    row = got.rows[0]
    assert row == got.headline and row["path"] == "unsloth, fastgen rollouts" and row["steps"] == 2
    assert (row["n"], row["base_correct"], row["tuned_correct"], row["base_format"], row["tuned_format"]) == (
        4,
        2,
        3,
        0,
        4,
    )
    assert row["s_per_step"] == 2.4  # the median after the first step
    assert got.extra["train"]["rollouts"] == "fastgen" and got.extra["train"]["loader"] == "unsloth"
    assert len(got.extra["base"]["per_question"]) == 4 and got.extra["tuned"]["config"]["engine"]
    assert (tmp_path / path.stem / "tuned" / "generations.jsonl").is_file()


def test_own_generation_and_fp8_are_what_the_train_command_is_asked(
    learning: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_phases(learning, monkeypatch)
    assert (
        learning.main(
            [
                "--stack-name",
                "portable",
                "--engine",
                "own",
                "--out",
                str(tmp_path / "own"),
                "--work",
                str(tmp_path / "w1"),
            ]
        )
        == 0
    )
    assert "grpo.fast_generation=false" in calls[1]
    assert next((tmp_path / "own").glob("learning-portable-own-*.json"))
    calls.clear()
    assert (
        learning.main(
            [
                "--stack-name",
                "fp8",
                "--fp8",
                "--backend",
                "vllm",
                "--out",
                str(tmp_path / "fp8"),
                "--work",
                str(tmp_path / "w2"),
            ]
        )
        == 0
    )
    base, train, tuned = calls
    assert "--fp8" in train and "--unquantized" in base and "--unquantized" in tuned  # one base precision
    assert "--load-in-4bit" not in base + tuned  # the recipe's 4-bit is not the base FP8 training ran on
    got = results.read(next((tmp_path / "fp8").glob("learning-fp8-vllm-*.json")))
    assert any("--unquantized" in n for n in got.extra["notes"])


def test_a_failed_phase_leaves_the_record_with_its_last_lines(
    learning: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_phases(learning, monkeypatch, fail="train")
    assert learning.main(["--stack-name", "fp8", "--fp8", "--out", str(tmp_path), "--work", str(tmp_path / "w")]) == 1
    got = results.read(next(tmp_path.glob("learning-fp8-vllm-*.json")))
    assert got.extra["status"] == "failed in train (rc 1)"
    (row,) = got.rows  # the base it measured, no tuned side
    assert row["base_correct"] == got.extra["base"]["correct"] and row["tuned_correct"] is None
    assert row["path"].endswith("training failed, see status") and row["steps"] == 0
    assert got.extra["train"]["log_tail"][-1] == "RuntimeError: boom"
    assert got.extra["base"]["n"] == 4  # the base evaluation done before it is kept
    assert "training failed" in capsys.readouterr().out


def test_a_killed_run_keeps_a_row_with_its_base_and_the_steps_it_made(
    learning: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_phases(learning, monkeypatch, kill_in_train=True)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as stop:
            learning.main(["--stack-name", "portable", "--out", str(tmp_path), "--work", str(tmp_path / "w")])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert stop.value.code == 128 + signal.SIGTERM
    got = results.read(next(tmp_path.glob("learning-portable-*.json")))
    assert got.extra["status"] == "killed (SIGTERM) during train"
    (row,) = got.rows
    assert row["base_correct"] == got.extra["base"]["correct"] and row["tuned_correct"] is None
    assert row["steps"] == 2 and row["s_per_step"] == 2.4  # the steps after the first
    assert row["path"].endswith("killed (SIGTERM) during train, see status")


def test_a_record_a_dead_process_left_started_is_closed_with_what_it_measured(
    learning: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_phases(learning, monkeypatch)
    learning.main(["--stack-name", "portable", "--out", str(tmp_path), "--work", str(tmp_path / "w")])
    path = next(tmp_path.glob("learning-portable-*.json"))
    got = results.read(path)  # as the machine left it mid-training: no rows, status "started"
    got.rows, got.headline = [], None
    got.extra.update(status="started", phase="train", train={"loader": "unsloth", "steps_done": 7, "s_per_step": 1.5})
    results.write(got, path.stem, tmp_path)
    assert learning.main(["--close", str(path), "--why", "cut off: the lease ended"]) == 0
    closed = results.read(path)
    assert closed.extra["status"] == "cut off: the lease ended during train"
    (row,) = closed.rows
    assert (row["steps"], row["s_per_step"], row["base_correct"]) == (7, 1.5, got.extra["base"]["correct"])
    assert row["tuned_correct"] is None and row["path"].startswith("unsloth, fastgen rollouts: cut off")
    assert learning.main(["--close", str(path)]) != 0  # it has its row now: left as it is
    assert results.read(path).extra["status"] == closed.extra["status"]


def test_hand_off_evaluates_the_adapter_and_pairs_it_with_the_other_stack(
    learning: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_phases(learning, monkeypatch)
    adapter = tmp_path / "adapters" / "tuned"
    adapter.mkdir(parents=True)
    recipe = {
        "model": {"load_in_4bit": True},
        "eval": {"data": "generated-easy:256", "split": "test", "n": 256, "max_new_tokens": 128},
    }
    (adapter / "manifest.json").write_text(json.dumps({"recipe": recipe}))
    other = _eval_folder(tmp_path / "portable-hf", [True, True, False, False], [False] * 4, ["a", "b", "c", "x"])
    assert (
        learning.main(
            [
                "--stack-name",
                "fp8",
                "--adapter-from",
                str(adapter),
                "--backend",
                "vllm",
                "--unquantized",
                "--pair-with",
                str(other),
                "--out",
                str(tmp_path / "o"),
                "--work",
                str(tmp_path / "w"),
            ]
        )
        == 0
    )
    [argv] = calls
    assert argv[argv.index("--backend") + 1] == "vllm" and "--unquantized" in argv and "--load-in-4bit" not in argv
    assert argv[argv.index("--data") + 1] == "generated-easy:256" and argv[argv.index("-n") + 1] == "256"
    got = results.read(next((tmp_path / "o").glob("learning-fp8-handoff-vllm-*.json")))
    assert got.rows[0]["identical_generations"] == "3/4" and got.rows[0]["a"] == "transformers@cpu"
    assert (got.rows[0]["a_correct"], got.rows[0]["b_correct"]) == (2, 3)
    assert learning.main(["--adapter-from", str(tmp_path), "--out", str(tmp_path / "o")]) == 2  # no manifest there
    # the first half (no --pair-with): a record with its one side, so the results schema has a row to show
    calls.clear()
    assert learning.main(["--stack-name", "portable", "--adapter-from", str(adapter), "--backend", "hf",
                          "--out", str(tmp_path / "h"), "--work", str(tmp_path / "w")]) == 0
    first = results.read(next((tmp_path / "h").glob("learning-portable-handoff-hf-*.json")))
    assert first.rows == [{"stack": "portable", "a": first.extra["eval"]["config"]["engine"], "n": 4,
                           "a_correct": first.extra["eval"]["correct"], "a_format": first.extra["eval"]["format_ok"]}]


def test_the_row_names_the_rollouts_that_ran(learning: ModuleType) -> None:
    off = "not fastgen: no CUDA device (the model is on cpu); TRL's generate is used"
    assert learning.rollouts_ran("fastgen", {"rollouts": off}) == off
    assert learning.rollouts_ran("fastgen", {"rollouts": "fastgen"}) == "fastgen rollouts"
    fell = {"rollouts": "fastgen", "fastgen_fell_back": "rlstack fastgen: falling back ..."}
    assert learning.rollouts_ran("fastgen", fell) == "fastgen rollouts (fell back to generate mid-run)"
    assert learning.rollouts_ran("vllm", {"rollouts": "not fastgen: vLLM generates the rollouts"}) == "vLLM rollouts"
    assert learning.rollouts_ran("own", {}) == "the loader's own generate"


def test_the_environment_names_the_image_tag(learning: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside an image the record says which image (its content tag, from RLSTACK_IMAGE), not only the stack."""
    monkeypatch.setenv("RLSTACK_ROOT", "/opt/rlstack")
    monkeypatch.setenv("RLSTACK_IMAGE", "rlstack/fp8:8ac73e8cf1b6")
    assert learning.environment("fp8", "0791b91f1825aa", "H100") == "image rlstack/fp8:8ac73e8cf1b6"
    monkeypatch.delenv("RLSTACK_IMAGE")
    assert learning.environment("fp8", "0791b91f1825aa", "H100") == "image rlstack/fp8 (lock 0791b91f1825)"
    monkeypatch.delenv("RLSTACK_ROOT")
    assert learning.environment("fp8", None, "H100") == "native"


def test_gpu_recipe_is_the_issue_shape_and_evaluates_held_out() -> None:
    r = recipes.load("smollm2-gpu")
    assert (r.lora.r, r.lora.target_modules, r.lora.top_layers) == (16, recipes.ALL_LINEAR, None)
    completions = r.grpo.per_device_train_batch_size * r.grpo.gradient_accumulation_steps
    assert (r.grpo.num_generations, completions, r.grpo.max_completion_length) == (8, 64, 128)
    assert r.grpo.per_device_train_batch_size <= 16  # the rows of Unsloth's unrolled log-softmax graph
    assert (r.grpo.temperature, r.grpo.learning_rate, r.grpo.max_steps) == (0.7, 2e-4, 80)
    assert r.model.load_in_4bit is False  # a 4-bit copy of the 135M base scores too low to learn from quickly
    assert r.eval.n >= 256 and r.eval.max_new_tokens >= 128 and r.eval.split == "test" and r.data.split == "train"
    assert r.data.train.partition(":")[0] == r.eval.data.partition(":")[0] == "generated-easy"
    harder = recipes.load("smollm2-gpu", ["data.train=generated-two-step:4000", "eval.data=generated-two-step:256"])
    assert harder.eval.data == "generated-two-step:256"


@pytest.mark.slow
def test_a_tiny_run_on_the_cpu(learning: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real commands end to end: base eval, 2 GRPO steps, tuned eval, pairing, the PNG; the embedded model
    where its folder is cached, else the tiny one."""
    cached = (embedded.folder_for(embedded.lookup("embedded:smollm2-135m")) / "model.safetensors").is_file()
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setenv("RLSTACK_TINY_CACHE", str(tmp_path / "tiny"))
    model = [] if cached else ["--set", "model.name=tiny"]
    args = [
        "--stack-name",
        "cpu",
        "--steps",
        "2",
        "--eval-n",
        "8",
        "--max-new-tokens",
        "16",
        "--eval-batch-size",
        "8",
        "--out",
        str(tmp_path / "out"),
        "--work",
        str(tmp_path / "work"),
        *model,
        *[
            x
            for s in (
                "model.load_in_4bit=false",
                "grpo.per_device_train_batch_size=4",
                "grpo.num_generations=4",
                "grpo.max_completion_length=16",
                "lora.top_layers=2",
                "data.train=generated-easy:50",
            )
            for x in ("--set", s)
        ],
    ]
    assert learning.main(args) == 0
    got = results.read(next((tmp_path / "out").glob("learning-cpu-fastgen-*.json")))
    row = got.rows[0]
    assert row["n"] == 8 and row["steps"] == 2 and 0 <= row["p"] <= 1
    assert [r["step"] for r in got.extra["curve"]] == [1, 2] and all("loss" in r for r in got.extra["curve"])
    assert got.extra["train"]["rollouts"].startswith("not fastgen: no CUDA device")  # said by rlstack train
    assert row["path"].startswith("transformers, not fastgen: no CUDA device")
    assert got.extra["png"]["path"] and Path(got.extra["png"]["path"]).is_file()
    assert got.extra["base"]["config"]["model"] == got.extra["tuned"]["config"]["model"]


def test_runs_started_in_one_minute_keep_their_own_folders(learning: ModuleType, tmp_path: Path) -> None:
    name = learning.label("portable", "fastgen", learning.datetime(2026, 12, 6, 17, 31, 5))
    got = [learning.claim(tmp_path, name) for _ in range(3)]
    assert got == [name, f"{name}-2", f"{name}-3"] and all((tmp_path / g).is_dir() for g in got)
