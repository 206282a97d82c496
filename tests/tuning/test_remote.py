"""Remote tuning's pure parts: the candidate order and the database made of a device's timings
(the compile and device sides run end to end in tests/interface/test_bundle.py)."""

from __future__ import annotations

from mlcpipe.tuning import SCHEMA, from_remote_timings
from mlcpipe.tuning.remote import candidates

SPACE = {"threads": [8, 16, 32], "rows": [1, 2, 4], "half2": [0, 1]}
DEFAULT = {"threads": 32, "rows": 4, "half2": 1, "unroll": 4}


def test_candidates_defaults_then_one_knob_moved_then_random():
    got = candidates(SPACE, DEFAULT, 20, seed=0)
    base = {"half2": 1, "rows": 4, "threads": 32}
    assert got[0] == base
    singles = [{**base, "half2": 0}, {**base, "rows": 1}, {**base, "rows": 2}, {**base, "threads": 8}, {**base, "threads": 16}]
    assert got[1:6] == singles
    assert len(got) == 18 and len({str(sorted(c.items())) for c in got}) == 18  # every combination once
    assert candidates(SPACE, DEFAULT, 3, seed=0) == [base, *singles[:2]]


def _index():
    knobs = [{"threads": 32}, {"threads": 16}, {"threads": 8}]
    return {"target_key": '{"kind":"cuda"}', "kernels": [
        {"kernel": "gemv_a", "signature": "sig-a", "default_rule": "GEMVDequant",
         "candidates": [{"function": f"k0_c{i}", "rule": "GEMVDequant", "knobs": k} for i, k in enumerate(knobs)]},
        {"kernel": "gemv_b", "signature": "sig-b", "default_rule": "GEMVDequant",
         "candidates": [{"function": "k1_c0", "rule": "GEMVDequant", "knobs": knobs[0]}]},
    ]}


def test_from_remote_timings_keeps_the_fastest_matching_candidate():
    timed = {"gemv_a": {"device": "H100", "method": "graph", "candidates": [
        {"function": "k0_c0", "us": 10.0, "error": None},
        {"function": "k0_c1", "us": 4.0, "error": "output differs from the defaults' (max abs err 3)"},  # fastest, wrong
        {"function": "k0_c2", "us": 7.5, "error": None},
    ]}}  # gemv_b was not timed (the budget ran out): no record
    db = from_remote_timings(_index(), timed)
    assert db["schema"] == SCHEMA and list(db["records"]) == ['{"kind":"cuda"}']
    table = db["records"]['{"kind":"cuda"}']
    assert list(table) == ["sig-a"]
    record = table["sig-a"]
    assert record["knobs"] == {"threads": 8} and record["ms"] == 0.0075 and record["default_ms"] == 0.01
    assert [c["error"] is None for c in record["candidates"]] == [True, False, True]
    assert record["timed_on"] == "H100"
