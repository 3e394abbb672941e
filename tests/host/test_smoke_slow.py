"""`invoke smoke` end to end with the tiny recipe (the embedded model's run is the README's and takes minutes):
train, both evaluations, the paired comparison, and the one-sentence summary as the very last line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlstack.host.smoke import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_ends_with_the_comparison_and_one_sentence(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RLSTACK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("RLSTACK_ADAPTERS", str(tmp_path / "adapters"))
    monkeypatch.setenv("RLSTACK_TINY_CACHE", str(tmp_path_factory.getbasetemp() / "tiny-cache"))
    assert run_smoke(recipe="smoke-cpu", steps=2, name="s", lock_check=False) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    base = json.loads((tmp_path / "runs" / "eval" / "s-base" / "results.json").read_text())
    tuned = json.loads((tmp_path / "runs" / "eval" / "s" / "results.json").read_text())
    assert base["config"]["model"] == tuned["config"]["model"] and base["config"]["adapter"] is None
    n = base["n"]
    assert re.fullmatch(rf"After 2 GRPO steps \(\d+\.\d min of training on this CPU\), on {n} held-out problems the "
                        r"tuned model .* \(McNemar p = [0-9.e+-]+, .*\)\.", lines[-1])
    assert f"instead of {base['correct']} correctly" in lines[-1]
    assert f"line on {tuned['format_ok']} instead of {base['format_ok']}" in lines[-1]
    table = "\n".join(lines[-8:])
    assert "accuracy" in table and "format" in table and "McNemar exact" in table
    assert any(ln.startswith("reward curve: ") and ln.endswith("reward_curve.png") for ln in lines)
    assert (tmp_path / "runs" / "train" / "s" / "reward_curve.png").is_file()
