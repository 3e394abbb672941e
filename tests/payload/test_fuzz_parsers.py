"""Fuzzing the parsers a user's input reaches: recipes (file and --set overrides), adapter manifests, JSONL
datasets and answer extraction. Each either succeeds or raises the module's RlstackError, never crashes."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstack.core.errors import RlstackError
from rlstack.payload import adapters, extract, recipes
from rlstack.payload.data.sources import load_jsonl

ROOT = Path(__file__).resolve().parents[2]
SMOKE = (ROOT / "recipes" / "smoke-cpu.toml").read_text()
FUZZ = settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)


@FUZZ
@given(cut=st.integers(0, len(SMOKE)), junk=st.text(max_size=30))
def test_recipe_file(tmp_path: Path, cut: int, junk: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(SMOKE[:cut] + junk)
    with contextlib.suppress(RlstackError):
        recipes.load(path)


@FUZZ
@given(overrides=st.lists(st.text(max_size=25), max_size=3))
def test_recipe_overrides(overrides: list[str]) -> None:
    with contextlib.suppress(RlstackError):
        recipes.load(ROOT / "recipes" / "smoke-cpu.toml", overrides)


@FUZZ
@given(body=st.one_of(st.text(max_size=200),
                      st.dictionaries(st.sampled_from(["name", "base_model", "files", "stack", "created", "x"]),
                                      st.one_of(st.text(max_size=8), st.integers(), st.none()), max_size=5)
                      .map(json.dumps)))
def test_manifest(tmp_path: Path, body: str) -> None:
    d = tmp_path / "a"
    d.mkdir(exist_ok=True)
    (d / "manifest.json").write_text(body)
    with contextlib.suppress(RlstackError):
        adapters.verify(d)


@FUZZ
@given(lines=st.lists(st.one_of(st.text(max_size=40),
                                st.fixed_dictionaries({"question": st.text(max_size=10),
                                                       "answer": st.text(max_size=10)}).map(json.dumps)),
                      max_size=5))
def test_jsonl_dataset(tmp_path: Path, lines: list[str]) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines))
    with contextlib.suppress(RlstackError):
        load_jsonl(path)


@FUZZ
@given(text=st.text(max_size=300))
def test_answer_extraction_never_crashes(text: str) -> None:
    got = extract.extract(text)
    assert got is not None
    extract.parse_number(text)
