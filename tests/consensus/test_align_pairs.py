"""Which rank deviated, on sequences shaped like real runs (no processes: the run-level cases
are in test_coverage.py and test_culprit.py): the alignment finds the first call with no
counterpart, the channel's own pattern says whose path broke."""

from __future__ import annotations

from hctool.consensus.blame import align, first_break


def ev(site: str, op: str = "all_gather_into_tensor", state: str = "completed", rank: int = 0, **kw) -> dict:
    return dict(
        {
            "op": op,
            "sh": [[4]],
            "dt": ["float32"],
            "site": site,
            "fn": "f",
            "state": state,
            "rank": rank,
            "g": "0:[0,1]",
            "stack": [],
        },
        **kw,
    )


ATTN, MLP, EXTRA = ev("p.py:18", "all_reduce"), ev("p.py:21", "all_reduce"), ev("p.py:20", "all_reduce")


def test_the_alignment_skips_an_inserted_call_that_paired_silently():
    # rank 0 inserted EXTRA, which paired with rank 1's MLP by sequence number; only the
    # alignment without it lines the rest up
    a, b = [ATTN, EXTRA, MLP, ATTN, MLP], [ATTN, MLP, ATTN, MLP]
    k, op = first_break(align(a, b, True, True))
    assert (op.kind, op.i) == ("gap_a", 1)


def test_an_open_sequence_leaves_its_peers_tail_pending():
    # rank 1 is still running: the calls rank 0 is ahead by are not gaps (yet)
    ops = align([ATTN, MLP, ATTN, MLP], [ATTN, MLP], True, False)
    assert first_break(ops) is None and [o.kind for o in ops][-2:] == ["pending", "pending"]


def test_a_gap_in_a_run_of_equal_calls_goes_last():
    # 20 turns of one call against 19, then the barrier both make: which turn is not in the data,
    # the gap goes to the last turn (where the sequences part)
    loop, bar = ev("p.py:10", "all_reduce"), ev("p.py:12", "barrier", sh=[], dt=[])
    k, op = first_break(align([loop] * 20 + [bar], [loop] * 19 + [bar], True, True))
    assert (op.kind, op.i) == ("gap_a", 19)


def test_calls_at_one_place_that_differ_are_a_mismatch_not_two_gaps():
    wide = ev("p.py:18", "all_reduce", sh=[[8]])
    k, op = first_break(align([ATTN, ATTN], [ATTN, wide], True, True))
    assert (op.kind, op.i, op.j) == ("mismatch", 1, 1)


def test_a_whole_extra_step_is_one_inserted_block():
    # FSDP2 on 2 GPUs: rank 1 runs one training step more (forward/backward gathers,
    # reduce-scatters, clip all_reduce) while rank 0 moved on to its checkpoint gathers
    fwd, bwd, rs = ev("example.py:101"), ev("example.py:102"), ev("example.py:102", "reduce_scatter_tensor")
    clip, ckpt = ev("example.py:103", "all_reduce"), ev("checkpoint.py:149")
    step = [fwd] * 3 + [bwd, rs] * 3 + [clip]
    rank0 = [dict(e, rank=0) for e in step * 2 + [ckpt, ckpt]]
    rank1 = [dict(e, rank=1) for e in step * 3 + [ckpt] * 5]
    f = _tracker(rank0 + rank1).first_divergence({0: "clean", 1: "clean"}, now=200.0, hang_after=None, final=True)
    assert (f["kind"], f["culprits"], f["cause_rank"], f["cause_seq"]) == ("extra", [1], 1, 20), f


def test_two_different_calls_with_no_history_and_no_source_name_both():
    a = [dict(ATTN, rank=0), ev("p.py:30", "barrier", rank=0, sh=[], dt=[])]
    b = [dict(ATTN, rank=1), ev("p.py:31", "broadcast", rank=1, root=0)]
    f = _tracker(a + b).first_divergence({0: "clean", 1: "clean"}, now=200.0, hang_after=None, final=True)
    assert f["culprits"] == [0, 1] and f["confidence"] == "low", f


def _tracker(events: list[dict]):
    from hctool.consensus.analyze import Tracker

    tr = Tracker()
    tr.world_size = 2
    tr.groups.update({"0:[0,1]": [0, 1], "1:[0,1]": [0, 1]})
    for i, e in enumerate(events):
        base = {
            "sh": [[2]],
            "dt": ["float32"],
            "ro": "SUM",
            "root": None,
            "label": None,
            "digest": None,
            "fn": "<module>",
            "stack": [],
            "th": "MainThread",
            "t": 100.0 + i,
            "w": 1000.0 + i,
            "async": False,
            "op": "all_reduce",
            "state": "completed",
        }
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
    evs = (
        _loop(0)
        + _loop(1)
        + [
            {"rank": 0, "g": "0:[0,1]", "site": "p.py:12", "state": "blocked"},
            {"rank": 1, "g": "1:[0,1]", "site": "p.py:20", "state": "blocked"},
        ]
    )
    f = _tracker(evs).first_divergence({0: None, 1: None}, now=100.0, hang_after=1e9, final=False)
    assert (f["kind"], f["culprits"]) == ("extra", [0])
    assert "rank 0 waits in 0:[0,1]" in f["deadlock"] and "rank 1 waits in 1:[0,1]" in f["deadlock"]
