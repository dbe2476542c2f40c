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
