"""hctool names the first differing field of the per-rank state records (--state-digest)."""

from __future__ import annotations

import json

from hctool.protocol.faults import parse_fault
from hctool.repro.state import find_state_divergence

FIELDS = ["waiting_queue", "running", "lru_order", "radix_tree", "device_free"]


def _write(d, rank, **state):
    base = {
        "waiting_queue": ["a", "b"],
        "running": ["c"],
        "lru_order": ["n1", "n2", "n3"],
        "radix_tree": ["n1 device=1", "n2 device=1", "n3 device=1"],
        "device_free": [512],
    }
    (d / f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "tick": 41, "fields": FIELDS, "state": {**base, **state}})
    )


def test_names_the_first_differing_field(tmp_path):
    _write(tmp_path, 0)
    _write(tmp_path, 1, lru_order=["n2", "n1", "n3"])
    sd = find_state_divergence(tmp_path)
    assert sd["field"] == "lru_order[0]" and sd["tick"] == 41
    assert sd["ranks"] == {"0": "n1", "1": "n2"} and sd["differing_fields"] == ["lru_order"]


def test_a_missing_node_is_the_tree_not_the_lru_order(tmp_path):
    _write(tmp_path, 0)
    _write(tmp_path, 1, lru_order=["n1", "n3"], radix_tree=["n1 device=1", "n3 device=1"], device_free=[528])
    sd = find_state_divergence(tmp_path)
    assert sd["field"] == "radix_tree[1]" and sd["differing_fields"] == ["radix_tree", "device_free"]


def test_equal_or_missing_records_name_nothing(tmp_path):
    assert find_state_divergence(tmp_path / "absent") is None
    _write(tmp_path, 0)
    assert find_state_divergence(tmp_path) is None  # one rank only
    _write(tmp_path, 1)
    (tmp_path / "rank2.json").write_text("{trunc")  # a rank killed while writing
    assert find_state_divergence(tmp_path) is None


def test_new_fault_kinds_round_trip():
    assert parse_fault("host-pool-shrink:rank=1,pages=1").spec() == "host-pool-shrink:rank=1,pages=1"
    assert parse_fault("clock-jitter:rank=1,ms=20").ms == 20
