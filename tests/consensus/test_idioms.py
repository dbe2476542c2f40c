"""Correct idioms that pair one collective from two call sites (Join, the rank-0-first
barriers, a rank-0-only sender branch) or that look rank-dependent (no_sync gradient
accumulation, distributed checkpoint on every rank) are consistent; their misuse is
named with the right culprit and the call site on every rank. Real gloo ranks
through `hctool check-consensus run`, as the corpus runs them."""

from __future__ import annotations

import os

import pytest

from tests.consensus.helpers import run_check, site

# Findings here never wait for --hang-after (an exit, a cycle, a mismatch): a long one
# keeps a rank that starts seconds late on a loaded box from looking hung.
SLOW_START = ["--hang-after", "15"]
# program -> (nproc, cross-site pairings the correct program shows, by design)
IDIOMS = {
    "ddp_join.py": (2, True),
    "main_first.py": (2, True),
    "bcast_sender.py": (2, True),
    "no_sync_accum.py": (2, False),
    "dcp_save.py": (3, False),
}
# program -> (nproc, verdict, kind, culprits, {rank: (op, site marker or None, caller marker or None)})
MISUSES = {
    # Join missing: rank 1's extra backward all-reduces alone, rank 0 has finished
    "ddp_join.py": (2, "diverged", "extra", [1], {1: ("all_reduce", "backward", None), 0: (None, None, None)}),
    # rank 0's evaluation calls the release barrier once more; it pairs with the peers' final barrier
    "main_first.py": (
        2,
        "diverged",
        "extra",
        [0],
        {0: ("barrier", "release", "evalload"), 1: ("barrier", "final", None)},
    ),
    # rank 0 all-reduces every micro-batch: its first one pairs with rank 1's step all-reduce
    "no_sync_accum.py": (
        2,
        "diverged",
        "extra",
        [0],
        {0: ("all_reduce", "accumulate", None), 1: ("all_reduce", "sync", None)},
    ),
    # dcp.save under `if rank == 0:`: rank 0 gathers plans while the others wait in the barrier
    "dcp_save.py": (
        3,
        "diverged",
        "op",
        [0],
        {0: ("gather_object", "save", None), 1: ("barrier", "barrier", None), 2: ("barrier", "barrier", None)},
    ),
    # rank 0 publishes once more from a rank-local check; rank 1 has moved on to the step's sync
    "bcast_sender.py": (
        2,
        "diverged",
        "extra",
        [0],
        {0: ("broadcast_object_list", "send", "republish"), 1: ("all_reduce", "sync", None)},
    ),
    # one batch more on rank 1 while rank 0 waits in the barrier after the loop: rank 1, not both
    "ddp_barrier.py": (
        2,
        "diverged",
        "extra",
        [1],
        {1: ("all_reduce", "backward", None), 0: ("barrier", "barrier", None)},
    ),
}
# The default run keeps the cases (~30 s here); `pytest -m slow` runs the rest.
FAST_IDIOMS = {"main_first.py", "ddp_join.py"}
FAST_MISUSES = {"main_first.py", "ddp_barrier.py"}


def _params(names, fast):
    return [pytest.param(n, marks=() if n in fast else pytest.mark.slow) for n in sorted(names)]


def _run(program, tmp_path, fix):
    nproc = IDIOMS.get(program, MISUSES.get(program))[0]
    args = [str(tmp_path / "ckpt")] if program == "dcp_save.py" else None
    return run_check(program, tmp_path, nproc=nproc, fix=fix, extra=SLOW_START, args=args)


def _assert_consistent(program, tmp_path):
    code, report, stderr = _run(program, tmp_path, fix=True)
    assert (report["verdict"], code, report["first_divergence"]) == ("consistent", 0, None), (
        program,
        report.get("first_divergence"),
        stderr[-3000:],
    )
    pairings = report.get("cross_site_pairings", [])
    assert bool(pairings) == IDIOMS[program][1], pairings  # the pairing by design was seen ...
    assert all(p["legitimate"] for p in pairings), pairings  # ... and judged legitimate
    counts = report["counts"]
    assert len({sum(c.values()) for c in counts.values()}) == 1, counts
    return report


@pytest.mark.parametrize("program", _params(IDIOMS, FAST_IDIOMS))
def test_correct_idiom_is_consistent(program, tmp_path, no_leftover_processes):
    report = _assert_consistent(program, tmp_path)
    if program == "main_first.py":  # the waiting ranks' barrier paired with rank 0's releasing one
        (pairing,) = report["cross_site_pairings"]
        assert pairing["ranks"]["0"]["site"] == site(program, "release")
        assert pairing["ranks"]["1"]["site"] == site(program, "wait")


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("program", sorted(IDIOMS))
def test_correct_idiom_stays_consistent(program, tmp_path, no_leftover_processes):
    """HCTOOL_IDIOM_RUNS times each (default 3; measured with 10, docs/consensus.md)."""
    for k in range(int(os.environ.get("HCTOOL_IDIOM_RUNS", "3"))):
        _assert_consistent(program, tmp_path / str(k))


@pytest.mark.parametrize("program", _params(MISUSES, FAST_MISUSES))
def test_misuse_is_named(program, tmp_path, no_leftover_processes):
    nproc, verdict, kind, culprits, ranks = MISUSES[program]
    code, report, stderr = _run(program, tmp_path, fix=False)
    first = report["first_divergence"]
    assert (report["verdict"], code) == (verdict, 1), (report, stderr[-3000:])
    assert (first["kind"], first["culprit_ranks"]) == (kind, culprits), first
    for rank, (op, marker, caller) in ranks.items():
        entry = first["ranks"][str(rank)]
        assert entry["op"] == op, (rank, entry)
        assert entry["site"] == (site(program, marker) if marker else None), (rank, entry)
        if caller:  # the same line reached from another place: the stack says from where
            assert any(s.startswith(site(program, caller) + " ") for s in entry["stack"]), (rank, entry)
        if op is None:  # a rank that had finished: where it was last
            assert entry["state"] == "absent" and entry["last_seen"], entry
    located = [p for p in report.get("cross_site_pairings", []) if not p["legitimate"]]
    if program in ("main_first.py", "no_sync_accum.py"):  # the pairing that was the divergence is named so
        assert [(p["group"], p["seq"]) for p in located][:1] == [(first["group"], first["seq"])], located
    if program in ("main_first.py", "bcast_sender.py"):  # the by-design pairing before it stays legitimate
        assert any(p["legitimate"] and p["seq"] < first["seq"] for p in report["cross_site_pairings"])


def test_wait_cycle_through_four_ranks(tmp_path, no_leftover_processes):
    """Two overlapping groups, the order of their calls flipped on ranks 2 and 3:
    nobody issued a call more, every rank waits for two others."""
    code, report, stderr = run_check("wait_cycle4.py", tmp_path, nproc=4, extra=SLOW_START)
    first = report["first_divergence"]
    assert (report["verdict"], code) == ("hung", 1), (report, stderr[-3000:])
    assert (first["kind"], first["culprit_ranks"]) == ("wait_cycle", [0, 1, 2, 3]), first
    cycle = {e["rank"]: e for e in first["cycle"]}
    assert sorted(cycle) == [0, 1, 2, 3], first["cycle"]
    for rank, group, marker in (
        (0, "0:[0,1,2,3]", "world"),
        (1, "0:[0,1,2,3]", "world"),
        (2, "1:[0,1,2,3]", "tp_early"),
        (3, "1:[0,1,2,3]", "tp_early"),
    ):
        entry = cycle[rank]
        assert (entry["group"], entry["seq"], entry["site"]) == (group, 1, site("wait_cycle4.py", marker)), entry
        assert first["ranks"][str(rank)]["site"] == site("wait_cycle4.py", marker)
    assert "rank 0 waits in 0:[0,1,2,3] seq 1" in first["deadlock"], first["deadlock"]
