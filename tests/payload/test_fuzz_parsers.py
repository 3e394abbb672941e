"""Fuzzing the parsers a user's input reaches: recipes (file and --set overrides), adapter manifests, JSONL
datasets, eval results and generations (compare, rescore) and answer extraction. Each either succeeds or raises
the module's RlstackError, never crashes: any bytes, any JSON."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstack.core.errors import RlstackError
from rlstack.payload import adapters, extract, recipes
from rlstack.payload.data.sources import load_jsonl
from rlstack.payload.evaluate import compare, scoring

ROOT = Path(__file__).resolve().parents[2]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
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


@FUZZ
@given(data=st.binary(max_size=400))
def test_recipe_file_any_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "r.toml"
    path.write_bytes(data)
    with contextlib.suppress(RlstackError):
        recipes.load(path)


@FUZZ
@given(body=st.one_of(st.binary(max_size=300), JSON.map(lambda v: json.dumps(v).encode()),
                      st.fixed_dictionaries({"name": st.text(max_size=8), "base_model": st.text(max_size=8),
                                             "created": st.text(max_size=4),
                                             "files": st.dictionaries(st.text(max_size=12), st.text(max_size=4),
                                                                      max_size=3)})
                      .map(lambda v: json.dumps(v).encode())))
def test_manifest_any_bytes(tmp_path: Path, body: bytes) -> None:
    d = tmp_path / "a"
    d.mkdir(exist_ok=True)
    (d / "manifest.json").write_bytes(body)
    with contextlib.suppress(RlstackError):
        adapters.verify(d)


def _per_question() -> st.SearchStrategy[dict[str, object]]:
    values = st.one_of(st.booleans(), JSON)
    return st.fixed_dictionaries({"per_question": st.dictionaries(st.sampled_from("abc"), values, max_size=3)},
                                 optional={"per_question_format": st.dictionaries(st.sampled_from("abc"), values,
                                                                                  max_size=3),
                                           "per_question_identity": JSON, "generations": JSON})


@FUZZ
@given(base=st.one_of(st.binary(max_size=200), JSON.map(lambda v: json.dumps(v).encode()),
                      _per_question().map(lambda v: json.dumps(v).encode())),
       tuned=_per_question().map(lambda v: json.dumps(v).encode()),
       generations=st.one_of(st.none(), st.binary(max_size=200), st.lists(JSON, max_size=3).map(
           lambda rows: "\n".join(json.dumps(r) for r in rows).encode())))
def test_compare_any_results(tmp_path: Path, base: bytes, tuned: bytes, generations: bytes | None) -> None:
    for name, body in (("b", base), ("t", tuned)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "results.json").write_bytes(body)
        gen = tmp_path / name / "generations.jsonl"
        gen.unlink(missing_ok=True)
        if generations is not None:
            gen.write_bytes(generations)
    with contextlib.suppress(RlstackError):
        got = compare.compare(tmp_path / "b" / "results.json", tmp_path / "t" / "results.json", iters=5)
        assert 0 < got["n"] <= 3


@FUZZ
@given(body=st.one_of(st.binary(max_size=300), st.lists(st.one_of(JSON, st.fixed_dictionaries(
    {"id": st.one_of(st.text(max_size=4), st.integers()), "generation": st.text(max_size=20),
     "reference": st.text(max_size=8)})), max_size=4).map(lambda rows: "\n".join(json.dumps(r) for r in rows)
                                                          .encode())))
def test_generations_any_bytes(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "generations.jsonl"
    path.write_bytes(body)
    with contextlib.suppress(RlstackError):
        scoring.rescore(path, tmp_path / "out.json")
