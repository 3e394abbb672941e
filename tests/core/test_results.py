"""The one results schema: a result round-trips through write and read, a file that does not fit is refused with
its path, and the ratio column compares each row with the peer of the same run (at the same load)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.core import results


def _result(**kw: object) -> results.Result:
    base: dict[str, object] = dict(
        question="rollouts",
        title="engines",
        ran=results.Ran(command="python3 bench/x.py", bench="x"),
        where=results.Where(gpu="G", environment="native"),
        date="2026-12-04T15:00:00Z",
        columns=["engine", "batch", "tps"],
        rows=[
            {"engine": "peer", "batch": 8, "tps": 100.0},
            {"engine": "mine", "batch": 8, "tps": 150.0},
            {"engine": "peer", "batch": 64, "tps": 400.0},
            {"engine": "mine", "batch": 64, "tps": 300.0},
        ],
        metric="tps",
        baseline={"engine": "peer"},
        group_by="batch",
    )
    return results.Result.model_validate({**base, **kw})


def test_write_then_read_is_the_same_result(tmp_path: Path) -> None:
    r = _result(extra={"ceilings": {"copy_TBps": 4.1}})
    path = results.write(r, "x", tmp_path)
    assert path == tmp_path / "x.json" and results.read(path) == r
    assert [p for p, _ in results.load_all(tmp_path)] == [path]


def test_the_ratio_is_against_the_peer_at_the_same_load() -> None:
    r = _result()
    assert [r.ratio(row) for row in r.rows] == [1.0, 1.5, 1.0, 0.75]
    slower_is_worse = _result(metric="tps", lower_is_better=True)
    assert slower_is_worse.ratio(slower_is_worse.rows[1]) == pytest.approx(100 / 150)
    assert _result(baseline=None).ratio(r.rows[1]) is None  # no peer named: no ratio


@pytest.mark.parametrize(
    "change", [{"question": "speed"}, {"date": "last tuesday"}, {"rows": "none"}, {"typo_field": 1}]
)
def test_a_file_that_does_not_fit_names_itself(tmp_path: Path, change: dict[str, object]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**_result().model_dump(mode="json"), **change}))
    with pytest.raises(results.ResultError, match="bad.json") as err:
        results.read(path)
    assert err.value.hint and "results.write" in err.value.hint


def test_a_missing_file_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(results.ResultError, match="invoke bench"):
        results.read(tmp_path / "none.json")


def test_every_committed_result_fits_the_schema() -> None:
    loaded = results.load_all()
    assert loaded, "bench/results has no results"
    for path, r in loaded:
        assert r.columns and r.rows, path
        assert all(any(c in row for row in r.rows) for c in r.columns), f"{path.name}: a column no row has"
