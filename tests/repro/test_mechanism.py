"""A buggy variant is `ok` only when the run shows the mechanism it declares."""

from __future__ import annotations

import pytest

from hctool.consensus.model import Divergence
from hctool.repro.mechanism import Mechanism, MechanismError, check_mechanism, parse_mechanism

# The shape of a real 30760 per-poll finding (eng layout: every call goes through collectives.py).
VOTE = Divergence.from_json(
    {
        "group": "1:[0,1]",
        "seq": 708,
        "kind": "extra",
        "culprit_ranks": [1],
        "ranks": {
            "0": {
                "op": "all_reduce",
                "function": "_all_reduce",
                "reduce_op": "MAX",
                "state": "blocked",
                "stack": [
                    "collectives.py:25 _all_reduce",
                    "collectives.py:49 vote_prefetch",
                    "hiradix_cache.py:266 _vote_prefetch",
                    "hiradix_cache.py:251 check_prefetch_progress",
                    "scheduler_prefill.py:64 get_new_batch_prefill",
                ],
            },
            "1": {
                "op": "all_reduce",
                "function": "_all_reduce",
                "reduce_op": "MIN",
                "state": "blocked",
                "stack": [
                    "collectives.py:25 _all_reduce",
                    "collectives.py:40 agree_admitted",
                    "scheduler_prefill.py:73 get_new_batch_prefill",
                ],
            },
        },
    }
)
# A crash that has nothing to do with the prefetch vote.
OTHER = Divergence.from_json(
    {
        "group": "1:[0,1]",
        "seq": 3,
        "kind": "shape",
        "culprit_ranks": [0],
        "ranks": {
            "0": {"op": "all_reduce", "function": "forward", "stack": ["model.py:80 forward"]},
            "1": {
                "op": "broadcast_object_list",
                "function": "broadcast_reqs",
                "stack": ["collectives.py:31 broadcast_reqs"],
            },
        },
    }
)


def test_function_is_found_on_any_rank_stack():
    mech = Mechanism(function="check_prefetch_progress", kind=("extra", "shape"))
    ok, evidence = check_mechanism(mech, VOTE, None, True)
    assert ok and "rank 0 was in check_prefetch_progress" in evidence[0] and evidence[1] == "kind: extra"


@pytest.mark.parametrize("first", [OTHER, None])
def test_another_failure_is_not_this_bug(first):
    ok, evidence = check_mechanism(Mechanism(function="check_prefetch_progress"), first, None, False)
    assert not ok and "NOT seen" in evidence[0]


def test_kind_culprit_state_and_output():
    assert not check_mechanism(Mechanism(kind=("reduce_op",)), VOTE, None, True)[0]
    assert check_mechanism(Mechanism(culprit_ranks=(1,)), VOTE, None, True)[0]
    assert not check_mechanism(Mechanism(culprit_ranks=(0,)), VOTE, None, True)[0]
    state = {"tick": 41, "field": "lru_order[3]"}
    ok, ev = check_mechanism(Mechanism(state_field="lru_order"), None, state, True)
    assert ok and ev == ["state: ranks first differ in lru_order[3] at tick 41"]
    assert not check_mechanism(Mechanism(state_field="radix_tree"), None, state, True)[0]
    assert not check_mechanism(Mechanism(state_field="lru_order"), None, None, True)[0]
    assert check_mechanism(Mechanism(output="differs"), None, None, False)[0]
    assert not check_mechanism(Mechanism(output="differs"), None, None, True)[0]


@pytest.mark.parametrize(
    "table, message",
    [
        ({}, "at least one of"),
        ({"functon": "x"}, r"unknown fields \['functon'\]"),
        ({"kind": ["sideways"]}, "kind 'sideways'"),
        ({"culprit_ranks": [True]}, "culprit_ranks"),
        ({"output": "wrong"}, "output must be"),
        ("check_prefetch_progress", "must be a table"),
    ],
)
def test_bad_mechanism_tables(table, message):
    with pytest.raises(MechanismError, match=message):
        parse_mechanism(table)


def test_kind_may_be_one_string():
    assert parse_mechanism({"kind": "extra"}).kind == ("extra",)
