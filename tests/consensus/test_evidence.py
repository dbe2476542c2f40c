"""The rule of docs/consensus.md "Evidence and location" on sequences shaped like the
idioms' real traces (no processes: test_idioms.py runs the programs): a cross-site
pairing alone is no divergence, evidence is, and the pairing locates it."""

from __future__ import annotations

from hctool.consensus.analyze import Tracker, build_report
from hctool.consensus.pattern import HOLD

G = "0:[0,1]"


def _tracker(events: list[dict], world: int = 2, groups=None) -> Tracker:
    tr = Tracker()
    tr.world_size = world
    tr.groups.update(groups or {G: [0, 1]})
    for i, e in enumerate(events):
        base = {
            "g": G,
            "sh": [[4]],
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


def _calls(rank: int, *sites: str, **kw) -> list[dict]:
    return [dict({"rank": rank, "site": f"p.py:{s}"}, **kw) for s in sites]


def _report(tr: Tracker, ended=None, final=True) -> dict:
    ended = ended or {r: "clean" for r in tr.all_ranks()}
    finding = tr.first_divergence(ended, now=200.0, hang_after=None, final=final)
    return build_report(tr, ended, finding, {}, final=final).to_json()


def test_a_cross_site_pairing_alone_is_no_divergence():
    # main-process-first: rank 0 releases from line 23 what rank 1 waits for at line 20
    barrier = {"op": "barrier", "sh": [], "dt": []}
    tr = _tracker(
        _calls(0, "23", **barrier)
        + _calls(1, "20", **barrier)
        + _calls(0, "33", "33", "33")
        + _calls(1, "33", "33", "33")
    )
    report = _report(tr)
    assert (report["verdict"], report["first_divergence"]) == ("consistent", None)
    (pairing,) = report["cross_site_pairings"]
    assert (pairing["seq"], pairing["legitimate"]) == (0, True)
    assert {r: e["site"] for r, e in pairing["ranks"].items()} == {"0": "p.py:23", "1": "p.py:20"}


def test_evidence_at_the_end_is_located_at_the_pairing_that_broke_the_pattern():
    # rank 0's evaluation releases once more (line 23 called from line 28): it pairs
    # with rank 1's final barrier and rank 0's own final barrier is left alone
    barrier = {"op": "barrier", "sh": [], "dt": []}
    rank0 = (
        _calls(0, "23", stack=["p.py:23 load", "p.py:31 <module>"], **barrier)
        + _calls(0, "33", "33")
        + _calls(0, "23", stack=["p.py:23 load", "p.py:28 evaluate"], **barrier)
        + _calls(0, "36", **barrier)
    )
    rank1 = (
        _calls(1, "20", stack=["p.py:20 load", "p.py:31 <module>"], **barrier)
        + _calls(1, "33", "33")
        + _calls(1, "36", **barrier)
    )
    report = _report(_tracker(rank0 + rank1))
    first = report["first_divergence"]
    assert (first["seq"], first["kind"], first["culprit_ranks"]) == (3, "extra", [0]), first
    assert (first["ranks"]["0"]["site"], first["ranks"]["1"]["site"]) == ("p.py:23", "p.py:36")
    assert [(p["seq"], p["legitimate"]) for p in report["cross_site_pairings"]] == [(0, True), (3, False)]


def test_a_vote_from_another_line_that_shifts_the_meetings_is_no_divergence():
    # 38268's neutral join: a rank that no longer tracks a prefetch casts the same MAX vote from
    # the neutral line (387), its peer from the tracked line (388); how often each line met its
    # peer's shifts, and the ranks still issue the same calls: consistent
    def votes(rank, *callers):
        return [
            {
                "rank": rank,
                "site": "h.py:414",
                "fn": "_vote_prefetch",
                "sh": [[2]],
                "dt": ["int64"],
                "ro": "MAX",
                "stack": ["h.py:414 _vote_prefetch", f"h.py:{c} check_prefetch_progress"],
            }
            for c in callers
        ]

    tr = _tracker(votes(0, "388", "388", "388", "388", "388") + votes(1, "388", "387", "387", "388", "388"))
    report = _report(tr)
    assert (report["verdict"], report["first_divergence"]) == ("consistent", None), report["first_divergence"]
    assert all(p["legitimate"] for p in report["cross_site_pairings"])


def test_compensating_insertions_with_equal_counts_are_not_reported():
    # each rank inserted one same-shape call (rank 0 at line 12, rank 1 at line 14): the counts
    # agree, nothing hangs, and no call differs; the documented limit (assert_same covers it)
    tr = _tracker(_calls(0, "10", "10", "12", "10", "10", "10") + _calls(1, "10", "10", "10", "10", "14", "10"))
    report = _report(tr)
    assert report["first_divergence"] is None and len(report["cross_site_pairings"]) == 2


def test_shadow_pairings_of_a_joined_rank_are_consistent():
    # Join: rank 0 runs out of inputs and shadows rank 1's forward (30) and backward (31)
    # collectives from its `with` line (23), then both leave through that line
    steps = ["30", "31"] * 3
    tr = _tracker(_calls(0, *steps[:2], *["23"] * 4, "23", "23") + _calls(1, *steps, "23", "23"))
    report = _report(tr)
    assert report["first_divergence"] is None, report["first_divergence"]
    assert all(p["legitimate"] for p in report["cross_site_pairings"]) and len(report["cross_site_pairings"]) == 2


def test_a_long_legitimate_pairing_is_dropped_from_memory():
    # a rank-0-only sender branch every tick: the window keeps only HOLD calls after a pairing
    n = 3 * HOLD
    tr = _tracker([e for t in range(n) for e in _calls(0, "17") + _calls(1, "23")])
    assert tr.pending() <= 2 * (HOLD + 1), tr.pending()
    report = _report(tr)
    assert report["first_divergence"] is None
    assert report["cross_site_pairings"][0]["count"] == n


def test_an_object_a_rank_gathers_has_no_shape():
    # gather_object's argument is any object (dcp.save's write results differ in length per rank)
    obj = {"op": "gather_object", "root": 0, "dt": ["object"]}
    tr = _tracker(_calls(0, "22", sh=[[1]], **obj) + _calls(1, "22", sh=[[2]], **obj))
    assert _report(tr)["first_divergence"] is None


def test_a_cycle_no_call_explains_is_a_wait_cycle():
    # ranks 0 and 1 wait in the default group for 2 and 3, which wait in the subgroup for 0 and 1
    groups = {"0:[0,1,2,3]": [0, 1, 2, 3], "1:[0,1,2,3]": [0, 1, 2, 3]}
    evs = []
    for r in range(4):
        evs += [{"rank": r, "g": "0:[0,1,2,3]", "site": "p.py:29"}, {"rank": r, "g": "1:[0,1,2,3]", "site": "p.py:30"}]
        g, line = ("0:[0,1,2,3]", "29") if r < 2 else ("1:[0,1,2,3]", "26")
        evs.append({"rank": r, "g": g, "site": f"p.py:{line}", "state": "blocked"})
    tr = _tracker(evs, world=4, groups=groups)
    ended = {r: None for r in range(4)}
    report = _report(tr, ended=ended, final=False)
    first = report["first_divergence"]
    assert (report["verdict"], first["kind"], first["culprit_ranks"]) == ("hung", "wait_cycle", [0, 1, 2, 3]), first
    assert sorted((e["rank"], e["group"], e["seq"], e["site"]) for e in first["cycle"]) == [
        (0, "0:[0,1,2,3]", 1, "p.py:29"),
        (1, "0:[0,1,2,3]", 1, "p.py:29"),
        (2, "1:[0,1,2,3]", 1, "p.py:26"),
        (3, "1:[0,1,2,3]", 1, "p.py:26"),
    ]
    assert first["deadlock"].startswith("rank 0 waits in 0:[0,1,2,3] seq 1 for rank 2")


def test_three_ranks_a_call_site_alone_divides_no_majority(tmp_path):
    from tests.consensus.helpers import run_check, site

    code, report, err = run_check("three_ranks_op.py", tmp_path, nproc=3)
    assert code == 1, err[-3000:]
    fd = report["first_divergence"]
    assert (fd["kind"], fd["culprit_ranks"]) == ("op", [2]), fd
    assert fd["ranks"]["2"]["site"] == site("three_ranks_op.py", "bcast")
