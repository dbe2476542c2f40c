"""Which rank inserted the calls, on sequences shaped like real runs (no processes:
the run-level cases are in test_coverage.py)."""

from __future__ import annotations

from hctool.consensus.align import decide_pair


def ev(site: str, op: str = "all_gather_into_tensor", state: str = "completed") -> dict:
    return {"op": op, "sh": [[4]], "dt": ["float32"], "site": site, "fn": "f", "state": state, "rank": 0}


ATTN, MLP, EXTRA = ev("p.py:18", "all_reduce"), ev("p.py:21", "all_reduce"), ev("p.py:20", "all_reduce")


def test_inserted_call_that_paired_silently_names_the_inserter():
    # rank 0 inserted EXTRA, which paired with rank 1's MLP; rank 0's MLP now waits
    assert decide_pair([ATTN, EXTRA, MLP], [ATTN, MLP], 1, None, None, None, None) == ("extra", "a", True)
    assert decide_pair([ATTN, MLP, ATTN, EXTRA, MLP], [ATTN, MLP, ATTN, MLP], 3, None, None, None, None)[:2] \
        == ("extra", "a")


def test_a_whole_extra_step_is_one_inserted_block():
    # FSDP2 on 2 GPUs: rank 1 runs one training step more (forward/backward gathers,
    # reduce-scatters, clip all_reduce) while rank 0 moved on to its checkpoint gathers
    fwd, bwd, rs = ev("example.py:101"), ev("example.py:102"), ev("example.py:102", "reduce_scatter_tensor")
    clip, ckpt = ev("example.py:103", "all_reduce"), ev("checkpoint.py:149")
    step = [fwd] * 3 + [bwd, rs] * 3 + [clip]
    rank0 = step * 2 + [ckpt, ckpt]
    rank1 = step * 3 + [ckpt] * 5
    kind, side, _ = decide_pair(rank0, rank1, len(step) * 2, None, None, None, None)
    assert (kind, side) == ("extra", "b")


def test_undecidable_stays_both():
    a, b = [ATTN, ev("p.py:30")], [ATTN, ev("p.py:31")]
    assert decide_pair(a, b, 1, None, None, None, None)[1] == "both"


def _tracker(events: list[dict]):
    from hctool.consensus.analyze import Tracker

    tr = Tracker()
    tr.world_size = 2
    tr.groups.update({"0:[0,1]": [0, 1], "1:[0,1]": [0, 1]})
    for i, e in enumerate(events):
        base = {"sh": [[2]], "dt": ["float32"], "ro": "SUM", "root": None, "label": None, "digest": None,
                "fn": "<module>", "stack": [], "th": "MainThread", "t": 100.0 + i, "w": 1000.0 + i, "async": False,
                "op": "all_reduce", "state": "completed"}
        tr.add(dict(base, **e), now=200.0)
    tr.prune()
    return tr


def _loop(rank: int, n: int = 3) -> list[dict]:
    return [{"rank": rank, "g": "0:[0,1]", "site": "p.py:10"} for _ in range(n)]


def test_rank_outside_any_collective_is_missing_not_its_peers_extra():
    # rank 0 waits at a barrier the group never used; rank 1 finished the loop and is elsewhere
    evs = _loop(0) + _loop(1) + [{"rank": 0, "g": "0:[0,1]", "site": "p.py:12", "op": "barrier", "state": "blocked"}]
    f = _tracker(evs).first_divergence({0: None, 1: None}, now=200.0, hang_after=1.5, final=False)
    assert (f["kind"], f["culprits"]) == ("missing", [1])


def test_peer_waiting_in_another_group_makes_a_cycle_reported_at_once():
    # as above, but rank 1 waits in the subgroup for rank 0: a cycle, reported without any hang threshold
    evs = _loop(0) + _loop(1) + [{"rank": 0, "g": "0:[0,1]", "site": "p.py:12", "state": "blocked"},
                                 {"rank": 1, "g": "1:[0,1]", "site": "p.py:20", "state": "blocked"}]
    f = _tracker(evs).first_divergence({0: None, 1: None}, now=100.0, hang_after=1e9, final=False)
    assert (f["kind"], f["culprits"]) == ("extra", [0])
    assert "rank 0 waits in 0:[0,1]" in f["deadlock"] and "rank 1 waits in 1:[0,1]" in f["deadlock"]
